/**
 * Wire-format validation for the REST and WebSocket APIs, FnCall and the cluster (a neutral
 * module: the gateway and the node both use it, neither owns it). Pure functions: they
 * take parsed JSON (or query strings) and either return a validated value or
 * throw a WarrenError with a stable code:
 *
 * - UNKNOWN_FIELD       a field the schema does not know (named in details.field)
 * - INVALID_ARGUMENT    wrong type, malformed value, missing required field
 * - LIMIT_OUT_OF_RANGE  a number that is negative, zero where invalid, NaN,
 *                       Infinity, too large, non-integral where an integer is
 *                       needed, or beyond this host's capacity (details name the
 *                       field and the allowed range)
 * - INVALID_ID          sandbox ids, session ids, image refs, command ids
 * - PATH_ESCAPE         sandbox paths that are relative, contain `..` or NUL
 * - NOT_SUPPORTED       backends this node does not offer
 */
import { WarrenError } from './errors';
import { BACKEND_NAMES } from './shim/types';
import { IDLE_ACTIONS, type BackendName, type ExecRequest, type IdleAction, type LifetimePolicy, type OpenSessionOptions, type PackRequest, type Priority, type SandboxSpec, type SessionMode } from './shim/types';
import { parseRegistryRef } from './shim/layers/distribution';
import { validateWriter } from './shim/sessions/input-numbering';

// ---------------------------------------------------------------- limits

export const LIMITS = {
  cpu: { min: 0.01, max: 64, default: 1 },
  memoryMb: { min: 16, max: 65536, default: 512 },
  pids: { min: 8, max: 32768, default: 1024 },
  diskMb: { min: 16, max: 1_048_576 },
  timeoutMs: { min: 1, max: 3_600_000 },
  maxOutputBytes: { min: 1, max: 64 * 1024 * 1024, default: 4 * 1024 * 1024 },
  terminal: { min: 1, max: 1000 },
  offset: { min: 0, max: Number.MAX_SAFE_INTEGER },
  fileMode: { min: 0, max: 0o7777 },
  envEntries: 256,
  envNameBytes: 256,
  envValueBytes: 128 * 1024,
  envTotalBytes: 512 * 1024,
  labels: 64,
  labelValueBytes: 256,
  layers: 16,
  cmdBytes: 256 * 1024,
  argvEntries: 4096,
  stdinBytes: 1024 * 1024,
  pathBytes: 4096,
  pathComponentBytes: 255,
  lifetimeSeconds: { min: 1, max: 31_536_000 },
  scrubPatterns: 256,
} as const;

/** What the host can give; the gateway fills this from `os`. */
export interface HostCapacity {
  cpus: number;
  memoryMb: number;
}

// ---------------------------------------------------------------- ids

export const SANDBOX_ID_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;
/** A node id: the prefix of its sandboxes' ids. */
export const NODE_ID_RE = /^[a-z0-9][a-z0-9-]{0,15}$/;
export const SESSION_ID_RE = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;
/** "name", "name:tag" or "sha256:<hex>". */
export const IMAGE_REF_RE = /^[a-z0-9][a-z0-9._-]{0,127}(?::[A-Za-z0-9][A-Za-z0-9._-]{0,127})?$/;
export const COMMAND_ID_RE = /^[A-Za-z0-9_.:-]{1,128}$/;
export const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
export const LABEL_KEY_RE = /^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$/;
export const SERVICE_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
/** "root", "1000", "1000:1000" or a user name from the sandbox's /etc/passwd. */
export const USER_RE = /^(?:\d{1,10}(?::\d{1,10})?|[a-z_][a-z0-9_-]{0,31}\$?)$/;
export const ACCOUNT_NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$/;

function describe(value: unknown): string {
  if (typeof value === 'string') {
    const shown = value.length > 64 ? `${value.slice(0, 64)}...` : value;
    return JSON.stringify(shown).replace(/\\u0000/g, '\\0');
  }
  if (typeof value === 'number' || typeof value === 'boolean' || value === null || value === undefined) return String(value);
  if (Array.isArray(value)) return 'an array';
  if (typeof value === 'bigint') return `${value}n`;
  return `a ${typeof value}`;
}

function badId(kind: string, value: unknown, rule: string, field?: string): WarrenError {
  return new WarrenError('INVALID_ID', `invalid ${kind} ${describe(value)}: ${rule}`, field === undefined ? { kind } : { kind, field });
}

function checkId(kind: string, value: unknown, re: RegExp, rule: string, field?: string): string {
  if (typeof value !== 'string') throw badId(kind, value, 'must be a string', field);
  if (value.includes('\0')) throw badId(kind, value, 'contains NUL', field);
  if (value.includes('..')) throw badId(kind, value, 'contains ".."', field);
  if (value.includes('/')) throw badId(kind, value, 'contains "/"', field);
  if (!re.test(value)) throw badId(kind, value, rule, field);
  return value;
}

