/**
 * The conformance suite for microVMs under Firecracker (the same backend,
 * another VmmDriver): where the firecracker binary (>= 1.8) and KVM that runs
 * the guest are there. Skipped with the probe's reason elsewhere (this
 * machine: not installed, and its KVM is PVM).
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { skipReason } from '../../src/features';
import { MicroVMBackend } from '../../src/shim/backends/microvm/backend';
import { firecracker } from '../../src/shim/backends/microvm/firecracker';
import { backendConformance } from './backend-suite';
import { openTestShim, spec } from '../helpers/warren';
import { tempDir } from '../helpers/tmp';

const skip = skipReason('native-helper', 'microvm-guest', 'firecracker');

backendConformance(
  test,
  'microvm',
  async () => {
    const fixture = await openTestShim();
    const image = fixture.shim.layers.resolveImage('busybox');
    const layers = await fixture.shim.layers.acquire(image.layers);
    const dir = tempDir('warren-conf-fc-');
    const backend = new MicroVMBackend({ dataDir: dir, driver: firecracker, runRoot: `/run/warren/fc-${process.pid}`, log: () => undefined, bootTimeoutMs: 60_000 });
    const prefix = `c${process.pid.toString(36)}`;
    return {
      backend,
      layers,
      spec: spec({ backend: 'microvm', memoryMb: 192, diskMb: 64 }),
      newId: () => `${prefix}-${randomBytes(6).toString('hex')}`,
      cleanup: (id) => backend.cleanup(id),
      close: async () => {
        backend.close();
        fixture.shim.layers.release(image.layers);
        await fixture.shim.close();
        fixture.shim.layers.unmountUnused();
        await rm(dir, { recursive: true, force: true });
        await rm(fixture.dataDir, { recursive: true, force: true });
        await rm(`/run/warren/fc-${process.pid}`, { recursive: true, force: true });
        await rm(`/run/warren/fc-${process.pid}-jail`, { recursive: true, force: true });
      },
    };
  },
  skip,
);
