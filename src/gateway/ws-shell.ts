/**
 * `WS /v1/sandboxes/:id/shell` — stateful shell sessions over WebSocket.
 * The full protocol is in docs/shell-protocol.md. In short:
 *
 *   upgrade  ?mode=command|pty&session=<id>&offset=<n>&cols=&rows=
 *            auth: `Authorization: Bearer <token>` or subprotocols
 *            `warren.v1, bearer.<token>` (the server selects `warren.v1`)
 *   server   {"type":"hello","session","mode","offset","liveOffset","sandbox"}
 *            {"type":"output","stream","offset","data"[,"encoding":"base64"]}   (command mode)
 *            binary frames = raw terminal output                                 (pty mode)
 *            {"type":"done","id","exitCode","timedOut","offset"}
 *            {"type":"lost","offset","bytes"}      (pty mode: output dropped before this client saw it)
 *            {"type":"exit","exitCode","signal"}   then close 1000
 *            {"type":"error","code","message"[,"id"]}
 *            {"type":"pong"[,"id"]}
 *   client   {"type":"run","id","cmd"[,"timeoutMs"]}
 *            {"type":"input","data"[,"encoding":"base64"]}  or binary frames (pty input)
 *            {"type":"signal","signal":"INT"} {"type":"resize","cols","rows"}
 *            {"type":"close"} (ends the session)  {"type":"ping"[,"id"]}
 *
 * A plain WebSocket close only detaches: the session lives in its holder and
 * can be re-attached with `session=` and `offset=` (missed output is replayed
 * from the holder's bounded buffer).
 *
 * Back-pressure: output is never buffered without bound. When a client's
 * un-sent bytes pass `highWaterBytes`, the gateway stops reading its holder
 * connection (the holder keeps the output in its own bounded ring, and lets
 * this client fall behind after its stall time: `lost` frames). Reading
 * resumes once the client has taken the queue down to a quarter of that. A
 * client that stays over the mark for `stallTimeoutMs`, or whose queue would
 * push the sum of all stalled clients' queues past `bufferBudgetBytes`, is
 * detached and closed with 4429; it re-attaches from the last offset it saw.
 */
import { isUtf8 } from 'node:buffer';
import type { Request, Response, Server, Websocket } from 'hyper-express';
import { WarrenError } from '../errors';
import type { CommandResult, SessionAttachment, SessionMode, SessionOutput } from '../shim/types';
import { InputNumbering, ackBatcher, validateSeq } from '../shim/sessions/input-numbering';
import { bearerFromHeader, bearerFromSubprotocols } from './auth';
import { type GatewayContext, raceSafe, sandboxFor } from './context';
import { publicError, sendError } from './http';
import {
  BoundedBytes,
  type IdempotencyRecord,
  type IdempotencyScope,
  type IdempotencyStore,
  type StoredResult,
  bodyHash,
  recordError,
  validateIdempotencyKey,
} from './idempotency';
import type { Reclaimer } from './reclaim';
import {
  LIMITS,
  expectNumber,
  expectObject,
  expectString,
  parseSignal,
  rejectUnknown,
  sessionOptions,
  validateCommandId,
  validateShellQuery,
} from '../validation';

export const SHELL_SUBPROTOCOL = 'warren.v1';

/** WebSocket close codes used by the shell endpoint. */
export const CLOSE_CODES = {
  /** the session ended (shell exited or {"type":"close"}) */
  SESSION_ENDED: 1000,
  /** the gateway is shutting down; re-attach later */
  GOING_AWAY: 1001,
  /** the client could not keep up with output; re-attach with offset= */
  BACKPRESSURE: 4429,
  /** the attachment to the session failed */
  ATTACHMENT_LOST: 4500,
} as const;

export interface ShellOptions {
  /** Origins allowed to open shells from a browser. Requests with another Origin header are refused. */
  allowedOrigins: readonly string[];
  /** Un-sent bytes per client past which its holder connection is paused (default 256 KiB). */
  highWaterBytes?: number;
  /** How long a client may stay over the high-water mark before it is closed with 4429 (default 10 s). */
  stallTimeoutMs?: number;
  /** The most un-sent bytes all stalled clients together may hold; past it the longest-stalled go (default 64 MiB). */
  bufferBudgetBytes?: number;
  /** Told when connections go, to give their memory back. */
  reclaimer?: Reclaimer;
  /** Largest message a client may send (default 1 MiB). */
  maxMessageBytes?: number;
  /** Seconds without traffic before the socket is closed; pings are sent automatically (default 120). */
  idleTimeoutS?: number;
}

