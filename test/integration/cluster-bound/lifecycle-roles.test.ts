// The gateway test file lifecycle-roles, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../lifecycle-roles.test';
