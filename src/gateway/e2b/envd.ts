/**
 * The sandbox plane ("envd") of the E2B surface: the Connect services
 * `process.Process` and `filesystem.Filesystem`, `/files` and `/health`,
 * routed by the SDK's `E2b-Sandbox-Id` header on the gateway's own port.
 *
 * Authentication is the per-sandbox access token (`X-Access-Token`), an HMAC
 * of the sandbox id (state.ts), checked before the sandbox is looked up, so
 * without a token nothing tells existing ids from missing ones. The Warren
 * token is never needed here.
 *
 * Everything runs inside the sandbox as the requesting user (envd's
 * `Authorization: Basic <user>:`; default `user`, home /home/user): commands
 * through the shim's exec, file operations through small coreutils/findutils
 * commands, so permissions, ownership and confinement are the sandbox's own.
 */
import { posix } from 'node:path';
import { gunzip } from 'node:zlib';
import type { Req as Request, Res as Response, Router as Server } from './http';
import { WarrenError } from '../../errors';
import type { DirWatch, ExecStream, SandboxInfo } from '../../shim/types';
import type { GatewayContext } from '../context';
import { publicError } from '../http';
import { LIMITS, validateEnv, validateSandboxPath, validateUser } from '../../validation';
import { E2bProcess, type ProcessConfig, type ProcessEnd, ProcessTable, endStatus } from './processes';
import { E2bState } from './state';
import {
  E2bError,
  boolField,
  bodyPending,
  bytesField,
  connectErrorBody,
  decodeRequestMessage,
  endEnvelope,
  enumField,
  messageEnvelope,
  multipartBoundary,
  objectField,
  parseConnectTimeout,
  parseMultipart,
  readBodyAnyEncoding,
  sendJsonBody,
  stringField,
  timestampJson,
  toE2bError,
  uintField,
  userFromBasicAuth,
} from './wire';

export const DEFAULT_USER = 'user';
/** Largest RPC request message (they are small JSON documents). */
const RPC_BODY_LIMIT = 1024 * 1024;

/** What the sandbox plane shares with the control plane and the interpreter. */
export interface Plane {
  ctx: GatewayContext;
  state: E2bState;
  processes: Map<string, ProcessTable>;
  /** Sandboxes whose `user` account is known to exist. */
  usersEnsured: Set<string>;
  log: (line: string) => void;
  /** Called when a sandbox is deleted through this surface (drop its processes and contexts). */
  onSandboxGone: ((id: string) => void)[];
}

/** Home of a sandbox user as E2B lays it out. */
export function homeOf(user: string): string {
  return user === 'root' || user === '0' ? '/root' : `/home/${user}`;
}

/** A client path (relative ones against the user's home), normalised and checked like every Warren sandbox path. */
export function resolvePath(raw: string, user: string, field = 'path'): string {
  if (raw.includes('\0')) throw new E2bError(400, `${field}: must not contain NUL`, 'invalid_argument');
  if (raw.split('/').includes('..')) throw new E2bError(400, `${field} ${JSON.stringify(raw.slice(0, 100))} has a ".." component`, 'invalid_argument');
  const abs = raw === '' ? homeOf(user) : raw.startsWith('/') ? raw : posix.join(homeOf(user), raw);
  try {
    return validateSandboxPath(abs, field);
  } catch (err) {
    if (err instanceof WarrenError) throw new E2bError(400, err.message, 'invalid_argument');
    throw err;
  }
}

function header(req: Request, name: string): string | undefined {
  const v = req.headers[name];
  return typeof v === 'string' && v !== '' ? v : undefined;
}

/**
 * The sandbox a sandbox-plane request is for, after its token: 401 without a
 * valid token; 502 (what the SDK reads as "sandbox not running") when it is
 * missing, stopped, or paused without auto-resume.
 */
export async function planeSandbox(plane: Plane, req: Request, opts: { traffic?: boolean } = {}): Promise<SandboxInfo> {
  const id = header(req, 'e2b-sandbox-id');
  if (id === undefined) throw new E2bError(400, 'missing E2b-Sandbox-Id header (set E2B_SANDBOX_URL to this gateway)', 'invalid_argument');
  const access = header(req, 'x-access-token');
  const traffic = header(req, 'e2b-traffic-access-token');
  const ok =
    E2bState.tokenMatches(access, plane.state.envdToken(id)) || (opts.traffic === true && E2bState.tokenMatches(traffic, plane.state.trafficToken(id)));
  if (!ok) throw new E2bError(401, access === undefined && traffic === undefined ? 'missing X-Access-Token' : 'invalid access token for this sandbox', 'unauthenticated');
  let info: SandboxInfo;
  try {
    info = await plane.ctx.shim.getSandbox(id);
  } catch {
    throw new E2bError(502, `sandbox ${id} is not running`, 'unavailable');
  }
  if (info.state === 'paused' || info.state === 'hibernated') {
    if (!plane.state.get(id)?.autoResume) throw new E2bError(502, `sandbox ${id} is paused; connect to it to resume`, 'unavailable');
  } else if (info.state !== 'running') {
    throw new E2bError(502, `sandbox ${id} is ${info.state}`, 'unavailable');
  }
  return info;
}