interface UpgradeContext {
  conn: ShellConnection;
}

/** After a 4429 close, how long a client that reads nothing keeps its socket (and queue) before it is cut. */
const CLOSE_GRACE_MS = 5000;

/** How far past the high-water mark a client's queue may go while a paused holder's last output lands. */
const QUEUE_SLACK_BYTES = 4 * 1024 * 1024;

export const SHELL_DEFAULTS = {
  highWaterBytes: 256 * 1024,
  stallTimeoutMs: 10_000,
  bufferBudgetBytes: 64 * 1024 * 1024,
} as const;

interface Limits {
  highWater: number;
  /**
   * The most bytes one client's socket may queue. Output keeps arriving for a moment after the
   * holder is paused (a remote node's frames already in flight); past this the client is dropped
   * with 4429 rather than queueing more.
   */
  queueCap: number;
  lowWater: number;
  stallTimeoutMs: number;
  budget: number;
}

/** The live connections, and the budget that the queues of stalled ones share. */
class ShellRegistry {
  readonly all = new Set<ShellConnection>();
  readonly stalled = new Set<ShellConnection>();
  /** Numbered input of writers that re-attach (`writer=`): each frame applied once on this gateway. */
  readonly inputs = new InputNumbering();

  constructor(
    readonly limits: Limits,
    /** Called when a connection is gone, so that its queue's memory is given back. */
    readonly released: () => void,
  ) {}

  /** A connection went over its high-water mark: drop the longest-stalled ones while the stalled queues exceed the budget. */
  checkBudget(): void {
    let total = 0;
    for (const c of this.stalled) total += c.queuedBytes;
    if (total <= this.limits.budget) return;
    const byAge = [...this.stalled].sort((a, b) => a.stalledSince - b.stalledSince);
    for (const c of byAge) {
      if (total <= this.limits.budget) break;
      total -= c.queuedBytes;
      c.dropSlow('the gateway holds too much output for slow clients');
    }
  }
}
const RECENT_DONE = 64;
const SIGKILL = 9;

/** What a shell connection needs for idempotent runs. */
export interface ShellKeys {
  store: IdempotencyStore;
  account: string;
  /** Another attachment to a session of this sandbox (to follow a keyed command started elsewhere). */
  attach(sessionId: string, fromOffset: number): Promise<SessionAttachment>;
}

interface KeyedRun {
  commandId: string;
  /** Output offset when it was sent: output from here on is its own. */
  from: number;
  stdout: BoundedBytes;
  stderr: BoundedBytes;
}

/**
 * Follow a keyed command that another attachment (maybe of a gateway process
 * that has died) sent: attach to its session from the offset where it began,
 * collect its output, and wait for its status line (or the shell's exit, when
 * the command ended the shell). The holder remembers its last 16 status lines
 * apart from its ring, so a command whose line was dropped from the ring still
 * has its exit code. Stores and returns the result; a session that is gone
 * leaves the outcome unknown (IDEMPOTENCY_INTERRUPTED).
 */
