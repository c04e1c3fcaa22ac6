// The adversarial gateway tests, with the gateway on the shim protocol (see use-remote.ts).
import './use-remote';
import '../../adversarial/gateway.test';