/** The user of a request: Basic auth (RPCs) or `?username=` (/files); default `user`. */
export function requestUser(raw: string | undefined): string {
  const user = raw ?? DEFAULT_USER;
  try {
    return validateUser(user);
  } catch (err) {
    throw new E2bError(400, (err as Error).message, 'invalid_argument');
  }
}

/** A passwd/group line for `user` with the first id from 1000 not taken in either file. */
export function addUserEntries(passwd: string, group: string): { passwd: string; group: string; uid: number } | null {
  const has = (text: string) => text.split('\n').some((l) => l.startsWith('user:'));
  if (has(passwd)) return null;
  const taken = new Set<number>();
  for (const text of [passwd, group]) for (const l of text.split('\n')) if (/^[^:]*:[^:]*:\d+:/.test(l)) taken.add(Number(l.split(':')[2]));
  let uid = 1000;
  while (taken.has(uid)) uid++;
  const nl = (t: string) => (t === '' || t.endsWith('\n') ? t : `${t}\n`);
  return {
    passwd: `${nl(passwd)}user:x:${uid}:${uid}::/home/user:/bin/bash\n`,
    group: has(group) ? group : `${nl(group)}user:x:${uid}:\n`,
    uid,
  };
}

/**
 * E2B clients expect a `user` account with home /home/user. Images need not
 * have one: it is added to the sandbox's own writable layer on first use
 * (packed snapshots carry it on). /etc is read-only inside sandboxes, so the
 * account files are written through the shim's confined file access; the
 * home directory is made inside the sandbox.
 */
export async function ensureUser(plane: Plane, id: string): Promise<void> {
  if (plane.usersEnsured.has(id)) return;
  const shim = plane.ctx.shim;
  const read = async (p: string) => {
    try {
      return (await shim.readFile(id, p, 4 * 1024 * 1024)).toString('utf8');
    } catch (err) {
      if (err instanceof WarrenError && err.code === 'FILE_NOT_FOUND') return '';
      throw err;
    }
  };
  const next = addUserEntries(await read('/etc/passwd'), await read('/etc/group'));
  if (next !== null) {
    await shim.writeFile(id, '/etc/group', Buffer.from(next.group), 0o644);
    await shim.writeFile(id, '/etc/passwd', Buffer.from(next.passwd), 0o644);
    // The home directory, owned by the new user (once per sandbox: its passwd entry is new).
    const home = await shim.exec(id, { cmd: ['/bin/sh', '-c', 'mkdir -p /home/user && chown "$1:$1" /home/user', 'e2b-home', String(next.uid)], user: 'root', timeoutMs: 30_000 });
    if (home.exitCode !== 0) throw new E2bError(502, `creating /home/user failed: ${home.stderr.trim().slice(0, 200)}`, 'unavailable');
  }
  plane.usersEnsured.add(id);
}

// ---------------------------------------------------------------- Connect plumbing

type Unary = (info: SandboxInfo, msg: Record<string, unknown>, req: Request) => Promise<unknown>;
type Streaming = (info: SandboxInfo, msg: Record<string, unknown>, req: Request, stream: ConnectStream) => Promise<void>;

/** A server-streaming answer: message envelopes, keepalives, exactly one end-of-stream envelope. */
export class ConnectStream {
  private ended = false;
  private keepalive: NodeJS.Timeout | null = null;
  private deadline: NodeJS.Timeout | null = null;
  private readonly closeHandlers: (() => void)[] = [];
  private readonly drainHandlers: (() => void)[] = [];
  waiting = false;

  constructor(
    private readonly res: Response,
    private readonly keepaliveMessage: unknown,
  ) {
    res.status(200);
    res.header('content-type', 'application/connect+json');
    res.header('cache-control', 'no-store');
    res.on('close', () => this.onClose());
    res.on('drain', () => {
      this.waiting = false;
      for (const h of this.drainHandlers) h();
    });
  }

  get closed(): boolean {
    return this.ended || this.res.completed;
  }

  /** Keepalive events at the interval the client asked for (`Keepalive-Ping-Interval`, seconds). */
  startKeepalive(header: string | undefined): void {
    const s = header !== undefined && /^\d{1,6}$/.test(header) ? Number(header) : 0;
    if (s <= 0) return;
    this.keepalive = setInterval(() => this.send(this.keepaliveMessage), Math.max(1, s) * 1000);
    this.keepalive.unref();
  }

