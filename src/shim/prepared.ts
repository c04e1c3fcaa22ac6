/**
 * Prepared sandboxes: creates made ahead of time, so that a create of a shape the node has seen
 * recently costs a few limit writes instead of a spawn.
 *
 * A shape is what a backend makes a sandbox from (for the container backend: its layers, disk
 * quota, confinement and scheduling class; Backend.preparedShape). Everything a request may vary
 * within a shape (cpu, memory and pids limits, user, env, labels, lifetime) is given to the
 * prepared sandbox when it is claimed (Backend.claimPrepared), so the result is the sandbox a
 * fresh create would make. Nothing runs in a prepared sandbox but its pid 1, which has run
 * nothing itself; it has no record, is in no list and counts for no account.
 *
 * The pool learns shapes from creates: each create of a shape asks for `perShape` prepared ones
 * of it, made one at a time in the background. A shape nobody asked for in `idleMs` is given back,
 * and at most `maxShapes` are kept (the least recently asked for goes first). A policy change
 * or an image removal flushes the pool (`flush`); a node killed with prepared sandboxes leaves
 * directories without records, which its next start removes (Backend.leftovers).
 */
import type { BackendSandbox } from './types';

export interface PreparedOptions {
  /** Prepared sandboxes kept per shape (0: the pool is off). */
  perShape: number;
  /** Shapes kept at once. */
  maxShapes: number;
  /** A shape with no create for this long is given back (ms). */
  idleMs: number;
}

export const DEFAULT_PREPARED: PreparedOptions = { perShape: 2, maxShapes: 4, idleMs: 60_000 };

export interface Prepared {
  readonly id: string;
  readonly box: BackendSandbox;
  /** The layers the sandbox holds (acquired when it was made; they go with it to the claimer). */
  readonly digests: readonly string[];
}

/** What the pool needs from its node: make one sandbox of a shape, and give one back. */
export interface PreparedHost<S> {
  make(request: S): Promise<Prepared>;
  discard(p: Prepared): Promise<void>;
  log(line: string): void;
}

interface Shape<S> {
  request: S;
  ready: Prepared[];
  lastAsked: number;
  /** No more makes before this time (a make of this shape failed). */
  pausedUntil: number;
}

/** A take's refill starts this long after it (see fillSoon). */
const FILL_DELAY_MS = 10;

/** After a failed make, a shape is not made again for this long. */
const RETRY_MS = 5_000;

export class PreparedPool<S> {
  private readonly shapes = new Map<string, Shape<S>>();
  private making: Promise<void> | null = null;
  private fillTimer: NodeJS.Timeout | null = null;
  private closed = false;
  private readonly sweeper: NodeJS.Timeout | null;
  /** Sandboxes being made or given back: `close` waits for them. */
  private readonly inFlight = new Set<Promise<unknown>>();

  constructor(
    readonly options: PreparedOptions,
    private readonly host: PreparedHost<S>,
    private readonly now: () => number = Date.now,
  ) {
    this.sweeper = options.perShape > 0 ? setInterval(() => this.expireIdle(), Math.max(1000, Math.min(options.idleMs / 2, 30_000))) : null;
    this.sweeper?.unref();
  }

  get enabled(): boolean {
    return this.options.perShape > 0 && !this.closed;
  }

  /** Prepared sandboxes held now (they count against the node's capacity like live ones). */
  get size(): number {
    let n = 0;
    for (const s of this.shapes.values()) n += s.ready.length;
    return n;
  }

  /**
   * Whether the pool holds anything or has work under way: a make in flight holds its tasks and
   * memory before it is ready, and a give-back holds them until its pid 1 is gone.
   */
  get holding(): boolean {
    return this.size > 0 || this.inFlight.size > 0;
  }

  /** Per shape, the ids ready now and how long ago it was last asked for (features report, tests). */
  report(): Array<{ shape: string; ready: string[]; lastAskedMs: number }> {
    return [...this.shapes].map(([shape, s]) => ({ shape, ready: s.ready.map((p) => p.id), lastAskedMs: this.now() - s.lastAsked }));
  }

  /**
   * A prepared sandbox of `shape`, taken out of the pool (synchronous: two creates never get the
   * same one), and the pool asked to make up for it. undefined when none is ready.
   */
  take(shape: string, request: S): Prepared | undefined {
    if (!this.enabled) return undefined;
    const s = this.ask(shape, request);
    const p = s.ready.shift();
    this.fillSoon();
    return p;
  }