export function validateSandboxId(value: unknown): string {
  return checkId('sandbox id', value, SANDBOX_ID_RE, 'must match ^[a-z0-9][a-z0-9-]{0,62}$');
}

export function validateSessionId(value: unknown): string {
  return checkId('session id', value, SESSION_ID_RE, 'must match ^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$');
}

export function validateImageRef(value: unknown, field = 'image'): string {
  return checkId('image reference', value, IMAGE_REF_RE, 'must be "name", "name:tag" or "sha256:<hex>" (lower-case name, at most 128 characters each)', field);
}

export function validateCommandId(value: unknown): string {
  if (typeof value === 'number' && Number.isSafeInteger(value) && value >= 0) return String(value);
  return checkId('command id', value, COMMAND_ID_RE, 'must be 1..128 characters of [A-Za-z0-9_.:-] or a non-negative integer', 'id');
}

// ---------------------------------------------------------------- primitives

function invalid(field: string, message: string): WarrenError {
  return new WarrenError('INVALID_ARGUMENT', `${field}: ${message}`, { field });
}

function outOfRange(field: string, value: unknown, min: number, max: number, integer: boolean): WarrenError {
  const kind = integer ? 'an integer' : 'a number';
  return new WarrenError('LIMIT_OUT_OF_RANGE', `${field} must be ${kind} in ${min}..${max} (got ${describe(value)})`, { field, min, max });
}

/** Plain JSON object (not null, not an array). */
export function expectObject(value: unknown, field: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw invalid(field, `must be a JSON object (got ${describe(value)})`);
  }
  return value as Record<string, unknown>;
}

/** Throws UNKNOWN_FIELD for the first own key of `obj` not in `allowed`. */
export function rejectUnknown(obj: Record<string, unknown>, allowed: readonly string[], prefix = ''): void {
  for (const key of Object.keys(obj)) {
    if (!allowed.includes(key)) {
      const field = prefix === '' ? key : `${prefix}.${key}`;
      throw new WarrenError('UNKNOWN_FIELD', `unknown field "${field}" (allowed: ${allowed.join(', ')})`, { field });
    }
  }
}

export function expectString(value: unknown, field: string, opts: { maxBytes?: number; allowEmpty?: boolean; allowNul?: boolean } = {}): string {
  if (typeof value !== 'string') throw invalid(field, `must be a string (got ${describe(value)})`);
  if (!opts.allowEmpty && value.length === 0) throw invalid(field, 'must not be empty');
  if (!opts.allowNul && value.includes('\0')) throw invalid(field, 'must not contain NUL');
  if (opts.maxBytes !== undefined && Buffer.byteLength(value) > opts.maxBytes) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} must be at most ${opts.maxBytes} bytes`, { field, min: 0, max: opts.maxBytes });
  }
  return value;
}

/** A number in [min, max]; integers only when `integer`. Non-numbers are INVALID_ARGUMENT, bad numbers LIMIT_OUT_OF_RANGE. */
export function expectNumber(value: unknown, field: string, min: number, max: number, integer: boolean): number {
  if (typeof value !== 'number') throw invalid(field, `must be a number (got ${describe(value)})`);
  if (!Number.isFinite(value) || value < min || value > max || (integer && !Number.isInteger(value))) {
    throw outOfRange(field, value, min, max, integer);
  }
  return value;
}

/** An integer given as a decimal string (query parameters). */
export function parseIntParam(value: string | undefined, field: string, min: number, max: number): number | undefined {
  if (value === undefined || value === '') return undefined;
  if (!/^-?\d+(?:\.\d+)?(?:e\d+)?$/i.test(value)) throw invalid(field, `must be a decimal integer (got ${describe(value)})`);
  return expectNumber(Number(value), field, min, max, true);
}

// ---------------------------------------------------------------- paths

/**
 * A path inside a sandbox: absolute, at most 4096 bytes, no NUL, no `..`
 * component. Returns it normalised (`//` and `/./` collapsed, no trailing `/`).
 */
export function validateSandboxPath(value: unknown, field = 'path'): string {
  if (typeof value !== 'string' || value === '') {
    throw invalid(field, `must be a non-empty absolute path (got ${describe(value)})`);
  }
  const fail = (why: string) => new WarrenError('PATH_ESCAPE', `${field} ${describe(value)} ${why}`, { field });
  if (value.includes('\0')) throw fail('contains NUL');
  if (value[0] !== '/') throw fail('is not absolute');
  if (Buffer.byteLength(value) > LIMITS.pathBytes) throw fail(`is longer than ${LIMITS.pathBytes} bytes`);
  const parts: string[] = [];
  for (const part of value.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') throw fail('has a ".." component');
    if (Buffer.byteLength(part) > LIMITS.pathComponentBytes) throw fail(`has a component longer than ${LIMITS.pathComponentBytes} bytes`);
    parts.push(part);
  }
  return `/${parts.join('/')}`;
}

