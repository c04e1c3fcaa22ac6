/**
 * The Warren TypeScript SDK.
 *
 *   const client = new WarrenClient({ url: 'http://127.0.0.1:7070', token });
 *   const sb = await client.createSandbox({ image: 'default', cpu: 1, memoryMb: 512 });
 *   const r = await sb.exec(['echo', 'hi']);          // { exitCode: 0, stdout: 'hi\n', ... }
 *   const sh = await sb.shell({ mode: 'command' });
 *   await sh.run('cd /tmp && export X=1');             // state persists between runs
 *   await sh.close();
 *   await sb.delete();
 *
 * HTTP goes through an undici keep-alive pool; shells use `ws`. Every failure
 * is a WarrenError whose `code` is the server's stable code.
 */
import type { Readable } from 'node:stream';
import { Pool } from 'undici';
import type { NodeRecord } from '../cluster/placement';
import { type ErrorCode, WarrenError } from '../errors';
import type {
  BackendName,
  EnvironmentInfo,
  ExecResult,
  FeatureReport,
  FileEntry,
  ImageInfo,
  ImagePushResult,
  IdleAction,
  ImportProgress,
  InputAction,
  PackRequest,
  PackResult,
  PauseResult,
  Priority,
  ResumeResult,
  SandboxInfo,
  SandboxNetworkInfo,
  SessionInfo,
} from '../shim/types';
import { NdjsonDecoder } from './ndjson';
import { ShellClient, type ShellOptions, errorFromBody } from './shell';
import { FunctionsApi } from './functions';
import { JobsApi } from './jobs';

export { WarrenError, ErrorCodes, type ErrorCode } from '../errors';
export type {
  BackendName,
  EnvironmentInfo,
  ExecResult,
  ExecStatus,
  FeatureReport,
  FileEntry,
  ImageInfo,
  ImagePushResult,
  IdleAction,
  ImportProgress,
  InputAction,
  MouseButton,
  PackRequest,
  PackResult,
  PauseResult,
  Priority,
  ResumeResult,
  SandboxInfo,
  SandboxNetworkInfo,
  SandboxLifecycleInfo,
  SandboxState,
  SessionInfo,
  SessionMode,
} from '../shim/types';
export { ShellClient, type ShellOptions, type ShellOutput, type CommandOutcome, type ShellExit, type RunOptions } from './shell';
export { NdjsonDecoder } from './ndjson';
export * from './functions';
export * from './jobs';

export interface WarrenClientOptions {
  /** Gateway base URL, e.g. http://127.0.0.1:7070 */
  url: string;
  token?: string;
  /** Keep-alive connections in the pool (default 32). */
  connections?: number;
}

export interface CreateSandboxRequest {
  backend?: BackendName;
  image?: string;
  workspaces?: string[];
  toolkits?: string[];
  cpu?: number;
  memoryMb?: number;
  pids?: number;
  diskMb?: number;
  ttlSeconds?: number;
  idleSeconds?: number;
  onIdle?: IdleAction;
  network?: Record<string, boolean>;
  priority?: Priority;
  user?: string;
  env?: Record<string, string>;
  labels?: Record<string, string>;
}

export interface ExecOptions {
  stdin?: string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutMs?: number;
  user?: string;
  /** Bytes kept per stream (1..64 MiB, default 4 MiB); past it the writer is stopped and `truncated` is set. */
  maxOutputBytes?: number;
  /** "base64": stdout/stderr are base64 of the exact bytes (see execBytes); default UTF-8 text. */
  encoding?: 'utf8' | 'base64';
  /**
   * A client request id (docs/idempotency.md): the command runs at most once
   * for this key on this sandbox within the gateway's window; sending it again
   * returns the first run's result (waiting for it while it runs). With a key,
   * a lost connection or an unreachable gateway is retried automatically.
   */
  idempotencyKey?: string;
  /** With idempotencyKey: how long to keep retrying after connection loss (default 120000 ms; 0: no retries). */
  retryForMs?: number;
}

