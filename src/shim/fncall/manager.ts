/**
 * The FnCall manager: the node's warm pools, invocation (compile + run),
 * judge, batch, SandboxFusion's run_code, and admission (per-pool bounded
 * queues, per-account concurrency).
 *
 * Pools come from `<dataDir>/fncall.json` ({ pools: [...] }, see
 * docs/fncall.md) and from the API. Pool containers are not sandboxes: they are
 * not in the registry, and a restarted node destroys leftovers and makes new
 * ones (a warm container holds no state worth keeping).
 */
import { existsSync, mkdirSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import os from 'node:os';
import { WarrenError, asWarrenError } from '../../errors';
import { inSpan } from '../../telemetry';
import { fnCallBackend } from '../backends/registry';
import type { HostProcessBackend } from '../types';
import type { LayerStore } from '../layers/store';
import { check, verdictOf } from './checkers';
import { type PoolContainer, type StepOptions, internalError, zygoteEnabled } from './container';
import { DEFAULT_COMPILE_TIMEOUT_MS, LANGUAGES, UNAVAILABLE, aliasesOf, expandArgv } from './languages';
import { TOOLKITS, poolLanguages, poolLayerStack, toolkitClosure, toolkitLayerName } from './toolkits';
import { Pool } from './pool';
import type { FnCallConfig, InvokeRequest, InvokeResult, JudgeRequest, JudgeResult, JudgeTestResult, PoolSpec, PoolStats, StepResult } from './types';
import { validateConfig, validatePoolSpec } from './wire';
import { KERNEL_FALLBACK_NOTE, type KernelBackend, batchInvocation, parseBatchResult } from '../kernels';
import { type RunJupyterRequest, type RunJupyterResponse, toRunCodeResponse } from './sandboxfusion';

export { JUDGE_IMAGE } from './toolkits';
import { JUDGE_IMAGE } from './toolkits';
/** Start-up allowance of a /run_jupyter kernel (jupyter_client + ipykernel), on top of total_timeout. */
const KERNEL_START_MS = 30_000;
export const JUDGE_PACKAGES = ['python3', 'gcc', 'g++', 'libc6-dev'];
const DEFAULT_ACCOUNT_CONCURRENCY = 64;
const FETCH_FILE_LIMIT = 16 * 1024 * 1024;
/** verl's default memory_limit_mb. */
const RUN_CODE_MEMORY_MB = 1024;

export interface ToolkitBuild {
  name: string;
  digest: string;
  /** Taken from the node cache (no build). */
  cached: boolean;
  /** Wall time of the build (or of taking it from the cache). */
  buildMs: number;
  sizeBytes: number;
}

export interface FnCallOptions {
  dataDir: string;
  nodeId: string;
  layers: LayerStore;
  log: (line: string) => void;
  config?: FnCallConfig;
  onProgress?: (p: { phase: string; message: string; fraction?: number }) => void;
}

export interface LanguagesInfo {
  available: Array<{ name: string; aliases: string[]; toolkit: string | null; compiled: boolean; testRunner: boolean; lazy: boolean; pools: string[] }>;
  unavailable: Array<{ name: string; reason: string }>;
  toolkits: Array<{ name: string; packages: string[]; below: string[]; lazy: boolean; build: ToolkitBuild | null }>;
  kernels: { run_jupyter: KernelBackend; interpreter: KernelBackend; note: string };
}

export class FnCallManager {
  private readonly pools = new Map<string, Pool>();
  private readonly backend: HostProcessBackend;
  private readonly dir: string;
  private readonly inflight = new Map<string, number>();
  private config: FnCallConfig = {};
  private imageBuild: Promise<void> | null = null;
  private readonly toolkitBuilds = new Map<string, Promise<ToolkitBuild>>();
  /** Toolkit builds run one at a time: each is CPU- and disk-heavy (dpkg, mkfs). */
  private buildQueue: Promise<unknown> = Promise.resolve();
  readonly toolkitBuildTimes: Record<string, ToolkitBuild> = {};
  private readonly host = { cpus: os.availableParallelism?.() ?? os.cpus().length, memoryMb: Math.floor(os.totalmem() / (1024 * 1024)) };

  constructor(private readonly opts: FnCallOptions) {
    this.dir = join(opts.dataDir, 'fncall');
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    this.backend = fnCallBackend(this.dir);
  }

  /** Change node-level settings at run time (accountConcurrency, runCodePool, runCodeAnonymous). */
  updateConfig(cfg: Omit<FnCallConfig, 'pools'>): void {
    this.config = { ...this.config, ...cfg };
  }

  get accountConcurrency(): number {
    return this.config.accountConcurrency ?? DEFAULT_ACCOUNT_CONCURRENCY;
  }

  get runCodeAnonymous(): boolean {
    return this.config.runCodeAnonymous === true;
  }

  /** Clean up after a crash, read the config, start the configured pools (warming happens in the background). */
  async start(): Promise<void> {
    for (const id of readdirSync(this.dir)) {
      if (!/^fn-[a-z0-9-]+$/.test(id)) continue;
      this.opts.log(`fncall: removing leftover pool container ${id}`);
      await this.backend.cleanup(id).catch((err) => this.opts.log(`fncall: cleanup ${id}: ${(err as Error).message}`));
    }
    const file = join(this.opts.dataDir, 'fncall.json');
    let cfg = this.opts.config;
    if (cfg === undefined && existsSync(file)) {
      try {
        cfg = validateConfig(JSON.parse(readFileSync(file, 'utf8')));
      } catch (err) {
        throw new WarrenError('INVALID_ARGUMENT', `${file}: ${(err as Error).message}`);
      }
    }
    this.config = cfg ?? {};
    for (const p of this.config.pools ?? []) this.createPool(p, 'config');
  }

  /** `authorize`: refuses content the asking account may not use (the gateway's content check). */
  createPool(body: unknown, source: 'api' | 'config' = 'api', authorize?: (spec: { image: string; layers: string[] }) => void): PoolStats {
    const spec = validatePoolSpec(body, this.host);
    authorize?.(spec);
    if (this.pools.has(spec.name)) throw new WarrenError('ALREADY_EXISTS', `pool ${spec.name} already exists`, { pool: spec.name });
    // Unknown images fail now (except "judge", built on first use).
    if (spec.image !== JUDGE_IMAGE) this.opts.layers.resolveImage(spec.image);
    for (const l of spec.layers) if (TOOLKITS[l] === undefined) this.opts.layers.resolveLayer(l, 'toolkit');
    if (spec.image !== JUDGE_IMAGE && spec.layers.some((l) => TOOLKITS[l] !== undefined)) {
      throw new WarrenError('INVALID_ARGUMENT', `the toolkit layers (${Object.keys(TOOLKITS).join(', ')}) are built over the ${JUDGE_IMAGE} image; pool ${spec.name} uses ${spec.image}`, { field: 'layers' });
    }
    const pool = new Pool(spec, {
      backend: this.backend,
      nodeId: this.opts.nodeId,
      log: this.opts.log,
      prepare: (s) => this.prepare(s),
    });
    this.pools.set(spec.name, pool);
    pool.start();
    this.opts.log(`fncall: pool ${spec.name} (${source}): image ${spec.image}, ${spec.min}..${spec.max} containers`);
    return pool.stats();
  }

  private async prepare(spec: PoolSpec) {
    if (spec.image === JUDGE_IMAGE) await this.ensureJudgeImage();
    const image = this.opts.layers.resolveImage(spec.image);
    const digests: string[] = [];
    for (const l of poolLayerStack(spec)) {
      digests.push(TOOLKITS[l] !== undefined ? (await this.ensureToolkit(l)).digest : this.opts.layers.resolveLayer(l, 'toolkit').digest);
    }
    digests.push(...image.layers);
    const layers = await this.opts.layers.acquire(digests);
    return { layers, release: () => this.opts.layers.release(digests) };
  }

  /** Build the "judge" image (python3, gcc, g++) once; the node cache makes later builds instant. */
  ensureJudgeImage(): Promise<void> {
    if (this.opts.layers.listImages().some((i) => i.name === JUDGE_IMAGE)) return Promise.resolve();
    this.imageBuild ??= (async () => {
      this.opts.log(`fncall: building the ${JUDGE_IMAGE} image (${JUDGE_PACKAGES.join(', ')}); cached for later starts`);
      await this.opts.layers.buildDebian({
        name: JUDGE_IMAGE,
        include: JUDGE_PACKAGES,
        onProgress: (p) => {
          this.opts.onProgress?.(p);
          if (p.fraction === undefined || p.fraction === 1) this.opts.log(`fncall: image ${JUDGE_IMAGE}: ${p.phase}: ${p.message}`);
        },
      });
    })().finally(() => {
      this.imageBuild = null;
    });
    return this.imageBuild;
  }

  /**
   * A toolkit layer (toolkits.ts) built over the judge image and the toolkits it needs, from
   * Debian's packages; the node cache keeps it, so this is a build once per machine.
   */
  ensureToolkit(name: string): Promise<ToolkitBuild> {
    const t = TOOLKITS[name];
    if (t === undefined) return Promise.reject(new WarrenError('NOT_FOUND', `no toolkit ${JSON.stringify(name).slice(0, 40)} (known: ${Object.keys(TOOLKITS).join(', ')})`));
    let p = this.toolkitBuilds.get(name);
    if (p === undefined) {
      p = (async () => {
        await this.ensureJudgeImage();
        const below: string[] = [];
        for (const b of toolkitClosure(t.below)) below.push((await this.ensureToolkit(b)).digest);
        below.push(...this.opts.layers.resolveImage(JUDGE_IMAGE).layers);
        const run = this.buildQueue.then(() => {
          this.opts.log(`fncall: toolkit ${name}: ${t.packages.join(' ')} (built once, then taken from the node cache)`);
          return this.opts.layers.buildDebianLayer({
            name: toolkitLayerName(name),
            packages: t.packages,
            below,
            onProgress: (pr) => {
              this.opts.onProgress?.({ ...pr, message: `toolkit ${name}: ${pr.message}` });
              if (pr.phase !== 'fetch' || pr.fraction === 0) this.opts.log(`fncall: toolkit ${name}: ${pr.phase}: ${pr.message}`);
            },
          });
        });
        this.buildQueue = run.catch(() => undefined);
        const info = await run;
        const b: ToolkitBuild = { name, digest: info.layers[0]!, cached: info.cached, buildMs: info.buildMs, sizeBytes: info.sizeBytes };
        this.toolkitBuildTimes[name] = b;
        this.opts.log(`fncall: toolkit ${name}: ${b.cached ? 'from the node cache' : 'built'} in ${(b.buildMs / 1000).toFixed(1)} s (${(b.sizeBytes / 1048576).toFixed(0)} MiB)`);
        return b;
      })();
      this.toolkitBuilds.set(name, p);
      p.catch(() => this.toolkitBuilds.delete(name));
    }
    return p;
  }

  /** Every language: which toolkit carries it, which pools carry it; and the unavailable ones with the reason. */
  languages(): LanguagesInfo {
    const pools = [...this.pools.values()];
    const ipy = TOOLKITS.python!.packages.includes('python3-ipykernel') && TOOLKITS.python!.packages.includes('python3-jupyter-client');
    return {
      // /run_jupyter runs in the judge pools (python toolkit); the E2B interpreter template uses
      // the same toolkit, other templates (images without ipykernel) get the fallback.
      kernels: { run_jupyter: ipy ? 'ipykernel' : 'stdlib', interpreter: ipy ? 'ipykernel' : 'stdlib', note: KERNEL_FALLBACK_NOTE },
      toolkits: Object.values(TOOLKITS).map((t) => ({ name: t.name, packages: t.packages, below: t.below, lazy: t.lazy === true, build: this.toolkitBuildTimes[t.name] ?? null })),
      available: Object.values(LANGUAGES).map((l) => ({
        name: l.name,
        aliases: aliasesOf(l.name),
        toolkit: l.toolkit,
        compiled: l.compile !== undefined,
        testRunner: l.testRunner === true,
        lazy: l.toolkit !== null && TOOLKITS[l.toolkit]?.lazy === true,
        pools: pools.filter((p) => poolLanguages(p.spec).includes(l.name)).map((p) => p.spec.name),
      })),
      unavailable: Object.entries(UNAVAILABLE).map(([name, reason]) => ({ name, reason })),
    };
  }

  pool(name: string): Pool {
    const p = this.pools.get(name);
    if (p === undefined) throw new WarrenError('NOT_FOUND', `no pool ${JSON.stringify(name).slice(0, 40)}`, { pool: name });
    return p;
  }

  listPools(): PoolStats[] {
    return [...this.pools.values()].map((p) => p.stats());
  }

  async deletePool(name: string): Promise<void> {
    const p = this.pool(name);
    this.pools.delete(name);
    await p.close();
  }

  /**
   * The pool for POST /run_code and /run_jupyter: `runCodePool` (default "run-code", made on
   * first use: the judge image with the python toolkit, 1024 MB as verl asks) when it carries
   * the language, else another pool that does, else `<runCodePool>-<toolkit>`, made on first use
   * with that language's toolkit (its first start builds the toolkit when the node cache lacks it).
   */
  runCodePool(language = 'python3'): string {
    const name = this.config.runCodePool ?? 'run-code';
    const make = (n: string, layers: string[]) => {
      if (this.pools.has(n)) return;
      try {
        this.createPool({ name: n, image: JUDGE_IMAGE, layers, min: 1, limits: { memoryMb: Math.min(RUN_CODE_MEMORY_MB, this.host.memoryMb) } }, 'config');
      } catch (err) {
        if (!(err instanceof WarrenError && err.code === 'ALREADY_EXISTS')) throw err;
      }
    };
    const carries = (p: Pool | undefined) => p !== undefined && poolLanguages(p.spec).includes(language);
    if (!this.pools.has(name)) make(name, []);
    if (carries(this.pools.get(name))) return name;
    for (const p of this.pools.values()) if (carries(p)) return p.spec.name;
    const toolkit = LANGUAGES[language]?.toolkit;
    if (!toolkit) return name;
    const n = `${name}-${toolkit}`.slice(0, 32);
    make(n, [toolkit]);
    return n;
  }

  /**
   * POST /run_jupyter: the cells in one stateful kernel (src/shim/kernels: ipykernel in the judge
   * python toolkit), as one invocation. The invocation's wall limit is total_timeout plus the
   * kernel's start-up (KERNEL_START_MS), within the pool's ceiling; the driver itself stops the
   * cells at total_timeout and interrupts a cell at cell_timeout.
   */
  async runJupyter(poolName: string, account: string, req: RunJupyterRequest): Promise<RunJupyterResponse> {
    const limits = this.pool(poolName).spec.limits;
    const total = req.totalTimeoutS === null ? limits.maxTimeoutMs : Math.min(Math.ceil(req.totalTimeoutS * 1000) + KERNEL_START_MS, limits.maxTimeoutMs);
    const b = batchInvocation(req);
    const inv: InvokeRequest = {
      cmd: b.cmd,
      files: [...req.files, b.driver],
      stdin: b.stdin,
      env: {},
      fetchFiles: [...req.fetchFiles, b.resultPath],
      timeoutMs: total,
    };
    const r = await this.invoke(poolName, account, inv);
    const files = { ...(r.files ?? {}) };
    const result = parseBatchResult(files[b.resultPath]);
    delete files[b.resultPath];
    const driver = toRunCodeResponse({ ...r, files: {} }).run_result;
    if (r.status === 'internal_error') return { status: 'SandboxError', message: r.message ?? 'sandbox error', driver, cells: result?.cells ?? [], executor_pod_name: null, files };
    // As SandboxFusion: Success when the driver ran every cell (cells that raised included: their
    // errors are in the cells); Failed when it did not finish (total_timeout, a limit, a crash).
    const finished = r.status === 'ok' && result !== null && result.status === 'Finished';
    let message = '';
    if (!finished) {
      const cells = `${result?.cells.length ?? 0} of ${req.cells.length} cells`;
      if (result?.status === 'TimeLimitExceeded') message = `total_timeout reached after ${cells}`;
      // The invocation's wall limit is total_timeout plus the kernel's start-up allowance.
      else if (r.status === 'timeout' && r.limit === 'wallMs') message = `total_timeout (with ${KERNEL_START_MS / 1000} s for the kernel's start, within the pool's ceiling) reached after ${cells}`;
      else message = `the kernel driver did not finish (${r.status}${r.limit ? `: ${r.limit}` : ''})`;
    }
    return { status: finished ? 'Success' : 'Failed', message, driver, cells: result?.cells ?? [], executor_pod_name: null, files };
  }

  // ---------------------------------------------------------------- admission

  /** Take one of the account's concurrency slots; with `wait`, wait for one instead of refusing. */
  private async admit(account: string, wait: boolean): Promise<() => void> {
    const limit = this.accountConcurrency;
    for (;;) {
      const n = this.inflight.get(account) ?? 0;
      if (n < limit) {
        this.inflight.set(account, n + 1);
        let done = false;
        return () => {
          if (done) return;
          done = true;
          const m = (this.inflight.get(account) ?? 1) - 1;
          if (m <= 0) this.inflight.delete(account);
          else this.inflight.set(account, m);
        };
      }
      if (!wait) {
        throw new WarrenError('RESOURCE_EXHAUSTED', `account ${account} already has ${n} invocations running (quota ${limit})`, { account, quota: limit, retryAfterS: 1 });
      }
      await new Promise((r) => setTimeout(r, 5));
    }
  }

  private async withContainer<T>(poolName: string, account: string, opts: { wait: boolean; python?: boolean }, fn: (c: PoolContainer, queueMs: number, pool: Pool) => Promise<T>): Promise<T> {
    const pool = this.pool(poolName);
    const release = await this.admit(account, opts.wait);
    const t0 = performance.now();
    let c: PoolContainer;
    const l = pool.spec.limits;
    pool.noteInvocation(opts.python === true && process.env.WARREN_FNCALL_PREWARM !== '0' && !zygoteEnabled() ? { fileSizeBytes: l.fileSizeBytes, tmpfsBytes: l.tmpfsBytes, maxCpuMs: l.maxTimeoutMs } : null);
    try {
      c = await pool.acquire({ bypassQueueLimit: opts.wait, python: opts.python === true });
    } catch (err) {
      release();
      throw err;
    }
    const queueMs = performance.now() - t0;
    try {
      return await fn(c, queueMs, pool);
    } finally {
      release();
      void pool.release(c, performance.now() - t0);
    }
  }

  // ---------------------------------------------------------------- invoke

  invoke(poolName: string, account: string, req: InvokeRequest, opts: { wait?: boolean } = {}): Promise<InvokeResult> {
    return inSpan('warren.fncall.invoke', { 'warren.fncall.pool': poolName, 'warren.fncall.language': req.language ?? 'cmd' }, async (span) => {
      const result = await this.withContainer(poolName, account, { wait: opts.wait ?? false, python: req.language === 'python3' }, async (c, queueMs, pool) => {
        span.setAttribute('warren.fncall.container', c.id);
        return this.runIn(c, pool, req, queueMs);
      });
      span.setAttribute('warren.fncall.status', result.status);
      span.setAttribute('warren.fncall.wall_ms', result.wallMs);
      span.setAttribute('warren.fncall.cpu_ms', result.cpuMs);
      return result;
    });
  }

  private limitsFor(pool: Pool, req: Pick<InvokeRequest, 'timeoutMs' | 'cpuMs' | 'memoryMb' | 'maxOutputBytes'>) {
    const l = pool.spec.limits;
    const check = (field: string, v: number | undefined, max: number, dflt: number) => {
      if (v === undefined) return dflt;
      if (v > max) throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} ${v} exceeds pool ${pool.spec.name}'s ceiling of ${max}`, { field, min: 1, max });
      return v;
    };
    const wallMs = check('timeoutMs', req.timeoutMs, l.maxTimeoutMs, l.timeoutMs);
    return {
      wallMs,
      cpuMs: check('cpuMs', req.cpuMs, l.maxTimeoutMs, wallMs),
      memoryMb: check('memoryMb', req.memoryMb, l.memoryMb, l.memoryMb),
      maxOutputBytes: check('maxOutputBytes', req.maxOutputBytes, 64 * 1024 * 1024, l.maxOutputBytes),
      fileSizeBytes: l.fileSizeBytes,
      tmpfsBytes: l.tmpfsBytes,
      cpu: l.cpu,
    };
  }

  /** python3 runs may use an interpreter started ahead of time (PoolContainer.prewarmPython). */
  private warmOptions(language: InvokeRequest['language']): Partial<Pick<StepOptions, 'warmPython' | 'zygote'>> {
    if (language !== 'python3') return {};
    if (zygoteEnabled()) return { zygote: true };
    if (process.env.WARREN_FNCALL_PREWARM === '0') return {};
    return { warmPython: { script: LANGUAGES.python3.source } };
  }

  /** Check limits against the pool before queueing (a bad request must not wait for a container). */
  checkLimits(poolName: string, req: Pick<InvokeRequest, 'timeoutMs' | 'cpuMs' | 'memoryMb' | 'maxOutputBytes'> & { language?: string }, field = 'language'): void {
    const pool = this.pool(poolName);
    if (req.language !== undefined) {
      const carried = poolLanguages(pool.spec);
      if (!carried.includes(req.language)) {
        const others = [...this.pools.values()].filter((p) => poolLanguages(p.spec).includes(req.language!)).map((p) => p.spec.name);
        const t = LANGUAGES[req.language]?.toolkit;
        throw new WarrenError(
          'INVALID_ARGUMENT',
          `pool ${poolName} does not carry language ${req.language} (it carries: ${carried.join(', ')})${others.length ? `; pools that do: ${others.join(', ')}` : t ? `; a pool with the toolkit layer "${t}" in its layers does` : ''}`,
          { field, code: 'UNKNOWN_LANGUAGE', available: carried },
        );
      }
    }
    this.limitsFor(pool, req);
  }

  /**
   * Write the source (and the request's files), then compile it when the language compiles.
   * Returns the compile step's result and the values of the run argv's templates.
   */
  private async compile(c: PoolContainer, pool: Pool, req: InvokeRequest): Promise<{ compile: StepResult | undefined; vars: Record<string, string> }> {
    const lang = LANGUAGES[req.language!]!;
    const l = this.limitsFor(pool, req);
    const named = lang.sourceFor?.(req.code!) ?? { source: lang.source, vars: {} };
    const vars = { ...named.vars, source: named.source, memoryMb: String(l.memoryMb) };
    const support = (lang.support ?? []).map((f) => ({ path: f.path, data: Buffer.from(f.text, 'utf8'), mode: 0o644 }));
    c.writeFiles([...req.files, ...support, { path: named.source, data: Buffer.from(req.code!, 'utf8'), mode: 0o644 }]);
    if (!lang.compile) return { compile: undefined, vars };
    // Compilers get the pool's memory and their own time limit: a compile bomb stops at either.
    const wallMs = Math.min(Math.max(req.compileTimeoutMs ?? DEFAULT_COMPILE_TIMEOUT_MS, lang.minCompileTimeoutMs ?? 0), pool.spec.limits.maxTimeoutMs);
    const compile = await c.run({
      argv: expandArgv(lang.compile, { ...vars, memoryMb: String(pool.spec.limits.memoryMb) }),
      env: lang.env ?? {},
      stdin: Buffer.alloc(0),
      wallMs,
      cpuMs: wallMs,
      memoryMb: pool.spec.limits.memoryMb,
      maxOutputBytes: 1024 * 1024,
      fileSizeBytes: Math.max(l.fileSizeBytes, 256 * 1024 * 1024),
      tmpfsBytes: l.tmpfsBytes,
      cpu: l.cpu,
    });
    return { compile, vars };
  }

  /** The argv and environment of a language's run step. */
  private runStep(req: Pick<InvokeRequest, 'language' | 'env'>, vars: Record<string, string>): { argv: string[]; env: Record<string, string> } {
    const lang = LANGUAGES[req.language!]!;
    return { argv: expandArgv(lang.run, vars), env: { ...(lang.env ?? {}), ...req.env } };
  }

  private async runIn(c: PoolContainer, pool: Pool, req: InvokeRequest, queueMs: number): Promise<InvokeResult> {
    const l = this.limitsFor(pool, req);
    const base = { pool: pool.spec.name, queueMs: Math.round(queueMs * 1000) / 1000 };
    try {
      let argv = req.cmd;
      let compile: StepResult | undefined;
      let env = req.env;
      if (req.language !== undefined) {
        const prepared = await this.compile(c, pool, req);
        compile = prepared.compile;
        if (compile !== undefined && compile.status !== 'ok') {
          return { ...compile, compile, phase: 'compile', ...base };
        }
        ({ argv, env } = this.runStep(req, prepared.vars));
      } else {
        c.writeFiles(req.files);
      }
      const run = await c.run({ argv: argv!, env, stdin: req.stdin, ...l, ...this.warmOptions(req.language) });
      const result: InvokeResult = { ...run, phase: 'run', ...base };
      if (compile !== undefined) result.compile = compile;
      if (req.fetchFiles.length > 0 && run.status !== 'internal_error') result.files = c.readFiles(req.fetchFiles, FETCH_FILE_LIMIT);
      return result;
    } catch (err) {
      const e = asWarrenError(err);
      if (e.status < 500) throw e;
      this.opts.log(`fncall: invocation in ${c.id} failed: ${e.code}: ${e.message}`);
      return { ...internalError(e.message), phase: 'run', ...base };
    }
  }

  // ---------------------------------------------------------------- judge

  judge(poolName: string, account: string, req: JudgeRequest): Promise<JudgeResult> {
    return inSpan('warren.fncall.judge', { 'warren.fncall.pool': poolName, 'warren.fncall.language': req.language, 'warren.fncall.tests': req.tests.length }, async (span) => {
      const r = await this.withContainer(poolName, account, { wait: false, python: req.language === 'python3' }, async (c, _q, pool) => {
        const base: JudgeResult = { verdict: 'AC', passed: 0, total: req.tests.length, ran: 0, tests: [], maxWallMs: 0, maxCpuMs: 0, maxMemPeakBytes: 0, pool: poolName };
        const inv: InvokeRequest = { code: req.code, language: req.language, files: [], stdin: Buffer.alloc(0), env: {}, fetchFiles: [] };
        for (const k of ['timeoutMs', 'cpuMs', 'memoryMb', 'maxOutputBytes', 'compileTimeoutMs'] as const) if (req[k] !== undefined) inv[k] = req[k];
        const l = this.limitsFor(pool, inv);
        let compile: StepResult | undefined;
        let vars: Record<string, string> = {};
        try {
          ({ compile, vars } = await this.compile(c, pool, inv));
        } catch (err) {
          const e = asWarrenError(err);
          if (e.status < 500) throw e;
          compile = internalError(e.message);
        }
        if (compile !== undefined) base.compile = compile;
        if (compile !== undefined && compile.status !== 'ok') {
          base.verdict = compile.status === 'internal_error' ? 'IE' : 'CE';
          return base;
        }
        const { argv, env } = this.runStep({ language: req.language, env: {} }, vars);
        for (const [index, t] of req.tests.entries()) {
          let run: StepResult;
          try {
            run = await c.run({ argv, env, stdin: t.stdin, ...l, ...this.warmOptions(req.language) });
          } catch (err) {
            run = internalError(asWarrenError(err).message);
          }
          // Between tests of one submission: no process survives, files (the binary) stay.
          if (!(await c.killLeftovers())) run = internalError('processes survived the kill');
          else if (req.language === 'python3' && index + 1 < req.tests.length && !zygoteEnabled()) void c.prewarmPython({ fileSizeBytes: l.fileSizeBytes, tmpfsBytes: l.tmpfsBytes, maxCpuMs: pool.spec.limits.maxTimeoutMs });
          let verdict = verdictOf(run.status);
          if (verdict === 'AC' && !check(req.checker, run.stdout, t.expected)) verdict = 'WA';
          const tr: JudgeTestResult = {
            index,
            verdict,
            status: run.status,
            exitCode: run.exitCode,
            signal: run.signal,
            wallMs: run.wallMs,
            cpuMs: run.cpuMs,
            memPeakBytes: run.memPeakBytes,
            stdout: run.stdout.slice(0, 1024),
            stderr: run.stderr.slice(0, 1024),
          };
          base.tests.push(tr);
          base.ran++;
          base.maxWallMs = Math.max(base.maxWallMs, run.wallMs);
          base.maxCpuMs = Math.max(base.maxCpuMs, run.cpuMs);
          base.maxMemPeakBytes = Math.max(base.maxMemPeakBytes, run.memPeakBytes);
          if (verdict === 'AC') base.passed++;
          else {
            if (base.verdict === 'AC') base.verdict = verdict;
            if (req.stopOnFirstFailure) break;
          }
          if (run.status === 'internal_error') break;
        }
        return base;
      });
      span.setAttribute('warren.fncall.verdict', r.verdict);
      return r;
    });
  }

  // ---------------------------------------------------------------- batch

  /**
   * Many invocations, at most `concurrency` at a time (default: the pool's max):
   * the batch waits for containers instead of being refused, so it never floods
   * the pool's queue. Results come back in request order; an invocation that
   * fails before running has `{ error: { code, message } }` in its place.
   */
  async batch(poolName: string, account: string, reqs: InvokeRequest[], concurrency?: number): Promise<Array<InvokeResult | { error: { code: string; message: string } }>> {
    const pool = this.pool(poolName);
    const width = Math.max(1, Math.min(concurrency ?? pool.spec.max, pool.spec.max, this.accountConcurrency));
    const out: Array<InvokeResult | { error: { code: string; message: string } }> = new Array(reqs.length);
    let next = 0;
    await inSpan('warren.fncall.batch', { 'warren.fncall.pool': poolName, 'warren.fncall.size': reqs.length }, () =>
      Promise.all(
        Array.from({ length: Math.min(width, reqs.length) }, async () => {
          for (;;) {
            const i = next++;
            if (i >= reqs.length) return;
            try {
              out[i] = await this.invoke(poolName, account, reqs[i]!, { wait: true });
            } catch (err) {
              const e = asWarrenError(err);
              out[i] = { error: { code: e.code, message: e.message } };
            }
          }
        }),
      ),
    );
    return out;
  }

  /** Wait until a pool has `min` warm containers. */
  waitWarm(name: string, timeoutMs?: number): Promise<void> {
    return this.pool(name).waitWarm(timeoutMs);
  }

  async close(): Promise<void> {
    const pools = [...this.pools.values()];
    this.pools.clear();
    await Promise.all(pools.map((p) => p.close()));
    this.backend.close?.();
  }
}
