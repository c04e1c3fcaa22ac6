/**
 * A `SessionAttachment` over one connection to a session holder.
 *
 * Command mode: `run()` sends MARK (the holder snapshots the shell's process
 * tree) and one line to the shell's stdin that evals the command in the
 * current shell with stdin from /dev/null, then writes "<id> <code>\n" to the
 * status pipe (fd 3). Output streams through onOutput with absolute offsets;
 * the status line resolves `run()` and fires onCommandDone.
 *
 * Timeout: SIGNAL(SIGWINCH, SHELL) makes the shell abandon the rest of the
 * command (the wrapper traps it, see commandWrapper) and SIGNAL(SIGKILL,
 * FOREGROUND) kills every process started since the MARK (not the shell, not
 * older background jobs). The shell then reports, the session stays usable,
 * and run() resolves with timedOut=true and exitCode null. Until the grace
 * period ends the kill is repeated every 250 ms (for a command that replaced
 * the trap and goes on starting processes). If the shell still does not
 * report within `graceMs` (it ignores SIGWINCH and loops in a builtin), the
 * whole tree is killed: the session ends, run() resolves with exitCode null
 * and timedOut true, and onExit fires.
 */
import path from 'node:path';
import { WarrenError } from '../../errors';
import type { CommandResult, SessionAttachment, SessionInfo, SessionOutput } from '../types';
import { HolderClient } from './holder-client';
import {
  ABORT_SIGNAL,
  SignalTarget,
  commandWrapper,
  encodeInput,
  encodeMark,
  encodeSignal,
  parseStatusLine,
  type HolderFrame,
  type HolderInfo,
} from './holder-protocol';

const SIGKILL = 9;
/** Largest command text accepted by run(). */
export const MAX_COMMAND_BYTES = 1 << 20;
/** Largest timeout accepted by run() (24 h). */
export const MAX_TIMEOUT_MS = 24 * 3600 * 1000;
/** Output kept for an attachment nobody listens to yet (then the oldest is dropped and counted as lost). */
const MAX_QUEUED_OUTPUT = 16 << 20;

export interface ShellSessionOptions {
  /** After a timeout, how long the shell has to report before the session is killed (default 2000 ms). */
  graceMs?: number;
  /** Connect / INFO timeout (default 5000 ms). */
  connectTimeoutMs?: number;
}

export interface ExitStatus {
  exitCode: number | null;
  signal: number | null;
}

interface PendingRun {
  commandId: string;
  /** Output offset when the command was sent: its status line ends after it. */
  startOffset: number;
  timedOut: boolean;
  resolve(r: CommandResult): void;
  reject(e: Error): void;
  timer: NodeJS.Timeout | undefined;
  grace: NodeJS.Timeout | undefined;
}

export class ShellSession implements SessionAttachment {
  readonly info: SessionInfo;
  /** INFO as the holder reported it when this attachment was made. */
  readonly holderInfo: HolderInfo;
  /** Output bytes this attachment will never see (dropped from the holder's bounded buffer). */
  lostBytes = 0;

  private nextOff: number;
  /** Output offset at attach time: what comes before it is replay. */
  private readonly liveFrom: number;
  private statusTail = '';
  private pending: PendingRun | null = null;
  private exitStatus: ExitStatus | null = null;
  private ended = false;
  private readonly graceMs: number;

  private outListeners: Array<(o: SessionOutput) => void> = [];
  private doneListeners: Array<(r: CommandResult) => void> = [];
  private exitListeners: Array<(s: ExitStatus) => void> = [];
  private lostListeners: Array<(bytes: number, nextOffset: number) => void> = [];
  private queuedOut: SessionOutput[] = [];
  private queuedOutBytes = 0;
  private queuedDone: CommandResult[] = [];