async function collectKeyed(keys: ShellKeys, rec: IdempotencyRecord): Promise<StoredResult> {
  const meta = rec.meta as { session?: string; commandId?: string; startOffset?: number; deadline?: number };
  const interrupted = (why: string): WarrenError => {
    const error = { code: 'IDEMPOTENCY_INTERRUPTED', message: `the first run of this command cannot be followed: ${why}; its outcome is unknown and it is not run again under this key` };
    keys.store.fail(rec.scope, error, 'interrupted');
    return recordError({ ...rec, state: 'interrupted', error });
  };
  if (typeof meta.session !== 'string' || typeof meta.commandId !== 'string' || typeof meta.startOffset !== 'number') throw interrupted('its record is incomplete');
  let att: SessionAttachment;
  try {
    att = await keys.attach(meta.session, meta.startOffset);
  } catch (err) {
    if (err instanceof WarrenError && (err.code === 'SESSION_NOT_FOUND' || err.code === 'SANDBOX_NOT_FOUND')) throw interrupted(`session ${meta.session} has ended`);
    throw err;
  }
  const cap = keys.store.maxStoredOutputBytes;
  const out = new BoundedBytes(cap);
  const err = new BoundedBytes(cap);
  const commandId = meta.commandId;
  const startOffset = meta.startOffset;
  let timedOut = false;
  const timers: NodeJS.Timeout[] = [];
  try {
    const status = await new Promise<{ exitCode: number | null } | null>((resolve) => {
      let lastOutput = Date.now();
      att.onOutput((o) => {
        lastOutput = Date.now();
        if (o.stream === 'stdout') out.push(o.data);
        else if (o.stream === 'stderr') err.push(o.data);
      });
      att.onCommandDone((r) => {
        if (r.commandId === commandId) resolve({ exitCode: r.exitCode });
      });
      att.onExit((st) => resolve({ exitCode: st.exitCode }));
      // The status line may have been dropped from the ring: ask the holder's list of recent ones.
      att.onLost?.(() => {
        att.recentStatus?.(commandId, startOffset).then((st) => st && resolve({ exitCode: st.exitCode }), () => resolve(null));
      });
      // Once a second: a holder that went away ends the wait (its INFO fails), and a status the
      // holder remembers is taken once the replayed output has gone quiet.
      const poll = setInterval(() => {
        att.recentStatus?.(commandId, startOffset).then(
          (st) => {
            if (st !== null && Date.now() - lastOutput >= 1000) resolve({ exitCode: st.exitCode });
          },
          () => resolve(null),
        );
      }, 1000);
      timers.push(poll);
      // The timeout of the first run was the gateway's that sent it: enforced here too, with the
      // same SIGKILL of what the command started (repeated for a while, for commands that fork).
      if (typeof meta.deadline === 'number') {
        const kill = (left: number): void => {
          timedOut = true;
          try {
            if (att.abortCommand) att.abortCommand();
            else att.signal(SIGKILL);
          } catch {
            return;
          }
          if (left > 0) timers.push(setTimeout(() => kill(left - 1), 250));
        };
        timers.push(setTimeout(() => kill(8), Math.max(0, meta.deadline - Date.now())));
      }
    });
    if (status === null) throw interrupted(`the connection to session ${meta.session} ended`);
    // As for a run sent here: what the shell reports after the kill is not the command's status.
    const outcome = { exitCode: timedOut ? null : status.exitCode, timedOut, commandId };
    keys.store.finish(rec.scope, outcome, out.bytes(), err.bytes(), out.total, err.total);
    return { outcome, stdout: out.bytes().subarray(0, cap), stderr: err.bytes().subarray(0, cap), stdoutBytes: out.total, stderrBytes: err.total };
  } finally {
    for (const tm of timers) clearTimeout(tm);
    att.detach();
  }
}

class ShellConnection {
  private ws: Websocket<unknown> | null = null;
  private pending: { data: string | Buffer; binary: boolean }[] = [];
  private pendingBytes = 0;
  /** Over the high-water mark: the holder connection is paused. */
  private throttled = false;
  /** Date.now() when it went over (for the budget's choice of whom to drop). */
  stalledSince = 0;
  private stallTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private ended = false;
  private exitSent = false;
  /** {"type":"close"} is in progress: the attachment is ending the session itself. */
  private closingSession = false;
  /** Command ids reported done lately (run() resolution and onCommandDone may both report one). */
  private readonly recentDone: string[] = [];
  /**
   * Commands this attachment's own run() is running: their answer is that run's result. A status
   * line with the same id replayed from before (a client may reuse ids across attachments, and
   * replay can arrive after the new run started) is an earlier command's and is not reported.
   * What the holder reported for the id meanwhile is kept: it is the answer when run() fails
   * because the command ended the shell (`exit 3`).
   */
  private readonly runningHere = new Map<string, CommandResult | null>();
  /** Next output offset the client has not been sent. */
  private nextOffset: number;
  /** The keyed command this attachment is running: its output is kept for retries. */
  private keyed: KeyedRun | null = null;
  private readonly openTimer: NodeJS.Timeout;
  private readonly ack: (seq: number) => void;

  constructor(
    readonly att: SessionAttachment,
    readonly mode: SessionMode,
    readonly sandboxId: string,
    startOffset: number,
    private readonly registry: ShellRegistry,
    private readonly log: (line: string) => void,
    private readonly keys: ShellKeys | null = null,
    /** `account/sandbox/session/writer` when the client named its writer (writer=): its numbered input is applied once. */
    private readonly writerKey: string | null = null,
  ) {
    this.nextOffset = startOffset;
    this.ack = ackBatcher((seq) => this.sendJson({ type: 'ack', seq }));
    this.sendJson({ type: 'hello', session: att.info.id, mode, offset: startOffset, liveOffset: att.info.outputOffset, sandbox: sandboxId });
    att.onOutput((out) => this.onOutput(out));
    att.onCommandDone((res) => {
      if (this.runningHere.has(res.commandId)) this.runningHere.set(res.commandId, res);
      else this.reportDone(res.commandId, res);
    });
    att.onExit((status) => this.onExit(status));
    // pty mode sees gaps in the offsets of its binary frames; command mode's offsets also count status bytes, so it is told.
    if (mode === 'command') att.onLost?.((bytes, next) => this.onLost(bytes, next));
    att.onDisconnect?.((reason) => this.onDisconnect(reason));
    registry.all.add(this);
    // If the socket never opens (client vanished mid-handshake), let go of the session.
    this.openTimer = setTimeout(() => {
      if (this.ws === null) this.letGo(true);
    }, 10_000);
    this.openTimer.unref();
  }

