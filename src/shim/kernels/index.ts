/**
 * Stateful Python kernels inside sandboxes, shared by POST /run_jupyter
 * (one batch of cells as one FnCall invocation) and the E2B code interpreter
 * (long-lived contexts in a sandbox). Both run the same driver (driver.ts),
 * which drives ipykernel through jupyter_client where the image has them and
 * falls back to a standard-library kernel where it does not; both report
 * which one ran.
 */
import type { ExecStream } from '../types';
import { KERNEL_DRIVER } from './driver';

export { KERNEL_DRIVER } from './driver';

export type KernelBackend = 'ipykernel' | 'stdlib';

/** Why a kernel may be the fallback: reported by /v1/features and /v1/languages. */
export const KERNEL_FALLBACK_NOTE =
  'kernels are ipykernel (through jupyter_client) where the image has python3-ipykernel and python3-jupyter-client (the judge python toolkit does); elsewhere a standard-library kernel with the same events runs instead (no IPython magics, no inline matplotlib)';

export type KernelEvent =
  | { type: 'stream'; name: 'stdout' | 'stderr'; text: string }
  | { type: 'display_data' | 'execute_result'; data: Record<string, unknown>; metadata?: Record<string, unknown>; execution_count?: number }
  | { type: 'error'; ename: string; evalue: string; traceback: string[] };

export interface KernelDone {
  type: 'done';
  status: 'ok' | 'error' | 'timeout' | 'interrupted' | 'restarted';
  execution_count: number;
}

// ---------------------------------------------------------------- batch (run_jupyter)

export const BATCH_DRIVER_PATH = '/tmp/.warren-kernel.py';
export const BATCH_RESULT_PATH = '/tmp/.warren-kernel-result.json';

export interface BatchCell {
  stdout: string;
  stderr: string;
  display: Array<Record<string, unknown>>;
  error: Array<{ ename: string; evalue: string; traceback: string[] }>;
}

export interface BatchResult {
  /** Finished: every cell ran (errors included); TimeLimitExceeded: total_timeout stopped the run. */
  status: 'Finished' | 'TimeLimitExceeded';
  backend: KernelBackend | null;
  reason: string | null;
  cells: BatchCell[];
}

/** The program, stdin and driver file of one batch run; the result is read back from BATCH_RESULT_PATH. */
export function batchInvocation(req: { cells: string[]; cellTimeoutS: number | null; totalTimeoutS: number | null }): {
  cmd: string[];
  driver: { path: string; data: Buffer; mode: number };
  stdin: Buffer;
  resultPath: string;
} {
  return {
    cmd: ['python3', '-B', BATCH_DRIVER_PATH, 'batch', BATCH_RESULT_PATH],
    driver: { path: BATCH_DRIVER_PATH, data: Buffer.from(KERNEL_DRIVER), mode: 0o644 },
    stdin: Buffer.from(JSON.stringify({ cells: req.cells, cell_timeout: req.cellTimeoutS ?? 0, total_timeout: req.totalTimeoutS ?? 0 })),
    resultPath: BATCH_RESULT_PATH,
  };
}