/** Errors after which a request with an idempotency key is simply sent again: the connection, not the command, failed. */
function retriable(err: unknown): boolean {
  return err instanceof WarrenError && (err.code === 'UNAVAILABLE' || err.code === 'TIMEOUT');
}

/**
 * Send `attempt` until it succeeds, fails for a reason other than the
 * connection, or `retryForMs` has passed (back-off 100 ms doubling to 2 s).
 */
async function withRetries<T>(retryForMs: number, attempt: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + retryForMs;
  let delay = 100;
  for (;;) {
    try {
      return await attempt();
    } catch (err) {
      if (!retriable(err) || Date.now() + delay > deadline) throw err;
      await new Promise((r) => setTimeout(r, delay));
      delay = Math.min(delay * 2, 2000);
    }
  }
}

/** An exec result with the output as bytes. */
export interface ExecBytesResult extends Omit<ExecResult, 'stdout' | 'stderr'> {
  stdout: Buffer;
  stderr: Buffer;
}

export interface ExecStreamOptions extends Omit<ExecOptions, 'encoding'> {
  /** Each chunk of stdout as it comes (a slow listener does not slow the command: chunks are queued in the client). */
  onStdout?: (chunk: Buffer) => void;
  onStderr?: (chunk: Buffer) => void;
}

/** A node as its latest record in etcd says (docs/cluster.md), as a cluster gateway shows it. */
export interface ClusterNode extends Omit<NodeRecord, 'images'> {
  /** The names of the images it holds. */
  images: string[];
  /** Creates this gateway counts on top of the record (in flight, or done since it was written). */
  pending: number;
  /** How old the record is, by the gateway's clock. */
  recordAgeMs: number;
}

export interface ClusterNodes {
  nodes: ClusterNode[];
  /** Nodes that lost their lease, with the registrations (epochs) they lost. */
  lost: { node: string; epochs: number[] }[];
  /** Layer digests staged in the overflow pool's registry. */
  staged: string[];
}

export interface Health {
  status: 'ok';
  node: string;
  version: string;
  uptimeS: number;
}

export interface AccountInfo {
  id: string;
  name: string;
  role: 'admin' | 'builder' | 'runtime';
  createdAt: string;
}

export interface ImportOptions {
  kind?: ImageInfo['kind'];
  /** How to read PATH (a path on the gateway's host): a rootfs directory or an OCI archive. Default: guessed from the name. */
  type?: 'directory' | 'oci-archive';
  onProgress?: (p: ImportProgress) => void;
}

export interface BuildOptions {
  suite?: string;
  include?: string[];
  onProgress?: (p: ImportProgress) => void;
}

type Method = 'GET' | 'POST' | 'PUT' | 'PATCH' | 'DELETE';

/** uWebSockets (the gateway's HTTP server) closes an HTTP connection idle for 10 s; it is not configurable. */
export const SERVER_IDLE_CLOSE_MS = 10_000;
/** Idle connections are kept well under the server's close, with room for a loaded event loop. */
const CLIENT_IDLE_KEEP_MS = 4_000;
const IDEMPOTENT: ReadonlySet<Method> = new Set(['GET', 'PUT', 'DELETE']);
/** Errors of a connection that ended before an answer began (undici's and the kernel's names). */
const CONNECTION_LOST: ReadonlySet<string> = new Set(['ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET']);

interface RequestOptions {
  query?: Record<string, string | number | string[] | undefined>;
  json?: unknown;
  body?: Buffer | string;
  headersTimeout?: number;
  bodyTimeout?: number;
  headers?: Record<string, string>;
}

function queryString(query: RequestOptions['query']): string {
  if (!query) return '';
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) {
    if (v === undefined) continue;
    if (Array.isArray(v)) for (const item of v) q.append(k, item);
    else q.append(k, String(v));
  }
  const s = q.toString();
  return s === '' ? '' : `?${s}`;
}