/** A host path (image import sources): absolute, no NUL, no `..`. */
export function validateHostPath(value: unknown, field: string): string {
  if (typeof value !== 'string' || value === '') throw invalid(field, 'must be a non-empty absolute path');
  const fail = (why: string) => new WarrenError('PATH_ESCAPE', `${field} ${describe(value)} ${why}`, { field });
  if (value.includes('\0')) throw fail('contains NUL');
  if (value[0] !== '/') throw fail('is not absolute');
  if (value.split('/').includes('..')) throw fail('has a ".." component');
  if (Buffer.byteLength(value) > LIMITS.pathBytes) throw fail(`is longer than ${LIMITS.pathBytes} bytes`);
  return value;
}

// ---------------------------------------------------------------- maps

export function validateEnv(value: unknown, field = 'env'): Record<string, string> {
  const obj = expectObject(value, field);
  const keys = Object.keys(obj);
  if (keys.length > LIMITS.envEntries) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} may have at most ${LIMITS.envEntries} entries`, { field, min: 0, max: LIMITS.envEntries });
  }
  let total = 0;
  const out: [string, string][] = [];
  for (const name of keys) {
    const f = `${field}.${name}`;
    if (!ENV_NAME_RE.test(name) || name.length > LIMITS.envNameBytes) {
      throw invalid(f, `environment variable names must match ^[A-Za-z_][A-Za-z0-9_]*$ (at most ${LIMITS.envNameBytes} characters)`);
    }
    const v = expectString(obj[name], f, { maxBytes: LIMITS.envValueBytes, allowEmpty: true });
    total += name.length + Buffer.byteLength(v) + 2;
    out.push([name, v]);
  }
  if (total > LIMITS.envTotalBytes) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} must be at most ${LIMITS.envTotalBytes} bytes in total`, { field, min: 0, max: LIMITS.envTotalBytes });
  }
  // fromEntries defines own properties, so "__proto__" stays a plain key.
  return Object.fromEntries(out);
}

export function validateLabels(value: unknown, field = 'labels'): Record<string, string> {
  const obj = expectObject(value, field);
  const keys = Object.keys(obj);
  if (keys.length > LIMITS.labels) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} may have at most ${LIMITS.labels} entries`, { field, min: 0, max: LIMITS.labels });
  }
  const out: [string, string][] = [];
  for (const key of keys) {
    const f = `${field}.${key}`;
    if (!LABEL_KEY_RE.test(key) || key.includes('..')) throw invalid(f, 'label keys must match ^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$');
    out.push([key, expectString(obj[key], f, { maxBytes: LIMITS.labelValueBytes, allowEmpty: true })]);
  }
  return Object.fromEntries(out);
}

/** `?label=k=v` query values (repeatable) -> a label filter. */
export function parseLabelFilter(values: readonly string[]): Record<string, string> | undefined {
  if (values.length === 0) return undefined;
  const obj: Record<string, string> = {};
  for (const raw of values) {
    const eq = raw.indexOf('=');
    if (eq <= 0) throw invalid('label', `must be key=value (got ${describe(raw)})`);
    Object.defineProperty(obj, raw.slice(0, eq), { value: raw.slice(eq + 1), enumerable: true, writable: true, configurable: true });
  }
  return validateLabels(obj, 'label');
}

export function validateUser(value: unknown, field = 'user'): string {
  const s = expectString(value, field, { maxBytes: 64 });
  if (!USER_RE.test(s)) throw invalid(field, 'must be "root", a user name, "uid" or "uid:gid"');
  return s;
}

function validateLayerList(value: unknown, field: string): string[] {
  if (!Array.isArray(value)) throw invalid(field, `must be an array of image references (got ${describe(value)})`);
  if (value.length > LIMITS.layers) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} may list at most ${LIMITS.layers} layers`, { field, min: 0, max: LIMITS.layers });
  }
  return value.map((v, i) => validateImageRef(v, `${field}[${i}]`));
}

// ---------------------------------------------------------------- create

export const CREATE_FIELDS = [
  'backend', 'image', 'workspaces', 'toolkits', 'cpu', 'memoryMb', 'pids', 'diskMb', 'ttlSeconds', 'idleSeconds',
  'onIdle', 'network', 'priority', 'user', 'env', 'labels',
] as const;

const BACKENDS: readonly BackendName[] = BACKEND_NAMES;

