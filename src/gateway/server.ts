/**
 * The Warren gateway: REST (v1) and WebSocket shells over hyper-express.
 * Every answer is JSON; every error is `{ "error": { "code", "message" } }`
 * with the status of its WarrenError code. The routes live in ./routes and
 * ./ws-shell.ts; the contract is in docs/api.md.
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import HyperExpress from 'hyper-express';
import type { Database } from '../state/db';
import { WarrenError } from '../errors';
import type { Shim } from '../shim/types';
import { type Accounts, Auth, type Quota, localAccounts } from './auth';
import type { GatewayContext } from './context';
import { DEFAULT_UPLOAD_LIMIT, type Log, sendError } from './http';
import { createReclaimer } from './reclaim';
import { registerEnvironmentRoutes } from './routes/environments';
import { registerFileRoutes } from './routes/files';
import { registerFunctionRoutes } from './routes/functions';
import { registerImageRoutes } from './routes/images';
import { registerSandboxRoutes } from './routes/sandboxes';
import { registerSystemRoutes } from './routes/system';
import { registerPolicyRoutes } from './routes/policy';
import { type ShellOptions, registerShellRoutes } from './ws-shell';
import { registerScreenRoutes } from './routes/screen';
import { registerUiRoutes } from './routes/ui';
import { startE2bSurface } from './e2b';
import { IDEMPOTENCY_DEFAULTS, type IdempotencyOptions, IdempotencyStore } from './idempotency';
import { type IdempotencyContext, followElsewhere } from './idempotent-exec';

/** Whether the node still knows sandbox `id` (any state): its idempotency keys are kept until it is gone. */
async function sandboxExists(ctx: GatewayContext, id: string): Promise<boolean> {
  try {
    await ctx.shim.getSandbox(id);
    return true;
  } catch (err) {
    // a cluster answers SANDBOX_LOST for the sandboxes of a node that lost its lease: gone too
    if (err instanceof WarrenError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'NOT_FOUND' || err.code === 'SANDBOX_LOST')) return false;
    throw err;
  }
}

export interface GatewayOptions {
  shim: Shim;
  db: Database;
  dataDir: string;
  host: string;
  /** 0 picks an ephemeral port; the real one is returned. */
  port: number;
  /** Origins allowed to open WebSocket shells from browsers (default: none). */
  allowedOrigins?: string[];
  log?: (line: string) => void;
  /** Largest file or archive upload/download in bytes (default 256 MiB). */
  uploadLimitBytes?: number;
  /** Quota of accounts without their own (concurrent sandboxes, cpu, memory); default unlimited. */
  defaultQuota?: Quota;
  /** Port of the E2B-compatible surface (docs/e2b.md); absent: not served. */
  e2bPort?: number;
  /** Back-pressure limits of shell connections (docs/shell-protocol.md). */
  shell?: Pick<ShellOptions, 'highWaterBytes' | 'stallTimeoutMs' | 'bufferBudgetBytes'>;
  /** Idempotency keys: window and stored output bound (docs/idempotency.md). */
  idempotency?: IdempotencyOptions;
  /** Who may call (default: the tokens in `db`; a cluster gateway: the accounts in etcd). */
  auth?: Accounts;
  /** The node's machine, when it is not this one: creates are checked against its cpus and memory. */
  nodeHost?: { cpus: number; memoryMb: number };
  /** What a deployment adds to the standard API (a cluster: its nodes, jobs and distributed policy). */
  extension?: GatewayExtension;
}

/**
 * Routes and answers a deployment adds to the standard API. The gateway is
 * the same everywhere; `warren gateway` (a cluster) serves its policy from
 * etcd in place of the node's policy directory, and adds its own routes.
 */
