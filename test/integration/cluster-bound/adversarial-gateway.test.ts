// The adversarial gateway tests, with the gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../../adversarial/gateway.test';
