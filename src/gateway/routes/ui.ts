/**
 * The web dashboard: its static files under /ui, and a few read-only views
 * under /v1/ui that the dashboard needs and the rest of the API does not keep
 * over time. They add no power: every one is authenticated, applies the same
 * ownership rule as /v1/sandboxes (non-admins see only their own sandboxes),
 * and changes nothing. docs/ui.md describes the dashboard; docs/api.md the routes.
 *
 *   GET  /ui, /ui/*                    the dashboard (built into dist/ui by `npm run build:ui`)
 *   GET  /v1/ui/metrics?since=ms       recent samples: live sandboxes, create latency,
 *                                      memory released by pauses, FnCall pool counts and latency
 *   GET  /v1/ui/usage                  cpu and memory use of the caller's visible sandboxes
 *   GET  /v1/ui/sandboxes/:id/usage    the recent use of one sandbox
 *   GET  /v1/ui/denials                recent egress denials of the visible sandboxes, newest first
 *   GET  /v1/ui/policy                 (admin) the policy's audit log, newest first
 *   POST /v1/ui/policy/validate        (admin) check the policy directory in force without applying it
 */
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { open as openFile } from 'node:fs/promises';
import { extname, join } from 'node:path';
import type { Request, Response, Server } from 'hyper-express';
import { WarrenError } from '../../errors';
import { PolicyError, diffPolicy, loadPolicy } from '../../security/policy';
import { policyStore } from '../../security/confinement';
import type { SandboxInfo, SandboxStats } from '../../shim/types';
import { recentSeries } from '../../telemetry/recent';
import { type Account, can, requirePermission } from '../auth';
import { type GatewayContext, authed, open, sandboxFor } from '../context';
import { queryOf, queryOne, rejectUnknownQuery, sendJson } from '../http';
import { fncallOf } from './functions';

/** Where `npm run build:ui` puts the dashboard (dist/ui, next to dist/src). */
export const UI_DIR = join(__dirname, '../../../ui');

const SAMPLE_INTERVAL_MS = 2000;
/** Sampling stops this long after the last dashboard request (no timers on nodes nobody watches). */
const SAMPLE_LINGER_MS = 10 * 60 * 1000;
/** 15 minutes of node samples at the interval above. */
const NODE_SAMPLES = 450;
/** 3 minutes per sandbox. */
const SANDBOX_SAMPLES = 90;
const DENIALS_SHOWN = 200;
const AUDIT_TAIL_BYTES = 256 * 1024;

const CONTENT_TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.map': 'application/json; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.txt': 'text/plain; charset=utf-8',
};

/**
 * The policy for every /ui answer. Scripts only from the gateway's own files;
 * no inline script at all. Style elements need the per-page nonce: xterm.js
 * creates <style> elements at run time, and the dashboard stamps them with the
 * nonce of its page, so no 'unsafe-inline' is needed for them either.
 * connect-src 'self' covers the API and the shell WebSocket on the same origin.
 */
export function contentSecurityPolicy(nonce: string): string {
  return [
    "default-src 'none'",
    "script-src 'self'",
    `style-src 'self' 'nonce-${nonce}'`,
    "img-src 'self' data: blob:",
    "font-src 'self'",
    "connect-src 'self'",
    "base-uri 'none'",
    "form-action 'none'",
    "frame-ancestors 'none'",
  ].join('; ');
}

// ---------------------------------------------------------------- samples

interface PoolPoint {
  t: number;
  warm: number;
  busy: number;
  starting: number;
  queued: number;
  p50Ms: number | null;
  p99Ms: number | null;
}

interface UsagePoint {
  t: number;
  memoryBytes: number;
  memoryPeakBytes: number;
  /** Percent of one core over the last interval (null for the first sample). */
  cpuPercent: number | null;
  pids: number;
}

interface NodeTick {
  t: number;
  /** Live sandboxes per owner. */
  live: Record<string, number>;
}

