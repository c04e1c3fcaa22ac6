/**
 * Client side of the shell WebSocket protocol (docs/shell-protocol.md).
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { IncomingMessage } from 'node:http';
import WebSocket from 'ws';
import { WarrenError, type ErrorCode, ErrorCodes } from '../errors';
import { UnackedInput } from '../shim/sessions/input-numbering';
import type { SessionMode } from '../shim/types';

export interface ShellOptions {
  mode?: SessionMode;
  /** Attach to an existing session instead of opening a new one. */
  session?: string;
  /** With `session`: replay output from this offset (default 0: everything still buffered). */
  offset?: number;
  cols?: number;
  rows?: number;
  /** Handshake timeout (default 30 s). */
  connectTimeoutMs?: number;
  /** Output listener installed before the handshake, so replayed output right after hello is never missed. */
  onOutput?: (out: ShellOutput) => void;
  /**
   * Re-attach by itself when the connection breaks (closed without a close frame, the gateway
   * going away, the gateway losing the session's node): from the last offset received, so no
   * output is lost or repeated, and a command in flight is resumed (it runs exactly once) instead
   * of failing. Input (write, resize, signal) is numbered and kept until the gateway acknowledges
   * it, so it reaches the session exactly once too, also what is written while the connection is
   * made again. Tried for `reconnectWindowMs` (default 15 s). Default true.
   */
  reconnect?: boolean;
  reconnectWindowMs?: number;
}

/** Input kept for the gateway until it acknowledges it (while the connection is made again, too). */
const UNACKED_MAX_BYTES = 1024 * 1024;

/** Close codes after which the session is still there to re-attach to. */
const RESUMABLE_CLOSE = new Set([1001, 1006, 1011, 1012, 1013, 4500]);

export interface ShellOutput {
  stream: 'stdout' | 'stderr' | 'pty';
  /** Absolute offset of `data` in the session's output stream. */
  offset: number;
  data: Buffer;
}

export interface CommandOutcome {
  exitCode: number | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  /** Output bytes of this command the session's buffer dropped before this client took them (set when > 0: the client read too slowly). */
  lostBytes?: number;
  /** Set when the gateway answered a run with an idempotency key that had already run: the first run's result. */
  replayed?: boolean;
  /** With replayed: the stored output was cut at the gateway's bound. */
  truncated?: boolean;
}

export interface RunOptions {
  timeoutMs?: number;
  /**
   * A client request id (docs/idempotency.md): within the gateway's window the
   * command runs once in this session for this key. After a lost connection,
   * re-attach (`sandbox.shell({ session, offset })`) and run it again with the
   * same key: you get the first run's result (`replayed: true`), waiting for it
   * if it is still running, also across a gateway restart.
   */
  idempotencyKey?: string;
}

export interface ShellExit {
  exitCode: number | null;
  signal: number | null;
}

interface ActiveRun {
  id: string;
  stdout: Buffer[];
  stderr: Buffer[];
  lost: number;
  resolve: (r: CommandOutcome) => void;
  reject: (e: Error) => void;
  /** The message, sent again after a re-attach (as a resume, or with its idempotency key). */
  msg: Record<string, unknown>;
}

export declare interface ShellClient {
  on(event: 'output', listener: (out: ShellOutput) => void): this;
  on(event: 'done', listener: (d: { id: string; exitCode: number | null; timedOut: boolean }) => void): this;
  on(event: 'exit', listener: (e: ShellExit) => void): this;
  on(event: 'error', listener: (e: WarrenError) => void): this;
  on(event: 'close', listener: (code: number, reason: string) => void): this;
  on(event: 'reconnect', listener: (r: { code: number; attempts: number }) => void): this;
  on(event: string, listener: (...args: any[]) => void): this;
}

/**
 * One attachment to a shell session. `close()` ends the session; `detach()`
 * only drops this connection (re-attach later with `{ session, offset }`).
 * Events: `output`, `done`, `exit`, `error` (server error frames not tied to
 * a `run`), `close` (code, reason).
 */
export class ShellClient extends EventEmitter {
  /** Session id (use it to re-attach). */
  session = '';
  mode: SessionMode = 'command';
  /** Next output offset: everything before it has been received. */
  offset = 0;
  closed = false;
  closeCode: number | null = null;
  closeReason = '';
  exit: ShellExit | null = null;

