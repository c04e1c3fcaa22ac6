/**
 * FnCall: short stateless invocations in warm, precreated containers.
 * These are the validated shapes the manager works with; the wire forms and
 * their validation live in ./wire.ts.
 */

export type InvokeStatus = 'ok' | 'runtime_error' | 'timeout' | 'memory_limit' | 'output_limit' | 'signal' | 'internal_error';

/** Which limit ended the program, when one did. */
export type LimitHit = 'wallMs' | 'cpuMs' | 'memoryMb' | 'maxOutputBytes';

export interface PoolLimits {
  /** CPU cores of each container (CFS quota). */
  cpu: number;
  /** Memory of each container; an invocation may ask for less, never more. */
  memoryMb: number;
  /** Processes and threads of each container: a fork bomb stops here. */
  pids: number;
  /** Largest file an invocation may write (RLIMIT_FSIZE). */
  fileSizeBytes: number;
  /** Size of the scratch filesystem (/tmp, /mnt, ... of every invocation, emptied after each) and of each invocation's fresh /dev/shm. */
  tmpfsBytes: number;
  /** Size of the work dir /work (a tmpfs of each container, emptied after every invocation). */
  workBytes: number;
  /** Defaults and ceilings of per-invocation limits. */
  timeoutMs: number;
  maxTimeoutMs: number;
  maxOutputBytes: number;
}

export interface PoolSpec {
  name: string;
  /** Image name or digest; "judge" (python3, gcc, g++) is built on first use. */
  image: string;
  /** Extra layers (toolkits) stacked over the image, top-most first. */
  layers: string[];
  min: number;
  max: number;
  /** Invocations that may wait for a container; past it, 429 RESOURCE_EXHAUSTED. */
  maxQueue: number;
  /** Idle containers above `min` are destroyed after this long. */
  idleSeconds: number;
  limits: PoolLimits;
}

/** A name of LANGUAGES (languages.ts). */
export type Language = string;

export interface InputFile {
  /** Normalised path relative to the work dir (/work). */
  path: string;
  data: Buffer;
  mode: number;
}

export interface InvokeRequest {
  /** Exactly one of cmd or code+language. */
  cmd?: string[];
  code?: string;
  language?: Language;
  files: InputFile[];
  stdin: Buffer;
  env: Record<string, string>;
  timeoutMs?: number;
  cpuMs?: number;
  memoryMb?: number;
  maxOutputBytes?: number;
  compileTimeoutMs?: number;
  /** Files (relative to /work) to return after the run, base64. */
  fetchFiles: string[];
}

/** The result of one step (compile or run). */
export interface StepResult {
  status: InvokeStatus;
  exitCode: number | null;
  signal: number | null;
  /** UTF-8 text (invalid sequences replaced by U+FFFD); see stdoutBase64. */
  stdout: string;
  stderr: string;
  /** The exact bytes, base64, present only when the output is not valid UTF-8. */
  stdoutBase64?: string;
  stderrBase64?: string;
  truncated: boolean;
  wallMs: number;
  cpuMs: number;
  memPeakBytes: number;
  limit?: LimitHit;
  /** Why internal_error happened. */
  message?: string;
}

export interface InvokeResult extends StepResult {
  /** Compiled languages: the compile step's own result. A failed compile ends the invocation with phase "compile". */
  compile?: StepResult;
  phase: 'compile' | 'run';
  /** fetchFiles that existed, base64. */
  files?: Record<string, string>;
  pool: string;
  /** Time spent waiting for a warm container. */
  queueMs: number;
}

export type Checker = { kind: 'exact' } | { kind: 'tokens' } | { kind: 'float'; eps: number };

export interface JudgeRequest {
  code: string;
  language: Language;
  tests: Array<{ stdin: Buffer; expected: string }>;
  checker: Checker;
  stopOnFirstFailure: boolean;
  timeoutMs?: number;
  cpuMs?: number;
  memoryMb?: number;
  maxOutputBytes?: number;
  compileTimeoutMs?: number;
}

export type Verdict = 'AC' | 'WA' | 'TLE' | 'MLE' | 'RE' | 'CE' | 'OLE' | 'IE';

export interface JudgeTestResult {
  index: number;
  verdict: Verdict;
  status: InvokeStatus;
  exitCode: number | null;
  signal: number | null;
  wallMs: number;
  cpuMs: number;
  memPeakBytes: number;
  /** First bytes of the program's output (for WA diagnosis). */
  stdout: string;
  stderr: string;
}

export interface JudgeResult {
  verdict: Verdict;
  passed: number;
  total: number;
  /** Tests actually run (fewer than total when stopped at the first failure). */
  ran: number;
  compile?: StepResult;
  tests: JudgeTestResult[];
  maxWallMs: number;
  maxCpuMs: number;
  maxMemPeakBytes: number;
  pool: string;
}

export interface PoolStats {
  name: string;
  image: string;
  state: 'preparing' | 'ready' | 'failed' | 'closing';
  message?: string;
  min: number;
  max: number;
  maxQueue: number;
  /** Idle, ready containers. */
  warm: number;
  /** Idle containers whose python3 interpreter is already started, waiting for its program. */
  interpreters: number;
  /** python3 invocations forked from a container's zygote (docs/fncall.md), since the pool started. */
  zygoteRuns: number;
  busy: number;
  starting: number;
  queued: number;
  invocations: number;
  /** Containers replaced because they died or failed the post-invocation check. */
  replaced: number;
  rejected: number;
  p50Ms: number | null;
  p99Ms: number | null;
  limits: PoolLimits;
  layers: string[];
  /** The languages the pool's image and toolkit layers carry. */
  languages: string[];
  idleSeconds: number;
}

export interface FnCallConfig {
  pools?: Array<Partial<PoolSpec> & { name: string }>;
  /** Concurrent invocations per account across all pools (default 64). */
  accountConcurrency?: number;
  /** Pool used by POST /run_code (created with defaults on first use when missing; default "run_code"). */
  runCodePool?: string;
  /** Let POST /run_code run without a bearer token (SandboxFusion clients send none). Default false. */
  runCodeAnonymous?: boolean;
}