  /** End with deadline_exceeded when the request's Connect-Timeout-Ms passes; `onExpire` runs first. */
  setDeadline(ms: number | undefined, onExpire?: () => void): void {
    if (!ms) return;
    this.deadline = setTimeout(() => {
      onExpire?.();
      this.end(new E2bError(504, `deadline of ${ms} ms exceeded`, 'deadline_exceeded'));
    }, ms);
    this.deadline.unref();
  }

  onClosed(fn: () => void): void {
    this.closeHandlers.push(fn);
  }

  onDrain(fn: () => void): void {
    this.drainHandlers.push(fn);
  }

  /** Write a message; false when the client is behind (wait for onDrain) or gone. */
  send(msg: unknown): boolean {
    if (this.closed) return false;
    const ok = this.res.write(messageEnvelope(msg));
    if (!ok) this.waiting = true;
    return ok;
  }

  end(error?: E2bError): void {
    if (this.ended) return;
    this.ended = true;
    this.clearTimers();
    if (!this.res.completed) this.res.end(endEnvelope(error));
    for (const h of this.closeHandlers.splice(0)) h();
  }

  private onClose(): void {
    this.clearTimers();
    this.ended = true;
    for (const h of this.closeHandlers.splice(0)) h();
  }

  private clearTimers(): void {
    if (this.keepalive) clearInterval(this.keepalive);
    if (this.deadline) clearTimeout(this.deadline);
    this.keepalive = this.deadline = null;
  }
}

function sendConnectError(res: Response, e: E2bError, close: boolean): void {
  if (res.completed) return;
  res.status(e.status);
  res.header('content-type', 'application/json');
  if (close) res.header('connection', 'close');
  res.send(connectErrorBody(e), close);
}

function registerService(app: Server, plane: Plane, service: string, unary: Record<string, Unary>, streaming: Record<string, Streaming>): void {
  const known = [...Object.keys(unary), ...Object.keys(streaming)];
  app.post(`/${service}/:method`, async (req, res) => {
    const method = req.path_parameters.method ?? '';
    const isStream = Object.prototype.hasOwnProperty.call(streaming, method);
    let read = false;
    try {
      if (!isStream && !Object.prototype.hasOwnProperty.call(unary, method)) {
        throw new E2bError(501, `${service}/${method} is not implemented (known: ${known.join(', ')})`, 'unimplemented');
      }
      const info = await planeSandbox(plane, req);
      const body = await readBodyAnyEncoding(req, RPC_BODY_LIMIT);
      read = true;
      const msg = decodeRequestMessage(body, isStream);
      await ensureUser(plane, info.id);
      if (isStream) {
        const stream = new ConnectStream(res, keepaliveFor(service));
        try {
          await streaming[method]!(info, msg, req, stream);
        } catch (err) {
          // Headers may already be out: errors of a stream travel in its end envelope.
          stream.end(toE2bError(err, (e) => publicError(e, plane.log)));
        }
        return;
      }
      const answer = await unary[method]!(info, msg, req);
      sendJsonBody(res, 200, JSON.stringify(answer ?? {}));
    } catch (err) {
      sendConnectError(res, toE2bError(err, (e) => publicError(e, plane.log)), !read && bodyPending(req));
    }
  });
}

function keepaliveFor(service: string): unknown {
  return service === 'process.Process' ? { event: { keepalive: {} } } : { keepalive: {} };
}

// ---------------------------------------------------------------- process.Process

function tableOf(plane: Plane, id: string): ProcessTable {
  let t = plane.processes.get(id);
  if (!t) plane.processes.set(id, (t = new ProcessTable()));
  return t;
}

function selectorOf(msg: Record<string, unknown>): { pid?: number; tag?: string } {
  const sel = objectField(msg.process, 'process');
  if (sel.pid !== undefined) return { pid: uintField(sel.pid, 'process.pid') };
  if (sel.tag !== undefined) return { tag: stringField(sel.tag, 'process.tag') };
  throw new E2bError(400, 'process: give a pid or a tag', 'invalid_argument');
}

function parseConfig(v: unknown, user: string): ProcessConfig {
  const c = objectField(v, 'process');
  const cmd = stringField(c.cmd, 'process.cmd');
  if (cmd === '') throw new E2bError(400, 'process.cmd is required', 'invalid_argument');
  const argsRaw = c.args ?? [];
  if (!Array.isArray(argsRaw) || argsRaw.length > LIMITS.argvEntries) throw new E2bError(400, 'process.args: must be an array of strings', 'invalid_argument');
  const args = argsRaw.map((a, i) => stringField(a, `process.args[${i}]`));
  if (Buffer.byteLength(cmd) + args.reduce((n, a) => n + Buffer.byteLength(a) + 1, 0) > LIMITS.cmdBytes) {
    throw new E2bError(400, `process command line exceeds ${LIMITS.cmdBytes} bytes`, 'invalid_argument');
  }
  let envs: Record<string, string>;
  try {
    envs = validateEnv(c.envs ?? {}, 'process.envs');
  } catch (err) {
    throw new E2bError(400, (err as Error).message, 'invalid_argument');
  }
  const cfg: ProcessConfig = { cmd, args, envs };
  const cwd = c.cwd === undefined || c.cwd === null || c.cwd === '' ? undefined : stringField(c.cwd, 'process.cwd');
  cfg.cwd = cwd === undefined ? homeOf(user) : resolvePath(cwd, user, 'process.cwd');
  return cfg;
}

