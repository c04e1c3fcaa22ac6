/**
 * A warm pool: containers made ahead of time, handed to one invocation at a
 * time, reset and verified after it, destroyed and replaced when they die or
 * fail the check. The pool keeps `min` containers, grows while invocations
 * wait (up to `max`), and shrinks back to `min` after `idleSeconds` idle.
 * Waiting invocations form a bounded FIFO queue; past it the pool refuses
 * with RESOURCE_EXHAUSTED (429) and a retry hint.
 */
import { randomBytes } from 'node:crypto';
import { WarrenError } from '../../errors';
import type { HostProcessBackend } from '../types';
import { poolLanguages } from './toolkits';
import type { ResolvedLayer, SandboxSpec } from '../types';
import { PoolContainer, type WarmSpec } from './container';
import type { PoolSpec, PoolStats } from './types';

interface Waiter {
  resolve: (c: PoolContainer) => void;
  reject: (err: unknown) => void;
  since: number;
}

export interface PoolDeps {
  backend: HostProcessBackend;
  nodeId: string;
  log: (line: string) => void;
  /** Resolve and acquire the pool's layers (may build the image); called once. */
  prepare: (spec: PoolSpec) => Promise<{ layers: ResolvedLayer[]; release: () => void }>;
}

const LATENCY_WINDOW = 2048;
/** Idle containers keep a python3 interpreter waiting this long after the pool's last python3 invocation. */
const PYTHON_WARM_KEEP_MS = 5 * 60_000;
/** Below this average idle time between invocations, interpreters are not started ahead of time. */
const PYTHON_WARM_MIN_IDLE_MS = 15;

export class Pool {
  private readonly containers = new Set<PoolContainer>();
  private readonly destroying = new Set<Promise<void>>();
  private readonly idle: PoolContainer[] = [];
  private warmPython: WarmSpec | null = null;
  private lastPythonAt = 0;
  private pythonShare = 0;
  private idleGapMs = 1000;
  private readonly idleSince = new WeakMap<PoolContainer, number>();
  private readonly waiters: Waiter[] = [];
  private starting = 0;
  private state: PoolStats['state'] = 'preparing';
  private message: string | undefined;
  private layers: ResolvedLayer[] | null = null;
  private releaseLayers: (() => void) | null = null;
  private preparing: Promise<void> | null = null;
  private timer: NodeJS.Timeout | null = null;
  private failures = 0;
  private nextStartAt = 0;
  private readonly latencies: number[] = [];
  private latencyPos = 0;
  invocations = 0;
  /** zygoteRuns of containers already discarded. */
  private retiredZygoteRuns = 0;
  replaced = 0;
  rejected = 0;

  constructor(
    readonly spec: PoolSpec,
    private readonly deps: PoolDeps,
  ) {}

  /** Prepare the image in the background and start keeping `min` warm. */
  start(): void {
    this.preparing ??= this.deps
      .prepare(this.spec)
      .then(({ layers, release }) => {
        if (this.state === 'closing') {
          release();
          return;
        }
        this.layers = layers;
        this.releaseLayers = release;
        this.state = 'ready';
        this.message = undefined;
        this.maintain();
      })
      .catch((err) => {
        this.state = 'failed';
        this.message = (err as Error).message;
        this.deps.log(`fncall: pool ${this.spec.name}: ${this.message}`);
        this.rejectWaiters(err);
      });
    this.timer ??= setInterval(() => this.maintain(), 500);
    this.timer.unref();
  }

  /** A container for one invocation; resolves when one is free (FIFO). */
  acquire(opts: { bypassQueueLimit?: boolean; python?: boolean } = {}): Promise<PoolContainer> {
    if (this.state === 'closing') return Promise.reject(new WarrenError('NOT_FOUND', `pool ${this.spec.name} is being deleted`));
    if (this.state === 'failed') return Promise.reject(new WarrenError('UNAVAILABLE', `pool ${this.spec.name} failed: ${this.message}`));
    for (;;) {
      const c = this.takeIdle(opts.python === true);
      if (c === undefined) break;
      if (c.alive) return Promise.resolve(c);
      this.forget(c);
    }
    if (!opts.bypassQueueLimit && this.waiters.length >= this.spec.maxQueue) {
      this.rejected++;
      throw new WarrenError('RESOURCE_EXHAUSTED', `pool ${this.spec.name} is saturated: ${this.waiters.length} invocations are already waiting (maxQueue ${this.spec.maxQueue})`, {
        pool: this.spec.name,
        retryAfterS: this.retryAfterS(),
      });
    }
    return new Promise((resolve, reject) => {
      this.waiters.push({ resolve, reject, since: Date.now() });
      this.maintain();
    });
  }

