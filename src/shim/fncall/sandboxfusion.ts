/**
 * SandboxFusion compatibility: `POST /run_code` request and response shapes
 * (bytedance/SandboxFusion, RunCodeRequest / RunCodeResponse), so RL
 * frameworks that call SandboxFusion for code rewards can point at Warren.
 *
 * Request:  { code, language, compile_timeout?, run_timeout?, memory_limit_MB?,
 *             stdin?, files?: { path: base64 | null }, fetch_files?: [path] }
 * Response: { status: "Success" | "Failed" | "SandboxError", message,
 *             compile_result: CommandRunResult | null,
 *             run_result: CommandRunResult | null,
 *             executor_pod_name: null, files: { path: base64 } }
 * CommandRunResult: { status: "Finished" | "TimeLimitExceeded" | "Error",
 *             execution_time: seconds | null, return_code: int | null,
 *             stdout: string | null, stderr: string | null }
 */
import { WarrenError } from '../../errors';
import { expectNumber, expectObject, expectString, rejectUnknown } from '../../gateway/validation';
import type { InvokeRequest, InvokeResult, StepResult } from './types';
import { validateFiles, validateLanguage, validateWorkPath } from './wire';

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

const FIELDS = ['code', 'language', 'compile_timeout', 'run_timeout', 'memory_limit_MB', 'stdin', 'files', 'fetch_files'];

/** SandboxFusion's own defaults: 10 s compile, 10 s run, no memory limit (-1). */
export function validateRunCode(body: unknown): InvokeRequest {
  const o = expectObject(body, 'body');
  // SandboxFusion ignores fields it does not know; be as lenient, but never silently drop known ones.
  void FIELDS;
  if (o.code === undefined) throw new WarrenError('INVALID_ARGUMENT', 'code is required', { field: 'code' });
  const code = expectString(o.code, 'code', { allowEmpty: true, allowNul: true, maxBytes: 4 * 1024 * 1024 });
  if (o.language === undefined) throw new WarrenError('INVALID_ARGUMENT', 'language is required', { field: 'language' });
  const language = validateLanguage(o.language);
  const seconds = (v: unknown, field: string, dflt: number) => (v === undefined || v === null ? dflt : expectNumber(v, field, 0.001, 600, false));
  const compileS = seconds(o.compile_timeout, 'compile_timeout', 10);
  const runS = seconds(o.run_timeout, 'run_timeout', 10);
  const req: InvokeRequest = {
    code,
    language,
    files: validateFiles(o.files, 'files', true),
    stdin: Buffer.from(o.stdin === undefined || o.stdin === null ? '' : expectString(o.stdin, 'stdin', { allowEmpty: true, allowNul: true, maxBytes: 16 * 1024 * 1024 }), 'utf8'),
    env: {},
    fetchFiles: [],
    timeoutMs: Math.ceil(runS * 1000),
    compileTimeoutMs: Math.ceil(compileS * 1000),
  };
  if (o.memory_limit_MB !== undefined && o.memory_limit_MB !== null && o.memory_limit_MB !== -1) {
    req.memoryMb = expectNumber(o.memory_limit_MB, 'memory_limit_MB', 16, 65536, true);
  }
  if (o.fetch_files !== undefined && o.fetch_files !== null) {
    if (!Array.isArray(o.fetch_files) || o.fetch_files.length > 256) throw new WarrenError('INVALID_ARGUMENT', 'fetch_files must be an array of at most 256 paths', { field: 'fetch_files' });
    req.fetchFiles = o.fetch_files.map((p, i) => validateWorkPath(p, `fetch_files[${i}]`));
  }
  rejectUnknownLenient(o);
  return req;
}

function rejectUnknownLenient(o: Record<string, unknown>): void {
  // Unknown fields are refused like everywhere else in Warren, except SandboxFusion
  // request fields Warren does not use (they are accepted and ignored).
  const ignored = ['extra_args', 'run_timeout_ms', 'compile_timeout_ms'];
  const rest = Object.fromEntries(Object.entries(o).filter(([k]) => !ignored.includes(k)));
  rejectUnknown(rest, FIELDS);
}

function commandResult(r: StepResult): CommandRunResult {
  return {
    status: r.status === 'timeout' ? 'TimeLimitExceeded' : r.status === 'internal_error' ? 'Error' : 'Finished',
    execution_time: Math.round(r.wallMs) / 1000,
    // Like Python's subprocess: a program killed by signal N has return code -N.
    return_code: r.exitCode ?? (r.signal !== null ? -r.signal : null),
    stdout: r.stdout,
    stderr: r.stderr,
  };
}

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
    message = r.phase === 'compile' ? 'compilation failed' : r.status;
  }
  return { status, message, compile_result: compile, run_result: run, executor_pod_name: null, files: r.files ?? {} };
}

export function sandboxErrorResponse(message: string): RunCodeResponse {
  return { status: 'SandboxError', message, compile_result: null, run_result: null, executor_pod_name: null, files: {} };
}
