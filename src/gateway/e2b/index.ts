/**
 * The E2B-compatible surface (docs/e2b.md): E2B's own `e2b` and
 * `@e2b/code-interpreter` SDKs work against Warren with four environment
 * variables. The control plane lives under a prefix (`/e2b`); the sandbox
 * plane (envd's Connect services, /files, /health, the interpreter's
 * /execute and /contexts) answers on the gateway's own port, routed by the
 * SDK's `E2b-Sandbox-Id` header. Warren's strict unknown-field rule does not
 * apply here: the SDKs send optional fields and add more over time.
 */
import type { Server } from 'hyper-express';
import type { Database } from '../../state/db';
import type { GatewayContext } from '../context';
import { Control } from './control';
import { type Plane, registerEnvd } from './envd';
import { registerInterpreter } from './interpreter';
import { E2bState } from './state';

export interface E2bOptions {
  db: Database;
  /** Path prefix of the control plane (E2B_API_URL = http://HOST:PORT<prefix>); default /e2b. */
  prefix?: string;
}

export function registerE2bRoutes(app: Server, ctx: GatewayContext, opts: E2bOptions): { close(): void } {
  const plane: Plane = { ctx, state: new E2bState(opts.db), processes: new Map(), usersEnsured: new Set(), log: ctx.log, onSandboxGone: [] };
  const control = new Control(plane, { prefix: opts.prefix ?? '/e2b' });
  control.register(app);
  registerEnvd(app, plane);
  registerInterpreter(app, plane);
  control.start();
  return { close: () => control.close() };
}
