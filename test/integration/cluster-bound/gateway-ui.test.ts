// The gateway test file gateway-ui, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../gateway-ui.test';
