/**
 * FnCall in the SDK: `client.functions`.
 *
 *   const r = await client.functions.invoke('py', { code: 'print(1)', language: 'python3' });
 *   const j = await client.functions.judge('py', { code, language: 'cpp', tests, checker: 'tokens' });
 *   const pools = await client.functions.list();   // live stats: warm, busy, queued, p50/p99
 */
import type { WarrenClient } from './index';
import type { InvokeResult, InvokeStatus, JudgeResult, PoolLimits, PoolStats, Verdict } from '../shim/fncall/types';
import type { RunCodeResponse, RunJupyterResponse } from '../shim/fncall/sandboxfusion';
import type { FnCallManager } from '../shim/fncall/manager';

export type LanguagesInfo = ReturnType<FnCallManager['languages']>;

export type { InvokeResult, InvokeStatus, JudgeResult, PoolLimits, PoolStats, Verdict, RunCodeResponse };

export type FileInput = string | { content: string; mode?: number } | { base64: string; mode?: number };

export interface InvokeOptions {
  cmd?: string | string[];
  code?: string;
  language?: 'python3' | 'python' | 'bash' | 'c' | 'cpp' | string;
  /** path (relative to /work) -> content */
  files?: Record<string, FileInput>;
  stdin?: string;
  stdinBase64?: string;
  env?: Record<string, string>;
  timeoutMs?: number;
  cpuMs?: number;
  memoryMb?: number;
  maxOutputBytes?: number;
  compileTimeoutMs?: number;
  fetchFiles?: string[];
}

export interface JudgeOptions {
  code: string;
  language: string;
  tests: Array<{ stdin?: string; expected: string }>;
  /** "exact" | "tokens" | "float(1e-6)" */
  checker?: string | { kind: 'float'; eps: number };
  stopOnFirstFailure?: boolean;
  timeoutMs?: number;
  cpuMs?: number;
  memoryMb?: number;
  maxOutputBytes?: number;
  compileTimeoutMs?: number;
}

export interface PoolOptions {
  name: string;
  image?: string;
  layers?: string[];
  min?: number;
  max?: number;
  maxQueue?: number;
  idleSeconds?: number;
  limits?: Partial<PoolLimits>;
}

export type BatchItem = InvokeResult | { error: { code: string; message: string } };

export class FunctionsApi {
  constructor(private readonly client: WarrenClient) {}

  private path(pool: string, suffix = ''): string {
    return `/v1/functions/${encodeURIComponent(pool)}${suffix}`;
  }

  async list(): Promise<PoolStats[]> {
    return (await this.client.requestJson<{ pools: PoolStats[] }>('GET', '/v1/functions')).pools;
  }

  get(pool: string): Promise<PoolStats> {
    return this.client.requestJson('GET', this.path(pool));
  }

  /** Create a pool; with `wait`, resolve once `min` containers are warm (may build the judge image first). */
  create(spec: PoolOptions, opts: { wait?: boolean } = {}): Promise<PoolStats> {
    return this.client.requestJson('POST', '/v1/functions', { json: spec, query: opts.wait ? { wait: '1' } : {}, headersTimeout: 900_000 });
  }

  async delete(pool: string): Promise<void> {
    await this.client.requestJson('DELETE', this.path(pool));
  }

  invoke(pool: string, req: InvokeOptions): Promise<InvokeResult> {
    return this.client.requestJson('POST', this.path(pool, '/invoke'), { json: req, headersTimeout: 900_000, bodyTimeout: 900_000 });
  }

  judge(pool: string, req: JudgeOptions): Promise<JudgeResult> {
    return this.client.requestJson('POST', this.path(pool, '/judge'), { json: req, headersTimeout: 3_600_000, bodyTimeout: 3_600_000 });
  }

  async batch(pool: string, invocations: InvokeOptions[], opts: { concurrency?: number } = {}): Promise<BatchItem[]> {
    const body: Record<string, unknown> = { invocations };
    if (opts.concurrency !== undefined) body.concurrency = opts.concurrency;
    return (await this.client.requestJson<{ results: BatchItem[] }>('POST', this.path(pool, '/batch'), { json: body, headersTimeout: 3_600_000, bodyTimeout: 3_600_000 })).results;
  }

  /** SandboxFusion-compatible POST /run_code. */
  runCode(req: Record<string, unknown>): Promise<RunCodeResponse> {
    return this.client.requestJson('POST', '/run_code', { json: req, headersTimeout: 900_000, bodyTimeout: 900_000 });
  }

  /** SandboxFusion-compatible POST /run_jupyter: cells in one stateful Python kernel. */
  runJupyter(req: Record<string, unknown>): Promise<RunJupyterResponse> {
    return this.client.requestJson('POST', '/run_jupyter', { json: req, headersTimeout: 900_000, bodyTimeout: 900_000 });
  }

  /** The languages of this node: toolkit and pools of each available one, and the unavailable ones with the reason. */
  languages(): Promise<LanguagesInfo> {
    return this.client.requestJson('GET', '/v1/languages');
  }
}