  /**
   * Give back what is held and stop making (a policy change, an image removal, a create the
   * node has no room for). Resolves when what was held or under way at the call is gone: a make
   * in flight lands in a shape that no longer exists and is given back then.
   */
  async flush(): Promise<void> {
    const all: Prepared[] = [];
    for (const s of this.shapes.values()) all.push(...s.ready.splice(0));
    this.shapes.clear();
    const underWay = [...this.inFlight];
    await Promise.all(all.map((p) => this.discard(p)));
    await Promise.allSettled(underWay);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.sweeper) clearInterval(this.sweeper);
    if (this.fillTimer) clearTimeout(this.fillTimer);
    await this.flush();
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
  }

  /** A prepared sandbox whose pid 1 ended is no use: out of the pool and given back. */
  private watch(shape: string, p: Prepared): void {
    void p.box.ended.then(() => {
      const s = this.shapes.get(shape);
      const i = s?.ready.indexOf(p) ?? -1;
      if (s === undefined || i < 0) return;
      s.ready.splice(i, 1);
      this.host.log(`prepared sandbox ${p.id}: pid 1 ended; giving it back`);
      void this.discard(p);
      this.fillSoon();
    });
  }

  private ask(shape: string, request: S): Shape<S> {
    let s = this.shapes.get(shape);
    if (s === undefined) {
      s = { request, ready: [], lastAsked: this.now(), pausedUntil: 0 };
      this.shapes.set(shape, s);
      this.evict();
    } else {
      // Map order is the order shapes were last asked for
      this.shapes.delete(shape);
      this.shapes.set(shape, s);
      s.lastAsked = this.now();
      s.request = request;
    }
    return s;
  }

  private evict(): void {
    while (this.shapes.size > this.options.maxShapes) {
      const [oldest, s] = this.shapes.entries().next().value as [string, Shape<S>];
      this.shapes.delete(oldest);
      for (const p of s.ready) void this.discard(p);
    }
  }

  /** Give back the shapes nobody asked for in idleMs (run by a timer; public for tests). */
  expireIdle(): void {
    const now = this.now();
    for (const [shape, s] of [...this.shapes]) {
      if (now - s.lastAsked < this.options.idleMs) continue;
      this.shapes.delete(shape);
      for (const p of s.ready) void this.discard(p);
    }
  }

  /**
   * Makes start a little after a take, not at once: the claimer's first exec usually follows its
   * create, and a spawn beside it on a small machine costs that exec more than the wait costs
   * the pool. The delay does not move with later takes, so a steady stream of creates still
   * gets its refills.
   */
  private fillSoon(): void {
    if (this.fillTimer !== null || this.making !== null) return;
    this.fillTimer = setTimeout(() => {
      this.fillTimer = null;
      this.fill();
    }, FILL_DELAY_MS);
    this.fillTimer.unref();
  }

  /** One make at a time, for the most recently asked shape that is short, until none is. */
  private fill(): void {
    if (this.making !== null || !this.enabled) return;
    const next = this.shortest();
    if (next === null) return;
    const [shape, s] = next;
    const run = (async () => {
      try {
        const p = await this.host.make(s.request);
        if (this.closed || this.shapes.get(shape) !== s) {
          await this.discard(p);
          return;
        }
        s.ready.push(p);
        this.watch(shape, p);
      } catch (err) {
        s.pausedUntil = this.now() + RETRY_MS;
        this.host.log(`prepared sandboxes: making one failed (${(err as Error).message}); retrying this shape in ${RETRY_MS / 1000} s`);
      }
    })();
    this.making = run;
    this.track(run);
    void run.finally(() => {
      this.making = null;
      // the next make waits for the event loop to turn, so a create that arrived meanwhile goes first
      setImmediate(() => this.fill());
    });
  }

  private shortest(): [string, Shape<S>] | null {
    const now = this.now();
    const shapes = [...this.shapes].reverse();
    for (const [shape, s] of shapes) if (s.ready.length < this.options.perShape && s.pausedUntil <= now) return [shape, s];
    return null;
  }

  /** Give back one taken out of the pool that its claimer could not use. */
  giveBack(p: Prepared): Promise<void> {
    return this.discard(p);
  }

  private discard(p: Prepared): Promise<void> {
    const d = this.host.discard(p).catch((err: Error) => this.host.log(`prepared sandbox ${p.id}: giving it back failed: ${err.message}`));
    this.track(d);
    return d;
  }

  private track(p: Promise<unknown>): void {
    this.inFlight.add(p);
    void p.finally(() => this.inFlight.delete(p));
  }
}
