// The gateway test file gateway-user-errors, with its gateway on the shim protocol (see use-remote.ts).
import './use-remote';
import '../gateway-user-errors.test';