function processEvent(p: E2bProcess): { start: unknown } {
  return { start: { pid: p.pid } };
}

/** Attach a stream to a process: data events until its end (or the stream's own end). */
function attach(p: E2bProcess, stream: ConnectStream, wrap: (event: unknown) => unknown): void {
  const listener = {
    get waiting() {
      return stream.waiting;
    },
    data: (out: { stream: string; data: Buffer }) => stream.send(wrap({ data: { [out.stream]: out.data.toString('base64') } })),
    end: (end: ProcessEnd, timedOut: boolean) => {
      if (timedOut) {
        stream.end(new E2bError(504, `process ${p.pid} was killed: the request's timeout passed (pass timeoutMs: 0 for no limit)`, 'deadline_exceeded'));
        return;
      }
      const ev: Record<string, unknown> = { exited: end.exited, status: end.status };
      if (end.exitCode !== 0) ev.exitCode = end.exitCode;
      if (end.error !== undefined) ev.error = end.error;
      stream.send(wrap({ end: ev }));
      stream.end();
    },
  };
  p.listeners.add(listener);
  stream.onDrain(() => p.drained());
  stream.onClosed(() => {
    p.listeners.delete(listener);
    p.drained();
  });
}

const SIGNALS = { SIGNAL_UNSPECIFIED: 0, SIGNAL_SIGTERM: 15, SIGNAL_SIGKILL: 9 } as const;

function isShell(cmd: string): boolean {
  return ['/bin/bash', 'bash', '/usr/bin/bash', '/bin/sh', 'sh'].includes(cmd);
}

async function startProcess(plane: Plane, info: SandboxInfo, msg: Record<string, unknown>, req: Request, stream: ConnectStream): Promise<void> {
  const user = requestUser(userFromBasicAuth(header(req, 'authorization')));
  const config = parseConfig(msg.process, user);
  const tag = msg.tag === undefined || msg.tag === null ? undefined : stringField(msg.tag, 'tag');
  const wantStdin = boolField(msg.stdin, 'stdin');
  const table = tableOf(plane, info.id);
  const pid = table.allocatePid();
  const deadline = parseConnectTimeout(header(req, 'connect-timeout-ms'));
  let proc: E2bProcess;

  if (msg.pty !== undefined && msg.pty !== null) {
    const size = objectField(objectField(msg.pty, 'pty').size, 'pty.size');
    const cols = Math.min(1000, Math.max(1, uintField(size.cols, 'pty.size.cols', 80)));
    const rows = Math.min(1000, Math.max(1, uintField(size.rows, 'pty.size.rows', 24)));
    // PTYs are Warren shell sessions: an interactive bash (what E2B's pty.create starts).
    if (!isShell(config.cmd)) throw new E2bError(501, 'PTY processes run the interactive shell (/bin/bash); other PTY commands are not supported', 'unimplemented');
    const att = await plane.ctx.shim.openSession(info.id, { mode: 'pty', cols, rows, env: config.envs, ...(config.cwd ? { cwd: config.cwd } : {}), user });
    proc = new E2bProcess(pid, info.id, config, tag, null, att);
    table.add(proc);
    attach(proc, stream, (event) => ({ event }));
    stream.send({ event: processEvent(proc) });
    att.onOutput((o) => proc.emit({ stream: 'pty', data: o.data }));
    att.onExit((s) => {
      proc.finish(endStatus(s.exitCode, s.signal));
      table.remove(pid);
      void att.close().catch(() => undefined);
    });
  } else {
    let exec: ExecStream;
    try {
      exec = await plane.ctx.shim.execStream(info.id, { cmd: [config.cmd, ...config.args], env: config.envs, ...(config.cwd ? { cwd: config.cwd } : {}), user });
    } catch (err) {
      if (err instanceof WarrenError && err.code === 'SPAWN_ERROR' && err.errno === 2) throw new E2bError(404, `cannot start ${config.cmd}: no such file or directory (or working directory ${config.cwd} is missing)`, 'not_found');
      throw err;
    }
    proc = new E2bProcess(pid, info.id, config, tag, exec, null);
    table.add(proc);
    exec.stdin.on('error', () => undefined);
    if (!wantStdin) exec.stdin.end();
    attach(proc, stream, (event) => ({ event }));
    stream.send({ event: processEvent(proc) });
    let open = 2;
    let exitStatus: { exitCode: number | null; signal: number | null } | null = null;
    let grace: NodeJS.Timeout | null = null;
    const done = () => {
      if (exitStatus === null || proc.ended) return;
      if (grace) clearTimeout(grace);
      proc.finish(endStatus(exitStatus.exitCode, exitStatus.signal));
      table.remove(pid);
    };
    for (const [s, name] of [
      [exec.stdout, 'stdout'],
      [exec.stderr, 'stderr'],
    ] as const) {
      s.on('data', (d: Buffer) => proc.emit({ stream: name, data: d }));
      s.on('error', () => undefined);
      s.on('close', () => {
        if (--open === 0) done();
      });
    }
    void exec.exited.then((st) => {
      exitStatus = st;
      if (open === 0) return done();
      // Background children may hold the pipes open: do not wait for them forever.
      grace = setTimeout(() => {
        exec.stdout.destroy();
        exec.stderr.destroy();
        done();
      }, 100);
    });
  }
  proc.setDeadline(deadline);
  stream.startKeepalive(header(req, 'keepalive-ping-interval'));
}

