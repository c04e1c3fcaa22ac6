/**
 * The control plane of the E2B surface (E2B's REST API under a prefix, `/e2b`
 * by default): create, connect, get, list, kill, timeout, pause, metrics,
 * snapshots, fork, network. `X-API-KEY` is a Warren token; everything goes
 * through the same rules as the native API (validation of the native create
 * request, environment permissions, quotas, ownership: another account's
 * sandbox is 404).
 *
 * Mapping: templates are Warren images and environments (`base` starts the
 * default image; `code-interpreter-v1` the judge image with its python toolkit,
 * which carries ipykernel, numpy, pandas and matplotlib, or the default image
 * where this node has no FnCall); `metadata` are labels;
 * `envVars` the sandbox env; `timeout` is the lifecycle ttl when the timeout
 * kills, or this surface's timer when it pauses (`autoPause`); the network
 * options map onto services of policies/services.yaml.
 */
import { randomBytes } from 'node:crypto';
import type { Req as Request, Res as Response, Router as Server } from './http';
import { WarrenError } from '../../errors';
import { policyStore } from '../../security/confinement';
import { JUDGE_IMAGE } from '../../shim/fncall/manager';
import { toolkitLayerName } from '../../shim/fncall/toolkits';
import type { SandboxInfo, SandboxSpec } from '../../shim/types';
import { type Account, bearerFromHeader, can, principalOf, requirePermission } from '../auth';
import { sandboxFor } from '../context';
import { publicError } from '../http';
import { factsForCreate, withQuota } from '../routes/sandboxes';
import { IMAGE_REF_RE, LIMITS, validateCreateRequest } from '../../validation';
import { type Plane, ensureUser } from './envd';
import type { E2bRecord } from './state';
import { E2bError, bodyPending, readBodyAnyEncoding, restErrorBody, toE2bError } from './wire';

/** What the surface reports as envd's version: the SDK's feature gates up to octet-stream uploads (0.5.7) apply. */
export const ENVD_VERSION = '0.5.7';
export const DEFAULT_TIMEOUT_S = 300;
/** Templates of E2B's SDKs that mean "the default environment". */
export const DEFAULT_TEMPLATES = ['base', 'code-interpreter-v1', 'default'];
/** The template @e2b/code-interpreter creates by default: a Jupyter kernel with the scientific stack. */
export const INTERPRETER_TEMPLATE = 'code-interpreter-v1';
/** Returned as the sandbox domain: not an E2B one, and never resolvable, so a client without E2B_SANDBOX_URL fails locally. */
export const SANDBOX_DOMAIN = 'e2b.warren.invalid';
const PAUSED_TTL_S = LIMITS.lifetimeSeconds.max;
const ALL_TRAFFIC = '0.0.0.0/0';

export interface ControlOptions {
  prefix: string;
}

type Handler = (req: Request, res: Response, account: Account) => Promise<void>;

function sendRest(res: Response, status: number, body?: unknown): void {
  if (res.completed) return;
  res.status(status);
  if (body === undefined) {
    res.send();
    return;
  }
  res.header('content-type', 'application/json');
  res.send(JSON.stringify(body));
}

