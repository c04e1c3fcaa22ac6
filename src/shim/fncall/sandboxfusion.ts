/**
 * SandboxFusion compatibility: `POST /run_code` and `POST /run_jupyter` with
 * SandboxFusion's request and response shapes (bytedance/SandboxFusion), so RL
 * frameworks that call SandboxFusion for code rewards (verl, its official
 * client) can point at Warren unchanged. docs/fncall.md has the mapping.
 *
 * The request side accepts what SandboxFusion accepts: unknown fields are
 * ignored, numbers may be strings of numbers (pydantic coerces them), and
 * timeouts and memory above the operator's policy (the pool's ceilings) are
 * lowered to it rather than refused, so a client's defaults (verl: 1024 MB)
 * never turn every sample into an error. Errors name the request's own fields.
 */
import { WarrenError } from '../../errors';
import { expectObject, expectString } from '../../validation';
import type { InvokeRequest, InvokeResult, PoolLimits, StepResult } from './types';
import type { BatchCell } from '../kernels';
import { validateFiles, validateLanguage, validateSandboxPath } from './wire';

export interface CommandRunResult {
  status: 'Finished' | 'TimeLimitExceeded' | 'Error';
  execution_time: number | null;
  return_code: number | null;
  stdout: string | null;
  stderr: string | null;
}

export interface RunCodeResponse {
  status: 'Success' | 'Failed' | 'SandboxError';
  message: string;
  compile_result: CommandRunResult | null;
  run_result: CommandRunResult | null;
  executor_pod_name: string | null;
  files: Record<string, string>;
}

/** A run_code request after validation: the invoke request plus what is decided against the pool. */
export interface RunCodeRequest extends InvokeRequest {
  /** Seconds asked for; null: no limit asked (0 or absent), i.e. the policy's. */
  runTimeoutS: number | null;
  compileTimeoutS: number | null;
  /** MB asked for; null: the pool's (-1, 0 or absent). */
  memoryLimitMb: number | null;
}

