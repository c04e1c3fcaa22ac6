import test from 'ava';
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { BackendRegistry } from '../../src/shim/backends/registry';
import { vmBackendStatus, skipReason } from '../../src/features';
import { desktopImage } from '../../src/shim/backends/vm/image';
import { backendConformance } from './backend-suite';
import { openTestShim, spec } from '../helpers/warren';
import { tempDir } from '../helpers/tmp';

const status = vmBackendStatus();
const skip = skipReason('native-helper', 'qemu', 'debootstrap') ?? (status.available ? null : `vm backend unavailable: ${status.reason}`);

if (skip === null) {
  // The desktop image is built once per node (a few minutes, cached in /var/cache/warren/vm): before the suite's clock starts.
  test.before(async (t) => {
    t.timeout(20 * 60_000);
    await desktopImage();
  });
}

backendConformance(
  test,
  'vm',
  async () => {
    const fixture = await openTestShim();
    const image = fixture.shim.layers.resolveImage('busybox');
    const layers = await fixture.shim.layers.acquire(image.layers);
    const dir = tempDir('warren-conf-fullvm-');
    const backend = BackendRegistry.build({
      dataDir: dir,
      network: null,
      log: () => undefined,
      // A boot that stalls fails the create with the guest's console well inside a test's 10 minutes
      // (a desktop boots in about 20 s here, under TCG, even with the suite running beside it).
      bootTimeoutMs: 4 * 60_000,
    }).get('vm');
    const prefix = `f${process.pid.toString(36)}`;
    return {
      backend,
      layers,
      spec: spec({ backend: 'vm', cpu: 2, memoryMb: 384, diskMb: 1024 }),
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
