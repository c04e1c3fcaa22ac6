/**
 * Lifetime policies: what a sandbox's clock says it should do next.
 *
 * - `ttlSeconds`: a hard maximum age. At `expiresAt` the sandbox is stopped
 *   (processes killed, resources released, the record kept as `stopped`
 *   with `stopReason: "ttl"`). `extend` moves `expiresAt` later.
 * - `idleSeconds` + `onIdle`: after that long without a request (exec, files,
 *   shell input, session attach) and with nothing in flight, the sandbox is
 *   paused, hibernated, stopped or deleted, or (`reclaim`) keeps running with
 *   its cold memory given back: once per idle period, again after activity.
 *
 * Pure functions; the scheduler (scheduler.ts) keeps the clocks and persists
 * them so they survive a gateway restart.
 */
import { WarrenError } from '../../errors';
import type { IdleAction, LifetimePolicy } from '../types';

export { IDLE_ACTIONS, type IdleAction, type LifetimePolicy } from '../types';

/** The clocks of one sandbox (persisted in the registry's `lifecycle` column). */
export interface LifecycleClock {
  /** ms since the epoch; null = no hard maximum. */
  expiresAt: number | null;
  /** ms since the epoch of the last request. */
  lastActivityAt: number;
  idleSeconds: number | null;
  onIdle: IdleAction;
  /** `reclaim`: when its cold memory was last given back (ms); it is due again only after later activity. */
  coldReclaimedAt?: number;
}

/** The cold reclaim of this idle period has been done (activity since then starts a new period). */
function reclaimedThisPeriod(clock: LifecycleClock): boolean {
  return clock.coldReclaimedAt !== undefined && clock.coldReclaimedAt >= clock.lastActivityAt;
}

export type DueAction = { kind: 'expire' } | { kind: 'idle'; action: IdleAction };

export const MAX_POLICY_SECONDS = 31_536_000;

export function clockFor(policy: LifetimePolicy | undefined, now: number): LifecycleClock {
  return {
    expiresAt: policy?.ttlSeconds !== undefined ? now + policy.ttlSeconds * 1000 : null,
    lastActivityAt: now,
    idleSeconds: policy?.idleSeconds ?? null,
    onIdle: policy?.onIdle ?? 'pause',
  };
}

/** When the idle policy fires (ms), or null. */
export function idleAt(clock: LifecycleClock): number | null {
  return clock.idleSeconds === null ? null : clock.lastActivityAt + clock.idleSeconds * 1000;
}

/**
 * What is due at `now`. `state` matters: an idle pause does not fire on a
 * sandbox that is already paused or hibernated (its clock restarts when it
 * is resumed); the hard maximum fires in every live state.
 */
export function dueAction(clock: LifecycleClock, state: string, inFlight: number, now: number): DueAction | null {
  if (clock.expiresAt !== null && now >= clock.expiresAt) return { kind: 'expire' };
  if (inFlight > 0) return null;
  const at = idleAt(clock);
  if (at === null || now < at) return null;
  if (clock.onIdle === 'reclaim') return state === 'running' && !reclaimedThisPeriod(clock) ? { kind: 'idle', action: 'reclaim' } : null;
  if (state === 'paused' && (clock.onIdle === 'pause' || clock.onIdle === 'hibernate')) {
    return clock.onIdle === 'hibernate' ? { kind: 'idle', action: 'hibernate' } : null;
  }
  if (state === 'hibernated' && (clock.onIdle === 'pause' || clock.onIdle === 'hibernate')) return null;
  return { kind: 'idle', action: clock.onIdle };
}

/** The next moment (ms) something may become due, or null when nothing will. */
export function nextWake(clock: LifecycleClock, state: string): number | null {
  const candidates: number[] = [];
  if (clock.expiresAt !== null) candidates.push(clock.expiresAt);
  const at = idleAt(clock);
  const idleMatters =
    clock.onIdle === 'reclaim' ? state === 'running' && !reclaimedThisPeriod(clock) : !((state === 'paused' && clock.onIdle === 'pause') || state === 'hibernated');
  if (at !== null && idleMatters) candidates.push(at);
  return candidates.length === 0 ? null : Math.min(...candidates);
}

/**
 * Extend a sandbox's hard maximum by `seconds` (from the current expiry, or
 * from now when it has already passed). A sandbox without a ttl gets one only
 * when `ttlSeconds` is given instead.
 */
export function extendClock(clock: LifecycleClock, req: { seconds?: number; ttlSeconds?: number }, now: number): LifecycleClock {
  if (req.seconds !== undefined && req.ttlSeconds !== undefined) {
    throw new WarrenError('INVALID_ARGUMENT', 'give either seconds (added to the current expiry) or ttlSeconds (a new maximum from now), not both');
  }
  if (req.ttlSeconds !== undefined) return { ...clock, expiresAt: now + req.ttlSeconds * 1000 };
  if (req.seconds !== undefined) {
    if (clock.expiresAt === null) {
      throw new WarrenError('INVALID_ARGUMENT', 'this sandbox has no ttl to extend; pass ttlSeconds to set one', { field: 'seconds' });
    }
    return { ...clock, expiresAt: Math.max(clock.expiresAt, now) + req.seconds * 1000 };
  }
  throw new WarrenError('INVALID_ARGUMENT', 'extend needs seconds or ttlSeconds');
}

export function clockJson(clock: LifecycleClock): {
  expiresAt: string | null;
  lastActivityAt: string;
  idleAt: string | null;
  idleSeconds: number | null;
  onIdle: IdleAction;
} {
  const at = idleAt(clock);
  return {
    expiresAt: clock.expiresAt === null ? null : new Date(clock.expiresAt).toISOString(),
    lastActivityAt: new Date(clock.lastActivityAt).toISOString(),
    idleAt: at === null ? null : new Date(at).toISOString(),
    idleSeconds: clock.idleSeconds,
    onIdle: clock.onIdle,
  };
}