  open(ws: Websocket<unknown>): void {
    clearTimeout(this.openTimer);
    if (this.closed) {
      ws.close(CLOSE_CODES.ATTACHMENT_LOST, 'session attachment lost');
      return;
    }
    this.ws = ws;
    ws.on('message', (msg: ArrayBuffer, isBinary: boolean) => this.onMessage(msg, isBinary));
    ws.on('close', (code: number) => {
      // a writer that detached on purpose does not come back: forget its numbering
      if (code === 1000 && this.writerKey !== null) this.registry.inputs.forget(this.writerKey);
      this.onClose();
    });
    ws.on('drain', () => this.onDrain());
    const queued = this.pending;
    this.pending = [];
    this.pendingBytes = 0;
    ws.atomic(() => {
      for (const m of queued) this.send(m.data, m.binary);
    });
    if (this.ended) this.finish();
    else if (ws.buffered <= this.registry.limits.highWater) this.unthrottle();
  }

  /** Bytes queued for this client in the gateway (before the socket opened, or in uWS). */
  get queuedBytes(): number {
    return this.ws === null ? this.pendingBytes : this.ws.buffered;
  }

  // ---------------------------------------------------------------- server -> client

  private send(data: string | Buffer, binary: boolean): void {
    if (this.closed) return;
    const ws = this.ws;
    if (ws === null) {
      this.pending.push({ data, binary });
      this.pendingBytes += data.length;
      if (this.pendingBytes > this.registry.limits.highWater) this.throttle();
      return;
    }
    if (ws.buffered + data.length > this.registry.limits.queueCap) {
      // The frame is not sent: the client re-attaches from the last offset it saw, and the
      // holder replays from there.
      this.dropSlow('output queue full');
      return;
    }
    ws.atomic(() => ws.send(data, binary));
    if (ws.buffered > this.registry.limits.highWater) this.throttle();
  }

  private sendJson(obj: object): void {
    this.send(JSON.stringify(obj), false);
  }

  /** Over the high-water mark: stop taking output from the holder until the client catches up. */
  private throttle(): void {
    if (this.throttled || this.closed) return;
    this.throttled = true;
    this.stalledSince = Date.now();
    this.att.pauseOutput?.();
    this.registry.stalled.add(this);
    this.stallTimer = setTimeout(() => this.dropSlow('slow consumer'), this.registry.limits.stallTimeoutMs);
    this.stallTimer.unref();
    this.registry.checkBudget();
  }

  private unthrottle(): void {
    if (!this.throttled) return;
    this.throttled = false;
    clearTimeout(this.stallTimer);
    this.registry.stalled.delete(this);
    if (!this.closed) this.att.resumeOutput?.();
  }

  private onDrain(): void {
    const ws = this.ws;
    if (ws !== null && this.throttled && ws.buffered <= this.registry.limits.lowWater) this.unthrottle();
  }

  /** Give up on a client that does not read: detach, close with 4429, and cut the socket if even that is not taken. */
  dropSlow(why: string): void {
    if (!this.letGo(true)) return;
    const ws = this.ws;
    if (ws === null) return;
    ws.close(CLOSE_CODES.BACKPRESSURE, `${why}: re-attach with session= and offset=`);
    // A client that reads nothing never takes the close frame either: free its queue.
    setTimeout(() => ws.destroy(), CLOSE_GRACE_MS).unref();
  }

  /** The attachment broke under us (the node could not be reached again): the client re-attaches from its offset. */
  private onDisconnect(reason: string): void {
    if (!this.letGo(false)) return;
    this.ws?.close(CLOSE_CODES.ATTACHMENT_LOST, 'session attachment lost: re-attach with session= and offset=');
    this.log(`shell: session ${this.att.info.id} of ${this.sandboxId}: ${reason}`);
  }

  private onLost(bytes: number, next: number): void {
    if (this.closed) return;
    this.nextOffset = Math.max(this.nextOffset, next);
    this.sendJson({ type: 'lost', offset: next, bytes });
  }