export class WarrenClient {
  readonly url: string;
  readonly images: ImagesApi;
  /** FnCall pools, invoke, judge, batch, run_code. */
  readonly functions: FunctionsApi;
  /** Jobs of many sandboxes (a cluster gateway). */
  readonly jobs: JobsApi;
  private readonly token: string | undefined;
  private readonly pool: Pool;
  private readonly basePath: string;

  constructor(opts: WarrenClientOptions) {
    const u = new URL(opts.url);
    this.url = opts.url.replace(/\/+$/, '');
    this.basePath = u.pathname.replace(/\/+$/, '');
    this.token = opts.token;
    // The gateway closes a connection after SERVER_IDLE_CLOSE_MS without traffic. A client
    // that keeps it longer can write a request into a socket the server is closing and get
    // ECONNRESET for a request the gateway never saw, so idle connections are dropped first.
    this.pool = new Pool(u.origin, {
      connections: opts.connections ?? 32,
      keepAliveTimeout: CLIENT_IDLE_KEEP_MS,
      keepAliveMaxTimeout: CLIENT_IDLE_KEEP_MS,
    });
    this.images = new ImagesApi(this);
    this.functions = new FunctionsApi(this);
    this.jobs = new JobsApi(this);
  }

  /** Low-level request; resolves with the raw undici response after checking the status. */
  async request(method: Method, path: string, opts: RequestOptions = {}) {
    const headers: Record<string, string> = { ...opts.headers };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let body: Buffer | string | undefined = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers['content-type'] = 'application/json';
    } else if (body !== undefined) {
      headers['content-type'] = 'application/octet-stream';
    }
    const send = () =>
      this.pool.request({
        method,
        path: this.basePath + path + queryString(opts.query),
        headers,
        body,
        headersTimeout: opts.headersTimeout ?? 300_000,
        bodyTimeout: opts.bodyTimeout ?? 300_000,
      });
    let res;
    try {
      try {
        res = await send();
      } catch (err) {
        // A connection the server closed while this request was being written: a request
        // whose repetition has the same effect is sent once more, on a new connection.
        // POST is never repeated here (an exec would run twice).
        if (!IDEMPOTENT.has(method) || !CONNECTION_LOST.has((err as { code?: string }).code ?? '')) throw err;
        res = await send();
      }
    } catch (err) {
      const code = (err as { code?: string }).code;
      if (code === 'UND_ERR_HEADERS_TIMEOUT' || code === 'UND_ERR_BODY_TIMEOUT') {
        throw new WarrenError('TIMEOUT', `no answer from Warren at ${this.url} in time (${method} ${path}): ${(err as Error).message}`);
      }
      throw new WarrenError('UNAVAILABLE', `cannot reach Warren at ${this.url}: ${(err as Error).message}`);
    }
    if (res.statusCode >= 400) {
      const text = await res.body.text().catch(() => '');
      throw errorFromBody(res.statusCode, text);
    }
    return res;
  }

  async requestJson<T>(method: Method, path: string, opts: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, opts);
    if (res.statusCode === 204) {
      await res.body.dump();
      return undefined as T;
    }
    return (await res.body.json()) as T;
  }

  async requestBuffer(method: Method, path: string, opts: RequestOptions = {}): Promise<Buffer> {
    const res = await this.request(method, path, opts);
    return Buffer.from(await res.body.arrayBuffer());
  }

  /** Shell WebSocket URL for a sandbox. */
  shellUrl(id: string): string {
    return `${this.url}/v1/sandboxes/${encodeURIComponent(id)}/shell`;
  }

  get bearer(): string | undefined {
    return this.token;
  }

  health(): Promise<Health> {
    return this.requestJson('GET', '/v1/health');
  }

  features(): Promise<FeatureReport> {
    return this.requestJson('GET', '/v1/features');
  }

  /** Admin, through a cluster gateway: the live nodes as their records say, the lost ones, the staged layers. */
  clusterNodes(): Promise<ClusterNodes> {
    return this.requestJson('GET', '/v1/cluster/nodes');
  }

  /**
   * Admin, through a cluster gateway: forget a node that is gone for good (its lost epochs and its
   * quota blocks). NODE_LIVE while the node holds a lease; NOT_FOUND when nothing of it is kept.
   */
  forgetNode(id: string): Promise<{ node: string; lostEpochs: number[]; quotaBlocks: number }> {
    return this.requestJson('DELETE', `/v1/cluster/nodes/${encodeURIComponent(id)}`);
  }

  async createSandbox(req: CreateSandboxRequest = {}): Promise<Sandbox> {
    const info = await this.requestJson<SandboxInfo>('POST', '/v1/sandboxes', { json: req });
    return new Sandbox(this, info);
  }

  async getSandbox(id: string): Promise<Sandbox> {
    return new Sandbox(this, await this.requestJson<SandboxInfo>('GET', `/v1/sandboxes/${encodeURIComponent(id)}`));
  }

  /** A handle for a sandbox id without fetching it. */
  sandbox(id: string): Sandbox {
    return new Sandbox(this, null, id);
  }

  async listSandboxes(filter: { labels?: Record<string, string>; owner?: string } = {}): Promise<SandboxInfo[]> {
    const label = filter.labels ? Object.entries(filter.labels).map(([k, v]) => `${k}=${v}`) : undefined;
    const r = await this.requestJson<{ sandboxes: SandboxInfo[] }>('GET', '/v1/sandboxes', { query: { label, owner: filter.owner } });
    return r.sandboxes;
  }

  /**
   * One page of sandboxes in id order (`limit` 1..1000); pass the answer's `next` as `after`
   * for the following page (absent on the last one).
   */
  async listSandboxesPage(page: { limit: number; after?: string }, filter: { labels?: Record<string, string>; owner?: string } = {}): Promise<{ sandboxes: SandboxInfo[]; next?: string }> {
    const label = filter.labels ? Object.entries(filter.labels).map(([k, v]) => `${k}=${v}`) : undefined;
    return this.requestJson<{ sandboxes: SandboxInfo[]; next?: string }>('GET', '/v1/sandboxes', { query: { label, owner: filter.owner, limit: String(page.limit), after: page.after } });
  }

  async deleteSandbox(id: string): Promise<void> {
    await this.requestJson('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`);
  }

  /** Admin: create an account; the token is shown only here. */
  createAccount(name: string, role: AccountInfo['role'] = 'runtime'): Promise<AccountInfo & { token: string }> {
    return this.requestJson('POST', '/v1/accounts', { json: { name, role } });
  }

  async listAccounts(): Promise<AccountInfo[]> {
    return (await this.requestJson<{ accounts: AccountInfo[] }>('GET', '/v1/accounts')).accounts;
  }

  whoami(): Promise<AccountInfo> {
    return this.requestJson('GET', '/v1/accounts/me');
  }

  // ---- lifecycle (docs/lifecycle.md) ----

  /** Pause every sandbox whose labels match (a job, for preemption). */
  async pauseSandboxes(labels: Record<string, string>, owner?: string): Promise<PauseResult[]> {
    const label = Object.entries(labels).map(([k, v]) => `${k}=${v}`);
    return (await this.requestJson<{ sandboxes: PauseResult[] }>('POST', '/v1/sandboxes/pause', { query: { label, owner } })).sandboxes;
  }

  async resumeSandboxes(labels: Record<string, string>, owner?: string): Promise<ResumeResult[]> {
    const label = Object.entries(labels).map(([k, v]) => `${k}=${v}`);
    return (await this.requestJson<{ sandboxes: ResumeResult[] }>('POST', '/v1/sandboxes/resume', { query: { label, owner } })).sandboxes;
  }

  async listEnvironments(): Promise<EnvironmentInfo[]> {
    return (await this.requestJson<{ environments: EnvironmentInfo[] }>('GET', '/v1/environments')).environments;
  }

  publishEnvironment(name: string, published = true): Promise<EnvironmentInfo> {
    return this.requestJson('POST', `/v1/environments/${encodeURIComponent(name)}/${published ? 'publish' : 'unpublish'}`);
  }

  /** An account's quota and usage ("me" for one's own). */
  quota(accountId = 'me'): Promise<{ account: string; quota: Quota; usage: { sandboxes: number; cpu: number; memoryMb: number } }> {
    return this.requestJson('GET', `/v1/accounts/${encodeURIComponent(accountId)}/quota`);
  }

  /** Admin: set an account's quota (null = unlimited). */
  setQuota(accountId: string, quota: Partial<Quota>): Promise<{ account: string; quota: Quota }> {
    return this.requestJson('PUT', `/v1/accounts/${encodeURIComponent(accountId)}/quota`, { json: quota });
  }

  /** Close the connection pool. */
  async close(): Promise<void> {
    await this.pool.close();
  }
}