  private ws!: WebSocket;
  private active: ActiveRun | null = null;
  /** Output below this offset existed before we attached (replay). */
  private replayEnd = 0;
  private queue: Promise<unknown> = Promise.resolve();
  private nextId = 1;
  /** Command ids are this client's own: an id of an earlier attachment's command, replayed, never answers a new run. */
  private readonly idPrefix = `c${randomBytes(4).toString('hex')}-`;
  private readonly closedPromise: Promise<void>;
  private resolveClosed!: () => void;
  /** This client's name for its numbered input (docs/shell-protocol.md, "Lost connections"). */
  private readonly writer = randomBytes(12).toString('base64url');
  /** Input sent, or waiting for the connection, that the gateway has not acknowledged. */
  private readonly unacked = new UnackedInput(UNACKED_MAX_BYTES);
  /** The socket is open and what was not acknowledged has been sent again on it. */
  private linkUp = false;

  /** Output that arrived before anyone listened (bounded); flushed to the first 'output' listener. */
  private early: ShellOutput[] | null = [];
  private earlyBytes = 0;

  private constructor() {
    super();
    this.closedPromise = new Promise((r) => (this.resolveClosed = r));
    this.on('newListener', (event: string) => {
      if (event !== 'output' || this.early === null) return;
      const early = this.early;
      this.early = null;
      if (early.length > 0) queueMicrotask(() => early.forEach((o) => this.emit('output', o)));
    });
  }

  private emitOutput(out: ShellOutput): void {
    if (this.early !== null) {
      if (this.earlyBytes + out.data.length <= 1024 * 1024) {
        this.early.push(out);
        this.earlyBytes += out.data.length;
      }
      return;
    }
    this.emit('output', out);
  }

  /** Open the socket and wait for the server's hello. */
  static connect(url: string, token: string | undefined, opts: ShellOptions = {}): Promise<ShellClient> {
    const client = new ShellClient();
    return client.start(url, token, opts);
  }

  private url = '';
  private token: string | undefined;
  private opts: ShellOptions = {};
  /** detach() or close() was called: the socket's end is ours. */
  private ending = false;
  /** The connection broke and the session is being attached again: runs wait for it. */
  private reattaching: Promise<void> | null = null;

  private start(url: string, token: string | undefined, opts: ShellOptions): Promise<ShellClient> {
    this.url = url;
    this.token = token;
    this.opts = opts;
    if (opts.onOutput) this.on('output', opts.onOutput);
    return this.open(opts).then(
      (liveOffset) => {
        this.replayEnd = liveOffset;
        this.linkUp = true;
        return this;
      },
      (err) => {
        this.closed = true;
        this.resolveClosed();
        throw err;
      },
    );
  }