  private onOutput(out: SessionOutput): void {
    const k = this.keyed;
    if (k !== null && out.offset >= k.from && out.stream !== 'pty') (out.stream === 'stderr' ? k.stderr : k.stdout).push(out.data);
    if (this.closed) return;
    const end = out.offset + out.data.length;
    if (end <= this.nextOffset && out.data.length > 0) return; // already sent (replay overlap)
    if (this.mode === 'pty') {
      // Binary frames carry no offsets: announce gaps (bytes the holder's buffer dropped) explicitly.
      if (out.offset > this.nextOffset) this.sendJson({ type: 'lost', offset: out.offset, bytes: out.offset - this.nextOffset });
      this.nextOffset = end;
      this.send(out.data, true);
      return;
    }
    this.nextOffset = end;
    const stream = out.stream === 'stderr' ? 'stderr' : 'stdout';
    if (isUtf8(out.data)) {
      this.sendJson({ type: 'output', stream, offset: out.offset, data: out.data.toString('utf8') });
    } else {
      this.sendJson({ type: 'output', stream, offset: out.offset, data: out.data.toString('base64'), encoding: 'base64' });
    }
  }

  private forgetDone(id: string): void {
    const i = this.recentDone.indexOf(id);
    if (i >= 0) this.recentDone.splice(i, 1);
  }

  private reportDone(id: string, res: CommandResult): void {
    if (this.recentDone.includes(id)) return;
    this.recentDone.push(id);
    if (this.recentDone.length > RECENT_DONE) this.recentDone.shift();
    // `offset`: where a re-attach should start so that nothing before this point is replayed.
    const offset = Math.max(this.nextOffset, this.att.info.outputOffset);
    this.sendJson({ type: 'done', id, exitCode: res.exitCode, timedOut: res.timedOut, offset });
  }

  private sendError(err: unknown, id?: string): void {
    const e = publicError(err, this.log);
    const frame: Record<string, unknown> = { type: 'error', code: e.code, message: e.message };
    if (id !== undefined) frame.id = id;
    this.sendJson(frame);
  }

  private onExit(status: { exitCode: number | null; signal: number | null }): void {
    if (this.exitSent) return;
    // A command that ended the shell (`exit 3`): its status came before the exit; its run() only
    // fails once the socket is gone, so its done goes now.
    for (const [id, res] of this.runningHere) if (res !== null) this.reportDone(id, res);
    this.exitSent = true;
    this.ended = true;
    this.sendJson({ type: 'exit', exitCode: status.exitCode, signal: status.signal });
    if (this.ws !== null) this.finish();
  }

  /** The session is over: close the socket after the queued frames. */
  private finish(): void {
    const ws = this.ws;
    if (ws === null || this.closed) return;
    this.closed = true;
    ws.close(CLOSE_CODES.SESSION_ENDED, 'session ended');
  }

  // ---------------------------------------------------------------- client -> server

  /**
   * Whether a validated input frame is to be applied: frames without `seq` always are; numbered
   * ones are acknowledged, and applied only once per named writer (input-numbering.ts).
   */
  private fresh(seqField: unknown): boolean {
    if (seqField === undefined) return true;
    const seq = validateSeq(seqField);
    this.ack(seq);
    return this.writerKey === null || this.registry.inputs.take(this.writerKey, seq);
  }

