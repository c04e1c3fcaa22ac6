// The gateway test file fncall-invoke, with its gateway on a ClusterShim (see use-cluster.ts).
import './use-cluster';
import '../fncall-invoke.test';
