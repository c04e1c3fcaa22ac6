// The gateway test file gateway-user-errors, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../gateway-user-errors.test';