  private onMessage(msg: ArrayBuffer, isBinary: boolean): void {
    if (this.closed || this.ended) return;
    if (isBinary) {
      try {
        // uWS reuses the ArrayBuffer after this callback returns: copy.
        this.att.write(Buffer.from(new Uint8Array(msg)));
      } catch (err) {
        this.sendError(err);
      }
      return;
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(Buffer.from(msg).toString('utf8'));
    } catch {
      this.sendError(new WarrenError('INVALID_ARGUMENT', 'text frames must be JSON objects'));
      return;
    }
    let id: string | undefined;
    try {
      const m = expectObject(parsed, 'message');
      switch (m.type) {
        case 'run': {
          rejectUnknown(m, ['type', 'id', 'cmd', 'timeoutMs', 'idempotencyKey', 'resume']);
          id = validateCommandId(m.id);
          if (this.mode !== 'command') throw new WarrenError('INVALID_ARGUMENT', 'run is only available in command mode (mode=command)');
          const cmd = expectString(m.cmd, 'cmd', { maxBytes: LIMITS.cmdBytes });
          const timeoutMs = m.timeoutMs === undefined ? undefined : expectNumber(m.timeoutMs, 'timeoutMs', LIMITS.timeoutMs.min, LIMITS.timeoutMs.max, true);
          if (m.resume !== undefined && typeof m.resume !== 'boolean') throw new WarrenError('INVALID_ARGUMENT', 'resume: must be a boolean', { field: 'resume' });
          const resume = m.resume === true;
          const cmdId = id;
          if (m.idempotencyKey !== undefined) {
            this.forgetDone(cmdId);
            this.runKeyed(cmdId, cmd, timeoutMs, validateIdempotencyKey(m.idempotencyKey));
            return;
          }
          // From now on the id names this command: an earlier one's report must not hide its own.
          // A resume names the same command: its done, replayed before this message came, stands.
          if (!resume) this.forgetDone(cmdId);
          else if (this.recentDone.includes(cmdId)) return;
          this.runningHere.set(cmdId, null);
          this.att.run(cmdId, cmd, timeoutMs, resume).then(
            (res) => {
              this.runningHere.delete(cmdId);
              this.reportDone(cmdId, res);
            },
            (err) => {
              const reported = this.runningHere.get(cmdId) ?? null;
              this.runningHere.delete(cmdId);
              if (reported !== null) this.reportDone(cmdId, reported);
              // After a detach the attachment fails pending runs; nobody is listening any more.
              else if (!this.closed) this.sendError(err, cmdId);
            },
          );
          return;
        }
        case 'input': {
          rejectUnknown(m, ['type', 'data', 'encoding', 'seq']);
          const data = expectString(m.data, 'data', { allowEmpty: true, allowNul: true });
          if (m.encoding !== undefined && m.encoding !== 'base64' && m.encoding !== 'utf8') {
            throw new WarrenError('INVALID_ARGUMENT', 'encoding: must be "utf8" or "base64"', { field: 'encoding' });
          }
          if (this.fresh(m.seq)) this.att.write(m.encoding === 'base64' ? Buffer.from(data, 'base64') : data);
          return;
        }
        case 'signal': {
          rejectUnknown(m, ['type', 'signal', 'seq']);
          const signal = parseSignal(m.signal);
          if (this.fresh(m.seq)) this.att.signal(signal);
          return;
        }
        case 'resize': {
          rejectUnknown(m, ['type', 'cols', 'rows', 'seq']);
          const cols = expectNumber(m.cols, 'cols', LIMITS.terminal.min, LIMITS.terminal.max, true);
          const rows = expectNumber(m.rows, 'rows', LIMITS.terminal.min, LIMITS.terminal.max, true);
          if (this.fresh(m.seq)) this.att.resize(cols, rows);
          return;
        }
        case 'close':
          rejectUnknown(m, ['type']);
          this.closingSession = true;
          this.att.close().then(
            () => this.onExit({ exitCode: null, signal: null }),
            (err) => {
              this.sendError(err);
              this.onExit({ exitCode: null, signal: null });
            },
          );
          return;
        case 'ping': {
          rejectUnknown(m, ['type', 'id']);
          const pong: Record<string, unknown> = { type: 'pong' };
          if (m.id !== undefined) pong.id = validateCommandId(m.id);
          this.sendJson(pong);
          return;
        }
        default:
          throw new WarrenError('INVALID_ARGUMENT', `unknown message type ${JSON.stringify(m.type)} (run, input, signal, resize, close, ping)`, { field: 'type' });
      }
    } catch (err) {
      this.sendError(err, id);
    }
  }