  private constructor(
    private readonly client: HolderClient,
    holderInfo: HolderInfo,
    readonly socketPath: string,
    fromOffset: number,
    opts: ShellSessionOptions,
  ) {
    this.holderInfo = holderInfo;
    this.graceMs = opts.graceMs ?? 2000;
    const meta = holderInfo.info ?? {};
    this.info = {
      id: typeof meta.sessionId === 'string' ? meta.sessionId : path.basename(socketPath, '.sock'),
      sandboxId: typeof meta.sandboxId === 'string' ? meta.sandboxId : '',
      mode: holderInfo.mode,
      createdAt: holderInfo.createdAt,
      outputOffset: holderInfo.outputOffset,
      alive: holderInfo.alive,
    };
    this.nextOff = Math.min(fromOffset, holderInfo.outputOffset);
    this.liveFrom = holderInfo.outputOffset;
    client.handlers = {
      onFrame: (f) => this.onFrame(f),
      onEnd: (err) => this.onEnd(err),
    };
  }

  /** Connect to the holder at `socketPath` and receive output from `fromOffset` on (replayed, then live). */
  static async attach(socketPath: string, fromOffset: number, opts: ShellSessionOptions = {}): Promise<ShellSession> {
    if (!Number.isSafeInteger(fromOffset) || fromOffset < 0) {
      throw new WarrenError('INVALID_ARGUMENT', `fromOffset must be a non-negative integer, got ${fromOffset}`);
    }
    const client = await HolderClient.connect(socketPath, opts.connectTimeoutMs);
    let info: HolderInfo;
    try {
      info = await client.info(opts.connectTimeoutMs);
    } catch (e) {
      client.destroy();
      throw e;
    }
    const s = new ShellSession(client, info, socketPath, fromOffset, opts);
    client.attach(fromOffset);
    return s;
  }

  /** Offset just past the last output received (status bytes and lost bytes included): re-attach from here. */
  get nextOffset(): number {
    return this.nextOff;
  }

  /** Exit status of the shell, once it has exited. */
  get exit(): ExitStatus | null {
    return this.exitStatus;
  }

  get busy(): boolean {
    return this.pending !== null;
  }

  onOutput(listener: (out: SessionOutput) => void): void {
    this.outListeners.push(listener);
    if (this.queuedOut.length) {
      const q = this.queuedOut;
      this.queuedOut = [];
      this.queuedOutBytes = 0;
      for (const o of q) listener(o);
    }
  }

  onCommandDone(listener: (res: CommandResult) => void): void {
    this.doneListeners.push(listener);
    if (this.queuedDone.length) {
      const q = this.queuedDone;
      this.queuedDone = [];
      for (const r of q) listener(r);
    }
  }

  onExit(listener: (status: ExitStatus) => void): void {
    this.exitListeners.push(listener);
    const st = this.exitStatus;
    if (st) queueMicrotask(() => listener(st));
  }

  /** Called each time the holder reports a gap (LOST): how many bytes, and the offset output continues at. */
  onLost(listener: (bytes: number, nextOffset: number) => void): void {
    this.lostListeners.push(listener);
  }

  /** Back-pressure: stop taking output until resumeOutput() (the holder keeps it in its ring meanwhile). */
  pauseOutput(): void {
    this.client.pause();
  }

  resumeOutput(): void {
    this.client.resume();
  }

  /**
   * How command `commandId` ended, from the holder's recent status lines
   * (kept outside the ring, so also after its line was dropped from it).
   * Only lines that end past `after` count (ids are the client's and may
   * repeat across attachments). Null when the holder does not remember it
   * (still running, or too long ago).
   */
  async recentStatus(commandId: string, after: number): Promise<{ exitCode: number; endOffset: number } | null> {
    const info = await this.client.info();
    let found: { exitCode: number; endOffset: number } | null = null;
    for (const line of info.recentStatus ?? []) {
      const m = /^(\S+ \d{1,3}) (\d{1,20})$/.exec(line);
      const parsed = m ? parseStatusLine(m[1]!) : null;
      const endOffset = m ? Number(m[2]) : 0;
      if (parsed && parsed.commandId === commandId && endOffset > after) found = { exitCode: parsed.exitCode, endOffset };
    }
    return found;
  }