async function connectProcess(plane: Plane, info: SandboxInfo, msg: Record<string, unknown>, req: Request, stream: ConnectStream): Promise<void> {
  const p = tableOf(plane, info.id).get(selectorOf(msg));
  attach(p, stream, (event) => ({ event }));
  stream.send({ event: processEvent(p) });
  stream.startKeepalive(header(req, 'keepalive-ping-interval'));
  // The deadline of a Connect call bounds this stream, not the process.
  stream.setDeadline(parseConnectTimeout(header(req, 'connect-timeout-ms')));
}

function processUnary(plane: Plane): Record<string, Unary> {
  return {
    List: async (info) => ({
      processes: tableOf(plane, info.id)
        .list()
        .map((p) => {
          const config: Record<string, unknown> = { cmd: p.config.cmd, args: p.config.args, envs: p.config.envs };
          if (p.config.cwd !== undefined) config.cwd = p.config.cwd;
          return { config, pid: p.pid, ...(p.tag !== undefined ? { tag: p.tag } : {}) };
        }),
    }),
    SendInput: async (info, msg) => {
      const p = tableOf(plane, info.id).get(selectorOf(msg));
      const input = objectField(msg.input, 'input');
      if (input.pty !== undefined) p.writeInput(bytesField(input.pty, 'input.pty'), true);
      else p.writeInput(bytesField(input.stdin, 'input.stdin'), false);
      return {};
    },
    SendSignal: async (info, msg) => {
      const p = tableOf(plane, info.id).get(selectorOf(msg));
      const sig = enumField(msg.signal, 'signal', SIGNALS);
      if (sig !== 9 && sig !== 15) throw new E2bError(400, 'signal: SIGNAL_SIGTERM or SIGNAL_SIGKILL', 'invalid_argument');
      p.signal(sig);
      return {};
    },
    CloseStdin: async (info, msg) => {
      tableOf(plane, info.id).get(selectorOf(msg)).closeStdin();
      return {};
    },
    Update: async (info, msg) => {
      const p = tableOf(plane, info.id).get(selectorOf(msg));
      if (msg.pty === undefined || msg.pty === null) return {};
      if (!p.pty) throw new E2bError(400, `process ${p.pid} has no PTY`, 'failed_precondition');
      const size = objectField(objectField(msg.pty, 'pty').size, 'pty.size');
      p.pty.resize(Math.min(1000, Math.max(1, uintField(size.cols, 'pty.size.cols', 80))), Math.min(1000, Math.max(1, uintField(size.rows, 'pty.size.rows', 24))));
      return {};
    },
  };
}

// ---------------------------------------------------------------- filesystem.Filesystem

const FIND_FORMAT = '%y\\0%s\\0%m\\0%M\\0%u\\0%g\\0%T@\\0%l\\0%p\\0';
const FIELDS = 9;

/** envd's EntryInfo (proto3 JSON: int64 as a string, enums by name). */
export interface EntryJson {
  name: string;
  type: string;
  path: string;
  size: string;
  mode: number;
  permissions: string;
  owner: string;
  group: string;
  modifiedTime: string;
  symlinkTarget?: string;
}

/** Parse `find -printf FIND_FORMAT` output into entries (unit-tested). */
export function parseFindOutput(out: string): EntryJson[] {
  const f = out.split('\0');
  const entries: EntryJson[] = [];
  for (let i = 0; i + FIELDS <= f.length; i += FIELDS) {
    const [y, size, mode, perms, owner, group, mtime, link, path] = f.slice(i, i + FIELDS) as string[];
    const type = y === 'f' ? 'FILE_TYPE_FILE' : y === 'd' ? 'FILE_TYPE_DIRECTORY' : y === 'l' ? 'FILE_TYPE_SYMLINK' : 'FILE_TYPE_UNSPECIFIED';
    const e: EntryJson = {
      name: posix.basename(path!),
      type,
      path: path!,
      size: /^\d+$/.test(size!) ? size! : '0',
      mode: parseInt(mode!, 8) || 0,
      permissions: perms!,
      owner: owner!,
      group: group!,
      modifiedTime: timestampJson(Number(mtime) * 1000 || 0),
    };
    if (y === 'l') e.symlinkTarget = link!;
    entries.push(e);
  }
  return entries;
}

