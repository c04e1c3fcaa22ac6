import test from 'ava';
import { BackendRegistry } from '../../src/shim/backends/registry';
import { microvmBackendStatus, skipReason } from '../../src/features';
import { backendConformance } from './backend-suite';
import { microvmHarness } from '../helpers/microvm-harness';

const status = microvmBackendStatus();
const skip = skipReason('native-helper', 'qemu', 'microvm-guest') ?? (status.available ? null : `microvm backend unavailable: ${status.reason}`);

backendConformance(
  test,
  'microvm',
  () => microvmHarness('v', (dir) => ({ backend: BackendRegistry.build({ dataDir: dir, network: null, log: () => undefined }).get('microvm') })),
  skip,
);
