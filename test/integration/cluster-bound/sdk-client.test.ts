// The gateway test file sdk-client, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../sdk-client.test';