export interface GatewayExtension {
  /** Registered in place of the node's policy routes (GET /v1/policy, POST /v1/policy/apply). */
  policyRoutes?: (app: HyperExpress.Server, ctx: GatewayContext) => void;
  /** Registered after the standard routes. */
  routes?: (app: HyperExpress.Server, ctx: GatewayContext) => void;
  /** Merged into GET /v1/health. */
  health?: () => Promise<Record<string, unknown>>;
  /**
   * Whether this gateway is the only one following the node's supervised execs (default true):
   * then, at start, it removes the runs no key of its own names. Several gateways of a cluster
   * share the nodes and must not remove each other's.
   */
  soleGateway?: boolean;
}

export interface Gateway {
  port: number;
  url: string;
  /** Base URL of the E2B-compatible surface, when served. */
  e2bUrl?: string;
  close(): Promise<void>;
}

let cachedVersion: string | null = null;

/** Warren's version, from package.json. */
export function warrenVersion(): string {
  if (cachedVersion !== null) return cachedVersion;
  for (const rel of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(join(__dirname, rel), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'warren' && typeof pkg.version === 'string') return (cachedVersion = pkg.version);
    } catch {
      /* try the next location */
    }
  }
  return (cachedVersion = '0.0.0');
}

interface Listening {
  port: number;
  close(): void;
}

/** uWS's option for a listen socket without SO_REUSEPORT. */
const LIBUS_LISTEN_EXCLUSIVE_PORT = 1;

/**
 * Listen on host:port, alone. uWS sets SO_REUSEPORT by default, so a second gateway started on
 * a port already in use (or any uWS server of the same user) would share it, and the kernel
 * would hand each new connection to one or the other: clients would see another node's
 * sandboxes, or lose their shells to it. Exclusive, the second listen fails as "in use".
 */
function listenExclusive(app: HyperExpress.Server, host: string, port: number): Promise<Listening> {
  const uws = HyperExpress.compressors as unknown as { us_socket_local_port(s: unknown): number; us_listen_socket_close(s: unknown): void };
  // what Server.listen does first: the routes (and the not-found catch-all) are fixed here
  (app as unknown as { _compile(): void })._compile();
  const listen = app.uws_instance.listen as unknown as (host: string, port: number, options: number, cb: (socket: unknown) => void) => void;
  return new Promise((resolve, reject) => {
    listen.call(app.uws_instance, host, port, LIBUS_LISTEN_EXCLUSIVE_PORT, (socket) => {
      if (!socket) return reject(new Error('the port is in use, or the host is not an address of this machine'));
      let open = true;
      resolve({
        port: uws.us_socket_local_port(socket),
        close() {
          if (open) uws.us_listen_socket_close(socket);
          open = false;
        },
      });
    });
  });
}

