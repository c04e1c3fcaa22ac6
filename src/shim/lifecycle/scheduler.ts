/**
 * The lifetime scheduler: one timer for the whole node, armed for the earliest
 * moment any sandbox's policy may fire. Clocks are persisted through `persist`
 * (the registry) whenever a deadline changes and, for activity, at most once
 * per `activityFlushMs`, so a restarted gateway fires the same policies at
 * (nearly) the same moments: a deadline that passed while the gateway was down
 * fires right after the restart.
 */
import { type DueAction, type LifecycleClock, dueAction, nextWake } from './policy';

export interface SchedulerHooks {
  /** Current state of the sandbox ("running", "paused", ...), or null when it is gone. */
  state(id: string): string | null;
  /** Persist the clock (called on every deadline change, activity at most once per flush interval). */
  persist(id: string, clock: LifecycleClock): void;
  /** Carry out a due action. Errors are logged; the entry is re-armed for a retry. */
  fire(id: string, action: DueAction): Promise<void>;
  log?(line: string): void;
  now?(): number;
}

interface Entry {
  clock: LifecycleClock;
  inFlight: number;
  persistedActivity: number;
  firing: boolean;
  /** A failed action is retried no earlier than this. */
  retryAt: number;
}

const MAX_TIMER_MS = 2 ** 31 - 1;

export class LifecycleScheduler {
  private readonly entries = new Map<string, Entry>();
  private timer: NodeJS.Timeout | null = null;
  private armedFor = Infinity;
  private closed = false;
  private readonly now: () => number;

  constructor(
    private readonly hooks: SchedulerHooks,
    private readonly opts: { activityFlushMs?: number; retryMs?: number } = {},
  ) {
    this.now = hooks.now ?? Date.now;
  }

  track(id: string, clock: LifecycleClock): void {
    const e = { clock, inFlight: 0, persistedActivity: clock.lastActivityAt, firing: false, retryAt: 0 };
    this.entries.set(id, e);
    this.armOne(id, e);
  }

  untrack(id: string): void {
    this.entries.delete(id);
  }

  clock(id: string): LifecycleClock | null {
    return this.entries.get(id)?.clock ?? null;
  }

  /** Replace a clock (extend, resume) and persist it now. */
  update(id: string, clock: LifecycleClock): void {
    const e = this.entries.get(id);
    if (!e) return;
    e.clock = clock;
    e.persistedActivity = clock.lastActivityAt;
    e.retryAt = 0;
    this.hooks.persist(id, clock);
    this.armOne(id, e);
  }

  /** A request touched the sandbox. */
  touch(id: string): void {
    const e = this.entries.get(id);
    if (!e) return;
    const now = this.now();
    e.clock = { ...e.clock, lastActivityAt: now };
    if (now - e.persistedActivity >= (this.opts.activityFlushMs ?? 1000)) {
      e.persistedActivity = now;
      this.hooks.persist(id, e.clock);
    }
    if (e.clock.idleSeconds !== null) this.armOne(id, e);
  }

  /** A request started (idle policies never fire while one is in flight). Returns the matching `end`. */
  begin(id: string): () => void {
    const e = this.entries.get(id);
    if (!e) return () => undefined;
    this.touch(id);
    e.inFlight++;
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      e.inFlight = Math.max(0, e.inFlight - 1);
      this.touch(id);
    };
  }

  inFlight(id: string): number {
    return this.entries.get(id)?.inFlight ?? 0;
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    // Keep the last activity on disk for the next process.
    for (const [id, e] of this.entries) if (e.persistedActivity !== e.clock.lastActivityAt) this.hooks.persist(id, e.clock);
  }

  /** Run everything that is due now (the timer calls this; tests may too). */
  async runDue(): Promise<void> {
    const now = this.now();
    const work: Promise<void>[] = [];
    for (const [id, e] of this.entries) {
      if (e.firing || now < e.retryAt) continue;
      const state = this.hooks.state(id);
      if (state === null) {
        this.entries.delete(id);
        continue;
      }
      if (state !== 'running' && state !== 'paused' && state !== 'hibernated') continue;
      const action = dueAction(e.clock, state, e.inFlight, now);
      if (action === null) continue;
      e.firing = true;
      work.push(
        this.hooks
          .fire(id, action)
          .catch((err) => {
            e.retryAt = this.now() + (this.opts.retryMs ?? 5000);
            this.hooks.log?.(`lifecycle: ${id}: ${action.kind === 'expire' ? 'ttl expiry' : `idle ${action.action}`} failed: ${(err as Error).message}`);
          })
          .finally(() => {
            e.firing = false;
          }),
      );
    }
    await Promise.all(work);
    this.arm();
  }

  /**
   * Re-arm for a change of one entry: only an earlier wake than the armed one moves the timer.
   * A wake that moved later leaves the timer early; it then finds nothing due and re-arms from a
   * full scan. So a create, a touch or an exec costs the same at 10,000 sandboxes as at 10.
   */
  private armOne(id: string, e: { clock: LifecycleClock; inFlight: number; firing: boolean; retryAt: number }): void {
    if (this.closed || e.firing) return;
    const state = this.hooks.state(id);
    if (state === null) return;
    const at = e.inFlight > 0 ? e.clock.expiresAt : nextWake(e.clock, state);
    if (at === null) return;
    const next = Math.max(at, e.retryAt);
    if (this.timer && next >= this.armedFor) return;
    this.setTimer(next);
  }

  private setTimer(next: number): void {
    if (this.timer) clearTimeout(this.timer);
    this.armedFor = next;
    const delay = Math.min(MAX_TIMER_MS, Math.max(0, next - this.now()));
    this.timer = setTimeout(() => {
      this.timer = null;
      this.armedFor = Infinity;
      void this.runDue();
    }, delay);
    this.timer.unref();
  }

  private arm(): void {
    if (this.closed) return;
    let next = Infinity;
    for (const [id, e] of this.entries) {
      const state = this.hooks.state(id);
      if (state === null || e.firing) continue;
      // While a request is in flight only the hard maximum can fire; its end re-arms.
      const at = e.inFlight > 0 ? e.clock.expiresAt : nextWake(e.clock, state);
      if (at !== null) next = Math.min(next, Math.max(at, e.retryAt));
    }
    if (next === Infinity) {
      if (this.timer) clearTimeout(this.timer);
      this.timer = null;
      this.armedFor = Infinity;
      return;
    }
    if (this.timer && next >= this.armedFor) return;
    this.setTimer(next);
  }
}