  /** One socket: resolves at its hello with the hello's live offset, rejects if it ends before. Its close after that is onSocketClose's. */
  private open(opts: ShellOptions): Promise<number> {
    const u = new URL(this.url);
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    if (opts.mode) u.searchParams.set('mode', opts.mode);
    if (opts.session) u.searchParams.set('session', opts.session);
    if (opts.offset !== undefined) u.searchParams.set('offset', String(opts.offset));
    if (opts.cols !== undefined) u.searchParams.set('cols', String(opts.cols));
    if (opts.rows !== undefined) u.searchParams.set('rows', String(opts.rows));
    if (this.numbered) u.searchParams.set('writer', this.writer);
    const headers: Record<string, string> = {};
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    const ws = new WebSocket(u.toString(), {
      headers,
      perMessageDeflate: false,
      handshakeTimeout: this.opts.connectTimeoutMs ?? 30_000,
      maxPayload: 64 * 1024 * 1024,
    });
    ws.binaryType = 'nodebuffer';
    this.ws = ws;

    return new Promise<number>((resolve, reject) => {
      let settled = false;
      /** The hello came: from here on, this socket's close is the session's connection ending. */
      let attached = false;
      const fail = (err: Error) => {
        if (settled) return;
        settled = true;
        reject(err);
      };
      ws.on('unexpected-response', (req, res: IncomingMessage) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          fail(errorFromBody(res.statusCode ?? 0, Buffer.concat(chunks).toString('utf8')));
          req.destroy();
        });
        res.on('error', (e) => fail(unavailable(e)));
      });
      ws.on('error', (err) => {
        if (!settled) fail(unavailable(err));
        else if (this.listenerCount('error') > 0) this.emit('error', unavailable(err));
      });
      ws.on('message', (data: Buffer, isBinary: boolean) => {
        if (!settled) {
          // The first frame is always hello.
          let hello: Record<string, unknown>;
          try {
            hello = JSON.parse(data.toString('utf8')) as Record<string, unknown>;
          } catch {
            fail(new WarrenError('INTERNAL', 'shell: first frame was not a hello'));
            ws.terminate();
            return;
          }
          if (hello.type === 'error') {
            fail(new WarrenError(hello.code as ErrorCode, String(hello.message)));
            ws.terminate();
            return;
          }
          if (hello.type !== 'hello') {
            fail(new WarrenError('INTERNAL', `shell: expected hello, got ${String(hello.type)}`));
            ws.terminate();
            return;
          }
          this.session = String(hello.session);
          this.mode = hello.mode === 'pty' ? 'pty' : 'command';
          this.offset = Number(hello.offset) || 0;
          settled = true;
          attached = true;
          resolve(Number(hello.liveOffset) || this.offset);
          return;
        }
        this.onFrame(data, isBinary);
      });
      ws.on('close', (code: number, reason: Buffer) => {
        // A socket that never attached (refused, reset, an error status) was this open's failure,
        // already reported to its caller: it is not a connection of the session that broke.
        if (!attached) {
          fail(new WarrenError('UNAVAILABLE', `shell closed during the handshake (${code} ${reason.toString('utf8')})`));
          return;
        }
        this.onSocketClose(ws, code, reason.toString('utf8'));
      });
    });
  }

  private onSocketClose(ws: WebSocket, code: number, reason: string): void {
    // one reattach at a time: the one under way owns the session's recovery
    if (ws !== this.ws || this.closed || this.reattaching !== null) return;
    this.linkUp = false;
    const resumable = !this.ending && this.exit === null && this.opts.reconnect !== false && this.session !== '' && RESUMABLE_CLOSE.has(code);
    if (resumable) {
      this.reattaching = this.reattach(code, reason).finally(() => (this.reattaching = null));
      return;
    }
    this.ended(code, reason);
  }

  /** The socket is gone for good: fail what waits, tell the listeners. */
  private ended(code: number, reason: string): void {
    this.closed = true;
    this.closeCode = code;
    this.closeReason = reason;
    this.unacked.clear();
    const active = this.active;
    this.active = null;
    if (active) active.reject(closedError(code, reason));
    this.emit('close', code, reason);
    this.resolveClosed();
  }

  /**
   * Attach to the same session again from the last offset received, for up to the reconnect
   * window, and send the command in flight again: as a resume (the shell runs it only if the
   * first message never reached it), or with its idempotency key (the gateway answers the first
   * run's result).
   */
  private async reattach(code: number, reason: string): Promise<void> {
    const deadline = Date.now() + (this.opts.reconnectWindowMs ?? 15_000);
    let delay = 50;
    let attempts = 0;
    for (;;) {
      if (this.closed) return;
      if (this.ending) {
        this.ended(code, reason);
        return;
      }
      attempts++;
      try {
        const again: ShellOptions = { mode: this.mode, session: this.session, offset: this.offset };
        const from = this.offset;
        await this.open(again);
        if (this.ending) {
          this.ws.close(1000, 'detach');
          return;
        }
        // output at or after where this client had got to is the command in flight's own
        this.replayEnd = from;
        if (this.active !== null) {
          const msg = this.active.msg;
          this.ws.send(JSON.stringify(msg.idempotencyKey === undefined ? { ...msg, resume: true } : msg));
        }
        // input the gateway has not acknowledged: it skips what it applied before the break
        for (const text of this.unacked.texts()) this.ws.send(text);
        this.linkUp = true;
        this.emit('reconnect', { code, attempts });
        return;
      } catch (err) {
        const e = err as WarrenError;
        // the session or the sandbox is gone, or this token may no longer attach: nothing to resume
        const final = e instanceof WarrenError && e.status >= 400 && e.status < 500;
        if (final || this.ending || Date.now() + delay > deadline) {
          this.ended(code, reason);
          return;
        }
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 2, 1000);
      }
    }
  }

  private onFrame(data: Buffer, isBinary: boolean): void {
    if (isBinary) {
      const out: ShellOutput = { stream: 'pty', offset: this.offset, data };
      this.offset += data.length;
      this.emitOutput(out);
      return;
    }
    let m: Record<string, any>;
    try {
      m = JSON.parse(data.toString('utf8'));
    } catch {
      return;
    }
    switch (m.type) {
      case 'output': {
        const buf = m.encoding === 'base64' ? Buffer.from(String(m.data), 'base64') : Buffer.from(String(m.data), 'utf8');
        const stream: ShellOutput['stream'] = m.stream === 'stderr' ? 'stderr' : 'stdout';
        const offset = Number(m.offset);
        this.offset = Math.max(this.offset, offset + buf.length);
        // Replayed output belongs to commands from before this attachment, not to a new run.
        if (this.active && offset >= this.replayEnd) (stream === 'stderr' ? this.active.stderr : this.active.stdout).push(buf);
        this.emitOutput({ stream, offset, data: buf });
        return;
      }
      case 'done': {
        const id = String(m.id);
        const d = { id, exitCode: m.exitCode ?? null, timedOut: Boolean(m.timedOut) };
        if (typeof m.offset === 'number' && m.offset > this.offset) this.offset = m.offset;
        const active = this.active;
        if (active && active.id === id) {
          this.active = null;
          const enc = m.encoding === 'base64' ? 'base64' : 'utf8';
          const outcome: CommandOutcome =
            m.replayed === true
              ? {
                  exitCode: d.exitCode,
                  stdout: Buffer.from(String(m.stdout ?? ''), enc).toString('utf8'),
                  stderr: Buffer.from(String(m.stderr ?? ''), enc).toString('utf8'),
                  timedOut: d.timedOut,
                  replayed: true,
                  ...(m.truncated === true ? { truncated: true } : {}),
                }
              : {
                  exitCode: d.exitCode,
                  stdout: Buffer.concat(active.stdout).toString('utf8'),
                  stderr: Buffer.concat(active.stderr).toString('utf8'),
                  timedOut: d.timedOut,
                };
          if (active.lost > 0 && m.replayed !== true) outcome.lostBytes = active.lost;
          active.resolve(outcome);
        }
        this.emit('done', d);
        return;
      }
      case 'exit':
        this.exit = { exitCode: m.exitCode ?? null, signal: m.signal ?? null };
        this.emit('exit', this.exit);
        return;
      case 'error': {
        const err = new WarrenError(m.code as ErrorCode, String(m.message));
        const active = this.active;
        if (m.id !== undefined && active && active.id === String(m.id)) {
          this.active = null;
          active.reject(err);
        } else if (this.listenerCount('error') > 0) {
          this.emit('error', err);
        }
        return;
      }
      case 'lost':
        // The session's buffer dropped output before we took it (we read too slowly, or re-attached late).
        if (typeof m.offset === 'number' && m.offset > this.offset) this.offset = m.offset;
        if (this.active && typeof m.offset === 'number' && m.offset > this.replayEnd) this.active.lost += Number(m.bytes) || 0;
        this.emit('lost', Number(m.bytes) || 0);
        return;
      case 'pong':
        this.emit('pong', m);
        return;
      case 'ack':
        this.unacked.ack(Number(m.seq));
        return;
      default:
        return;
    }
  }

  private sendJson(obj: object): void {
    if (this.closed || this.ws.readyState !== WebSocket.OPEN) throw new WarrenError('UNAVAILABLE', 'shell connection is closed');
    this.ws.send(JSON.stringify(obj));
  }

  /**
   * Command mode: run one command in the session's shell (state such as cwd
   * and variables persists between runs). Runs are queued one at a time.
   */
  run(cmd: string, opts: RunOptions = {}): Promise<CommandOutcome> {
    const next = this.queue.then(async () => {
      if (this.reattaching !== null) await this.reattaching;
      return this.runNow(cmd, opts);
    });
    this.queue = next.catch(() => undefined);
    return next;
  }

  private runNow(cmd: string, opts: RunOptions): Promise<CommandOutcome> {
    return new Promise<CommandOutcome>((resolve, reject) => {
      const id = `${this.idPrefix}${this.nextId++}`;
      const msg: Record<string, unknown> = { type: 'run', id, cmd };
      if (opts.timeoutMs !== undefined) msg.timeoutMs = opts.timeoutMs;
      if (opts.idempotencyKey !== undefined) msg.idempotencyKey = opts.idempotencyKey;
      this.active = { id, stdout: [], stderr: [], lost: 0, resolve, reject, msg };
      try {
        this.sendJson(msg);
      } catch (err) {
        this.active = null;
        reject(err as Error);
      }
    });
  }

  /** Input is numbered (exactly once across re-attaches) unless `reconnect: false`. */
  private get numbered(): boolean {
    return this.opts.reconnect !== false;
  }

  /**
   * A numbered input message: kept until acknowledged, sent now if the connection is up, else
   * when it is made again. Throws once the shell is closed for good, or when 1 MiB of input is
   * already waiting for a gateway that does not answer.
   */
  private sendInput(obj: Record<string, unknown>): void {
    if (this.closed) throw new WarrenError('UNAVAILABLE', 'shell connection is closed');
    const text = this.unacked.add(obj);
    if (text === null) throw new WarrenError('UNAVAILABLE', `shell connection: ${this.unacked.pendingBytes} bytes of input wait for the gateway to take them`);
    if (this.linkUp && this.ws.readyState === WebSocket.OPEN) this.ws.send(text);
  }

  /** Send input: raw terminal bytes in pty mode. */
  write(data: string | Buffer): void {
    const buf = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
    if (this.numbered) return this.sendInput({ type: 'input', data: buf.toString('base64'), encoding: 'base64' });
    if (this.closed || this.ws.readyState !== WebSocket.OPEN) throw new WarrenError('UNAVAILABLE', 'shell connection is closed');
    this.ws.send(buf, { binary: true });
  }

  resize(cols: number, rows: number): void {
    if (this.numbered) return this.sendInput({ type: 'resize', cols, rows });
    this.sendJson({ type: 'resize', cols, rows });
  }

  signal(signal: string = 'INT'): void {
    if (this.numbered) return this.sendInput({ type: 'signal', signal });
    this.sendJson({ type: 'signal', signal });
  }

  /** End the session (its shell is killed) and wait for the socket to close. */
  async close(): Promise<ShellExit | null> {
    if (!this.closed) {
      this.ending = true;
      try {
        this.sendJson({ type: 'close' });
      } catch {
        /* already closing */
      }
      const timer = setTimeout(() => this.ws.terminate(), 10_000);
      await this.closedPromise;
      clearTimeout(timer);
    }
    return this.exit;
  }

  /** Drop this connection; the session keeps running. Re-attach with `{ session, offset }`. */
  async detach(): Promise<void> {
    if (!this.closed) {
      this.ending = true;
      this.ws.close(1000, 'detach');
      const timer = setTimeout(() => this.ws.terminate(), 5_000);
      await this.closedPromise;
      clearTimeout(timer);
    }
  }

  /** Resolves when the socket is closed (by either side). */
  waitClosed(): Promise<void> {
    return this.closedPromise;
  }
}