/** A number, or a string holding one (pydantic's coercion), in [min, max]. */
function sfNumber(v: unknown, field: string, min: number, max: number): number {
  const n = typeof v === 'string' && /^\s*-?\d+(\.\d+)?\s*$/.test(v) ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isFinite(n)) throw new WarrenError('INVALID_ARGUMENT', `${field} must be a number`, { field });
  if (n < min || n > max) throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} ${n} is out of range [${min}, ${max}]`, { field, min, max });
  return n;
}

function sfSeconds(v: unknown, field: string): number | null {
  if (v === undefined || v === null) return null;
  const s = sfNumber(v, field, 0, 1e9);
  return s === 0 ? null : s;
}

function sfFetch(v: unknown, field: string): string[] {
  if (v === undefined || v === null) return [];
  if (!Array.isArray(v) || v.length > 256) throw new WarrenError('INVALID_ARGUMENT', `${field} must be an array of at most 256 paths`, { field });
  return v.map((p, i) => validateSandboxPath(p, `${field}[${i}]`));
}

function sfStdin(v: unknown): Buffer {
  if (v === undefined || v === null) return Buffer.alloc(0);
  return Buffer.from(expectString(v, 'stdin', { allowEmpty: true, allowNul: true, maxBytes: 16 * 1024 * 1024 }), 'utf8');
}

/**
 * SandboxFusion's defaults: run and compile timeouts 10 s; memory_limit_MB -1 (no limit asked:
 * the pool's). verl sends memory_limit_MB 1024 (older versions spell it memory_limit_mb).
 */
export function validateRunCode(body: unknown): RunCodeRequest {
  const o = expectObject(body, 'body');
  if (o.code === undefined || o.code === null) throw new WarrenError('INVALID_ARGUMENT', 'code is required', { field: 'code' });
  const code = expectString(o.code, 'code', { allowEmpty: true, allowNul: true, maxBytes: 4 * 1024 * 1024 });
  if (o.language === undefined || o.language === null) throw new WarrenError('INVALID_ARGUMENT', 'language is required', { field: 'language' });
  const language = validateLanguage(o.language);
  const memField = o.memory_limit_MB !== undefined ? 'memory_limit_MB' : 'memory_limit_mb';
  const mem = o[memField] === undefined || o[memField] === null ? -1 : sfNumber(o[memField], memField, -1, 1 << 20);
  const run = o.run_timeout === undefined ? 10 : sfSeconds(o.run_timeout, 'run_timeout');
  const compile = o.compile_timeout === undefined ? 10 : sfSeconds(o.compile_timeout, 'compile_timeout');
  return {
    code,
    language,
    files: validateFiles(o.files, 'files', true, validateSandboxPath),
    stdin: sfStdin(o.stdin),
    env: {},
    fetchFiles: sfFetch(o.fetch_files, 'fetch_files'),
    runTimeoutS: run,
    compileTimeoutS: compile,
    memoryLimitMb: mem <= 0 ? null : Math.ceil(mem),
  };
}

/**
 * Fit a request to the pool's policy: a timeout above the pool's maximum, or none asked for
 * (run_timeout 0), is the maximum; memory above the pool's is the pool's; below 16 MB is 16.
 */
export function fitToPolicy(req: RunCodeRequest, limits: PoolLimits): InvokeRequest {
  const ms = (s: number | null) => (s === null ? limits.maxTimeoutMs : Math.max(1, Math.min(Math.ceil(s * 1000), limits.maxTimeoutMs)));
  const out: InvokeRequest = { ...req, timeoutMs: ms(req.runTimeoutS), compileTimeoutMs: ms(req.compileTimeoutS) };
  if (req.memoryLimitMb !== null) out.memoryMb = Math.max(16, Math.min(req.memoryLimitMb, limits.memoryMb));
  return out;
}

function commandResult(r: StepResult): CommandRunResult {
  const timedOut = r.status === 'timeout';
  return {
    status: timedOut ? 'TimeLimitExceeded' : r.status === 'internal_error' ? 'Error' : 'Finished',
    execution_time: Math.round(r.wallMs) / 1000,
    // Like Python's subprocess (which SandboxFusion uses): killed by signal N is -N (an OOM kill
    // or an output flood is -9). A program stopped at its time limit has no return code.
    return_code: timedOut ? null : (r.exitCode ?? (r.signal !== null ? -r.signal : null)),
    stdout: r.stdout,
    stderr: r.stderr,
  };
}

/**
 * Success: compiled (when compiled) and exited 0. Failed: anything the program did (compile error,
 * non-zero exit, signal, a time, memory or output limit), with message "" as SandboxFusion has it;
 * SandboxError: Warren could not run it, message says why.
 */
export function toRunCodeResponse(r: InvokeResult): RunCodeResponse {
  const compile = r.compile ? commandResult(r.compile) : null;
  const run = r.phase === 'run' ? commandResult(r) : null;
  let status: RunCodeResponse['status'] = 'Success';
  let message = '';
  if (r.status === 'internal_error') {
    status = 'SandboxError';
    message = r.message ?? 'sandbox error';
  } else if (r.status !== 'ok') {
    status = 'Failed';
  }
  return { status, message, compile_result: compile, run_result: run, executor_pod_name: null, files: r.files ?? {} };
}

export function sandboxErrorResponse(message: string): RunCodeResponse {
  return { status: 'SandboxError', message, compile_result: null, run_result: null, executor_pod_name: null, files: {} };
}

// ---------------------------------------------------------------- run_jupyter

/** A cell's outputs: stream text, MIME bundles of display_data and execute_result, errors with their traceback lines. */
export type JupyterCellResult = BatchCell;

export interface RunJupyterResponse {
  status: 'Success' | 'Failed' | 'SandboxError';
  message: string;
  driver: CommandRunResult | null;
  cells: JupyterCellResult[];
  executor_pod_name: null;
  files: Record<string, string>;
}

export interface RunJupyterRequest {
  cells: string[];
  cellTimeoutS: number | null;
  totalTimeoutS: number | null;
  files: InvokeRequest['files'];
  fetchFiles: string[];
}

/** SandboxFusion's run_jupyter: cells run in order in one kernel; cell_timeout 0 = none; total_timeout default 45 s. */
export function validateRunJupyter(body: unknown): RunJupyterRequest {
  const o = expectObject(body, 'body');
  if (!Array.isArray(o.cells) || o.cells.length > 1000) throw new WarrenError('INVALID_ARGUMENT', 'cells must be an array of at most 1000 code strings', { field: 'cells' });
  const cells = o.cells.map((c, i) => expectString(c, `cells[${i}]`, { allowEmpty: true, allowNul: false, maxBytes: 4 * 1024 * 1024 }));
  if (o.kernel !== undefined && o.kernel !== null && o.kernel !== 'python3') {
    throw new WarrenError('INVALID_ARGUMENT', `kernel ${JSON.stringify(String(o.kernel).slice(0, 32))} is not available (available: python3)`, { field: 'kernel', code: 'UNKNOWN_LANGUAGE', available: ['python3'] });
  }
  return {
    cells,
    cellTimeoutS: o.cell_timeout === undefined ? null : sfSeconds(o.cell_timeout, 'cell_timeout'),
    totalTimeoutS: o.total_timeout === undefined ? 45 : sfSeconds(o.total_timeout, 'total_timeout'),
    files: validateFiles(o.files, 'files', true, validateSandboxPath),
    fetchFiles: sfFetch(o.fetch_files, 'fetch_files'),
  };
}