async function readJsonBody(req: Request): Promise<Record<string, unknown>> {
  const buf = await readBodyAnyEncoding(req, 1024 * 1024);
  if (buf.length === 0) return {};
  let v: unknown;
  try {
    v = JSON.parse(buf.toString('utf8'));
  } catch (err) {
    throw new E2bError(400, `request body is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new E2bError(400, 'request body must be a JSON object');
  return v as Record<string, unknown>;
}

function timeoutSeconds(v: unknown, field: string, fallback: number): number {
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > LIMITS.lifetimeSeconds.max) {
    throw new E2bError(400, `${field} must be an integer number of seconds in 1..${LIMITS.lifetimeSeconds.max}`);
  }
  return v;
}

/** A Warren error as E2B reads it; bad native-request fields keep their messages. */
function asE2b(err: unknown, plane: Plane): E2bError {
  return toE2bError(err, (e) => publicError(e, plane.log));
}

// ---------------------------------------------------------------- network

/**
 * E2B's `allow_internet_access` and `network` forms onto Warren's per-service
 * egress: allowed entries are service names of services.yaml or host names
 * one of them lists; `denyOut` may only say "everything else" (0.0.0.0/0,
 * which Warren denies anyway) or name services. What has no Warren meaning
 * (all internet, CIDRs, proxies, header rules, inbound traffic) is a 400.
 */
export function mapNetwork(allowInternet: unknown, network: unknown, services: Record<string, { hosts: string[] }>): Record<string, boolean> | undefined {
  if (allowInternet !== undefined && allowInternet !== null && typeof allowInternet !== 'boolean') throw new E2bError(400, 'allow_internet_access must be true or false');
  if (network === undefined || network === null) return allowInternet === false ? {} : undefined;
  if (typeof network !== 'object' || Array.isArray(network)) throw new E2bError(400, 'network must be an object');
  const n = network as Record<string, unknown>;
  for (const key of ['egressProxy', 'rules', 'maskRequestHost']) {
    if (n[key] !== undefined && n[key] !== null) throw new E2bError(400, `network.${key} is not available on Warren: egress is allowed per service (policies/services.yaml)`);
  }
  if (n.allowPublicTraffic === true) throw new E2bError(400, 'network.allowPublicTraffic is not available on Warren: sandboxes take no inbound traffic');
  const out: Record<string, boolean> = {};
  const serviceFor = (entry: string, field: string): string => {
    if (Object.prototype.hasOwnProperty.call(services, entry)) return entry;
    const host = entry.toLowerCase().replace(/\.$/, '');
    for (const [name, s] of Object.entries(services)) {
      for (const h of s.hosts) {
        if (h === host || (h.startsWith('*.') && host.endsWith(h.slice(1)))) return name;
      }
    }
    const known = Object.keys(services).join(', ') || 'none';
    if (entry === ALL_TRAFFIC || /^[\d.]+\/\d+$/.test(entry) || /^[\d.]+$/.test(entry)) {
      throw new E2bError(400, `${field}: ${JSON.stringify(entry)}: Warren does not open addresses or CIDR ranges; allow services by name (${known})`);
    }
    throw new E2bError(400, `${field}: ${JSON.stringify(entry)} is neither a service of this node nor a host one of them lists (services: ${known})`);
  };
  const list = (v: unknown, field: string): string[] => {
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v) || v.length > 64 || v.some((x) => typeof x !== 'string')) throw new E2bError(400, `${field} must be an array of strings (at most 64)`);
    return v as string[];
  };
  for (const entry of list(n.allowOut, 'network.allowOut')) out[serviceFor(entry, 'network.allowOut')] = true;
  for (const entry of list(n.denyOut, 'network.denyOut')) {
    if (entry === ALL_TRAFFIC) continue;
    const s = serviceFor(entry, 'network.denyOut');
    if (out[s] === true) throw new E2bError(400, `network: service "${s}" is both allowed and denied`);
    out[s] = false;
  }
  if (Object.keys(out).length === 0 && allowInternet !== false && n.denyOut === undefined) return undefined;
  return out;
}

// ---------------------------------------------------------------- views

type E2bState = 'running' | 'paused';

function e2bState(info: SandboxInfo): E2bState | null {
  if (info.state === 'running' || info.state === 'creating') return 'running';
  if (info.state === 'paused' || info.state === 'hibernated') return 'paused';
  return null;
}

export class Control {
  /** Pause-on-timeout timers (kill-on-timeout is the lifecycle ttl). */
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private readonly cpuSamples = new Map<string, { at: number; us: number }>();

  constructor(
    private readonly plane: Plane,
    private readonly opts: ControlOptions,
  ) {}

  /** Re-arm pause timers after a restart; forget records of sandboxes that are gone. */
  async start(): Promise<void> {
    for (const rec of this.plane.state.all()) {
      let info: SandboxInfo;
      try {
        info = await this.plane.ctx.shim.getSandbox(rec.id);
      } catch {
        this.plane.state.remove(rec.id);
        continue;
      }
      if (rec.onTimeout === 'pause' && info.state === 'running') this.arm(rec);
    }
  }

  close(): void {
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
  }

  private arm(rec: E2bRecord): void {
    this.disarm(rec.id);
    if (rec.onTimeout !== 'pause') return;
    const delay = Math.max(0, rec.endAt - Date.now());
    const t = setTimeout(() => {
      this.timers.delete(rec.id);
      void this.plane.ctx.shim.pauseSandbox(rec.id).catch((err) => this.plane.log(`e2b: timeout pause of ${rec.id} failed: ${(err as Error).message}`));
    }, Math.min(delay, 2 ** 31 - 1));
    t.unref();
    this.timers.set(rec.id, t);
  }

  private disarm(id: string): void {
    const t = this.timers.get(id);
    if (t) clearTimeout(t);
    this.timers.delete(id);
  }

  /** The E2B record of a sandbox; sandboxes made through the native API get one on first sight. */
  private record(info: SandboxInfo): E2bRecord {
    const rec = this.plane.state.get(info.id);
    if (rec) return rec;
    const expires = info.lifecycle?.expiresAt ? Date.parse(info.lifecycle.expiresAt) : Date.now() + PAUSED_TTL_S * 1000;
    return { id: info.id, template: info.image, onTimeout: 'kill', autoResume: false, endAt: expires, startedAt: Date.parse(info.createdAt) };
  }

  /** The caller's sandbox in a state E2B knows (running or paused); 404 otherwise. */
  private async sandbox(account: Account, id: unknown): Promise<SandboxInfo> {
    let info: SandboxInfo;
    try {
      info = await sandboxFor(this.plane.ctx, account, id);
    } catch (err) {
      if (err instanceof WarrenError && err.code === 'INVALID_ID') throw new E2bError(404, `sandbox ${JSON.stringify(String(id)).slice(0, 80)} not found`);
      throw err;
    }
    if (e2bState(info) === null) throw new E2bError(404, `sandbox ${info.id} not found (it is ${info.state})`);
    return info;
  }

  private created(info: SandboxInfo, template: string): Record<string, unknown> {
    return {
      sandboxID: info.id,
      templateID: template,
      clientID: info.node,
      envdVersion: ENVD_VERSION,
      envdAccessToken: this.plane.state.envdToken(info.id),
      trafficAccessToken: this.plane.state.trafficToken(info.id),
      domain: SANDBOX_DOMAIN,
    };
  }

  private listed(info: SandboxInfo): Record<string, unknown> {
    const rec = this.record(info);
    return {
      templateID: rec.template,
      sandboxID: info.id,
      clientID: info.node,
      startedAt: new Date(rec.startedAt).toISOString(),
      endAt: new Date(rec.endAt).toISOString(),
      cpuCount: Math.max(1, Math.ceil(info.limits.cpu)),
      memoryMB: info.limits.memoryMb,
      diskSizeMB: info.limits.diskMb ?? 0,
      metadata: info.labels,
      state: e2bState(info),
      envdVersion: ENVD_VERSION,
    };
  }

  private detail(info: SandboxInfo): Record<string, unknown> {
    const rec = this.record(info);
    return {
      ...this.listed(info),
      envdAccessToken: this.plane.state.envdToken(info.id),
      domain: SANDBOX_DOMAIN,
      allowInternetAccess: info.network ? Object.values(info.network.services).some(Boolean) : false,
      lifecycle: { onTimeout: rec.onTimeout, autoResume: rec.autoResume },
    };
  }

  private async template(account: Account, raw: unknown): Promise<{ image: string; template: string }> {
    const template = raw === undefined || raw === null ? 'base' : raw;
    if (typeof template !== 'string' || template === '') throw new E2bError(400, 'templateID must be a non-empty string');
    if (DEFAULT_TEMPLATES.includes(template)) return { image: 'default', template };
    // What the account may not use looks missing, as on the native API.
    const principal = principalOf(account);
    const known =
      IMAGE_REF_RE.test(template) &&
      !template.includes('..') &&
      ((await this.plane.ctx.shim.listImages(principal)).some((i) => i.name === template || i.digest === template) || (await this.plane.ctx.shim.environment(template, principal)) !== null);
    if (!known) throw new E2bError(404, `template ${JSON.stringify(template.slice(0, 128))} not found (templates are this node's images and environments; "base" is the default image)`);
    return { image: template, template };
  }

  /**
   * The layers of the interpreter template over the judge image: FnCall's python toolkit (built
   * once per node, then from the node cache). Null (the default image, whose kernel is the
   * standard-library fallback) where this node has no FnCall or the toolkit cannot be built.
   */
  private async interpreterToolkits(): Promise<string[] | null> {
    const fn = this.plane.ctx.shim.functions;
    if (fn === undefined) return null;
    try {
      await fn.ensureToolkit('python');
      return [toolkitLayerName('python')];
    } catch (err) {
      this.plane.log(`e2b: ${INTERPRETER_TEMPLATE}: the python toolkit is not available (${(err as Error).message}); the default image and its standard-library kernel are used`);
      return null;
    }
  }

  /** The native spec of an E2B create body, validated like POST /v1/sandboxes. */
  private async spec(account: Account, b: Record<string, unknown>, image: string, toolkits: string[] = []): Promise<{ spec: SandboxSpec; rec: Omit<E2bRecord, 'id'> }> {
    for (const key of ['mcp', 'volumeMounts']) {
      const v = b[key];
      if (v !== undefined && v !== null && !(Array.isArray(v) && v.length === 0)) throw new E2bError(400, `${key} is not available on Warren`);
    }
    const iam = b.iam as { tokens?: Record<string, unknown> } | undefined;
    if (iam && iam.tokens && Object.keys(iam.tokens).length > 0) throw new E2bError(400, 'iam tokens are not available on Warren');
    const timeout = timeoutSeconds(b.timeout, 'timeout', DEFAULT_TIMEOUT_S);
    if (b.autoPause !== undefined && b.autoPause !== null && typeof b.autoPause !== 'boolean') throw new E2bError(400, 'autoPause must be true or false');
    const onTimeout = b.autoPause === true ? 'pause' : 'kill';
    const autoResume = typeof b.autoResume === 'object' && b.autoResume !== null && (b.autoResume as { enabled?: unknown }).enabled === true;
    if (autoResume && onTimeout !== 'pause') throw new E2bError(400, 'autoResume needs autoPause');
    const native: Record<string, unknown> = { image };
    if (toolkits.length > 0) native.toolkits = toolkits;
    if (b.metadata !== undefined && b.metadata !== null) native.labels = b.metadata;
    if (b.envVars !== undefined && b.envVars !== null) native.env = b.envVars;
    if (onTimeout === 'kill') native.ttlSeconds = timeout;
    const services = mapNetwork(b.allow_internet_access, b.network, policyStore().current.services);
    if (services !== undefined) native.network = services;
    const { availableBackends } = await factsForCreate(this.plane.ctx);
    let spec: SandboxSpec;
    try {
      spec = validateCreateRequest(native, { owner: account.id, host: this.plane.ctx.host, availableBackends });
    } catch (err) {
      if (err instanceof WarrenError) {
        const field = String((err.details as { field?: string } | undefined)?.field ?? '');
        const msg = err.message.replace(/^labels/, 'metadata').replace(/^env\b/, 'envVars');
        throw new E2bError(400, field.startsWith('labels') ? msg.replace(/labels/g, 'metadata') : msg);
      }
      throw err;
    }
    const now = Date.now();
    return { spec, rec: { template: '', onTimeout, autoResume, endAt: now + timeout * 1000, startedAt: now } };
  }

  private async createFrom(account: Account, spec: SandboxSpec, rec: Omit<E2bRecord, 'id'>): Promise<SandboxInfo> {
    const principal = principalOf(account);
    await this.plane.ctx.shim.authorizeContent(principal, spec);
    let info: SandboxInfo;
    try {
      info = await withQuota(this.plane.ctx, account, spec, () => this.plane.ctx.shim.createSandbox(spec, principal));
    } catch (err) {
      // A node without networking has loopback-only sandboxes: "no internet" is already true.
      if (err instanceof WarrenError && err.code === 'NOT_SUPPORTED' && spec.network !== undefined && Object.values(spec.network).every((v) => !v)) {
        const { network: _n, ...rest } = spec;
        info = await withQuota(this.plane.ctx, account, rest, () => this.plane.ctx.shim.createSandbox(rest, principal));
      } else throw err;
    }
    const full: E2bRecord = { ...rec, id: info.id };
    this.plane.state.put(full);
    this.arm(full);
    try {
      await ensureUser(this.plane, info.id);
    } catch (err) {
      this.plane.log(`e2b: sandbox ${info.id}: ${(err as Error).message}`);
    }
    return info;
  }

  register(app: Server): void {
    const p = this.opts.prefix;
    const route = (method: 'get' | 'post' | 'delete' | 'put', path: string, fn: Handler) => {
      app[method](`${p}${path}`, async (req: Request, res: Response) => {
        let read = false;
        try {
          const key = (req.headers['x-api-key'] as string | undefined) ?? bearerFromHeader(req.headers.authorization);
          if (key === undefined || key === '') throw new E2bError(401, 'missing API key (X-API-KEY: <warren token>)');
          const account = await this.plane.ctx.auth.authenticate(key);
          if (account === null) throw new E2bError(401, 'invalid API key');
          if (!can(account, 'sandboxes')) throw new E2bError(403, 'this account may not use sandboxes');
          await fn(req, res, account);
          read = true;
        } catch (err) {
          const e = asE2b(err, this.plane);
          if (res.completed) return;
          res.status(e.status);
          res.header('content-type', 'application/json');
          const close = !read && bodyPending(req);
          if (close) res.header('connection', 'close');
          res.send(restErrorBody(e), close);
        }
      });
    };

    route('post', '/v2/sandboxes', async (req, res, account) => {
      const b = await readJsonBody(req);
      const { image, template } = await this.template(account, b.templateID);
      const toolkits = template === INTERPRETER_TEMPLATE ? await this.interpreterToolkits() : null;
      const { spec, rec } = await this.spec(account, b, toolkits === null ? image : JUDGE_IMAGE, toolkits ?? []);
      const info = await this.createFrom(account, spec, { ...rec, template });
      sendRest(res, 201, this.created(info, template));
    });

    const list = async (req: Request, res: Response, account: Account, paged: boolean) => {
      const q = new URLSearchParams(req.path_query);
      const metadata = parseMetadataQuery(q.get('metadata'));
      const states = (q.getAll('state').join(',') || 'running,paused').split(',').filter((s) => s !== '');
      for (const s of states) if (s !== 'running' && s !== 'paused') throw new E2bError(400, `state: unknown state ${JSON.stringify(s)} (running, paused)`);
      const limitRaw = q.get('limit');
      const limit = limitRaw === null || limitRaw === '' ? 100 : Number(limitRaw);
      if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new E2bError(400, 'limit must be an integer in 1..1000');
      const cursor = q.get('nextToken');
      const all = (await this.plane.ctx.shim.listSandboxes(can(account, 'allSandboxes') ? {} : { owner: account.id }))
        .filter((s) => can(account, 'allSandboxes') || s.owner === account.id)
        .filter((s) => {
          const st = e2bState(s);
          return st !== null && states.includes(st);
        })
        .filter((s) => Object.entries(metadata).every(([k, v]) => s.labels[k] === v))
        .sort((a, b) => (a.createdAt === b.createdAt ? (a.id < b.id ? -1 : 1) : a.createdAt < b.createdAt ? -1 : 1));
      let start = 0;
      if (paged && cursor) {
        const after = decodeCursor(cursor);
        start = all.findIndex((s) => s.createdAt > after.createdAt || (s.createdAt === after.createdAt && s.id > after.id));
        if (start === -1) start = all.length;
      }
      const page = paged ? all.slice(start, start + limit) : all;
      if (paged && start + limit < all.length) {
        const last = page[page.length - 1]!;
        res.header('x-next-token', Buffer.from(JSON.stringify({ c: last.createdAt, i: last.id })).toString('base64url'));
      }
      sendRest(res, 200, page.map((s) => this.listed(s)));
    };
    route('get', '/v2/sandboxes', async (req, res, account) => list(req, res, account, true));
    route('get', '/sandboxes', async (req, res, account) => list(req, res, account, false));

    route('get', '/sandboxes/:id', async (req, res, account) => {
      sendRest(res, 200, this.detail(await this.sandbox(account, req.path_parameters.id)));
    });

    route('delete', '/sandboxes/:id', async (req, res, account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      this.disarm(info.id);
      await this.plane.ctx.shim.deleteSandbox(info.id);
      this.plane.state.remove(info.id);
      this.gone(info.id);
      sendRest(res, 204);
    });

    route('post', '/sandboxes/:id/timeout', async (req, res, account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      const b = await readJsonBody(req);
      const timeout = timeoutSeconds(b.timeout, 'timeout', NaN);
      if (Number.isNaN(timeout)) throw new E2bError(400, 'timeout is required');
      const rec = this.record(info);
      rec.endAt = Date.now() + timeout * 1000;
      if (rec.onTimeout === 'kill') await this.plane.ctx.shim.extendSandbox(info.id, { ttlSeconds: timeout });
      this.plane.state.put(rec);
      if (e2bState(info) === 'running') this.arm(rec);
      sendRest(res, 204);
    });

    const pause = async (req: Request, res: Response, account: Account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      await readJsonBody(req);
      if (e2bState(info) === 'paused') throw new E2bError(409, `sandbox ${info.id} is already paused`);
      const rec = this.record(info);
      this.disarm(info.id);
      // A paused E2B sandbox keeps its state until it is connected again or killed.
      if (rec.onTimeout === 'kill') await this.plane.ctx.shim.extendSandbox(info.id, { ttlSeconds: PAUSED_TTL_S });
      await this.plane.ctx.shim.pauseSandbox(info.id);
      sendRest(res, 204);
    };
    route('post', '/sandboxes/:id/pause', pause);

    const connect = async (req: Request, res: Response, account: Account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      const b = await readJsonBody(req);
      const rec = this.record(info);
      const timeout = timeoutSeconds(b.timeout, 'timeout', Math.max(1, Math.ceil((rec.endAt - Date.now()) / 1000)));
      const wasPaused = e2bState(info) === 'paused';
      if (wasPaused) await this.plane.ctx.shim.resumeSandbox(info.id);
      // Connecting never shortens the timeout.
      rec.endAt = Math.max(wasPaused ? 0 : rec.endAt, Date.now() + timeout * 1000);
      if (rec.onTimeout === 'kill') await this.plane.ctx.shim.extendSandbox(info.id, { ttlSeconds: Math.max(1, Math.ceil((rec.endAt - Date.now()) / 1000)) });
      this.plane.state.put(rec);
      this.arm(rec);
      sendRest(res, wasPaused ? 201 : 200, this.created(await this.plane.ctx.shim.getSandbox(info.id), rec.template));
    };
    route('post', '/v2/sandboxes/:id/connect', connect);
    route('post', '/sandboxes/:id/resume', connect);

    route('get', '/sandboxes/:id/metrics', async (req, res, account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      const stats = this.plane.ctx.shim.sandboxStats ? await this.plane.ctx.shim.sandboxStats(info.id).catch(() => null) : null;
      if (stats === null) {
        sendRest(res, 200, []);
        return;
      }
      const now = Date.now();
      const prev = this.cpuSamples.get(info.id) ?? { at: Date.parse(info.createdAt), us: 0 };
      this.cpuSamples.set(info.id, { at: now, us: stats.cpuUsageUs });
      const cores = Math.max(1, Math.ceil(info.limits.cpu));
      const pct = now > prev.at ? Math.min(100, ((stats.cpuUsageUs - prev.us) / 1000 / (now - prev.at) / cores) * 100) : 0;
      sendRest(res, 200, [
        {
          timestamp: new Date(now).toISOString(),
          timestampUnix: Math.floor(now / 1000),
          cpuUsedPct: Math.max(0, Math.round(pct * 100) / 100),
          cpuCount: cores,
          memUsed: stats.memoryCurrentBytes,
          memTotal: info.limits.memoryMb * 1024 * 1024,
          memCache: 0,
          diskUsed: 0,
          diskTotal: (info.limits.diskMb ?? 0) * 1024 * 1024,
        },
      ]);
    });

    route('post', '/sandboxes/:id/snapshots', async (req, res, account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      const b = await readJsonBody(req);
      requirePermission(account, 'packEnvironments');
      const name = b.name === undefined || b.name === null ? `snap-${info.id.slice(-8)}-${randomBytes(4).toString('hex')}` : b.name;
      if (typeof name !== 'string' || !IMAGE_REF_RE.test(name) || name.startsWith('sha256:')) {
        throw new E2bError(400, 'name must be a lower-case name ("name" or "name:tag", at most 128 characters each)');
      }
      const packed = await this.plane.ctx.shim.packSandbox(info.id, { name }, account.id);
      sendRest(res, 201, { snapshotID: packed.environment.name, names: [packed.environment.name] });
    });

    route('get', '/snapshots', async (req, res, account) => {
      const q = new URLSearchParams(req.path_query);
      const sandboxID = q.get('sandboxID');
      const name = q.get('name');
      const envs = (await this.plane.ctx.shim.listEnvironments(principalOf(account)))
        .filter((e) => can(account, 'allSandboxes') || e.owner === account.id)
        .filter((e) => !sandboxID || e.sourceSandbox === sandboxID)
        .filter((e) => !name || e.name === name || e.name.startsWith(`${name}:`))
        .sort((a, b) => (a.createdAt < b.createdAt ? -1 : 1));
      sendRest(res, 200, envs.map((e) => ({ snapshotID: e.name, names: [e.name] })));
    });

    route('delete', '/templates/:id', async (req, res, account) => {
      const id = req.path_parameters.id ?? '';
      const env = IMAGE_REF_RE.test(id) ? await this.plane.ctx.shim.environment(id, principalOf(account)) : null;
      if (env === null || (env.owner !== account.id && !can(account, 'allSandboxes'))) throw new E2bError(404, `snapshot ${JSON.stringify(id.slice(0, 128))} not found`);
      void res;
      throw new E2bError(501, `environments are kept by Warren's layer store and cannot be deleted through this API; unpublish it instead (POST /v1/environments/${env.name}/unpublish)`);
    });

    route('post', '/sandboxes/:id/fork', async (req, res, account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      const b = await readJsonBody(req);
      requirePermission(account, 'packEnvironments');
      const count = b.count === undefined || b.count === null ? 1 : b.count;
      if (typeof count !== 'number' || !Number.isInteger(count) || count < 1 || count > 16) throw new E2bError(400, 'count must be an integer in 1..16');
      const rec = this.record(info);
      const timeout = timeoutSeconds(b.timeout, 'timeout', DEFAULT_TIMEOUT_S);
      // A fork is the sandbox's files (pack_diff) started again: memory and processes are not carried.
      const packed = await this.plane.ctx.shim.packSandbox(info.id, { name: `fork-${info.id.slice(-8)}-${randomBytes(4).toString('hex')}` }, account.id);
      const results: unknown[] = [];
      for (let i = 0; i < count; i++) {
        try {
          const source = await this.plane.ctx.shim.getSandbox(info.id);
          const native: Record<string, unknown> = { image: packed.environment.name, labels: source.labels, cpu: source.limits.cpu, memoryMb: source.limits.memoryMb };
          if (rec.onTimeout === 'kill') native.ttlSeconds = timeout;
          if (source.network) native.network = source.network.services;
          const spec = validateCreateRequest(native, { owner: account.id, host: this.plane.ctx.host });
          const now = Date.now();
          const child = await this.createFrom(account, spec, { template: rec.template, onTimeout: rec.onTimeout, autoResume: rec.autoResume, endAt: now + timeout * 1000, startedAt: now });
          results.push({ sandbox: this.created(child, rec.template) });
        } catch (err) {
          const e = asE2b(err, this.plane);
          results.push({ error: { code: e.status, message: e.message } });
        }
      }
      sendRest(res, 200, results);
    });

    route('put', '/sandboxes/:id/network', async (req, res, account) => {
      const info = await this.sandbox(account, req.path_parameters.id);
      const b = await readJsonBody(req);
      const { allowInternetAccess, ...network } = b;
      const wanted = mapNetwork(allowInternetAccess, Object.keys(network).length > 0 ? network : undefined, policyStore().current.services) ?? {};
      // A replacement, as in E2B: services not named are switched off.
      const change: Record<string, boolean> = {};
      for (const s of Object.keys(info.network?.services ?? {})) change[s] = false;
      Object.assign(change, wanted);
      await this.plane.ctx.shim.updateNetwork(info.id, change);
      sendRest(res, 204);
    });

    // Everything else under the prefix: E2B's error shape, not Warren's.
    app.any(`${p}/*`, (req, res) => {
      if (res.completed) return;
      res.status(404).header('content-type', 'application/json');
      const close = bodyPending(req);
      if (close) res.header('connection', 'close');
      res.send(restErrorBody(new E2bError(404, `no E2B route for ${req.method} ${req.path.slice(0, 200)}`)), close);
    });

  }

  /** Forget what the surface keeps for a sandbox. */
  gone(id: string): void {
    this.disarm(id);
    this.cpuSamples.delete(id);
    this.plane.processes.delete(id);
    this.plane.usersEnsured.delete(id);
    for (const fn of this.plane.onSandboxGone) fn(id);
  }
}

/**
 * `?metadata=` as the SDK sends it: `k=v&k2=v2` with keys and values
 * URL-encoded once more (URLSearchParams already undid the outer layer).
 */
export function parseMetadataQuery(raw: string | null): Record<string, string> {
  if (raw === null || raw === '') return {};
  const out: Record<string, string> = {};
  for (const [k, v] of new URLSearchParams(raw)) {
    let key = k;
    let value = v;
    try {
      key = decodeURIComponent(k);
      value = decodeURIComponent(v);
    } catch {
      throw new E2bError(400, 'metadata: malformed percent-encoding');
    }
    Object.defineProperty(out, key, { value, enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function decodeCursor(token: string): { createdAt: string; id: string } {
  try {
    const v = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as { c?: unknown; i?: unknown };
    if (typeof v.c === 'string' && typeof v.i === 'string') return { createdAt: v.c, id: v.i };
  } catch {
    /* below */
  }
  throw new E2bError(400, 'nextToken is not a token this API returned');
}