export async function createGateway(opts: GatewayOptions): Promise<Gateway> {
  const log: Log = opts.log ?? ((line) => process.stderr.write(`${line}\n`));
  const ctx: GatewayContext = {
    shim: opts.shim,
    auth: opts.auth ?? localAccounts(new Auth(opts.db)),
    log,
    host: opts.nodeHost ?? { cpus: os.availableParallelism?.() ?? os.cpus().length, memoryMb: Math.floor(os.totalmem() / (1024 * 1024)) },
    uploadLimit: opts.uploadLimitBytes ?? DEFAULT_UPLOAD_LIMIT,
    version: warrenVersion(),
    startedAt: Date.now(),
  };
  if (opts.defaultQuota !== undefined) ctx.defaultQuota = opts.defaultQuota;
  const reclaimer = createReclaimer();
  ctx.reclaimer = reclaimer;
  const idem: IdempotencyContext = { store: new IdempotencyStore(opts.db, opts.idempotency), inflight: new Map() };
  ctx.idempotency = idem;
  // Unsupervised execs that were running under the previous gateway process lost their pipes with it;
  // supervised ones are followed to their result from here, and their files removed after.
  idem.store.markInterrupted();
  const followed = new Map<string, Set<string>>();
  for (const rec of idem.store.runningElsewhere()) {
    followElsewhere(ctx, idem, rec);
    const runs = followed.get(rec.scope.sandbox) ?? new Set<string>();
    runs.add(rec.meta.run as string);
    followed.set(rec.scope.sandbox, runs);
  }
  // Runs nobody will ask for (their key went, a crash before it was written) are removed once ended.
  if (opts.extension?.soleGateway !== false) {
    void opts.shim
      .listSandboxes()
      .then((list) => {
        for (const sb of list) {
          void opts.shim.sweepSupervised(sb.id, followed.get(sb.id) ?? new Set()).catch((err: Error) => log(`idempotency: sweeping supervised execs of ${sb.id} failed: ${err.message}`));
        }
      })
      .catch((err: Error) => log(`idempotency: listing sandboxes to sweep failed: ${err.message}`));
  }
  let collecting = false;
  const collectKeys = () => {
    if (collecting) return;
    collecting = true;
    idem.store
      .gc((id) => sandboxExists(ctx, id))
      .catch((err: Error) => log(`idempotency: garbage collection failed: ${err.message}`))
      .finally(() => (collecting = false));
  };
  collectKeys();
  const gcTimer = setInterval(collectKeys, Math.max(1000, Math.min(IDEMPOTENCY_DEFAULTS.gcIntervalMs, idem.store.windowMs)));
  gcTimer.unref();

  const app = new HyperExpress.Server({
    auto_close: false,
    // Limits are enforced per route from Content-Length before reading, so that
    // oversized bodies get a proper 413 error body; hyper-express's own limit
    // would answer an empty 413 only after swallowing the whole body.
    max_body_length: Number.MAX_SAFE_INTEGER,
  });

  app.set_error_handler((_req, res, err) => sendError(res, err, log, true));

  registerSystemRoutes(app, ctx, opts.extension?.health);
  (opts.extension?.policyRoutes ?? registerPolicyRoutes)(app, ctx);
  registerSandboxRoutes(app, ctx);
  registerFileRoutes(app, ctx);
  registerImageRoutes(app, ctx);
  registerEnvironmentRoutes(app, ctx);
  registerFunctionRoutes(app, ctx);
  registerUiRoutes(app, ctx);
  opts.extension?.routes?.(app, ctx);
  const shells = registerShellRoutes(app, ctx, { ...opts.shell, allowedOrigins: opts.allowedOrigins ?? [], reclaimer });
  const screens = registerScreenRoutes(app, ctx, { allowedOrigins: opts.allowedOrigins ?? [] });

  app.set_not_found_handler((req, res) => {
    sendError(res, new WarrenError('NOT_FOUND', `no route for ${req.method} ${req.path}`), log, !req.received);
  });

  let listening: Listening;
  try {
    listening = await listenExclusive(app, opts.host, opts.port);
  } catch (err) {
    throw new WarrenError('UNAVAILABLE', `cannot listen on ${opts.host}:${opts.port}: ${typeof err === 'string' ? err : (err as Error).message}`);
  }
  const e2b = opts.e2bPort === undefined ? null : await startE2bSurface(ctx, { db: opts.db, host: opts.host, port: opts.e2bPort }).catch((err) => {
    listening.close();
    throw new WarrenError('UNAVAILABLE', `cannot listen on ${opts.host}:${opts.e2bPort} (E2B surface): ${(err as Error).message}`);
  });
  const port = listening.port;
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host === '0.0.0.0' ? '127.0.0.1' : opts.host;
  const url = `http://${hostForUrl}:${port}`;

  let closed = false;
  return {
    port,
    url,
    ...(e2b ? { e2bUrl: e2b.url } : {}),
    async close() {
      if (closed) return;
      closed = true;
      clearInterval(gcTimer);
      shells.closeAll();
      screens.closeAll();
      reclaimer.close();
      listening.close();
      await e2b?.close();
    },
  };
}