  async run(commandId: string, command: string, timeoutMs?: number, resume = false): Promise<CommandResult> {
    if (this.info.mode !== 'command') throw new WarrenError('INVALID_ARGUMENT', 'run() needs a command-mode session; use write() on a pty session');
    const line = commandWrapper(commandId, command, resume); // validates id and NUL bytes
    if (Buffer.byteLength(line) > MAX_COMMAND_BYTES) throw new WarrenError('PAYLOAD_TOO_LARGE', `command is longer than ${MAX_COMMAND_BYTES} bytes`);
    if (timeoutMs !== undefined && (!Number.isInteger(timeoutMs) || timeoutMs < 1 || timeoutMs > MAX_TIMEOUT_MS)) {
      throw new WarrenError('INVALID_ARGUMENT', `timeoutMs must be an integer in 1..${MAX_TIMEOUT_MS}, got ${timeoutMs}`);
    }
    this.assertUsable();
    if (this.pending) {
      throw new WarrenError('SESSION_BUSY', `session ${this.info.id} is running command ${this.pending.commandId}`, { commandId: this.pending.commandId });
    }
    return new Promise<CommandResult>((resolve, reject) => {
      const p: PendingRun = { commandId, startOffset: this.nextOff, timedOut: false, resolve, reject, timer: undefined, grace: undefined };
      this.pending = p;
      // A resumed command may be running already: a MARK now would hide its processes from signals.
      if (resume) this.client.sendFrames(encodeInput(line));
      else this.client.sendFrames(encodeMark(), encodeInput(line));
      if (timeoutMs !== undefined) p.timer = setTimeout(() => this.onTimeout(p), timeoutMs);
    });
  }

  write(data: Buffer | string): void {
    if (this.info.mode !== 'pty') throw new WarrenError('INVALID_ARGUMENT', 'write() needs a pty session; use run() on a command session');
    this.assertUsable();
    this.client.input(data);
  }

  /** Resize the terminal (pty mode); a no-op in command mode. */
  resize(cols: number, rows: number): void {
    if (this.info.mode !== 'pty') return;
    this.assertUsable();
    this.client.resize(cols, rows);
  }

  /**
   * pty: signal the terminal's foreground process group. command: signal every
   * process started since the current (or last) command began, not the shell.
   */
  signal(signal: number): void {
    this.assertUsable();
    this.client.signal(signal, SignalTarget.FOREGROUND);
  }

  /**
   * Stop the command running in the session now, as a timeout does (the shell
   * abandons the rest of it, what it started is killed), also when another
   * attachment sent it. Repeat it for a command that forks while dying.
   */
  abortCommand(): void {
    this.assertUsable();
    this.client.sendFrames(encodeSignal(ABORT_SIGNAL, SignalTarget.SHELL), encodeSignal(SIGKILL, SignalTarget.FOREGROUND));
  }

  /** Refresh INFO from the holder. */
  async refreshInfo(): Promise<HolderInfo> {
    const i = await this.client.info();
    this.info.alive = i.alive;
    return i;
  }

  detach(): void {
    if (this.ended) return;
    this.client.destroy(); // -> onEnd
  }

  async close(): Promise<void> {
    if (this.ended) return;
    await this.client.close();
  }

  private assertUsable(): void {
    if (this.ended) throw new WarrenError('UNAVAILABLE', `attachment to session ${this.info.id} is closed`);
    if (this.exitStatus) throw new WarrenError('SESSION_NOT_FOUND', `session ${this.info.id} has ended`, { exit: this.exitStatus });
  }

  private onTimeout(p: PendingRun): void {
    if (this.pending !== p || this.ended) return;
    p.timedOut = true;
    p.timer = undefined;
    // One write: the holder signals the shell before it kills the command's
    // processes, so the shell's trap is pending when its wait returns.
    this.client.sendFrames(encodeSignal(ABORT_SIGNAL, SignalTarget.SHELL), encodeSignal(SIGKILL, SignalTarget.FOREGROUND));
    const deadline = Date.now() + this.graceMs;
    const again = (): void => {
      if (this.pending !== p || this.ended) return;
      if (Date.now() >= deadline) {
        // The shell does not come back (it ignores the abort signal and spins in a builtin): end the session.
        this.client.signal(SIGKILL, SignalTarget.TREE);
        return;
      }
      this.client.signal(SIGKILL, SignalTarget.FOREGROUND);
      p.grace = setTimeout(again, Math.min(250, Math.max(1, deadline - Date.now())));
    };
    p.grace = setTimeout(again, Math.min(250, this.graceMs));
  }