export class Sandbox {
  readonly id: string;
  /** The last fetched description (null for handles made with client.sandbox(id) until refresh()). */
  info: SandboxInfo | null;

  constructor(
    private readonly client: WarrenClient,
    info: SandboxInfo | null,
    id?: string,
  ) {
    this.info = info;
    this.id = info?.id ?? id!;
  }

  get state(): SandboxInfo['state'] | undefined {
    return this.info?.state;
  }

  private path(suffix = ''): string {
    return `/v1/sandboxes/${encodeURIComponent(this.id)}${suffix}`;
  }

  async refresh(): Promise<SandboxInfo> {
    this.info = await this.client.requestJson<SandboxInfo>('GET', this.path());
    return this.info;
  }

  /** Run a command (a string runs through /bin/sh -c; an array is argv). */
  exec(cmd: string | string[], opts: ExecOptions = {}): Promise<ExecResult> {
    const { idempotencyKey, retryForMs, ...rest } = opts;
    const timeout = (opts.timeoutMs ?? 300_000) + 60_000;
    const send = () =>
      this.client
        .requestJson<ExecResult>('POST', this.path('/exec'), {
          json: { cmd, ...rest },
          headersTimeout: timeout,
          bodyTimeout: timeout,
          ...(idempotencyKey !== undefined ? { headers: { 'idempotency-key': idempotencyKey } } : {}),
        })
        .catch((err: unknown) => {
          // The connection broke while the answer was read.
          throw err instanceof WarrenError ? err : new WarrenError('UNAVAILABLE', `the exec answer broke off: ${(err as Error).message}`);
        });
    return idempotencyKey === undefined ? send() : withRetries(retryForMs ?? 120_000, send);
  }