  /**
   * `run` with an idempotency key. The first time, the command runs here and
   * its result is stored. A key seen before answers the stored result, or, if
   * the command is still running (in this gateway process over another
   * attachment, or started by a gateway that has since died: the holder kept
   * running it), attaches to the session from where the command began and
   * waits for its status line. Either way the answer is a `done` frame with
   * `"replayed":true` and the command's output in `stdout`/`stderr`.
   */
  private runKeyed(cmdId: string, cmd: string, timeoutMs: number | undefined, key: string): void {
    const keys = this.keys;
    if (keys === null) throw new WarrenError('NOT_SUPPORTED', 'idempotency keys are not available on this gateway');
    const scope: IdempotencyScope = { account: keys.account, sandbox: this.sandboxId, key };
    const hash = bodyHash({ session: this.att.info.id, cmd, timeoutMs });
    if (this.keyed !== null) throw new WarrenError('SESSION_BUSY', `session ${this.att.info.id} is running command ${this.keyed.commandId}`, { commandId: this.keyed.commandId });
    const from = this.att.info.outputOffset;
    const meta: Record<string, unknown> = { session: this.att.info.id, commandId: cmdId, startOffset: from };
    if (timeoutMs !== undefined) meta.deadline = Date.now() + timeoutMs;
    const begun = keys.store.begin(scope, 'shell', hash, meta);
    if (!begun.first) {
      void this.answerKeyed(cmdId, begun.record);
      return;
    }
    const cap = keys.store.maxStoredOutputBytes;
    const k: KeyedRun = { commandId: cmdId, from, stdout: new BoundedBytes(cap), stderr: new BoundedBytes(cap) };
    this.keyed = k;
    this.runningHere.set(cmdId, null);
    this.att.run(cmdId, cmd, timeoutMs).then(
      (res) => {
        this.runningHere.delete(cmdId);
        if (this.keyed === k) this.keyed = null;
        keys.store.finish(scope, { exitCode: res.exitCode, timedOut: res.timedOut, commandId: cmdId }, k.stdout.bytes(), k.stderr.bytes(), k.stdout.total, k.stderr.total);
        this.reportDone(cmdId, res);
      },
      (err) => {
        const reported = this.runningHere.get(cmdId) ?? null;
        this.runningHere.delete(cmdId);
        if (this.keyed === k) this.keyed = null;
        // Refused before it started (busy, ended session): a retry may run it. Otherwise the
        // holder has it (this attachment went away): a retry attaches to it there.
        if (err instanceof WarrenError && err.status < 500) keys.store.release(scope);
        if (reported !== null) this.reportDone(cmdId, reported);
        else if (!this.closed) this.sendError(err, cmdId);
      },
    );
  }

  private async answerKeyed(cmdId: string, rec: IdempotencyRecord): Promise<void> {
    const keys = this.keys!;
    // This connection may see the first run's own status line (replayed, or live from the holder):
    // its answer is the replayed done below, under the retry's id, not a second done.
    const firstId = typeof rec.meta.commandId === 'string' ? rec.meta.commandId : undefined;
    if (firstId !== undefined && !this.recentDone.includes(firstId)) {
      this.recentDone.push(firstId);
      if (this.recentDone.length > RECENT_DONE) this.recentDone.shift();
    }
    try {
      let result = rec.result;
      if (rec.state === 'running') result = await collectKeyed(keys, rec);
      else if (rec.state !== 'done' || result === undefined) throw recordError(rec);
      const o = result.outcome;
      const frame: Record<string, unknown> = {
        type: 'done',
        id: cmdId,
        exitCode: o.exitCode ?? null,
        timedOut: o.timedOut === true,
        offset: Math.max(this.nextOffset, this.att.info.outputOffset),
        replayed: true,
        firstId: o.commandId ?? firstId,
      };
      const text = isUtf8(result.stdout) && isUtf8(result.stderr);
      frame.stdout = result.stdout.toString(text ? 'utf8' : 'base64');
      frame.stderr = result.stderr.toString(text ? 'utf8' : 'base64');
      if (!text) frame.encoding = 'base64';
      if (result.stdoutBytes > result.stdout.length || result.stderrBytes > result.stderr.length) frame.truncated = true;
      this.sendJson(frame);
    } catch (err) {
      this.sendError(err, cmdId);
    }
  }

  private onClose(): void {
    this.unthrottle();
    this.closed = true;
    this.registry.all.delete(this);
    this.registry.released();
    // Detach also after the shell exited, so the holder is not kept lingering for us.
    if (!this.closingSession) this.att.detach();
  }

  /** Gateway shutdown: detach (the session keeps running) and tell the client to come back. */
  shutdown(): void {
    clearTimeout(this.openTimer);
    if (!this.letGo(!this.closingSession)) return;
    this.ws?.close(CLOSE_CODES.GOING_AWAY, 'gateway shutting down');
  }

  /**
   * Stop serving this client: no more output taken for it, out of the registry, its queued frames
   * dropped; `detach` lets go of the session too. False when that was done already.
   */
  private letGo(detach: boolean): boolean {
    if (this.closed) return false;
    this.unthrottle();
    this.closed = true;
    this.registry.all.delete(this);
    if (detach) this.att.detach();
    this.pending = [];
    this.pendingBytes = 0;
    return true;
  }
}

/**
 * A page served by this gateway itself (the dashboard at /ui) opens shells
 * from the gateway's own origin: the browser's Origin names the host the
 * request is addressed to. A page on any other site cannot produce that pair
 * (browsers set both headers), and still needs a token.
 */
export function sameOrigin(origin: string, host: string | undefined): boolean {
  if (host === undefined || host === '') return false;
  try {
    const u = new URL(origin);
    return (u.protocol === 'http:' || u.protocol === 'https:') && u.host === host.toLowerCase();
  } catch {
    return false;
  }
}

