// The adversarial content-access tests, with the gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../../adversarial/content-access.test';