  /** Run a command and get its output as exact bytes (base64 on the wire: no loss for binary output). */
  async execBytes(cmd: string | string[], opts: Omit<ExecOptions, 'encoding'> = {}): Promise<ExecBytesResult> {
    const r = await this.exec(cmd, { ...opts, encoding: 'base64' });
    return { ...r, stdout: Buffer.from(r.stdout, 'base64'), stderr: Buffer.from(r.stderr, 'base64') };
  }

  /**
   * Run a command and receive its output while it runs (NDJSON on the wire,
   * docs/api.md); resolves with how it ended. Output is not kept: the
   * listeners get it.
   */
  async execStream(cmd: string | string[], opts: ExecStreamOptions = {}): Promise<Omit<ExecResult, 'stdout' | 'stderr'>> {
    const { onStdout, onStderr, idempotencyKey, retryForMs, ...rest } = opts;
    if (idempotencyKey === undefined) return this.execStreamOnce(cmd, rest, onStdout, onStderr);
    // A retry replays the output from its start: what the listeners already got is skipped.
    const delivered = { stdout: 0, stderr: 0 };
    const skipping = (stream: 'stdout' | 'stderr', listener: ((chunk: Buffer) => void) | undefined) => {
      let seen = 0;
      return (chunk: Buffer) => {
        const from = Math.max(0, delivered[stream] - seen);
        seen += chunk.length;
        if (from >= chunk.length) return;
        const part = from > 0 ? chunk.subarray(from) : chunk;
        delivered[stream] += part.length;
        listener?.(part);
      };
    };
    return withRetries(retryForMs ?? 120_000, () =>
      this.execStreamOnce(cmd, rest, skipping('stdout', onStdout), skipping('stderr', onStderr), { 'idempotency-key': idempotencyKey }),
    );
  }

