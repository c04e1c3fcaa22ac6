// The gateway test file gateway-shell, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../gateway-shell.test';
