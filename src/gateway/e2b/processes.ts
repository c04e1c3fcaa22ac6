/**
 * envd's process table, kept by the gateway per sandbox: processes started
 * through `process.Process/Start` (plain ones through the shim's streaming
 * exec, PTYs through shell sessions), so that they can be listed, fed input,
 * signalled, resized and re-attached by pid while they run. A process outlives
 * the stream that started it (E2B's background commands); it ends by itself,
 * by a signal, or when the start request's deadline (Connect-Timeout-Ms)
 * passes. Output is not buffered for later readers: an attachment sees what
 * the process writes from then on, as envd does.
 *
 * Pids are numbers of this table, one sequence per sandbox (E2B clients only
 * hand them back to this API).
 */
import type { ExecStream, SessionAttachment } from '../../shim/types';
import { E2bError } from './wire';

export interface ProcessConfig {
  cmd: string;
  args: string[];
  envs: Record<string, string>;
  cwd?: string;
}

export type ProcessOutput = { stream: 'stdout' | 'stderr' | 'pty'; data: Buffer };

export interface ProcessEnd {
  exitCode: number;
  exited: boolean;
  status: string;
  error?: string;
}

export interface ProcessListener {
  data(out: ProcessOutput): boolean;
  end(end: ProcessEnd, timedOut: boolean): void;
  /** Called when the listener's writes drained again (see `data` returning false). */
  readonly waiting: boolean;
}

/** Most live processes one sandbox may have in the table at once. */
export const MAX_PROCESSES = 512;

export class E2bProcess {
  readonly listeners = new Set<ProcessListener>();
  ended: ProcessEnd | null = null;
  private timer: NodeJS.Timeout | null = null;
  timedOut = false;
  private paused = false;

  constructor(
    readonly pid: number,
    readonly sandboxId: string,
    readonly config: ProcessConfig,
    readonly tag: string | undefined,
    readonly exec: ExecStream | null,
    readonly pty: SessionAttachment | null,
  ) {}

  /** Kill when the start request's deadline passes (0/undefined: no deadline). */
  setDeadline(ms: number | undefined): void {
    if (!ms) return;
    this.timer = setTimeout(() => {
      this.timedOut = true;
      this.signal(9);
    }, ms);
    this.timer.unref();
  }

  emit(out: ProcessOutput): void {
    let blocked = false;
    for (const l of this.listeners) if (!l.data(out)) blocked = true;
    // Back-pressure: a reader that cannot keep up holds the process's output back
    // (the pipe fills and the process blocks), instead of buffering without bound.
    if (blocked && this.exec && !this.paused) {
      this.paused = true;
      this.exec.stdout.pause();
      this.exec.stderr.pause();
    }
  }

  /** A listener's writes drained: let output flow again when nobody is still behind. */
  drained(): void {
    if (!this.paused || !this.exec) return;
    for (const l of this.listeners) if (l.waiting) return;
    this.paused = false;
    this.exec.stdout.resume();
    this.exec.stderr.resume();
  }

  finish(end: ProcessEnd): void {
    if (this.ended) return;
    this.ended = end;
    if (this.timer) clearTimeout(this.timer);
    for (const l of [...this.listeners]) l.end(end, this.timedOut);
    this.listeners.clear();
  }

  signal(sig: number): void {
    if (this.ended) return;
    if (this.exec) this.exec.kill(sig);
    else if (this.pty) {
      if (sig === 9) void this.pty.close().catch(() => undefined);
      else this.pty.signal(sig);
    }
  }

  writeInput(data: Buffer, pty: boolean): void {
    if (this.ended) throw new E2bError(404, `process ${this.pid} has ended`, 'not_found');
    if (this.pty) {
      this.pty.write(data);
      return;
    }
    if (pty) throw new E2bError(400, `process ${this.pid} has no PTY`, 'failed_precondition');
    if (!this.exec || this.exec.stdin.destroyed || this.exec.stdin.writableEnded) {
      throw new E2bError(400, `stdin of process ${this.pid} is closed (start it with stdin: true)`, 'failed_precondition');
    }
    this.exec.stdin.write(data);
  }

  closeStdin(): void {
    if (this.pty) throw new E2bError(400, `process ${this.pid} is a PTY; send EOF (Ctrl-D) as input instead`, 'failed_precondition');
    this.exec?.stdin.end();
  }
}

/** One sandbox's processes. */
export class ProcessTable {
  private nextPid = 1000;
  private readonly procs = new Map<number, E2bProcess>();

  allocatePid(): number {
    if (this.procs.size >= MAX_PROCESSES) throw new E2bError(429, `at most ${MAX_PROCESSES} processes per sandbox are tracked; wait for some to end`, 'resource_exhausted');
    return this.nextPid++;
  }

  add(p: E2bProcess): void {
    this.procs.set(p.pid, p);
  }

  remove(pid: number): void {
    this.procs.delete(pid);
  }

  get(selector: { pid?: number; tag?: string }): E2bProcess {
    let p: E2bProcess | undefined;
    if (selector.pid !== undefined) p = this.procs.get(selector.pid);
    else if (selector.tag !== undefined) p = [...this.procs.values()].find((x) => x.tag === selector.tag);
    if (p === undefined || p.ended) {
      throw new E2bError(404, `process ${selector.pid !== undefined ? `with pid ${selector.pid}` : `with tag ${JSON.stringify(selector.tag)}`} not found`, 'not_found');
    }
    return p;
  }

  list(): E2bProcess[] {
    return [...this.procs.values()].filter((p) => !p.ended);
  }

  get size(): number {
    return this.procs.size;
  }
}

/** envd's end-event status text. */
export function endStatus(exitCode: number | null, signal: number | null): ProcessEnd {
  if (signal !== null) {
    const names: Record<number, string> = { 1: 'hangup', 2: 'interrupt', 9: 'killed', 15: 'terminated', 13: 'broken pipe', 6: 'aborted', 11: 'segmentation fault' };
    return { exitCode: -1, exited: false, status: `signal: ${names[signal] ?? String(signal)}` };
  }
  return { exitCode: exitCode ?? -1, exited: true, status: `exit status ${exitCode ?? -1}` };
}