  private async execStreamOnce(
    cmd: string | string[],
    rest: Omit<ExecStreamOptions, 'onStdout' | 'onStderr' | 'idempotencyKey' | 'retryForMs'>,
    onStdout: ((chunk: Buffer) => void) | undefined,
    onStderr: ((chunk: Buffer) => void) | undefined,
    extraHeaders: Record<string, string> = {},
  ): Promise<Omit<ExecResult, 'stdout' | 'stderr'>> {
    const timeout = (rest.timeoutMs ?? 300_000) + 60_000;
    const res = await this.client.request('POST', this.path('/exec'), {
      json: { cmd, ...rest },
      headers: { accept: 'application/x-ndjson', ...extraHeaders },
      headersTimeout: timeout,
      bodyTimeout: timeout,
    });
    const decoder = new NdjsonDecoder();
    let end: Omit<ExecResult, 'stdout' | 'stderr'> | null = null;
    const handle = (v: unknown) => {
      const m = v as { type?: string; data?: string; encoding?: string; error?: { code: string; message: string } } & Record<string, unknown>;
      if (m.type === 'stdout' || m.type === 'stderr') {
        const buf = Buffer.from(String(m.data ?? ''), m.encoding === 'base64' ? 'base64' : 'utf8');
        (m.type === 'stdout' ? onStdout : onStderr)?.(buf);
      } else if (m.type === 'exit') {
        const { type: _type, ...outcome } = m;
        end = outcome as unknown as Omit<ExecResult, 'stdout' | 'stderr'>;
      } else if (m.type === 'error' && m.error) {
        // a code that is not one of ours becomes INTERNAL in the constructor
        throw new WarrenError(m.error.code as ErrorCode, m.error.message);
      }
    };
    try {
      for await (const chunk of res.body) for (const v of decoder.push(chunk as Buffer)) handle(v);
    } catch (err) {
      if (err instanceof WarrenError) throw err;
      throw new WarrenError('UNAVAILABLE', `the exec stream broke: ${(err as Error).message}`);
    }
    for (const v of decoder.end()) handle(v);
    if (end === null) throw new WarrenError('UNAVAILABLE', 'the exec stream ended without an exit line');
    return end;
  }

  readFile(path: string): Promise<Buffer> {
    return this.client.requestBuffer('GET', this.path('/files'), { query: { path } });
  }

  async writeFile(path: string, data: Buffer | string, mode?: number): Promise<void> {
    const query: Record<string, string> = { path };
    if (mode !== undefined) query.mode = mode.toString(8);
    await this.client.requestJson('PUT', this.path('/files'), { query, body: typeof data === 'string' ? Buffer.from(data) : data });
  }

  async listDir(path = '/'): Promise<FileEntry[]> {
    return (await this.client.requestJson<{ entries: FileEntry[] }>('GET', this.path('/files/list'), { query: { path } })).entries;
  }

  /** Extract a tar archive into directory `dir` inside the sandbox. */
  uploadTar(dir: string, tar: Buffer): Promise<{ path: string; entries: number }> {
    return this.client.requestJson('PUT', this.path('/files/archive'), { query: { path: dir }, body: tar });
  }

  /** A tar archive of `path` (file or directory) inside the sandbox. */
  downloadTar(path: string): Promise<Buffer> {
    return this.client.requestBuffer('GET', this.path('/files/archive'), { query: { path } });
  }

  async downloadTarStream(path: string): Promise<Readable> {
    const res = await this.client.request('GET', this.path('/files/archive'), { query: { path } });
    return res.body;
  }

  async sessions(): Promise<SessionInfo[]> {
    return (await this.client.requestJson<{ sessions: SessionInfo[] }>('GET', this.path('/sessions'))).sessions;
  }

  /** Open (or with `session`, re-attach to) a shell session. */
  shell(opts: ShellOptions = {}): Promise<ShellClient> {
    return ShellClient.connect(this.client.shellUrl(this.id), this.client.bearer, opts);
  }

