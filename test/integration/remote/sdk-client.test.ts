// The gateway test file sdk-client, with its gateway on the shim protocol (see use-remote.ts).
import './use-remote';
import '../sdk-client.test';