const FS_SCRIPTS = {
  exists: '[ -e "$1" ] || [ -L "$1" ] || { echo "no such file or directory: $1" >&2; exit 2; }',
  stat: `exec find "$1" -maxdepth 0 -printf '${FIND_FORMAT}'`,
};

async function fsRun(plane: Plane, id: string, user: string, script: string, args: string[]): Promise<string> {
  const r = await plane.ctx.shim.exec(id, { cmd: ['/bin/sh', '-c', script, 'e2b-fs', ...args], user, timeoutMs: 60_000, maxOutputBytes: 64 * 1024 * 1024 });
  if (r.exitCode === 0 || (r.exitCode === 1 && r.stdout.length > 0 && /Permission denied/.test(r.stderr))) return r.stdout;
  const msg = (r.stderr.trim() || r.status).split('\n').slice(-3).join('; ').slice(0, 500);
  switch (r.exitCode) {
    case 2:
      throw new E2bError(404, msg, 'not_found');
    case 17:
      throw new E2bError(409, msg, 'already_exists');
    case 20:
      throw new E2bError(400, msg, 'invalid_argument');
    default:
      if (/Permission denied/i.test(msg)) throw new E2bError(403, msg, 'permission_denied');
      if (/No space left/i.test(msg)) throw new E2bError(507, msg, 'resource_exhausted');
      if (r.status === 'timeout') throw new E2bError(504, 'filesystem operation timed out', 'deadline_exceeded');
      throw new E2bError(500, msg, 'internal');
  }
}

function one(entries: EntryJson[], path: string): EntryJson {
  const e = entries[0];
  if (!e) throw new E2bError(404, `no such file or directory: ${path}`, 'not_found');
  return e;
}

function filesystemUnary(plane: Plane): Record<string, Unary> {
  const userOf = (req: Request) => requestUser(userFromBasicAuth(header(req, 'authorization')));
  return {
    Stat: async (info, msg, req) => {
      const user = userOf(req);
      const path = resolvePath(stringField(msg.path, 'path'), user);
      return { entry: one(parseFindOutput(await fsRun(plane, info.id, user, `${FS_SCRIPTS.exists}\n${FS_SCRIPTS.stat}`, [path])), path) };
    },
    ListDir: async (info, msg, req) => {
      const user = userOf(req);
      const path = resolvePath(stringField(msg.path, 'path'), user);
      const depth = Math.min(64, Math.max(1, uintField(msg.depth, 'depth', 1)));
      const script = `${FS_SCRIPTS.exists}\n[ -d "$1" ] || { echo "path is not a directory: $1" >&2; exit 20; }\nexec find "$1" -mindepth 1 -maxdepth "$2" -printf '${FIND_FORMAT}'`;
      const entries = parseFindOutput(await fsRun(plane, info.id, user, script, [path, String(depth)]));
      return { entries: entries.filter((e) => e.type !== 'FILE_TYPE_UNSPECIFIED') };
    },
    MakeDir: async (info, msg, req) => {
      const user = userOf(req);
      const path = resolvePath(stringField(msg.path, 'path'), user);
      const script = `if [ -e "$1" ] || [ -L "$1" ]; then echo "directory already exists: $1" >&2; exit 17; fi\nmkdir -p -- "$1" || exit 1\n${FS_SCRIPTS.stat}`;
      return { entry: one(parseFindOutput(await fsRun(plane, info.id, user, script, [path])), path) };
    },
    Move: async (info, msg, req) => {
      const user = userOf(req);
      const source = resolvePath(stringField(msg.source, 'source'), user, 'source');
      const destination = resolvePath(stringField(msg.destination, 'destination'), user, 'destination');
      const script = `${FS_SCRIPTS.exists}\nmkdir -p -- "$(dirname -- "$2")" && mv -T -- "$1" "$2" || exit 1\nexec find "$2" -maxdepth 0 -printf '${FIND_FORMAT}'`;
      return { entry: one(parseFindOutput(await fsRun(plane, info.id, user, script, [source, destination])), destination) };
    },
    Remove: async (info, msg, req) => {
      const user = userOf(req);
      const path = resolvePath(stringField(msg.path, 'path'), user);
      if (path === '/') throw new E2bError(400, 'refusing to remove /', 'invalid_argument');
      await fsRun(plane, info.id, user, `${FS_SCRIPTS.exists}\nexec rm -rf -- "$1"`, [path]);
      return {};
    },
  };
}