export interface ShellRoutes {
  /** Live shell connections. */
  readonly size: number;
  closeAll(): void;
}

export function registerShellRoutes(app: Server, ctx: GatewayContext, opts: ShellOptions): ShellRoutes {
  const allowed = new Set(opts.allowedOrigins);
  const highWater = opts.highWaterBytes ?? SHELL_DEFAULTS.highWaterBytes;
  const registry = new ShellRegistry(
    {
      highWater,
      lowWater: Math.floor(highWater / 4),
      queueCap: highWater + QUEUE_SLACK_BYTES,
      stallTimeoutMs: opts.stallTimeoutMs ?? SHELL_DEFAULTS.stallTimeoutMs,
      budget: opts.bufferBudgetBytes ?? SHELL_DEFAULTS.bufferBudgetBytes,
    },
    () => opts.reclaimer?.note(),
  );
  const connections = registry.all;
  const pattern = '/v1/sandboxes/:id/shell';

  app.upgrade(pattern, async (req: Request, res: Response) => {
    try {
      const origin = req.headers.origin;
      if (origin !== undefined && !allowed.has(origin) && !sameOrigin(origin, req.headers.host)) {
        throw new WarrenError('ORIGIN_REFUSED', `origin ${JSON.stringify(origin)} may not open shells (not in allowedOrigins)`);
      }
      const proto = bearerFromSubprotocols(req.headers['sec-websocket-protocol']);
      const headerToken = bearerFromHeader(req.headers.authorization);
      if (proto.token !== undefined && !proto.offered) {
        throw new WarrenError('INVALID_ARGUMENT', `the bearer.<token> subprotocol must be offered together with ${SHELL_SUBPROTOCOL}`);
      }
      const account = await ctx.auth.require(headerToken ?? proto.token);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const q = validateShellQuery(new URLSearchParams(req.path_query));

      let att: SessionAttachment;
      let startOffset: number;
      if (q.session !== undefined) {
        att = await raceSafe(ctx, info.id, () => ctx.shim.attachSession(info.id, q.session!, q.offset ?? 0));
        startOffset = Math.min(q.offset ?? 0, att.info.outputOffset);
        if (att.info.mode !== q.mode && new URLSearchParams(req.path_query).has('mode')) {
          att.detach();
          throw new WarrenError('INVALID_ARGUMENT', `session ${q.session} is a ${att.info.mode} session (asked for mode=${q.mode})`, { field: 'mode' });
        }
      } else {
        att = await raceSafe(ctx, info.id, () => ctx.shim.openSession(info.id, sessionOptions(q)));
        startOffset = att.info.outputOffset;
      }
      if (res.completed) {
        // The client went away while the session was being opened.
        att.detach();
        return;
      }
      const idem = ctx.idempotency;
      const keys: ShellKeys | null =
        idem === undefined ? null : { store: idem.store, account: account.id, attach: (sessionId, from) => raceSafe(ctx, info.id, () => ctx.shim.attachSession(info.id, sessionId, from)) };
      const writerKey = q.writer === undefined ? null : `${account.id}/${info.id}/${att.info.id}/${q.writer}`;
      const conn = new ShellConnection(att, att.info.mode, info.id, startOffset, registry, ctx.log, keys, writerKey);
      // Select exactly our subprotocol; never echo the token back.
      if (proto.offered) req.headers['sec-websocket-protocol'] = SHELL_SUBPROTOCOL;
      else delete req.headers['sec-websocket-protocol'];
      const context: UpgradeContext = { conn };
      res.upgrade(context);
    } catch (err) {
      sendError(res, err, ctx.log);
    }
  });

  app.ws(
    pattern,
    {
      message_type: 'ArrayBuffer',
      idle_timeout: opts.idleTimeoutS ?? 120,
      // No uWS limit: past its own, uWS drops frames without a word, the close frame too (the
      // client then sees its socket end with 1006). The queue is bounded by queueCap instead.
      max_backpressure: 0,
      max_payload_length: opts.maxMessageBytes ?? 1024 * 1024,
    },
    (ws: Websocket<unknown>) => {
      const ctxObj = ws.context as unknown as UpgradeContext | undefined;
      if (ctxObj?.conn === undefined) {
        ws.close(CLOSE_CODES.ATTACHMENT_LOST, 'no session');
        return;
      }
      ctxObj.conn.open(ws);
    },
  );

  return {
    get size() {
      return connections.size;
    },
    closeAll() {
      for (const c of [...connections]) c.shutdown();
    },
  };
}