class Sampler {
  readonly ticks: NodeTick[] = [];
  readonly pools = new Map<string, PoolPoint[]>();
  readonly usage = new Map<string, { cpuUs: number; t: number; points: UsagePoint[] }>();
  private timer: NodeJS.Timeout | null = null;
  private lastRequest = 0;
  private running: Promise<void> | null = null;

  constructor(private readonly ctx: GatewayContext) {}

  /** Note a dashboard request; starts sampling if it had stopped. Resolves once at least one sample exists. */
  async wanted(): Promise<void> {
    this.lastRequest = Date.now();
    if (this.timer === null) {
      this.timer = setInterval(() => void this.tick(), SAMPLE_INTERVAL_MS);
      this.timer.unref();
    }
    if (this.ticks.length === 0) await this.tick();
  }

  private tick(): Promise<void> {
    if (Date.now() - this.lastRequest > SAMPLE_LINGER_MS && this.timer !== null) {
      clearInterval(this.timer);
      this.timer = null;
      return Promise.resolve();
    }
    this.running ??= this.sample().finally(() => (this.running = null));
    return this.running;
  }

  private async sample(): Promise<void> {
    const t = Date.now();
    let list: SandboxInfo[] = [];
    try {
      list = await this.ctx.shim.listSandboxes();
    } catch {
      /* a closing node has nothing to show */
    }
    const live: Record<string, number> = {};
    for (const s of list) if (isLive(s)) live[s.owner] = (live[s.owner] ?? 0) + 1;
    push(this.ticks, { t, live }, NODE_SAMPLES);

    try {
      for (const p of await fncallOf(this.ctx).listPools()) {
        let points = this.pools.get(p.name);
        if (points === undefined) this.pools.set(p.name, (points = []));
        push(points, { t, warm: p.warm, busy: p.busy, starting: p.starting, queued: p.queued, p50Ms: p.p50Ms, p99Ms: p.p99Ms }, NODE_SAMPLES);
      }
    } catch {
      /* a node without FnCall pools */
    }

    const stats = this.ctx.shim.sandboxStats?.bind(this.ctx.shim);
    const seen = new Set<string>();
    for (const s of list) {
      if (stats === undefined || (s.state !== 'running' && s.state !== 'paused')) continue;
      let st: SandboxStats | null = null;
      try {
        st = await stats(s.id);
      } catch {
        /* deleted meanwhile */
      }
      if (st === null) continue;
      seen.add(s.id);
      const prev = this.usage.get(s.id);
      const cpuPercent = prev === undefined || t <= prev.t ? null : Math.max(0, ((st.cpuUsageUs - prev.cpuUs) / 1000 / (t - prev.t)) * 100);
      const points = prev?.points ?? [];
      push(points, { t, memoryBytes: st.memoryCurrentBytes, memoryPeakBytes: st.memoryPeakBytes, cpuPercent: cpuPercent === null ? null : Math.round(cpuPercent * 10) / 10, pids: st.pidsCurrent }, SANDBOX_SAMPLES);
      this.usage.set(s.id, { cpuUs: st.cpuUsageUs, t, points });
    }
    for (const id of [...this.usage.keys()]) if (!seen.has(id)) this.usage.delete(id);
  }
}

function isLive(s: SandboxInfo): boolean {
  return s.state !== 'stopped' && s.state !== 'failed';
}

function push<T>(arr: T[], v: T, cap: number): void {
  arr.push(v);
  if (arr.length > cap) arr.splice(0, arr.length - cap);
}

const samplers = new WeakMap<GatewayContext, Sampler>();

function samplerOf(ctx: GatewayContext): Sampler {
  let s = samplers.get(ctx);
  if (s === undefined) samplers.set(ctx, (s = new Sampler(ctx)));
  return s;
}

/** The sandboxes `account` may see (the rule of GET /v1/sandboxes). */
async function visible(ctx: GatewayContext, account: Account): Promise<SandboxInfo[]> {
  const all = can(account, 'allSandboxes');
  return (await ctx.shim.listSandboxes(all ? {} : { owner: account.id })).filter((s) => all || s.owner === account.id);
}

