import test from 'ava';
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BackendRegistry } from '../../src/shim/backends/registry';
import { skipReason } from '../../src/features';
import { backendConformance } from './backend-suite';
import { openTestShim, spec } from '../helpers/warren';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'pidfd');

backendConformance(
  test,
  'container',
  async () => {
    const fixture = await openTestShim();
    const image = fixture.shim.layers.resolveImage('busybox');
    const layers = await fixture.shim.layers.acquire(image.layers);
    const dir = mkdtempSync(join(tmpdir(), 'warren-conf-'));
    const backend = BackendRegistry.build({ dataDir: dir, network: null, log: () => undefined }).get('container');
    const prefix = `c${process.pid.toString(36)}`;
    return {
      backend,
      layers,
      spec: spec(),
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