export interface CreateContext {
  owner: string;
  host: HostCapacity;
  /** Backends this node offers (from shim.features().backends). `container` is assumed when omitted. */
  availableBackends?: readonly BackendName[];
}

/** Validate a `POST /v1/sandboxes` body into a SandboxSpec. */
export function validateCreateRequest(body: unknown, ctx: CreateContext): SandboxSpec {
  const b = expectObject(body === undefined ? {} : body, 'body');
  rejectUnknown(b, CREATE_FIELDS);

  let backend: BackendName = 'container';
  if (b.backend !== undefined) {
    const v = expectString(b.backend, 'backend');
    if (v === 'fncall') {
      throw new WarrenError('NOT_SUPPORTED', 'fncall is not a sandbox backend: invoke a function pool through /v1/functions/:pool/invoke (or POST /run_code)', { field: 'backend', backend: v });
    }
    if (!BACKENDS.includes(v as BackendName)) throw invalid('backend', `must be one of ${BACKENDS.join(', ')} (got ${describe(v)})`);
    backend = v as BackendName;
  }
  const available = ctx.availableBackends ?? ['container'];
  if (!available.includes(backend)) {
    throw new WarrenError('NOT_SUPPORTED', `backend "${backend}" is not available on this node`, { field: 'backend', backend });
  }

  const image = b.image === undefined ? 'default' : validateImageRef(b.image, 'image');
  const workspaces = b.workspaces === undefined ? [] : validateLayerList(b.workspaces, 'workspaces');
  const toolkits = b.toolkits === undefined ? [] : validateLayerList(b.toolkits, 'toolkits');

  const cpuMax = Math.min(LIMITS.cpu.max, Math.max(LIMITS.cpu.min, ctx.host.cpus));
  const memMax = Math.min(LIMITS.memoryMb.max, Math.max(LIMITS.memoryMb.min, Math.floor(ctx.host.memoryMb)));
  const cpu = b.cpu === undefined ? Math.min(LIMITS.cpu.default, cpuMax) : expectNumber(b.cpu, 'cpu', LIMITS.cpu.min, cpuMax, false);
  const memoryMb = b.memoryMb === undefined ? Math.min(LIMITS.memoryMb.default, memMax) : expectNumber(b.memoryMb, 'memoryMb', LIMITS.memoryMb.min, memMax, true);
  const pids = b.pids === undefined ? LIMITS.pids.default : expectNumber(b.pids, 'pids', LIMITS.pids.min, LIMITS.pids.max, true);
  const diskMb = b.diskMb === undefined || b.diskMb === null ? null : expectNumber(b.diskMb, 'diskMb', LIMITS.diskMb.min, LIMITS.diskMb.max, true);

  // Lifetime policies (src/shim/lifecycle): a hard maximum, and what happens after idleSeconds without requests.
  const lifetime: LifetimePolicy = {};
  if (b.ttlSeconds !== undefined) lifetime.ttlSeconds = expectNumber(b.ttlSeconds, 'ttlSeconds', LIMITS.lifetimeSeconds.min, LIMITS.lifetimeSeconds.max, true);
  if (b.idleSeconds !== undefined) lifetime.idleSeconds = expectNumber(b.idleSeconds, 'idleSeconds', LIMITS.lifetimeSeconds.min, LIMITS.lifetimeSeconds.max, true);
  if (b.onIdle !== undefined) {
    const v = expectString(b.onIdle, 'onIdle');
    if (!(IDLE_ACTIONS as readonly string[]).includes(v)) throw invalid('onIdle', `must be one of ${IDLE_ACTIONS.map((a) => `"${a}"`).join(', ')}`);
    if (lifetime.idleSeconds === undefined) throw invalid('onIdle', 'only applies together with idleSeconds');
    lifetime.onIdle = v as IdleAction;
  }
  const network = b.network === undefined ? undefined : validateNetworkServices(b.network, 'network');

  let priority: Priority = 'normal';
  if (b.priority !== undefined) {
    const v = expectString(b.priority, 'priority');
    if (v !== 'normal' && v !== 'idle') throw invalid('priority', `must be "normal" or "idle" (got ${describe(v)})`);
    priority = v;
  }
  const user = b.user === undefined ? 'root' : validateUser(b.user);
  const env = b.env === undefined ? {} : validateEnv(b.env);
  const labels = b.labels === undefined ? {} : validateLabels(b.labels);

  const spec: SandboxSpec = { backend, image, workspaces, toolkits, cpu, memoryMb, pids, diskMb, priority, user, env, labels, owner: ctx.owner };
  if (Object.keys(lifetime).length > 0) spec.lifetime = lifetime;
  if (network !== undefined) spec.network = network;
  return spec;
}

const MAX_SERVICES = 64;

