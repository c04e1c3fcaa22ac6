// The gateway test file gateway-http, with its gateway on the shim protocol (see use-remote.ts).
import './use-remote';
import '../gateway-http.test';
