/**
 * Supervised execs: an exec whose result does not depend on the gateway
 * process. `warren-nsexec --supervise DIR` starts the command in the sandbox
 * (the same code and confinement as every exec), copies its output into
 * DIR/stdout and DIR/stderr (bounded: at the limit the pipe is closed and the
 * writer gets SIGPIPE), enforces the timeout, waits for it and writes
 * DIR/result when it has ended. The supervisor runs in its own session and
 * joins the sandbox's cgroup, so it outlives a gateway kill -9 but not the
 * sandbox. Whoever holds the run's directory follows it: tails the output
 * files while it runs and reads the result when it appears, in this gateway
 * process or in the next one.
 */
import { spawn } from 'node:child_process';
import { type FSWatcher, closeSync, mkdirSync, openSync, readFileSync, readSync, readdirSync, watch, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { WarrenError } from '../errors';
import type { ExecOutcome, ExecStatus, LiveExec } from './types';

const SIGKILL = 9;
/** How often a follower looks for new output and for the result. */
const POLL_MS = 25;
/** How often it checks that the supervisor is still there. */
const ALIVE_EVERY = 4;

/** What the supervisor writes into DIR/result. */
interface RawResult {
  exitCode: number | null;
  signal: number | null;
  timedOut: boolean;
  truncated: boolean;
  durationMs: number;
  stdoutBytes: number;
  stderrBytes: number;
}

/** Written by the node next to the output: what the outcome needs besides the supervisor's result. */
interface RunMeta {
  /** The sandbox's OOM kill count before the command started (a SIGKILL with a higher count later is 'oom'). */
  oomBefore: number;
}

export interface SupervisedStart {
  /** warren-nsexec path and its arguments up to (not including) `--`. */
  nsexec: string[];
  argv: string[];
  stdin?: Buffer | string | undefined;
  maxOutputBytes: number;
  timeoutMs?: number | undefined;
  oomBefore: number;
}

/** Start a supervised exec in `dir` (created here); resolves with the supervisor's pid once the command runs. */
export async function startSupervised(dir: string, s: SupervisedStart): Promise<number> {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writeFileSync(join(dir, 'meta.json'), JSON.stringify({ oomBefore: s.oomBefore } satisfies RunMeta));
  if (s.stdin !== undefined && s.stdin.length > 0) writeFileSync(join(dir, 'stdin'), s.stdin, { mode: 0o600 });
  const args = [...s.nsexec.slice(1), '--supervise', dir, '--max-output', String(s.maxOutputBytes)];
  if (s.timeoutMs !== undefined) args.push('--timeout-ms', String(Math.max(1, Math.round(s.timeoutMs))));
  args.push('--', ...s.argv);
  // Its own session, no fd of ours but the answer pipe (closed by it once the command runs).
  const child = spawn(s.nsexec[0]!, args, { detached: true, stdio: ['ignore', 'pipe', 'ignore'] });
  child.unref();
  const answer = await new Promise<string>((resolve, reject) => {
    let text = '';
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (c: string) => {
      text += c;
      if (text.includes('\n')) resolve(text.slice(0, text.indexOf('\n')));
    });
    child.stdout!.on('end', () => resolve(text));
    child.once('error', reject);
  });
  child.stdout!.destroy();
  const ok = /^ok (\d+)$/.exec(answer);
  if (ok) return child.pid!;
  const err = /^err (\S+) (-?\d+) (.*)$/.exec(answer);
  if (err) {
    const code = err[1] === 'SPAWN_ERROR' || err[1] === 'CGROUP_ERROR' || err[1] === 'INVALID_ARGUMENT' ? err[1] : 'SPAWN_ERROR';
    throw new WarrenError(code as 'SPAWN_ERROR', err[3]!, undefined, Number(err[2]) || undefined);
  }
  throw new WarrenError('SPAWN_ERROR', `the exec supervisor ended without starting the command${answer ? `: ${answer}` : ''}`);
}

/** Whether the supervisor that ran in `dir` is still there (pid and start time both match, not a zombie). */
export function supervisorAlive(dir: string): boolean {
  let line: string;
  try {
    line = readFileSync(join(dir, 'pid'), 'utf8');
  } catch {
    return false;
  }
  const [pid, start] = line.trim().split(' ');
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[0] !== 'Z' && fields[0] !== 'X' && fields[19] === start;
  } catch {
    return false;
  }
}

function statusOf(r: RawResult, oomKills: () => number, meta: RunMeta): ExecStatus {
  if (r.timedOut) return 'timeout';
  if (r.signal !== null) return r.signal === SIGKILL && oomKills() > meta.oomBefore ? 'oom' : 'killed';
  return r.exitCode === 0 ? 'ok' : 'error';
}

