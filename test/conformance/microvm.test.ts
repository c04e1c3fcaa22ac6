import test from 'ava';
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { BackendRegistry } from '../../src/shim/backends/registry';
import { microvmBackendStatus, skipReason } from '../../src/features';
import { backendConformance } from './backend-suite';
import { openTestShim, spec } from '../helpers/warren';
import { tempDir } from '../helpers/tmp';

const status = microvmBackendStatus();
const skip = skipReason('native-helper', 'qemu', 'microvm-guest') ?? (status.available ? null : `microvm backend unavailable: ${status.reason}`);

backendConformance(
  test,
  'microvm',
  async () => {
    const fixture = await openTestShim();
    const image = fixture.shim.layers.resolveImage('busybox');
    const layers = await fixture.shim.layers.acquire(image.layers);
    const dir = tempDir('warren-conf-vm-');
    const backend = BackendRegistry.build({ dataDir: dir, network: null, log: () => undefined }).get('microvm');
    const prefix = `v${process.pid.toString(36)}`;
    return {
      backend,
      layers,
      spec: spec({ backend: 'microvm', memoryMb: 192, diskMb: 64 }),
      newId: () => `${prefix}-${randomBytes(6).toString('hex')}`,
      cleanup: (id) => backend.cleanup(id),
      close: async () => {
        fixture.shim.layers.release(image.layers);
        await fixture.shim.close();
        fixture.shim.layers.unmountUnused();
        await rm(dir, { recursive: true, force: true });
        await rm(fixture.dataDir, { recursive: true, force: true });
      },
    };
  },
  skip,
);
