// The gateway test file gateway-http, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../gateway-http.test';