function sinceParam(req: Request): number {
  const q = queryOf(req);
  rejectUnknownQuery(q, ['since']);
  const raw = queryOne(q, 'since');
  if (raw === undefined) return 0;
  if (!/^\d{1,16}$/.test(raw)) throw new WarrenError('INVALID_ARGUMENT', 'since: milliseconds since the epoch', { field: 'since' });
  return Number(raw);
}

// ---------------------------------------------------------------- static files

interface Asset {
  body: Buffer;
  type: string;
}

/** The built files (flat directory; names only from this listing, so no path ever reaches the filesystem). */
function loadAssets(): Map<string, Asset> | null {
  if (!existsSync(join(UI_DIR, 'index.html'))) return null;
  const out = new Map<string, Asset>();
  for (const name of readdirSync(UI_DIR)) {
    const type = CONTENT_TYPES[extname(name)];
    const p = join(UI_DIR, name);
    if (type === undefined || !statSync(p).isFile()) continue;
    out.set(name, { body: readFileSync(p), type });
  }
  return out;
}

function securityHeaders(res: Response, nonce: string): void {
  res.header('content-security-policy', contentSecurityPolicy(nonce));
  res.header('x-content-type-options', 'nosniff');
  res.header('referrer-policy', 'no-referrer');
  res.header('x-frame-options', 'DENY');
  res.header('cross-origin-opener-policy', 'same-origin');
  res.header('cache-control', 'no-cache');
}