function unavailable(err: Error): WarrenError {
  return new WarrenError('UNAVAILABLE', `shell connection failed: ${err.message}`);
}

function closedError(code: number, reason: string): WarrenError {
  if (code === 4429) return new WarrenError('RESOURCE_EXHAUSTED', `shell dropped for back-pressure: ${reason}`);
  return new WarrenError('UNAVAILABLE', `shell connection closed (${code}${reason ? ` ${reason}` : ''})`);
}

/** Rebuild the server's `{error:{code,message}}` (or make one from the status). */
export function errorFromBody(status: number, text: string): WarrenError {
  try {
    const parsed = JSON.parse(text) as { error?: { code?: string; message?: string; details?: Record<string, unknown> } };
    const e = parsed.error;
    if (e && typeof e.code === 'string' && Object.hasOwn(ErrorCodes, e.code)) {
      return new WarrenError(e.code as ErrorCode, String(e.message ?? ''), e.details);
    }
  } catch {
    /* not JSON */
  }
  return new WarrenError(codeForStatus(status), `HTTP ${status}${text ? `: ${text.slice(0, 200)}` : ''}`, { status });
}

export function codeForStatus(status: number): ErrorCode {
  switch (status) {
    case 400: return 'INVALID_ARGUMENT';
    case 401: return 'UNAUTHENTICATED';
    case 403: return 'FORBIDDEN';
    case 404: return 'NOT_FOUND';
    case 409: return 'ALREADY_EXISTS';
    case 413: return 'PAYLOAD_TOO_LARGE';
    case 429: return 'RESOURCE_EXHAUSTED';
    case 501: return 'NOT_SUPPORTED';
    case 503: return 'UNAVAILABLE';
    case 504: return 'TIMEOUT';
    case 507: return 'DISK_FULL';
    default: return 'INTERNAL';
  }
}