  private settle(result: CommandResult, live = true): void {
    const p = this.pending;
    if (p && live && p.commandId === result.commandId) {
      this.pending = null;
      clearTimeout(p.timer);
      clearTimeout(p.grace);
      if (p.timedOut) {
        result.timedOut = true;
        result.exitCode = null; // what the shell reports after an abort is not the command's status
      }
      p.resolve(result);
    }
    if (this.doneListeners.length) for (const l of this.doneListeners) l(result);
    else this.queuedDone.push(result);
  }

  private onFrame(f: HolderFrame): void {
    switch (f.type) {
      case 'output': {
        this.nextOff = f.offset + f.data.length;
        if (this.nextOff > this.info.outputOffset) this.info.outputOffset = this.nextOff;
        if (f.stream === 'status') {
          this.onStatus(f.data, f.offset);
          return;
        }
        const out: SessionOutput = { stream: f.stream, offset: f.offset, data: f.data };
        if (this.outListeners.length) {
          for (const l of this.outListeners) l(out);
        } else {
          this.queuedOut.push(out);
          this.queuedOutBytes += f.data.length;
          while (this.queuedOutBytes > MAX_QUEUED_OUTPUT) {
            const old = this.queuedOut.shift()!;
            this.queuedOutBytes -= old.data.length;
            this.lostBytes += old.data.length;
          }
        }
        return;
      }
      case 'lost':
        this.lostBytes += f.bytes;
        this.nextOff += f.bytes;
        if (this.nextOff > this.info.outputOffset) this.info.outputOffset = this.nextOff;
        for (const l of this.lostListeners) l(f.bytes, this.nextOff);
        // The dropped bytes may have held the status line of the running command.
        if (this.pending !== null) this.recoverStatus(this.pending);
        return;
      case 'exit': {
        const st: ExitStatus = { exitCode: f.exitCode, signal: f.signal };
        this.exitStatus = st;
        this.info.alive = false;
        this.statusTail = '';
        if (this.pending) this.settle({ commandId: this.pending.commandId, exitCode: f.exitCode, timedOut: false });
        for (const l of this.exitListeners) l(st);
        return;
      }
      case 'closed':
        return;
    }
  }

  private recoverStatus(p: PendingRun): void {
    this.recentStatus(p.commandId, p.startOffset).then(
      (st) => {
        if (st !== null && this.pending === p) this.settle({ commandId: p.commandId, exitCode: st.exitCode, timedOut: false });
      },
      () => undefined, // the connection ended: onEnd fails the run
    );
  }

  private onStatus(data: Buffer, offset: number): void {
    // Status lines replayed from before this attachment belong to earlier
    // commands: they fire onCommandDone but never settle this attachment's run().
    const live = offset >= this.liveFrom;
    let text = this.statusTail + data.toString('latin1');
    let nl: number;
    while ((nl = text.indexOf('\n')) >= 0) {
      const parsed = parseStatusLine(text.slice(0, nl));
      text = text.slice(nl + 1);
      if (parsed) this.settle({ commandId: parsed.commandId, exitCode: parsed.exitCode, timedOut: false }, live);
    }
    this.statusTail = text.length > 256 ? '' : text;
  }

  private onEnd(err?: Error): void {
    this.ended = true;
    const p = this.pending;
    if (p) {
      this.pending = null;
      clearTimeout(p.timer);
      clearTimeout(p.grace);
      p.reject(new WarrenError('UNAVAILABLE', `connection to session ${this.info.id} ended before command ${p.commandId} finished${err ? `: ${err.message}` : ''}`));
    }
  }
}