  /** The current screen as PNG (vm backend), scaled down to `width` pixels wide when given. */
  screenshot(opts: { width?: number } = {}): Promise<Buffer> {
    return this.client.requestBuffer('GET', this.path('/screen'), opts.width === undefined ? {} : { query: { width: String(opts.width) } });
  }

  /**
   * Keyboard and pointer input at the hypervisor level (vm backend), e.g.
   * [{ type: 'click', x: 100, y: 200 }, { type: 'type', text: 'ls\n' }, { type: 'key', keys: 'ctrl+c' }]
   * (docs/vm.md lists the actions).
   */
  input(actions: InputAction[]): Promise<{ actions: number; events: number }> {
    return this.client.requestJson('POST', this.path('/input'), { json: { actions } });
  }

  /** WebSocket URL of the live view (VNC over WebSocket; authenticate with the bearer header or a bearer.<token> subprotocol). */
  vncUrl(): string {
    return `${this.client.url.replace(/^http/, 'ws')}/v1/sandboxes/${encodeURIComponent(this.id)}/vnc`;
  }

  delete(): Promise<void> {
    return this.client.deleteSandbox(this.id);
  }

  /** Freeze and give the memory back; any later request resumes it. */
  pause(): Promise<PauseResult> {
    return this.client.requestJson('POST', this.path('/pause'));
  }

  resume(): Promise<ResumeResult> {
    return this.client.requestJson('POST', this.path('/resume'));
  }

  /** Checkpoint with CRIU (NOT_SUPPORTED where the node cannot). */
  hibernate(): Promise<PauseResult> {
    return this.client.requestJson('POST', this.path('/hibernate'));
  }

  /** Push the hard maximum out: `{ seconds }` past the current expiry or `{ ttlSeconds }` from now. */
  /** Services, address, DNS bindings and recent denials of a sandbox with network. */
  network(): Promise<SandboxNetworkInfo> {
    return this.client.requestJson('GET', this.path('/network'));
  }

  /** Enable (true) or disable (false) services while the sandbox runs; the change is atomic. */
  setNetwork(change: Record<string, boolean>): Promise<SandboxNetworkInfo> {
    return this.client.requestJson('PATCH', this.path('/network'), { json: change });
  }

  async extend(req: { seconds?: number; ttlSeconds?: number }): Promise<SandboxInfo> {
    this.info = await this.client.requestJson<SandboxInfo>('POST', this.path('/extend'), { json: req });
    return this.info;
  }

  /** pack_diff: this sandbox's changes (scrubbed) become environment `req.name`. */
  pack(req: PackRequest): Promise<PackResult> {
    return this.client.requestJson('POST', this.path('/pack'), { json: req, headersTimeout: 1_800_000, bodyTimeout: 1_800_000 });
  }
}

export interface Quota {
  maxSandboxes: number | null;
  maxCpu: number | null;
  maxMemoryMb: number | null;
}

export class ImagesApi {
  constructor(private readonly client: WarrenClient) {}

  async list(): Promise<ImageInfo[]> {
    return (await this.client.requestJson<{ images: ImageInfo[] }>('GET', '/v1/images')).images;
  }

  /** Import a rootfs directory or OCI archive that lies on the gateway's host (admin). */
  import(name: string, path: string, opts: ImportOptions = {}): Promise<ImageInfo> {
    const type = opts.type ?? (/\.(tar|tar\.gz|tgz|oci)$/.test(path) ? 'oci-archive' : 'directory');
    const body: Record<string, unknown> = { name, source: { type, path } };
    if (opts.kind) body.kind = opts.kind;
    return this.post(body, opts.onProgress);
  }

  /** Build a Debian image with debootstrap. */
  build(name: string, opts: BuildOptions = {}): Promise<ImageInfo> {
    const source: Record<string, unknown> = { type: 'debootstrap' };
    if (opts.suite) source.suite = opts.suite;
    if (opts.include) source.include = opts.include;
    return this.post({ name, source }, opts.onProgress);
  }