/** The outcome of a supervised run that has ended; null while it has no result. */
export function supervisedOutcome(dir: string, oomKills: () => number): ExecOutcome | null {
  let raw: RawResult;
  try {
    raw = JSON.parse(readFileSync(join(dir, 'result'), 'utf8')) as RawResult;
  } catch {
    return null;
  }
  let meta: RunMeta = { oomBefore: Number.MAX_SAFE_INTEGER };
  try {
    meta = JSON.parse(readFileSync(join(dir, 'meta.json'), 'utf8')) as RunMeta;
  } catch {
    /* no meta: never called oom */
  }
  return { exitCode: raw.exitCode, signal: raw.signal, status: statusOf(raw, oomKills, meta), durationMs: raw.durationMs, truncated: raw.truncated };
}

function lost(): WarrenError {
  return new WarrenError('IDEMPOTENCY_INTERRUPTED', 'the supervisor of this exec ended without a result (the sandbox was deleted or the supervisor was killed); its outcome is unknown');
}

/** A file that grows while a run goes on, read as a Readable (it ends when told the file is complete). */
class FileTail extends Readable {
  private fd: number | null = null;
  private offset = 0;
  private wanted = true;

  constructor(private readonly path: string) {
    super({ highWaterMark: 64 * 1024 });
  }

  override _read(): void {
    this.wanted = true;
  }

  /** Push what the file has beyond what was pushed (while the reader wants it); `final`: then end. */
  pump(final: boolean): void {
    if (this.destroyed || this.readableEnded) return;
    if (this.fd === null) {
      try {
        this.fd = openSync(this.path, 'r');
      } catch {
        if (final) this.push(null);
        return;
      }
    }
    const buf = Buffer.allocUnsafe(64 * 1024);
    while (this.wanted || final) {
      const n = readSync(this.fd, buf, 0, buf.length, this.offset);
      if (n === 0) break;
      this.offset += n;
      this.wanted = this.push(Buffer.from(buf.subarray(0, n)));
    }
    if (final) this.push(null);
  }

  override _destroy(err: Error | null, cb: (e?: Error | null) => void): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
    cb(err);
  }

  close(): void {
    if (this.fd !== null) closeSync(this.fd);
    this.fd = null;
  }
}

/**
 * Follow the run in `dir` until its result is there: its output as it comes
 * (from the start of each stream), and its outcome. `done` rejects with
 * IDEMPOTENCY_INTERRUPTED when the supervisor is gone without a result.
 */
export function followSupervised(dir: string, oomKills: () => number, kill: () => void): LiveExec {
  const stdout = new FileTail(join(dir, 'stdout'));
  const stderr = new FileTail(join(dir, 'stderr'));
  const done = new Promise<ExecOutcome>((resolve, reject) => {
    let ticks = 0;
    let timer: NodeJS.Timeout | null = null;
    let finished = false;
    // inotify on the run's directory wakes the follower at once (output written, result renamed in);
    // the timer is the fallback and paces the liveness check.
    let watcher: FSWatcher | null = null;
    try {
      watcher = watch(dir, { persistent: false }, () => {
        if (finished || timer === null) return;
        clearTimeout(timer);
        timer = setTimeout(tick, 0);
      });
      watcher.on('error', () => undefined);
    } catch {
      watcher = null;
    }
    const stop = (): void => {
      finished = true;
      watcher?.close();
    };
    const tick = (): void => {
      timer = null;
      if (finished) return;
      const outcome = supervisedOutcome(dir, oomKills);
      if (outcome !== null) {
        stop();
        stdout.pump(true);
        stderr.pump(true);
        stdout.close();
        stderr.close();
        resolve(outcome);
        return;
      }
      stdout.pump(false);
      stderr.pump(false);
      if (++ticks % ALIVE_EVERY === 0 && !supervisorAlive(dir) && supervisedOutcome(dir, oomKills) === null) {
        stop();
        stdout.destroy();
        stderr.destroy();
        reject(lost());
        return;
      }
      timer = setTimeout(tick, POLL_MS);
    };
    tick();
  });
  return { stdout, stderr, done, kill };
}

/** Remove the runs under `base` that are not in `keep` and whose supervisor has ended. */
export async function sweepSupervised(base: string, keep: ReadonlySet<string>): Promise<number> {
  let names: string[];
  try {
    names = readdirSync(base);
  } catch {
    return 0;
  }
  let removed = 0;
  for (const name of names) {
    if (keep.has(name) || supervisorAlive(join(base, name))) continue;
    await dropSupervised(join(base, name));
    removed++;
  }
  return removed;
}

export async function dropSupervised(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true });
}
