/**
 * The E2B-compatible surface (docs/e2b.md): E2B's own `e2b` and
 * `@e2b/code-interpreter` SDKs work against Warren with four environment
 * variables. It has a listener of its own (see ./http.ts for why): the
 * control plane under `/e2b`, and on the same port the sandbox plane (envd's
 * Connect services, /files, /health, the interpreter's /execute and
 * /contexts), routed by the SDK's `E2b-Sandbox-Id` header. Warren's strict
 * unknown-field rule does not apply here: the SDKs send optional fields and
 * add more over time.
 */
import type { Database } from '../../state/db';
import type { GatewayContext } from '../context';
import { Control } from './control';
import { type Plane, registerEnvd } from './envd';
import { Router, listen } from './http';
import { registerInterpreter } from './interpreter';
import { E2bState } from './state';
import { E2bError, restErrorBody } from './wire';

export const E2B_PREFIX = '/e2b';

export interface E2bOptions {
  db: Database;
  host: string;
  /** 0 picks an ephemeral port. */
  port: number;
}

export interface E2bSurface {
  port: number;
  /** Base URL: E2B_SANDBOX_URL; E2B_API_URL is this plus /e2b. */
  url: string;
  close(): Promise<void>;
}

export async function startE2bSurface(ctx: GatewayContext, opts: E2bOptions): Promise<E2bSurface> {
  const plane: Plane = { ctx, state: new E2bState(opts.db), processes: new Map(), usersEnsured: new Set(), log: ctx.log, onSandboxGone: [] };
  const router = new Router();
  const control = new Control(plane, { prefix: E2B_PREFIX });
  control.register(router);
  registerEnvd(router, plane);
  registerInterpreter(router, plane);
  router.notFound((req, res) => {
    res.status(404).header('content-type', 'application/json');
    res.send(restErrorBody(new E2bError(404, `no E2B route for ${req.method} ${req.path.slice(0, 200)}`)), !req.received);
  });
  const { server, port } = await listen(router, opts.host, opts.port, ctx.log);
  // Re-arming timers asks the node about each sandbox; a failure is logged, the surface still serves.
  void control.start().catch((err: Error) => ctx.log(`e2b: re-arming pause timers failed: ${err.message}`));
  const host = opts.host.includes(':') ? `[${opts.host}]` : opts.host === '0.0.0.0' ? '127.0.0.1' : opts.host;
  return {
    port,
    url: `http://${host}:${port}`,
    async close() {
      control.close();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}