  /**
   * Pull an image pushed by Warren from an OCI registry (host[:port]/repo[:tag]).
   * mode 'lazy' (the node's default where it can) fetches only the chunk indexes
   * now and layer bytes when sandboxes read them; 'eager' downloads every layer.
   */
  pull(ref: string, opts: { name?: string; mode?: 'lazy' | 'eager'; onProgress?: (p: ImportProgress) => void } = {}): Promise<ImageInfo> {
    const name = opts.name ?? ref.replace(/^https?:\/\//, '').replace(/^[^/]+\//, '').replace(/@.*$/, '');
    const source: Record<string, unknown> = { type: 'registry', ref };
    if (opts.mode) source.mode = opts.mode;
    return this.post({ name, source }, opts.onProgress);
  }

  /** Push an image of the node to an OCI registry reference (host[:port]/repo[:tag]). */
  push(image: string, ref: string, opts: { onProgress?: (p: ImportProgress) => void } = {}): Promise<ImagePushResult> {
    return this.post({ image, ref }, opts.onProgress, '/v1/images/push', 'push');
  }

  /** Stage an image into an overflow pool's registry repository (host[:port]/repo). */
  stage(image: string, repository: string, opts: { onProgress?: (p: ImportProgress) => void } = {}): Promise<ImagePushResult> {
    return this.post({ image, repository }, opts.onProgress, '/v1/images/stage', 'push');
  }

  /** Remove an image, and its layers no other image uses (IMAGE_IN_USE while a sandbox uses it). */
  delete(name: string): Promise<{ name: string; removedLayers: string[] }> {
    return this.client.requestJson('DELETE', `/v1/images/${encodeURIComponent(name)}`);
  }

  /** Which layers the node holds ('local'), can mount from a registry ('lazy'), or lacks ('absent'). */
  async layers(digests?: string[]): Promise<Array<{ digest: string; state: 'local' | 'lazy' | 'absent'; mounted: boolean }>> {
    const q = digests && digests.length > 0 ? `?digests=${encodeURIComponent(digests.join(','))}` : '';
    return (await this.client.requestJson<{ layers: Array<{ digest: string; state: 'local' | 'lazy' | 'absent'; mounted: boolean }> }>('GET', `/v1/images/layers${q}`)).layers;
  }

  private async post(body: unknown, onProgress?: (p: ImportProgress) => void): Promise<ImageInfo>;
  private async post(body: unknown, onProgress: ((p: ImportProgress) => void) | undefined, path: string, key: 'push'): Promise<ImagePushResult>;
  private async post(body: unknown, onProgress?: (p: ImportProgress) => void, path = '/v1/images', key: 'image' | 'push' = 'image'): Promise<any> {
    const res = await this.client.request('POST', path, { json: body, headersTimeout: 600_000, bodyTimeout: 0 });
    const decoder = new NdjsonDecoder();
    let result: unknown = null;
    let failure: WarrenError | null = null;
    const handle = (ev: any) => {
      if (ev === null || typeof ev !== 'object') return;
      if (ev.type === 'progress') {
        const p: ImportProgress = { phase: String(ev.phase), message: String(ev.message) };
        if (typeof ev.fraction === 'number') p.fraction = ev.fraction;
        onProgress?.(p);
      } else if (ev.type === 'done') {
        result = ev[key];
      } else if (ev.type === 'error') {
        failure = new WarrenError(ev.error?.code, String(ev.error?.message ?? 'image import failed'));
      }
    };
    try {
      for await (const chunk of res.body) for (const ev of decoder.push(chunk as Buffer)) handle(ev);
      for (const ev of decoder.end()) handle(ev);
    } catch (err) {
      if (err instanceof SyntaxError) throw new WarrenError('INTERNAL', `malformed progress stream: ${err.message}`);
      throw new WarrenError('UNAVAILABLE', `image progress stream broke: ${(err as Error).message}`);
    }
    if (failure) throw failure;
    if (result === null) throw new WarrenError('UNAVAILABLE', 'image progress stream ended without a result');
    return result;
  }
}