/**
 * WatchDir: the node's directory watch (Shim.watchDir; for containers inotify
 * on directories opened by the confined walk, src/shim/backends/container-watch.ts),
 * after checking that the user may list the directory.
 */
async function watchDir(plane: Plane, info: SandboxInfo, msg: Record<string, unknown>, req: Request, stream: ConnectStream): Promise<void> {
  const user = requestUser(userFromBasicAuth(header(req, 'authorization')));
  const path = resolvePath(stringField(msg.path, 'path'), user);
  const recursive = boolField(msg.recursive, 'recursive');
  // The user must be able to list the directory (envd watches as that user).
  await fsRun(plane, info.id, user, `${FS_SCRIPTS.exists}\n[ -d "$1" ] || { echo "path is not a directory: $1" >&2; exit 20; }\n[ -r "$1" ] && [ -x "$1" ] || { echo "Permission denied: $1" >&2; exit 13; }`, [path]);
  let w: DirWatch;
  try {
    w = await plane.ctx.shim.watchDir(info.id, path, { recursive });
  } catch (err) {
    if (err instanceof WarrenError && err.code === 'FILE_NOT_FOUND') throw new E2bError(404, `cannot watch ${path}`, 'not_found');
    throw err;
  }
  const TYPES = { create: 'EVENT_TYPE_CREATE', write: 'EVENT_TYPE_WRITE', remove: 'EVENT_TYPE_REMOVE' } as const;
  w.onEvent((e) => stream.send({ filesystem: { name: e.name, type: TYPES[e.type] } }));
  stream.onClosed(() => w.close());
  stream.send({ start: {} });
  stream.startKeepalive(header(req, 'keepalive-ping-interval'));
  stream.setDeadline(parseConnectTimeout(header(req, 'connect-timeout-ms')));
}

// ---------------------------------------------------------------- /files and /health

function sendPlainError(res: Response, e: E2bError, close: boolean): void {
  if (res.completed) return;
  res.status(e.status);
  res.header('content-type', 'application/json');
  if (close) res.header('connection', 'close');
  res.send(JSON.stringify({ code: e.status, message: e.message }), close);
}