  /**
   * Which idle container serves the next invocation: for python3, the one whose prewarmed
   * interpreter has been waiting longest (most likely done starting); otherwise the most recently
   * used one without an interpreter (so none is killed for nothing), else the most recent.
   */
  private takeIdle(python: boolean): PoolContainer | undefined {
    let at = -1;
    if (python) {
      let since = Infinity;
      this.idle.forEach((c, i) => {
        const w = c.warmSince;
        if (w !== null && w < since) {
          since = w;
          at = i;
        }
      });
    } else {
      for (let i = this.idle.length - 1; i >= 0 && at < 0; i--) if (this.idle[i]!.warmSince === null) at = i;
    }
    const c = at < 0 ? this.idle.pop() : this.idle.splice(at, 1)[0];
    if (c !== undefined) this.noteIdleGap(performance.now() - (this.idleSince.get(c) ?? performance.now()));
    return c;
  }

  /** Seconds a refused client should wait: the queue's drain time at the recent pace. */
  retryAfterS(): number {
    const p50 = this.percentile(0.5) ?? 100;
    const perSlot = p50 / Math.max(1, this.containers.size);
    return Math.min(60, Math.max(1, Math.ceil((this.waiters.length * perSlot) / 1000)));
  }

  /** Give a container back: reset and verify it, then hand it to the next waiter or keep it warm. */
  async release(c: PoolContainer, latencyMs: number): Promise<void> {
    this.invocations++;
    this.latencies[this.latencyPos] = latencyMs;
    this.latencyPos = (this.latencyPos + 1) % LATENCY_WINDOW;
    const r = await c.reset();
    if (!r.ok || this.state === 'closing') {
      if (!r.ok && this.state !== 'closing') {
        this.deps.log(`fncall: pool ${this.spec.name}: replacing container ${c.id}: ${r.reason}`);
        this.replaced++;
      }
      await this.discard(c);
      this.maintain();
      return;
    }
    // Only when containers wait between invocations: when they are taken again at once, the
    // interpreter's start is on the next invocation's path anyway, and one started early is CPU
    // taken from the invocations that are running.
    if (this.waiters.length === 0 && this.idleGapMs > PYTHON_WARM_MIN_IDLE_MS) this.prewarm(c);
    this.handOver(c);
  }

  /**
   * A pool that serves python3 keeps an interpreter waiting in each idle container
   * (PoolContainer.prewarmPython), for as long as python3 invocations keep coming.
   */
  noteInvocation(python: WarmSpec | null): void {
    // recent share of python3 invocations (an exponential average over the last few: two others in a row stop the prewarming)
    this.pythonShare = this.pythonShare * 0.7 + (python !== null ? 0.3 : 0);
    if (python !== null) {
      this.warmPython = python;
      this.lastPythonAt = Date.now();
    }
  }

  private prewarm(c: PoolContainer): void {
    if (this.warmPython === null) return;
    // an interpreter that the next invocation would only kill is CPU for nothing
    if (this.pythonShare < 0.5 || Date.now() - this.lastPythonAt > PYTHON_WARM_KEEP_MS) return;
    void c.prewarmPython(this.warmPython);
  }

  private handOver(c: PoolContainer): void {
    const w = this.waiters.shift();
    if (w) {
      this.noteIdleGap(0);
      w.resolve(c);
    } else {
      this.idleSince.set(c, performance.now());
      this.idle.push(c);
    }
  }

  /** How long containers sit idle between invocations (an exponential average). */
  private noteIdleGap(ms: number): void {
    this.idleGapMs = this.idleGapMs * 0.8 + ms * 0.2;
  }

  private forget(c: PoolContainer): void {
    if (this.containers.has(c)) this.retiredZygoteRuns += c.zygoteRuns;
    this.containers.delete(c);
    const i = this.idle.indexOf(c);
    if (i >= 0) this.idle.splice(i, 1);
  }

  private async discard(c: PoolContainer): Promise<void> {
    this.forget(c);
    await this.destroy(c);
  }

  /** Destroy a container this pool no longer lists; close() waits for every destroy still going. */
  private destroy(c: PoolContainer): Promise<void> {
    const p = c
      .destroy()
      .catch((err) => this.deps.log(`fncall: destroying ${c.id}: ${(err as Error).message}`))
      .finally(() => this.destroying.delete(p));
    this.destroying.add(p);
    return p;
  }

  /** Grow, refill and shrink. Cheap; runs on a timer and on every change. */
  private maintain(): void {
    if (this.state !== 'ready' || this.layers === null) return;
    const { min, max, idleSeconds } = this.spec;
    const total = this.containers.size + this.starting;
    const demand = this.waiters.length - this.starting;
    let want = Math.max(0, min - total, Math.min(demand, max - total));
    // Start at most a few at once: container creation is CPU work too.
    want = Math.min(want, Math.max(2, this.spec.max), 8 - this.starting);
    if (Date.now() < this.nextStartAt) want = 0;
    for (let i = 0; i < want; i++) void this.startOne();
    if (this.waiters.length === 0 && this.idleGapMs > PYTHON_WARM_MIN_IDLE_MS) for (const c of this.idle) if (c.warmSince === null) this.prewarm(c);
    // Shrink: idle containers above min, unused for idleSeconds (oldest idle first).
    if (this.idle.length > 0 && this.containers.size > min) {
      const cutoff = Date.now() - idleSeconds * 1000;
      for (const c of [...this.idle]) {
        if (this.containers.size <= min) break;
        if (c.lastUsed < cutoff) void this.discard(c);
      }
    }
  }

