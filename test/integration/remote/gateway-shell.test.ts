// The gateway test file gateway-shell, with its gateway on the shim protocol (see use-remote.ts).
import './use-remote';
import '../gateway-shell.test';
