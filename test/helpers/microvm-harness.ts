/**
 * The conformance harness of a microVM backend (under any VMM): a busybox image from a test
 * shim's layer store, 192 MiB guests with a 64 MiB disk, and everything removed at the end.
 */
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import type { Backend } from '../../src/shim/types';
import type { BackendHarness } from '../conformance/backend-suite';
import { tempDir } from './tmp';
import { closeTestShim, openTestShim, spec } from './warren';

export async function microvmHarness(idPrefix: string, make: (dataDir: string) => { backend: Backend; close?: () => Promise<void> }): Promise<BackendHarness> {
  const fixture = await openTestShim();
  const image = fixture.shim.layers.resolveImage('busybox');
  const layers = await fixture.shim.layers.acquire(image.layers);
  const dir = tempDir('warren-conf-vm-');
  const made = make(dir);
  const prefix = `${idPrefix}${process.pid.toString(36)}`;
  return {
    backend: made.backend,
    layers,
    spec: spec({ backend: 'microvm', memoryMb: 192, diskMb: 64 }),
    newId: () => `${prefix}-${randomBytes(6).toString('hex')}`,
    cleanup: (id) => made.backend.cleanup(id),
    close: async () => {
      await made.close?.();
      fixture.shim.layers.release(image.layers);
      await closeTestShim(fixture);
      await rm(dir, { recursive: true, force: true });
    },
  };
}
