/**
 * The dashboard's only way to the node: the gateway's own REST API, with the
 * token the user logged in with. The token lives in sessionStorage (this tab
 * only, gone when it closes); never in localStorage, cookies or URLs.
 */
const TOKEN_KEY = 'warren.token';

export interface Account {
  id: string;
  name: string;
  role: 'admin' | 'builder' | 'runtime';
  createdAt: string;
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
  }
}

export function token(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(t: string | null): void {
  if (t === null) sessionStorage.removeItem(TOKEN_KEY);
  else sessionStorage.setItem(TOKEN_KEY, t);
}

/** Called when the API says the token is no good (stale, revoked, foreign): back to the login page. */
let onUnauthenticated: (err: ApiError) => void = () => undefined;
export function setUnauthenticatedHandler(fn: (err: ApiError) => void): void {
  onUnauthenticated = fn;
}

export interface RequestOptions {
  body?: unknown;
  raw?: BodyInit;
  query?: Record<string, string | string[] | undefined>;
  /** Answer as bytes instead of JSON. */
  binary?: boolean;
  signal?: AbortSignal;
}

export function url(path: string, query?: RequestOptions['query']): string {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query ?? {})) {
    if (v === undefined) continue;
    for (const x of Array.isArray(v) ? v : [v]) q.append(k, x);
  }
  const s = q.toString();
  return s === '' ? path : `${path}?${s}`;
}

export async function request<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
  const headers: Record<string, string> = {};
  const t = token();
  if (t !== null) headers.authorization = `Bearer ${t}`;
  let body: BodyInit | undefined;
  if (opts.body !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(opts.body);
  } else if (opts.raw !== undefined) {
    headers['content-type'] = 'application/octet-stream';
    body = opts.raw;
  }
  let res: Response;
  try {
    const init: RequestInit = { method, headers, cache: 'no-store' };
    if (body !== undefined) init.body = body;
    if (opts.signal) init.signal = opts.signal;
    res = await fetch(url(path, opts.query), init);
  } catch (err) {
    throw new ApiError(0, 'UNAVAILABLE', `the gateway cannot be reached: ${(err as Error).message}`);
  }
  if (!res.ok) {
    let code = 'HTTP_' + res.status;
    let message = `${res.status} ${res.statusText}`;
    let details: Record<string, unknown> | undefined;
    try {
      const j = (await res.json()) as { error?: { code?: string; message?: string; details?: Record<string, unknown> } };
      if (j.error?.code) code = j.error.code;
      if (j.error?.message) message = j.error.message;
      details = j.error?.details;
    } catch {
      /* not an API error body */
    }
    const err = new ApiError(res.status, code, message, details);
    if (res.status === 401) onUnauthenticated(err);
    throw err;
  }
  if (opts.binary) return new Uint8Array(await res.arrayBuffer()) as T;
  if (res.status === 204) return undefined as T;
  const text = await res.text();
  return (text === '' ? undefined : JSON.parse(text)) as T;
}

export const get = <T>(path: string, query?: RequestOptions['query']) => request<T>('GET', path, query ? { query } : {});
export const post = <T>(path: string, body?: unknown, query?: RequestOptions['query']) => {
  const o: RequestOptions = {};
  if (body !== undefined) o.body = body;
  if (query) o.query = query;
  return request<T>('POST', path, o);
};

export function describe(err: unknown): string {
  if (err instanceof ApiError) return `${err.code}: ${err.message}`;
  return err instanceof Error ? err.message : String(err);
}

// ---------------------------------------------------------------- shapes of the API

export interface Sandbox {
  id: string;
  backend: string;
  image: string;
  layers: string[];
  state: string;
  node: string;
  createdAt: string;
  owner: string;
  limits: { cpu: number; memoryMb: number; pids: number; diskMb: number | null };
  priority: string;
  labels: Record<string, string>;
  pid?: number;
  lifecycle?: { expiresAt: string | null; lastActivityAt: string; idleAt: string | null; idleSeconds: number | null; onIdle: string; pausedAt?: string; stopReason?: string; coldReclaim?: { at: string; releasedBytes: number; coldBytes: number; durationMs: number } };
  network?: { services: Record<string, boolean>; address: string };
}

export interface Usage {
  t: number;
  memoryBytes: number;
  memoryPeakBytes: number;
  cpuPercent: number | null;
  pids: number;
}

export interface Denial {
  sandbox?: string;
  owner?: string;
  at: string;
  service: string;
  destination: string;
  proto: string;
  hook: string;
}

export interface PoolStats {
  name: string;
  image: string;
  state: string;
  message?: string;
  min: number;
  max: number;
  warm: number;
  busy: number;
  starting: number;
  queued: number;
  invocations: number;
  replaced: number;
  rejected: number;
  p50Ms: number | null;
  p99Ms: number | null;
}

export interface PoolPoint {
  t: number;
  warm: number;
  busy: number;
  starting: number;
  queued: number;
  p50Ms: number | null;
  p99Ms: number | null;
}

export interface Metrics {
  now: number;
  intervalMs: number;
  scope: 'node' | 'account';
  live: { t: number; v: number }[];
  pools: Record<string, PoolPoint[]>;
  createMs?: { t: number; v: number; backend: string }[];
  pauseReleasedBytes?: { t: number; v: number; reclaim: string }[];
}

export interface Features {
  node: string;
  kernel: string;
  features: Record<string, { supported: boolean; reason?: string }>;
  backends: Record<string, { available: boolean; reason?: string }>;
  enforcer: string;
}