async function writeOne(plane: Plane, id: string, user: string, path: string, data: Buffer): Promise<void> {
  const proc = await plane.ctx.shim.execStream(id, { cmd: ['/bin/sh', '-c', 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"', 'e2b-write', path], user, timeoutMs: 300_000 });
  const stderr: Buffer[] = [];
  proc.stderr.on('data', (c: Buffer) => stderr.push(c));
  proc.stdout.resume();
  proc.stdin.on('error', () => undefined);
  proc.stdin.end(data);
  const st = await proc.exited;
  if (st.exitCode === 0) return;
  const msg = Buffer.concat(stderr).toString('utf8').trim().slice(0, 500) || `writing ${path} failed`;
  if (/No space left|Disk quota/i.test(msg)) throw new E2bError(507, msg, 'resource_exhausted');
  if (/Permission denied/i.test(msg)) throw new E2bError(403, msg, 'permission_denied');
  if (/Is a directory|Not a directory/i.test(msg)) throw new E2bError(400, msg, 'invalid_argument');
  throw new E2bError(500, msg, 'internal');
}

function gunzipLimited(data: Buffer, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) =>
    gunzip(data, { maxOutputLength: limit }, (err, out) => (err ? reject(new E2bError((err as NodeJS.ErrnoException).code === 'ERR_BUFFER_TOO_LARGE' ? 413 : 400, `gzip body: ${err.message}`, 'invalid_argument')) : resolve(out))),
  );
}

async function upload(plane: Plane, req: Request, res: Response): Promise<void> {
  const info = await planeSandbox(plane, req);
  const q = new URLSearchParams(req.path_query);
  const user = requestUser(q.get('username') ?? undefined);
  const limit = plane.ctx.uploadLimit;
  let body = await readBodyAnyEncoding(req, limit);
  if (/gzip/i.test(header(req, 'content-encoding') ?? '')) body = await gunzipLimited(body, limit);
  await ensureUser(plane, info.id);
  const files: { path: string; data: Buffer }[] = [];
  const boundary = multipartBoundary(header(req, 'content-type'));
  const queryPath = q.get('path') ?? undefined;
  if (boundary !== undefined) {
    for (const part of parseMultipart(body, boundary)) {
      if (part.filename === undefined && part.name !== 'file') continue;
      const target = part.filename !== undefined && part.filename !== '' && part.filename !== 'blob' ? part.filename : queryPath;
      if (target === undefined) throw new E2bError(400, 'a multipart file part needs a filename (its destination path) or ?path=', 'invalid_argument');
      files.push({ path: resolvePath(target, user, 'filename'), data: part.data });
    }
  } else {
    if (queryPath === undefined) throw new E2bError(400, 'path: query parameter is required for non-multipart uploads', 'invalid_argument');
    files.push({ path: resolvePath(queryPath, user), data: body });
  }
  if (files.length === 0) throw new E2bError(400, 'no file parts in the upload (field "file")', 'invalid_argument');
  for (const f of files) if (f.path === '/') throw new E2bError(400, 'cannot write to /', 'invalid_argument');
  for (const f of files) await writeOne(plane, info.id, user, f.path, f.data);
  sendJsonBody(res, 200, JSON.stringify(files.map((f) => ({ name: posix.basename(f.path), path: f.path, type: 'file' }))));
}

async function download(plane: Plane, req: Request, res: Response): Promise<void> {
  const info = await planeSandbox(plane, req);
  const q = new URLSearchParams(req.path_query);
  const user = requestUser(q.get('username') ?? undefined);
  const raw = q.get('path');
  if (raw === null) throw new E2bError(400, 'path: query parameter is required', 'invalid_argument');
  const path = resolvePath(raw, user);
  await ensureUser(plane, info.id);
  const script = '[ -e "$1" ] || { echo "file not found: $1" >&2; exit 2; }\n[ -d "$1" ] && { echo "path is a directory: $1" >&2; exit 21; }\n[ -r "$1" ] || { echo "Permission denied: $1" >&2; exit 13; }\nexec cat -- "$1"';
  const proc = await plane.ctx.shim.execStream(info.id, { cmd: ['/bin/sh', '-c', script, 'e2b-read', path], user, timeoutMs: 3_600_000 });
  proc.stdin.on('error', () => undefined);
  proc.stdin.end();
  const stderr: Buffer[] = [];
  proc.stderr.on('data', (c: Buffer) => stderr.push(c));
  // Hold the answer until the first byte or the exit: errors get a status, files stream.
  const first = await new Promise<Buffer | null>((resolve) => {
    const onData = (c: Buffer) => {
      proc.stdout.pause();
      proc.stdout.off('data', onData);
      resolve(c);
    };
    proc.stdout.on('data', onData);
    void proc.exited.then(() => setImmediate(() => resolve(null)));
  });
  if (first === null) {
    const st = await proc.exited;
    const msg = Buffer.concat(stderr).toString('utf8').trim().slice(0, 500);
    if (st.exitCode === 2) throw new E2bError(404, msg, 'not_found');
    if (st.exitCode === 21) throw new E2bError(400, msg, 'invalid_argument');
    if (st.exitCode === 13) throw new E2bError(403, msg, 'permission_denied');
    if (st.exitCode !== 0) throw new E2bError(500, msg || `reading ${path} failed`, 'internal');
    res.status(200).header('content-type', 'application/octet-stream').header('content-length', '0');
    res.send('');
    return;
  }
  res.status(200);
  res.header('content-type', 'application/octet-stream');
  res.header('content-disposition', `attachment; filename="${posix.basename(path).replace(/["\\\r\n]/g, '_')}"`);
  res.on('close', () => proc.kill(9));
  if (!res.write(first)) await new Promise<void>((r) => res.once("drain", () => r()));
  proc.stdout.on('data', (c: Buffer) => {
    if (!res.write(c)) {
      proc.stdout.pause();
      res.once('drain', () => proc.stdout.resume());
    }
  });
  proc.stdout.resume();
  // The whole file may have come with the first chunk: then stdout has already ended and closed.
  await new Promise<void>((resolve) => (proc.stdout.closed || proc.stdout.destroyed ? resolve() : proc.stdout.once('close', () => resolve())));
  const st = await proc.exited;
  if (res.completed) return;
  // A read that failed half-way must not look like a whole file.
  if (st.exitCode === 0) res.end();
  else res.close();
}

export function registerEnvd(app: Server, plane: Plane): void {
  registerService(app, plane, 'process.Process', processUnary(plane), {
    Start: (info, msg, req, stream) => startProcess(plane, info, msg, req, stream),
    Connect: (info, msg, req, stream) => connectProcess(plane, info, msg, req, stream),
  });
  registerService(app, plane, 'filesystem.Filesystem', filesystemUnary(plane), {
    WatchDir: (info, msg, req, stream) => watchDir(plane, info, msg, req, stream),
  });

  const plain = (fn: (req: Request, res: Response) => Promise<void>) => async (req: Request, res: Response) => {
    try {
      await fn(req, res);
    } catch (err) {
      sendPlainError(res, toE2bError(err, (e) => publicError(e, plane.log)), bodyPending(req) && !res.completed);
    }
  };
  app.get(
    '/health',
    plain(async (req, res) => {
      await planeSandbox(plane, req);
      res.status(204).send();
    }),
  );
  app.get('/files', plain((req, res) => download(plane, req, res)));
  app.post('/files', plain((req, res) => upload(plane, req, res)));
}
