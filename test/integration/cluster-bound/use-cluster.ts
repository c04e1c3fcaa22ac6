/**
 * Imported first by the files in this folder: the gateway test files they
 * import next bind their gateways to the node through a ClusterShim, as
 * `warren gateway --etcd` reaches its nodes (test/helpers/shim-binding.ts),
 * so the same tests hold for a cluster gateway as for `warren up`.
 */
import test from 'ava';
import { clusterBindings } from '../../helpers/shim-binding';
import { rootSkipReason } from '../../helpers/warren';

process.env.WARREN_TEST_SHIM = 'cluster';

// Without this the file would pass just as well with its gateways in-process.
test.after('every gateway of this file went through the ClusterShim', () => {
  if (rootSkipReason() === null && clusterBindings() === 0) throw new Error('no gateway of this file was bound through the ClusterShim');
});
