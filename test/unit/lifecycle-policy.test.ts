/** Lifetime policy arithmetic and the scheduler, with a fake clock. */
import test from 'ava';
import { clockFor, dueAction, extendClock, idleAt, nextWake, type LifecycleClock } from '../../src/shim/lifecycle/policy';
import { LifecycleScheduler } from '../../src/shim/lifecycle/scheduler';
import type { DueAction } from '../../src/shim/lifecycle/policy';
import { checkQuota, UNLIMITED } from '../../src/gateway/auth';
import { validateCreateRequest, validateExtendRequest, validatePackRequest, validateQuotaRequest } from '../../src/validation';
import { WarrenError } from '../../src/errors';

const T0 = 1_800_000_000_000;

test('clocks: ttl and idle deadlines', (t) => {
  const c = clockFor({ ttlSeconds: 60, idleSeconds: 10, onIdle: 'stop' }, T0);
  t.is(c.expiresAt, T0 + 60_000);
  t.is(idleAt(c), T0 + 10_000);
  t.is(nextWake(c, 'running'), T0 + 10_000);
  t.is(dueAction(c, 'running', 0, T0 + 9_999), null);
  t.deepEqual(dueAction(c, 'running', 0, T0 + 10_000), { kind: 'idle', action: 'stop' });
  t.is(dueAction(c, 'running', 1, T0 + 10_000), null, 'nothing idles while a request is in flight');
  t.deepEqual(dueAction(c, 'running', 1, T0 + 60_000), { kind: 'expire' }, 'the hard maximum fires anyway');
  const none = clockFor(undefined, T0);
  t.is(nextWake(none, 'running'), null);
  t.is(dueAction(none, 'running', 0, T0 + 1e12), null);
});

test('clocks: a paused sandbox does not idle-pause again', (t) => {
  const c = clockFor({ idleSeconds: 5, onIdle: 'pause' }, T0);
  t.is(dueAction(c, 'paused', 0, T0 + 10_000), null);
  t.is(nextWake(c, 'paused'), null);
  const h = clockFor({ idleSeconds: 5, onIdle: 'hibernate' }, T0);
  t.deepEqual(dueAction(h, 'paused', 0, T0 + 10_000), { kind: 'idle', action: 'hibernate' });
  t.is(dueAction(h, 'hibernated', 0, T0 + 10_000), null);
});

test('clocks: idle reclaim fires once per idle period, only on a running sandbox, again after activity', (t) => {
  const c = clockFor({ idleSeconds: 5, onIdle: 'reclaim' }, T0);
  t.is(nextWake(c, 'running'), T0 + 5_000);
  t.deepEqual(dueAction(c, 'running', 0, T0 + 5_000), { kind: 'idle', action: 'reclaim' });
  t.is(dueAction(c, 'paused', 0, T0 + 5_000), null, 'a paused sandbox has nothing resident to reclaim');
  t.is(nextWake(c, 'paused'), null);
  const done: LifecycleClock = { ...c, coldReclaimedAt: T0 + 5_001 };
  t.is(dueAction(done, 'running', 0, T0 + 60_000), null, 'not again in the same idle period');
  t.is(nextWake(done, 'running'), null);
  const active: LifecycleClock = { ...done, lastActivityAt: T0 + 7_000 };
  t.is(nextWake(active, 'running'), T0 + 12_000, 'activity starts a new period');
  t.deepEqual(dueAction(active, 'running', 0, T0 + 12_000), { kind: 'idle', action: 'reclaim' });
  const withTtl = { ...clockFor({ ttlSeconds: 30, idleSeconds: 5, onIdle: 'reclaim' }, T0), coldReclaimedAt: T0 + 6_000 };
  t.is(nextWake(withTtl, 'running'), T0 + 30_000, 'the ttl still wakes it');
});

test('extend: seconds past the current expiry, or a new ttl from now', (t) => {
  const c = clockFor({ ttlSeconds: 60 }, T0);
  t.is(extendClock(c, { seconds: 30 }, T0 + 1000).expiresAt, T0 + 90_000);
  t.is(extendClock(c, { seconds: 30 }, T0 + 120_000).expiresAt, T0 + 150_000, 'an expiry in the past counts from now');
  t.is(extendClock(c, { ttlSeconds: 10 }, T0 + 5000).expiresAt, T0 + 15_000);
  t.throws(() => extendClock(clockFor(undefined, T0), { seconds: 5 }, T0), { instanceOf: WarrenError as never, message: /no ttl/ });
  t.throws(() => extendClock(c, { seconds: 5, ttlSeconds: 5 }, T0));
});

