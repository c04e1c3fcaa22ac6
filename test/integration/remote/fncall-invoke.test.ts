// The gateway test file fncall-invoke, with its gateway on the shim protocol (see use-remote.ts).
import './use-remote';
import '../fncall-invoke.test';