/** The batch result file (base64 as fetched), or null when the driver never wrote one. */
export function parseBatchResult(b64: string | undefined): BatchResult | null {
  if (b64 === undefined) return null;
  try {
    const v = JSON.parse(Buffer.from(b64, 'base64').toString('utf8')) as BatchResult;
    return Array.isArray(v.cells) ? v : null;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------- serve (code interpreter)

/** The command that starts a serving driver (its working directory is the context's cwd). */
export const SERVE_COMMAND = ['python3', '-u', '-c', KERNEL_DRIVER, 'serve'];

export class KernelError extends Error {}

interface Pending {
  onEvent: (ev: KernelEvent) => void;
  resolve: (d: KernelDone) => void;
  reject: (err: Error) => void;
}

/**
 * One serving driver: executions run one at a time (queued); an execution's
 * events go to its own listener, its end resolves it. `interrupt()` stops the
 * running cell (the driver interrupts its kernel, the context keeps its state).
 */
export class KernelSession {
  backend: KernelBackend = 'stdlib';
  reason: string | null = null;
  dead = false;
  /** The last few KiB the driver wrote to stderr (its own failures, tracebacks of a crash). */
  stderrTail = '';
  /** How the driver ended, once it has. */
  exit: { exitCode: number | null; signal: number | null } | null = null;
  private buf = '';
  private current: Pending | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private readyWait: { resolve: () => void; reject: (e: Error) => void } | null = null;

  private constructor(readonly proc: ExecStream) {
    proc.stdout.on('data', (d: Buffer) => {
      this.buf += d.toString('utf8');
      let i: number;
      while ((i = this.buf.indexOf('\n')) !== -1) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        if (line !== '') this.onLine(line);
      }
    });
    proc.stderr.on('data', (d: Buffer) => {
      this.stderrTail = (this.stderrTail + d.toString('utf8')).slice(-4096);
    });
    proc.stdin.on('error', () => undefined);
    void proc.exited.then((e) => {
      this.exit = e;
      this.dead = true;
      const err = new KernelError('the kernel driver exited');
      this.readyWait?.reject(err);
      this.readyWait = null;
      this.current?.reject(err);
      this.current = null;
    });
  }

  /** Start a driver with `spawn` (which runs SERVE_COMMAND) and wait until its kernel is up. */
  static async start(spawn: () => Promise<ExecStream>, readyTimeoutMs = 120_000): Promise<KernelSession> {
    const s = new KernelSession(await spawn());
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        s.readyWait = null;
        s.close();
        reject(new KernelError(`the kernel did not start within ${readyTimeoutMs / 1000} s`));
      }, readyTimeoutMs);
      s.readyWait = {
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
    });
    return s;
  }

  private onLine(line: string): void {
    let ev: { type?: string; [k: string]: unknown };
    try {
      ev = JSON.parse(line) as typeof ev;
    } catch {
      return;
    }
    if (ev.type === 'ready') {
      this.backend = ev.backend === 'ipykernel' ? 'ipykernel' : 'stdlib';
      this.reason = typeof ev.reason === 'string' ? ev.reason : null;
      this.readyWait?.resolve();
      this.readyWait = null;
      return;
    }
    const cur = this.current;
    if (cur === null) return;
    if (ev.type === 'done') {
      if (typeof ev.backend === 'string') this.backend = ev.backend === 'ipykernel' ? 'ipykernel' : 'stdlib';
      this.current = null;
      cur.resolve(ev as unknown as KernelDone);
    } else if (ev.type === 'stream' || ev.type === 'display_data' || ev.type === 'execute_result' || ev.type === 'error') {
      cur.onEvent(ev as unknown as KernelEvent);
    }
  }

  private enqueue(req: Record<string, unknown>, onEvent: (ev: KernelEvent) => void, signal?: AbortSignal): Promise<KernelDone> {
    const run = () =>
      new Promise<KernelDone>((resolve, reject) => {
        if (this.dead) return reject(new KernelError('the kernel driver exited'));
        // Given up on while queued: never started.
        if (signal?.aborted) return resolve({ type: 'done', status: 'interrupted', execution_count: 0 });
        const pending: Pending = { onEvent, resolve, reject };
        this.current = pending;
        signal?.addEventListener('abort', () => {
          if (this.current === pending && !this.dead) this.proc.kill(2);
        });
        this.proc.stdin.write(`${JSON.stringify(req)}\n`);
      });
    const p = this.queue.then(run, run);
    this.queue = p.catch(() => undefined);
    return p;
  }

  /**
   * Run code; `timeoutMs` interrupts it in the driver (0/undefined: none); `env` applies to this
   * run only; aborting `signal` interrupts it (or drops it while it is still queued).
   */
  execute(code: string, opts: { env?: Record<string, string>; timeoutMs?: number; signal?: AbortSignal; onEvent: (ev: KernelEvent) => void }): Promise<KernelDone> {
    const req: Record<string, unknown> = { op: 'execute', code };
    if (opts.env && Object.keys(opts.env).length > 0) req.env = opts.env;
    if (opts.timeoutMs) req.timeout = opts.timeoutMs / 1000;
    return this.enqueue(req, opts.onEvent, opts.signal);
  }

  /** An execution is running or queued. */
  get busy(): boolean {
    return this.current !== null;
  }

  /** A fresh kernel in the same driver (state cleared), after the queued executions. */
  async restart(): Promise<void> {
    await this.enqueue({ op: 'restart' }, () => undefined);
  }

  /** close() was called (the driver's end is expected). */
  closed = false;

  /** End the driver and its kernel (the kernel dies with it: PR_SET_PDEATHSIG). */
  close(): void {
    this.closed = true;
    if (!this.dead) this.proc.kill(9);
  }
}
