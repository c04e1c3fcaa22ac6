/**
 * Imported first by the files in this folder: the gateway test files they
 * import next bind their gateways to the node through the shim protocol
 * (RemoteShim over loopback) instead of in-process, so the same tests hold
 * over both bindings of the Shim contract (test/helpers/shim-binding.ts).
 */
import test from 'ava';
import { remoteBindings } from '../../helpers/shim-binding';
import { rootSkipReason } from '../../helpers/warren';

process.env.WARREN_TEST_SHIM = 'remote';

// Without this the file would pass just as well with its gateways in-process.
test.after('every gateway of this file went through the shim protocol', () => {
  if (rootSkipReason() === null && remoteBindings() === 0) throw new Error('no gateway of this file was bound through the shim protocol');
});
