/**
 * The Shim contract a test gateway talks to its node through. In-process
 * (LocalShim) by default; with WARREN_TEST_SHIM=remote the node is served
 * over the shim protocol on loopback and the gateway holds a RemoteShim, so
 * the same gateway tests pass over both bindings (test/integration/remote).
 */
import { randomBytes } from 'node:crypto';
import { LocalShim } from '../../src/shim/local';
import type { ShimNode } from '../../src/shim/node';
import { RemoteShim } from '../../src/shim/remote/client';
import { serveShim } from '../../src/shim/remote/server';
import type { Shim } from '../../src/shim/types';

export interface BoundShim {
  shim: Shim;
  /** Stops serving the node (remote); the node itself stays open. */
  close(): Promise<void>;
}

let remoteCount = 0;

/** How many gateways of this test process were bound through the shim protocol. */
export function remoteBindings(): number {
  return remoteCount;
}

export async function bindShim(node: ShimNode, remote = process.env.WARREN_TEST_SHIM === 'remote'): Promise<BoundShim> {
  const local = new LocalShim(node);
  if (!remote) return { shim: local, close: async () => undefined };
  remoteCount++;
  const token = randomBytes(24).toString('hex');
  const server = await serveShim({ shim: local, token, host: '127.0.0.1', port: 0 });
  let shim: RemoteShim;
  try {
    shim = await RemoteShim.connect({ url: server.url, token });
  } catch (err) {
    await server.close();
    throw err;
  }
  return {
    shim,
    async close() {
      await shim.close();
      await server.close();
    },
  };
}