  private async startOne(): Promise<void> {
    this.starting++;
    const id = `fn-${this.deps.nodeId}-${randomBytes(5).toString('hex')}`;
    const s = this.spec;
    const spec: SandboxSpec = {
      backend: 'container',
      image: s.image,
      workspaces: [],
      toolkits: s.layers,
      cpu: s.limits.cpu,
      memoryMb: s.limits.memoryMb,
      pids: s.limits.pids,
      diskMb: null,
      priority: 'normal',
      user: 'root',
      env: {},
      labels: { 'warren.fncall.pool': s.name },
      owner: 'fncall',
    };
    let c: PoolContainer;
    try {
      c = await PoolContainer.create(this.deps.backend, id, spec, this.layers!, s.limits.workBytes, s.limits.tmpfsBytes);
    } catch (err) {
      this.starting--;
      this.failures++;
      this.nextStartAt = Date.now() + Math.min(30_000, 100 * 2 ** Math.min(this.failures, 8));
      this.deps.log(`fncall: pool ${s.name}: cannot start a container: ${(err as Error).message}`);
      if (this.containers.size === 0 && this.starting === 0 && this.failures >= 3) this.rejectWaiters(err);
      return;
    }
    this.failures = 0;
    if (this.state === 'closing') {
      // Counted as starting until it is gone: close() waits for that before releasing the layers.
      await this.destroy(c);
      this.starting--;
      return;
    }
    this.starting--;
    this.containers.add(c);
    void c.ended.then(() => {
      if (!this.containers.has(c) || this.state === 'closing') return;
      // Died on its own (kill -9 of its pid 1, OOM of the init, ...): replace it.
      this.deps.log(`fncall: pool ${s.name}: container ${c.id} died; replacing it`);
      this.replaced++;
      const wasIdle = this.idle.includes(c);
      this.forget(c);
      if (wasIdle) void this.destroy(c);
      this.maintain();
    });
    this.handOver(c);
    this.maintain();
  }

  private rejectWaiters(err: unknown): void {
    for (const w of this.waiters.splice(0)) w.reject(err);
  }

  private percentile(p: number): number | null {
    const xs = this.latencies.filter((x) => x !== undefined).sort((a, b) => a - b);
    if (xs.length === 0) return null;
    return xs[Math.min(xs.length - 1, Math.floor(p * xs.length))]!;
  }

  stats(): PoolStats {
    const s = this.spec;
    const out: PoolStats = {
      name: s.name,
      image: s.image,
      state: this.state,
      min: s.min,
      max: s.max,
      maxQueue: s.maxQueue,
      warm: this.idle.length,
      interpreters: this.idle.filter((c) => c.warmSince !== null).length,
      zygoteRuns: this.retiredZygoteRuns + [...this.containers].reduce((n, c) => n + c.zygoteRuns, 0),
      busy: this.containers.size - this.idle.length,
      starting: this.starting,
      queued: this.waiters.length,
      invocations: this.invocations,
      replaced: this.replaced,
      rejected: this.rejected,
      p50Ms: round(this.percentile(0.5)),
      p99Ms: round(this.percentile(0.99)),
      limits: s.limits,
      layers: s.layers,
      languages: poolLanguages(s),
      idleSeconds: s.idleSeconds,
    };
    if (this.message !== undefined) out.message = this.message;
    return out;
  }

  /** Wait until `min` containers are warm (tests, benchmarks, `warm: true` on create). */
  async waitWarm(timeoutMs = 600_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.idle.length < this.spec.min) {
      if (this.state === 'failed') throw new WarrenError('UNAVAILABLE', `pool ${this.spec.name} failed: ${this.message}`);
      if (Date.now() > deadline) throw new WarrenError('TIMEOUT', `pool ${this.spec.name} not warm after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** Destroy everything; waiting invocations fail. Busy containers are destroyed when released. */
  async close(): Promise<void> {
    this.state = 'closing';
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.rejectWaiters(new WarrenError('NOT_FOUND', `pool ${this.spec.name} was deleted`));
    await this.preparing?.catch(() => undefined);
    const all = [...this.containers];
    this.idle.length = 0;
    await Promise.all(all.map((c) => this.discard(c)));
    // Busy ones: their invocation ends with internal_error when the container goes.
    while (this.starting > 0) await new Promise((r) => setTimeout(r, 10));
    await Promise.all([...this.destroying]);
    this.releaseLayers?.();
    this.releaseLayers = null;
  }

  /** The containers of this pool: id (also the cgroup name), host pid of each pid 1 and of its python3 zygote. */
  containerList(): Array<{ id: string; pid: number; idle: boolean; zygotePid: number | null }> {
    return [...this.containers].map((c) => ({ id: c.id, pid: c.pid, idle: this.idle.includes(c), zygotePid: c.zygotePid }));
  }
}

function round(x: number | null): number | null {
  return x === null ? null : Math.round(x * 100) / 100;
}