export function registerUiRoutes(app: Server, ctx: GatewayContext): void {
  let assets: Map<string, Asset> | null | undefined;
  const asset = (name: string): Asset | undefined => {
    assets ??= loadAssets();
    return assets?.get(name);
  };
  const notBuilt = () => new WarrenError('NOT_FOUND', `the dashboard is not built in ${UI_DIR} (run npm run build:ui)`);

  const page = (_req: Request, res: Response) => {
    const index = asset('index.html');
    if (index === undefined) throw notBuilt();
    const nonce = randomBytes(16).toString('base64');
    securityHeaders(res, nonce);
    res.status(200);
    res.header('content-type', index.type);
    res.send(index.body.toString('utf8').replaceAll('__CSP_NONCE__', nonce));
  };

  app.get(
    '/ui',
    open(ctx, (_req, res) => {
      res.status(302);
      res.header('location', '/ui/');
      res.send();
    }),
  );
  app.get('/ui/', open(ctx, page));
  app.get(
    '/ui/:file',
    open(ctx, (req, res) => {
      const name = String(req.path_parameters.file);
      if (name === 'index.html') return page(req, res);
      const a = asset(name);
      if (a === undefined) {
        if (asset('index.html') === undefined) throw notBuilt();
        throw new WarrenError('NOT_FOUND', `no dashboard file ${JSON.stringify(name)}`);
      }
      securityHeaders(res, randomBytes(16).toString('base64'));
      res.status(200);
      res.header('content-type', a.type);
      res.send(a.body);
    }),
  );

  app.get(
    '/v1/ui/metrics',
    authed(ctx, async (req, res, account) => {
      const since = sinceParam(req);
      const sampler = samplerOf(ctx);
      await sampler.wanted();
      const node = can(account, 'allSandboxes');
      const live = sampler.ticks
        .filter((k) => k.t > since)
        .map((k) => ({ t: k.t, v: node ? Object.values(k.live).reduce((a, b) => a + b, 0) : (k.live[account.id] ?? 0) }));
      const pools: Record<string, PoolPoint[]> = {};
      for (const [name, points] of sampler.pools) pools[name] = points.filter((p) => p.t > since);
      const body: Record<string, unknown> = {
        now: Date.now(),
        intervalMs: SAMPLE_INTERVAL_MS,
        // Node-wide figures (every account's creates and pauses) are for admins; others see their own live count.
        scope: node ? 'node' : 'account',
        live,
        pools,
      };
      if (node) {
        body.createMs = recentSeries('warren.sandbox.create.duration')
          .since(since)
          .map((s) => ({ t: s.t, v: Math.round(s.v * 10) / 10, backend: s.attrs.backend ?? '' }));
        body.pauseReleasedBytes = recentSeries('warren.sandbox.pause.released')
          .since(since)
          .map((s) => ({ t: s.t, v: s.v, reclaim: s.attrs.reclaim ?? '' }));
      }
      sendJson(res, 200, body);
    }),
  );

  app.get(
    '/v1/ui/usage',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const sampler = samplerOf(ctx);
      await sampler.wanted();
      const out: Record<string, UsagePoint> = {};
      for (const s of await visible(ctx, account)) {
        const last = sampler.usage.get(s.id)?.points.at(-1);
        if (last !== undefined) out[s.id] = last;
      }
      sendJson(res, 200, { intervalMs: SAMPLE_INTERVAL_MS, sandboxes: out });
    }),
  );

  app.get(
    '/v1/ui/sandboxes/:id/usage',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const sampler = samplerOf(ctx);
      await sampler.wanted();
      sendJson(res, 200, { id: info.id, limits: info.limits, intervalMs: SAMPLE_INTERVAL_MS, samples: sampler.usage.get(info.id)?.points ?? [] });
    }),
  );

  app.get(
    '/v1/ui/denials',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const out: { sandbox: string; owner: string; at: string; service: string; destination: string; proto: string; hook: string }[] = [];
      let networked = 0;
      for (const s of await visible(ctx, account)) {
        if (s.network === undefined) continue;
        try {
          for (const d of (await ctx.shim.networkInfo(s.id)).denials) out.push({ sandbox: s.id, owner: s.owner, ...d });
          networked++;
        } catch {
          /* stopped or deleted meanwhile */
        }
      }
      out.sort((a, b) => (a.at < b.at ? 1 : a.at > b.at ? -1 : 0));
      sendJson(res, 200, { networkedSandboxes: networked, denials: out.slice(0, DENIALS_SHOWN) });
    }),
  );

  app.get(
    '/v1/ui/policy',
    authed(ctx, async (req, res, account) => {
      requirePermission(account, 'policy');
      rejectUnknownQuery(queryOf(req), []);
      const store = policyStore();
      sendJson(res, 200, { dir: store.dir, auditLog: store.auditLog, audit: store.auditLog === null ? [] : await auditTail(store.auditLog) });
    }),
  );

  app.post(
    '/v1/ui/policy/validate',
    authed(ctx, (req, res, account) => {
      requirePermission(account, 'policy');
      rejectUnknownQuery(queryOf(req), []);
      const store = policyStore();
      try {
        const next = loadPolicy(store.dir);
        sendJson(res, 200, { valid: true, dir: store.dir, changes: diffPolicy(store.current, next), digests: next.digests });
      } catch (err) {
        if (!(err instanceof PolicyError)) throw err;
        // An invalid directory is the answer here, not an error of the request.
        sendJson(res, 200, { valid: false, dir: store.dir, issues: err.issues });
      }
    }),
  );
}

/** The last entries of the policy audit log (JSON lines), newest first. */
async function auditTail(path: string): Promise<unknown[]> {
  let fh;
  try {
    fh = await openFile(path, 'r');
  } catch {
    return [];
  }
  try {
    const size = (await fh.stat()).size;
    const start = Math.max(0, size - AUDIT_TAIL_BYTES);
    const buf = Buffer.alloc(size - start);
    await fh.read(buf, 0, buf.length, start);
    const lines = buf.toString('utf8').split('\n');
    if (start > 0) lines.shift(); // a partial first line
    const out: unknown[] = [];
    for (const l of lines) {
      if (l.trim() === '') continue;
      try {
        out.push(JSON.parse(l));
      } catch {
        /* a line being written */
      }
    }
    return out.reverse().slice(0, 100);
  } finally {
    await fh.close();
  }
}