test('scheduler: fires due actions, never while in flight, retries failures, persists activity at most once per interval', async (t) => {
  let now = T0;
  const fired: Array<[string, DueAction]> = [];
  const persisted: Array<[string, LifecycleClock]> = [];
  const states = new Map([
    ['a', 'running'],
    ['b', 'running'],
  ]);
  let fail = true;
  const s = new LifecycleScheduler(
    {
      state: (id) => states.get(id) ?? null,
      persist: (id, c) => void persisted.push([id, c]),
      fire: async (id, action) => {
        if (id === 'b' && fail) {
          fail = false;
          throw new Error('boom');
        }
        fired.push([id, action]);
        if (action.kind === 'idle' && action.action === 'pause') states.set(id, 'paused');
      },
      now: () => now,
    },
    { activityFlushMs: 1000, retryMs: 2000 },
  );
  s.track('a', clockFor({ idleSeconds: 10, onIdle: 'pause' }, now));
  s.track('b', clockFor({ ttlSeconds: 5 }, now));
  now += 500;
  s.touch('a');
  t.is(persisted.length, 0, 'activity within the flush interval is not written');
  now += 600;
  s.touch('a');
  t.is(persisted.length, 1);
  const end = s.begin('a');
  now = T0 + 20_000;
  await s.runDue();
  t.deepEqual(fired, [], 'a is in flight; b failed once');
  end(); // the end of a request is activity too: the idle clock restarts
  now += 2500;
  await s.runDue();
  t.deepEqual(fired.map(([id]) => id), ['b'], 'b retried after retryMs; a idles 10 s after its last request');
  now += 8000;
  await s.runDue();
  t.deepEqual(fired.map(([id, a]) => `${id}:${a.kind}`).sort(), ['a:idle', 'b:expire', 'b:expire']);
  fired.length = 0;
  now += 100_000;
  await s.runDue();
  t.deepEqual(fired.map(([id]) => id), ['b'], 'a paused stays paused; b (still "running" in this fake) fires again');
  s.close();
});

test('quotas: 429 QUOTA_EXCEEDED names the limit', (t) => {
  checkQuota(UNLIMITED, { sandboxes: 100, cpu: 100, memoryMb: 1e6 }, { cpu: 1, memoryMb: 512 });
  const err = t.throws(() => checkQuota({ maxSandboxes: 2, maxCpu: null, maxMemoryMb: null }, { sandboxes: 2, cpu: 2, memoryMb: 1024 }, { cpu: 1, memoryMb: 512 })) as WarrenError;
  t.is(err.code, 'QUOTA_EXCEEDED');
  t.is(err.status, 429);
  t.is(err.details?.quota, 'maxSandboxes');
  t.is((t.throws(() => checkQuota({ maxSandboxes: null, maxCpu: 2, maxMemoryMb: null }, { sandboxes: 1, cpu: 1.5, memoryMb: 0 }, { cpu: 1, memoryMb: 1 })) as WarrenError).details?.quota, 'maxCpu');
  t.is((t.throws(() => checkQuota({ maxSandboxes: null, maxCpu: null, maxMemoryMb: 1000 }, { sandboxes: 1, cpu: 0, memoryMb: 600 }, { cpu: 1, memoryMb: 512 })) as WarrenError).details?.quota, 'maxMemoryMb');
  checkQuota({ maxSandboxes: 3, maxCpu: 2, maxMemoryMb: 1024 }, { sandboxes: 2, cpu: 1, memoryMb: 512 }, { cpu: 1, memoryMb: 512 });
});

test('wire validation of lifecycle requests', (t) => {
  const ctx = { owner: 'o', host: { cpus: 4, memoryMb: 8192 } };
  t.deepEqual(validateCreateRequest({ ttlSeconds: 30, idleSeconds: 5, onIdle: 'pause' }, ctx).lifetime, { ttlSeconds: 30, idleSeconds: 5, onIdle: 'pause' });
  t.is((t.throws(() => validateCreateRequest({ idleSeconds: 0 }, ctx)) as WarrenError).code, 'LIMIT_OUT_OF_RANGE');
  t.is((t.throws(() => validateCreateRequest({ idleSeconds: 5, onIdle: 'nap' }, ctx)) as WarrenError).code, 'INVALID_ARGUMENT');
  t.deepEqual(validateExtendRequest({ seconds: 10 }), { seconds: 10 });
  t.is((t.throws(() => validateExtendRequest({})) as WarrenError).code, 'INVALID_ARGUMENT');
  t.is((t.throws(() => validateExtendRequest({ seconds: 1, ttlSeconds: 1 })) as WarrenError).code, 'INVALID_ARGUMENT');
  t.is((t.throws(() => validateExtendRequest({ minutes: 1 })) as WarrenError).code, 'UNKNOWN_FIELD');
  t.deepEqual(validatePackRequest({ name: 'env:v1', scrub: ['/answers', '/home/*/.cache', '/a/**/b'], publish: true }), { name: 'env:v1', scrub: ['/answers', '/home/*/.cache', '/a/**/b'], publish: true });
  t.is((t.throws(() => validatePackRequest({ name: 'env', scrub: ['relative'] })) as WarrenError).code, 'PATH_ESCAPE');
  t.is((t.throws(() => validatePackRequest({ name: 'env', scrub: ['/a/../etc'] })) as WarrenError).code, 'PATH_ESCAPE');
  t.is((t.throws(() => validatePackRequest({ name: 'sha256:' + 'a'.repeat(64) })) as WarrenError).code, 'INVALID_ARGUMENT');
  t.is((t.throws(() => validatePackRequest({ scrub: [] })) as WarrenError).code, 'INVALID_ARGUMENT');
  t.deepEqual(validateQuotaRequest({ maxSandboxes: 3, maxCpu: null }), { maxSandboxes: 3, maxCpu: null });
  t.is((t.throws(() => validateQuotaRequest({ maxSandboxes: -1 })) as WarrenError).code, 'LIMIT_OUT_OF_RANGE');
});