/**
 * `network` of a create request and the body of `PATCH /v1/sandboxes/:id/network`: a map of
 * service names (services.yaml) to true/false. Whether a name exists in the catalog and whether
 * the account may use it is the node's decision (INVALID_ARGUMENT / FORBIDDEN there).
 */
export function validateNetworkServices(v: unknown, field: string): Record<string, boolean> {
  const net = expectObject(v, field);
  const names = Object.keys(net);
  if (names.length > MAX_SERVICES) throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} may name at most ${MAX_SERVICES} services`, { field, min: 0, max: MAX_SERVICES });
  const out: Record<string, boolean> = {};
  for (const service of names) {
    const f = `${field}.${service}`;
    if (!SERVICE_RE.test(service)) throw invalid(f, 'service names must match ^[a-z0-9][a-z0-9._-]{0,62}$');
    if (typeof net[service] !== 'boolean') throw invalid(f, `must be true or false (got ${describe(net[service])})`);
    out[service] = net[service] as boolean;
  }
  return out;
}

// ---------------------------------------------------------------- lifecycle

/** `POST /v1/sandboxes/:id/extend` `{ seconds }` (added to the current expiry) or `{ ttlSeconds }` (a new maximum from now). */
export function validateExtendRequest(body: unknown): { seconds?: number; ttlSeconds?: number } {
  const b = expectObject(body === undefined ? {} : body, 'body');
  rejectUnknown(b, ['seconds', 'ttlSeconds']);
  const out: { seconds?: number; ttlSeconds?: number } = {};
  if (b.seconds !== undefined) out.seconds = expectNumber(b.seconds, 'seconds', LIMITS.lifetimeSeconds.min, LIMITS.lifetimeSeconds.max, true);
  if (b.ttlSeconds !== undefined) out.ttlSeconds = expectNumber(b.ttlSeconds, 'ttlSeconds', LIMITS.lifetimeSeconds.min, LIMITS.lifetimeSeconds.max, true);
  if ((out.seconds === undefined) === (out.ttlSeconds === undefined)) throw invalid('body', 'give exactly one of seconds (added to the current expiry) or ttlSeconds (a new maximum from now)');
  return out;
}

/** `POST /v1/sandboxes/:id/pack`. Scrub patterns are absolute paths with `*`, `?` and whole-component `**`. */
export function validatePackRequest(body: unknown): PackRequest {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['name', 'scrub', 'publish', 'squash', 'compression']);
  if (b.name === undefined) throw invalid('name', 'is required');
  const name = validateImageRef(b.name, 'name');
  if (name.startsWith('sha256:')) throw invalid('name', 'must not be a digest');
  const req: PackRequest = { name };
  if (b.scrub !== undefined) {
    if (!Array.isArray(b.scrub)) throw invalid('scrub', 'must be an array of absolute paths or glob patterns');
    if (b.scrub.length > LIMITS.scrubPatterns) {
      throw new WarrenError('LIMIT_OUT_OF_RANGE', `scrub may list at most ${LIMITS.scrubPatterns} patterns`, { field: 'scrub', min: 0, max: LIMITS.scrubPatterns });
    }
    req.scrub = b.scrub.map((p, i) => {
      const s = expectString(p, `scrub[${i}]`, { maxBytes: LIMITS.pathBytes });
      validateSandboxPath(s.replace(/[*?]/g, 'x'), `scrub[${i}]`);
      return s;
    });
  }
  if (b.publish !== undefined) {
    if (typeof b.publish !== 'boolean') throw invalid('publish', 'must be true or false');
    req.publish = b.publish;
  }
  if (b.squash !== undefined) {
    if (typeof b.squash !== 'boolean') throw invalid('squash', 'must be true or false');
    req.squash = b.squash;
  }
  if (b.compression !== undefined) {
    const c = expectString(b.compression, 'compression');
    if (c !== 'none' && c !== 'lz4' && c !== 'lz4hc') throw invalid('compression', 'must be "none", "lz4" or "lz4hc"');
    req.compression = c;
  }
  return req;
}

/** Account quotas (`PUT /v1/accounts/:id/quota`); null = unlimited. */
export interface QuotaRequest {
  maxSandboxes?: number | null;
  maxCpu?: number | null;
  maxMemoryMb?: number | null;
}

export function validateQuotaRequest(body: unknown): QuotaRequest {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['maxSandboxes', 'maxCpu', 'maxMemoryMb']);
  const out: QuotaRequest = {};
  if (b.maxSandboxes !== undefined) out.maxSandboxes = b.maxSandboxes === null ? null : expectNumber(b.maxSandboxes, 'maxSandboxes', 0, 1_000_000, true);
  if (b.maxCpu !== undefined) out.maxCpu = b.maxCpu === null ? null : expectNumber(b.maxCpu, 'maxCpu', 0, 1_000_000, false);
  if (b.maxMemoryMb !== undefined) out.maxMemoryMb = b.maxMemoryMb === null ? null : expectNumber(b.maxMemoryMb, 'maxMemoryMb', 0, 1_000_000_000, true);
  return out;
}

// ---------------------------------------------------------------- exec

export const EXEC_FIELDS = ['cmd', 'stdin', 'env', 'cwd', 'timeoutMs', 'user', 'maxOutputBytes', 'encoding', 'idempotencyKey'] as const;

/** How exec output is put into the answer: "utf8" (default) or "base64" (the exact bytes). */
export function validateOutputEncoding(value: unknown): 'utf8' | 'base64' {
  if (value === undefined || value === 'utf8') return 'utf8';
  if (value === 'base64') return 'base64';
  throw invalid('encoding', `must be "utf8" or "base64" (got ${describe(value)})`);
}

export function validateCmd(value: unknown, field = 'cmd'): string | string[] {
  if (typeof value === 'string') return expectString(value, field, { maxBytes: LIMITS.cmdBytes });
  if (Array.isArray(value)) {
    if (value.length === 0) throw invalid(field, 'must not be an empty array');
    if (value.length > LIMITS.argvEntries) {
      throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} may have at most ${LIMITS.argvEntries} arguments`, { field, min: 1, max: LIMITS.argvEntries });
    }
    let total = 0;
    const argv = value.map((a, i) => {
      const s = expectString(a, `${field}[${i}]`, { allowEmpty: i > 0 });
      total += Buffer.byteLength(s) + 1;
      return s;
    });
    if (total > LIMITS.cmdBytes) throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} must be at most ${LIMITS.cmdBytes} bytes`, { field, min: 1, max: LIMITS.cmdBytes });
    return argv;
  }
  throw invalid(field, `must be a string or an array of strings (got ${describe(value)})`);
}

export function validateExecRequest(body: unknown): ExecRequest {
  const b = expectObject(body, 'body');
  rejectUnknown(b, EXEC_FIELDS);
  if (b.cmd === undefined) throw invalid('cmd', 'is required');
  const req: ExecRequest = { cmd: validateCmd(b.cmd) };
  if (b.stdin !== undefined) req.stdin = expectString(b.stdin, 'stdin', { maxBytes: LIMITS.stdinBytes, allowEmpty: true, allowNul: true });
  if (b.env !== undefined) req.env = validateEnv(b.env);
  if (b.cwd !== undefined) req.cwd = validateSandboxPath(b.cwd, 'cwd');
  if (b.timeoutMs !== undefined) req.timeoutMs = expectNumber(b.timeoutMs, 'timeoutMs', LIMITS.timeoutMs.min, LIMITS.timeoutMs.max, true);
  if (b.user !== undefined) req.user = validateUser(b.user);
  req.maxOutputBytes =
    b.maxOutputBytes === undefined
      ? LIMITS.maxOutputBytes.default
      : expectNumber(b.maxOutputBytes, 'maxOutputBytes', LIMITS.maxOutputBytes.min, LIMITS.maxOutputBytes.max, true);
  return req;
}

// ---------------------------------------------------------------- files

/** `mode=` query value: octal permission bits ("644", "0755"). */
export function parseFileMode(value: string | undefined): number | undefined {
  if (value === undefined || value === '') return undefined;
  if (!/^[0-7]{1,5}$/.test(value)) throw invalid('mode', `must be octal permission bits such as 644 or 0755 (got ${describe(value)})`);
  const mode = parseInt(value, 8);
  if (mode > LIMITS.fileMode.max) throw outOfRange('mode', value, 0, LIMITS.fileMode.max, true);
  return mode;
}

// ---------------------------------------------------------------- images

export interface ImageRequest {
  name: string;
  kind?: 'base' | 'workspace' | 'toolkit';
  source: { type: 'directory' | 'oci-archive'; path: string } | { type: 'debootstrap'; suite?: string; include?: string[] } | { type: 'registry'; ref: string; mode?: 'lazy' | 'eager' };
}

function validateRegistryRef(v: unknown, field: string, opts: { repositoryOnly?: boolean } = {}): string {
  const ref = expectString(v, field, { maxBytes: 512 });
  try {
    const r = parseRegistryRef(ref);
    if (opts.repositoryOnly && (r.tag !== null || r.digest !== null)) throw invalid(field, 'must be host[:port]/repository, without a tag');
  } catch (err) {
    if (err instanceof WarrenError && err.code === 'INVALID_ARGUMENT') throw invalid(field, err.message.replace(/^invalid registry reference [^:]*: /, ''));
    throw err;
  }
  return ref;
}

/** POST /v1/images/push: an image of this node to a registry reference. */
export function validatePushRequest(body: unknown): { image: string; ref: string } {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['image', 'ref']);
  if (b.image === undefined) throw invalid('image', 'is required');
  if (b.ref === undefined) throw invalid('ref', 'is required');
  return { image: validateImageRef(b.image, 'image'), ref: validateRegistryRef(b.ref, 'ref') };
}

/** POST /v1/images/stage: an image into an overflow pool's registry repository. */
export function validateStageRequest(body: unknown): { image: string; repository: string } {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['image', 'repository']);
  if (b.image === undefined) throw invalid('image', 'is required');
  if (b.repository === undefined) throw invalid('repository', 'is required');
  return { image: validateImageRef(b.image, 'image'), repository: validateRegistryRef(b.repository, 'repository', { repositoryOnly: true }) };
}

/** A name an image is stored under: an image reference that is not a digest. */
export function validateImageName(value: unknown, field = 'name'): string {
  const name = validateImageRef(value, field);
  if (name.startsWith('sha256:')) throw invalid(field, 'must not be a digest');
  return name;
}

export function validateImageRequest(body: unknown): ImageRequest {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['name', 'kind', 'source']);
  if (b.name === undefined) throw invalid('name', 'is required');
  const name = validateImageName(b.name);
  const req: ImageRequest = { name, source: { type: 'debootstrap' } };
  if (b.kind !== undefined) {
    const k = expectString(b.kind, 'kind');
    if (k !== 'base' && k !== 'workspace' && k !== 'toolkit') throw invalid('kind', 'must be "base", "workspace" or "toolkit"');
    req.kind = k;
  }
  if (b.source === undefined) throw invalid('source', 'is required');
  const s = expectObject(b.source, 'source');
  const type = expectString(s.type, 'source.type');
  if (type === 'directory' || type === 'oci-archive') {
    rejectUnknown(s, ['type', 'path'], 'source');
    req.source = { type, path: validateHostPath(s.path, 'source.path') };
  } else if (type === 'debootstrap') {
    rejectUnknown(s, ['type', 'suite', 'include'], 'source');
    const src: { type: 'debootstrap'; suite?: string; include?: string[] } = { type };
    if (s.suite !== undefined) {
      const suite = expectString(s.suite, 'source.suite', { maxBytes: 64 });
      if (!/^[a-z][a-z0-9-]{0,63}$/.test(suite)) throw invalid('source.suite', 'must be a Debian suite name such as bookworm');
      src.suite = suite;
    }
    if (s.include !== undefined) {
      if (!Array.isArray(s.include)) throw invalid('source.include', 'must be an array of package names');
      if (s.include.length > 256) throw new WarrenError('LIMIT_OUT_OF_RANGE', 'source.include may list at most 256 packages', { field: 'source.include', min: 0, max: 256 });
      src.include = s.include.map((p, i) => {
        const name = expectString(p, `source.include[${i}]`, { maxBytes: 128 });
        if (!/^[a-z0-9][a-z0-9+.-]*$/.test(name)) throw invalid(`source.include[${i}]`, 'must be a Debian package name');
        return name;
      });
    }
    req.source = src;
  } else if (type === 'registry') {
    rejectUnknown(s, ['type', 'ref', 'mode'], 'source');
    const src: { type: 'registry'; ref: string; mode?: 'lazy' | 'eager' } = { type, ref: validateRegistryRef(s.ref, 'source.ref') };
    if (s.mode !== undefined) {
      if (s.mode !== 'lazy' && s.mode !== 'eager') throw invalid('source.mode', 'must be "lazy" or "eager"');
      src.mode = s.mode;
    }
    req.source = src;
  } else {
    throw invalid('source.type', `must be "directory", "oci-archive", "debootstrap" or "registry" (got ${describe(type)})`);
  }
  return req;
}

// ---------------------------------------------------------------- accounts

export type Role = 'admin' | 'builder' | 'runtime';

export function validateAccountRequest(body: unknown): { name: string; role: Role } {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['name', 'role']);
  const name = expectString(b.name, 'name', { maxBytes: 64 });
  if (!ACCOUNT_NAME_RE.test(name)) throw invalid('name', 'must match ^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$');
  const role = b.role === undefined ? 'runtime' : expectString(b.role, 'role');
  if (role !== 'admin' && role !== 'builder' && role !== 'runtime') throw invalid('role', 'must be "admin", "builder" or "runtime"');
  return { name, role };
}

// ---------------------------------------------------------------- shell

export interface ShellQuery {
  mode: SessionMode;
  session?: string;
  offset?: number;
  cols?: number;
  rows?: number;
  /** The client's name for its numbered input (applied once across re-attaches). */
  writer?: string;
}

export function validateShellQuery(q: URLSearchParams): ShellQuery {
  for (const key of q.keys()) {
    if (!['mode', 'session', 'offset', 'cols', 'rows', 'writer'].includes(key)) {
      throw new WarrenError('UNKNOWN_FIELD', `unknown query parameter "${key}" (allowed: mode, session, offset, cols, rows, writer)`, { field: key });
    }
  }
  const modeRaw = q.get('mode') ?? 'command';
  if (modeRaw !== 'command' && modeRaw !== 'pty') throw invalid('mode', `must be "command" or "pty" (got ${describe(modeRaw)})`);
  const out: ShellQuery = { mode: modeRaw };
  const session = q.get('session');
  if (session !== null && session !== '') out.session = validateSessionId(session);
  const offset = parseIntParam(q.get('offset') ?? undefined, 'offset', LIMITS.offset.min, LIMITS.offset.max);
  if (offset !== undefined) {
    if (out.session === undefined) throw invalid('offset', 'only applies when attaching to a session (session=)');
    out.offset = offset;
  }
  const cols = parseIntParam(q.get('cols') ?? undefined, 'cols', LIMITS.terminal.min, LIMITS.terminal.max);
  const rows = parseIntParam(q.get('rows') ?? undefined, 'rows', LIMITS.terminal.min, LIMITS.terminal.max);
  if (cols !== undefined) out.cols = cols;
  if (rows !== undefined) out.rows = rows;
  const writer = q.get('writer');
  if (writer !== null) out.writer = validateWriter(writer);
  return out;
}

export function sessionOptions(q: ShellQuery): OpenSessionOptions {
  const o: OpenSessionOptions = { mode: q.mode };
  if (q.cols !== undefined) o.cols = q.cols;
  if (q.rows !== undefined) o.rows = q.rows;
  return o;
}

/** Signal names accepted by the shell protocol ("INT" or "SIGINT"), mapped to Linux numbers. */
export const SIGNALS: Readonly<Record<string, number>> = {
  HUP: 1, INT: 2, QUIT: 3, KILL: 9, USR1: 10, USR2: 12, TERM: 15, CONT: 18, STOP: 19, TSTP: 20, WINCH: 28,
};

export function parseSignal(value: unknown): number {
  if (typeof value === 'number' && Number.isInteger(value) && value >= 1 && value <= 64) return value;
  if (typeof value !== 'string') throw invalid('signal', `must be a signal name such as "INT" (got ${describe(value)})`);
  const name = value.toUpperCase().replace(/^SIG/, '');
  const n = SIGNALS[name];
  if (n === undefined || !Object.prototype.hasOwnProperty.call(SIGNALS, name)) {
    throw invalid('signal', `unknown signal ${describe(value)} (known: ${Object.keys(SIGNALS).join(', ')})`);
  }
  return n;
}

/**
 * A constant lookup table without a prototype. A key that names an Object.prototype member
 * ("constructor", "toString", "__proto__") is then absent, so looking up untrusted input finds
 * nothing instead of a built-in function.
 */
export function lookupTable<T extends object>(entries: T): T {
  return Object.assign(Object.create(null) as T, entries);
}

/** `table[key]` if it is the table's own entry (not an Object.prototype member); else undefined. */
export function ownValue<T>(table: Readonly<Record<string, T>>, key: string): T | undefined {
  return Object.hasOwn(table, key) ? table[key] : undefined;
}

/**
 * Set `o[k] = v` as an own data property: defined, never assigned, so a key named __proto__
 * (a file, a variable, a peer's JSON) stays a key and never becomes a prototype.
 */
export function defineKey(o: object, k: string, v: unknown): void {
  Object.defineProperty(o, k, { value: v, enumerable: true, writable: true, configurable: true });
}

/** Where a create may go in a cluster: nodes carrying all these labels, or only these nodes. */
export interface PlacementAsk {
  nodeSelector?: Record<string, string>;
  nodes?: string[];
}

export function validatePlacementAsk(v: unknown): PlacementAsk {
  if (v === undefined) return {};
  const o = expectObject(v, 'placement');
  rejectUnknown(o, ['nodeSelector', 'nodes'], 'placement.');
  const out: PlacementAsk = {};
  if (o.nodeSelector !== undefined) out.nodeSelector = validateLabels(o.nodeSelector, 'placement.nodeSelector');
  if (o.nodes !== undefined) {
    if (!Array.isArray(o.nodes) || o.nodes.length > 256 || o.nodes.some((n) => typeof n !== 'string' || !NODE_ID_RE.test(n))) {
      throw new WarrenError('INVALID_ARGUMENT', 'placement.nodes must be a list of node ids', { field: 'placement.nodes' });
    }
    out.nodes = o.nodes as string[];
  }
  return out;
}
