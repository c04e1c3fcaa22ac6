import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { WarrenError } from '../../src/errors';
import { openDatabase } from '../../src/state/db';
import { BoundedBytes, IdempotencyStore, bodyHash, idempotencyKeyOf, recordError, validateIdempotencyKey } from '../../src/gateway/idempotency';

const scope = (key: string, sandbox = 'sb-1', account = 'alice') => ({ account, sandbox, key });

function clockedStore(opts: ConstructorParameters<typeof IdempotencyStore>[1] = {}) {
  const clock = { now: 1_000_000 };
  const db = openDatabase(':memory:');
  return { db, clock, store: new IdempotencyStore(db, opts, () => clock.now) };
}

test('the first request claims a key; a retry finds the running record, then the stored result', (t) => {
  const { store } = clockedStore();
  const h = bodyHash({ cmd: 'echo hi' });
  const a = store.begin(scope('k'), 'exec', h);
  t.true(a.first);
  t.is(a.record.state, 'running');
  t.is(a.record.instance, store.instance);
  const b = store.begin(scope('k'), 'exec', h);
  t.false(b.first);
  t.is(b.record.state, 'running');
  store.finish(scope('k'), { exitCode: 0, status: 'ok' }, Buffer.from('hi\n'), Buffer.alloc(0));
  const c = store.begin(scope('k'), 'exec', h);
  t.false(c.first);
  t.is(c.record.state, 'done');
  t.deepEqual(c.record.result?.outcome, { exitCode: 0, status: 'ok' });
  t.is(c.record.result?.stdout.toString(), 'hi\n');
});

test('keys are scoped per account and sandbox', (t) => {
  const { store } = clockedStore();
  const h = bodyHash({ cmd: 'x' });
  t.true(store.begin(scope('k', 'sb-1', 'alice'), 'exec', h).first);
  t.true(store.begin(scope('k', 'sb-2', 'alice'), 'exec', h).first);
  t.true(store.begin(scope('k', 'sb-1', 'bob'), 'exec', h).first);
  t.false(store.begin(scope('k', 'sb-1', 'alice'), 'exec', h).first);
});

test('a key sent again with another body or kind is IDEMPOTENCY_KEY_REUSED (422)', (t) => {
  const { store } = clockedStore();
  store.begin(scope('k'), 'exec', bodyHash({ cmd: 'echo a' }));
  const e = t.throws(() => store.begin(scope('k'), 'exec', bodyHash({ cmd: 'echo b' })), { instanceOf: WarrenError });
  t.is(e?.code, 'IDEMPOTENCY_KEY_REUSED');
  t.is(e?.status, 422);
  const k = t.throws(() => store.begin(scope('k'), 'shell', bodyHash({ cmd: 'echo a' })), { instanceOf: WarrenError });
  t.is(k?.code, 'IDEMPOTENCY_KEY_REUSED');
});

test('body hashes ignore key order and undefined fields, and see every value', (t) => {
  t.is(bodyHash({ cmd: 'a', env: { X: '1', Y: '2' } }), bodyHash({ env: { Y: '2', X: '1' }, cmd: 'a', cwd: undefined }));
  t.not(bodyHash({ cmd: ['a', 'b'] }), bodyHash({ cmd: ['b', 'a'] }));
  t.not(bodyHash({ cmd: 'a', timeoutMs: 1 }), bodyHash({ cmd: 'a', timeoutMs: 2 }));
  t.not(bodyHash({ stdin: Buffer.from('a') }), bodyHash({ stdin: Buffer.from('b') }));
  t.regex(bodyHash({}), /^[0-9a-f]{64}$/);
});

test('the window: a key is remembered until it expires, then a request runs again', (t) => {
  const { store, clock } = clockedStore({ windowMs: 60_000 });
  const h = bodyHash({ cmd: 'x' });
  const a = store.begin(scope('k'), 'exec', h);
  t.is(a.record.expiresAt - a.record.createdAt, 60_000);
  store.finish(scope('k'), {}, Buffer.alloc(0), Buffer.alloc(0));
  clock.now += 59_999;
  t.false(store.begin(scope('k'), 'exec', h).first);
  clock.now += 1;
  t.is(store.get(scope('k')), undefined);
  // Expired, so also a different body is fine now.
  t.true(store.begin(scope('k'), 'exec', bodyHash({ cmd: 'y' })).first);
});

test('gc removes expired keys and keys of sandboxes that are gone', async (t) => {
  const { store, clock } = clockedStore({ windowMs: 1000 });
  const h = bodyHash({});
  store.begin(scope('old'), 'exec', h);
  clock.now += 500;
  store.begin(scope('young'), 'exec', h);
  store.begin(scope('other', 'sb-gone'), 'exec', h);
  t.is(store.size, 3);
  clock.now += 600;
  t.is(await store.gc(async (id) => id !== 'sb-gone'), 2);
  t.is(store.size, 1);
  t.truthy(store.get(scope('young')));
  store.dropSandbox('sb-1');
  t.is(store.size, 0);
});

test('stored output is cut at the bound; the byte counts say it was', (t) => {
  const { store } = clockedStore({ maxStoredOutputBytes: 4 });
  store.begin(scope('k'), 'exec', bodyHash({}));
  store.finish(scope('k'), {}, Buffer.from('abcdefgh'), Buffer.from('xy'), 8, 2);
  const r = store.get(scope('k'))!.result!;
  t.is(r.stdout.toString(), 'abcd');
  t.is(r.stdoutBytes, 8);
  t.is(r.stderr.toString(), 'xy');
  t.is(r.stderrBytes, 2);
});

test('records survive closing and reopening the database; runs of a dead gateway become interrupted, shell ones stay', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-idem-'));
  try {
    const path = join(dir, 'warren.db');
    const db1 = openDatabase(path);
    const s1 = new IdempotencyStore(db1);
    s1.begin(scope('exec-run'), 'exec', bodyHash({ cmd: 'x' }));
    s1.begin(scope('shell-run'), 'shell', bodyHash({ cmd: 'x' }), { session: 's-abc', commandId: 'c1', startOffset: 10 });
    s1.begin(scope('done'), 'exec', bodyHash({ cmd: 'y' }));
    s1.finish(scope('done'), { exitCode: 3 }, Buffer.from('out'), Buffer.from('err'));
    db1.close();

    const db2 = openDatabase(path);
    const s2 = new IdempotencyStore(db2);
    t.not(s2.instance, s1.instance);
    t.is(s2.markInterrupted(), 1);
    const cut = s2.get(scope('exec-run'))!;
    t.is(cut.state, 'interrupted');
    const err = recordError(cut);
    t.is(err.code, 'IDEMPOTENCY_INTERRUPTED');
    t.is(err.status, 409);
    const sh = s2.get(scope('shell-run'))!;
    t.is(sh.state, 'running');
    t.deepEqual(sh.meta, { session: 's-abc', commandId: 'c1', startOffset: 10 });
    // A shell run followed to its end after the restart is stored like any other.
    s2.finish(scope('shell-run'), { exitCode: 0 }, Buffer.from('late'), Buffer.alloc(0));
    t.is(s2.get(scope('shell-run'))!.state, 'done');
    t.is(s2.get(scope('done'))!.result?.stderr.toString(), 'err');
    // A finished record is never overwritten by a late finisher.
    s2.finish(scope('done'), { exitCode: 99 }, Buffer.alloc(0), Buffer.alloc(0));
    t.deepEqual(s2.get(scope('done'))!.result?.outcome, { exitCode: 3 });
    db2.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('release forgets a key (nothing ran); fail keeps the error for retries', (t) => {
  const { store } = clockedStore();
  store.begin(scope('a'), 'exec', bodyHash({}));
  store.release(scope('a'));
  t.true(store.begin(scope('a'), 'exec', bodyHash({ other: 1 })).first);
  store.begin(scope('b'), 'exec', bodyHash({}));
  store.fail(scope('b'), { code: 'INTERNAL', message: 'boom' });
  const rec = store.get(scope('b'))!;
  t.is(rec.state, 'failed');
  t.is(recordError(rec).code, 'INTERNAL');
});

test('keys: 1..200 characters of a URL-safe set; header and body field must agree', (t) => {
  for (const ok of ['a', '3f2b8c1e-9d4a-4b7e-8f00-1c2d3e4f5a6b', 'job-17/step:3', 'x'.repeat(200), 'AbC+/=_.']) t.is(validateIdempotencyKey(ok), ok);
  for (const bad of ['', 'x'.repeat(201), 'has space', 'new\nline', 'ü', 42, null, {}]) {
    const e = t.throws(() => validateIdempotencyKey(bad), { instanceOf: WarrenError });
    t.is(e?.code, 'INVALID_ARGUMENT');
    t.is(e?.status, 400);
  }
  t.is(idempotencyKeyOf(undefined, undefined), undefined);
  t.is(idempotencyKeyOf('', undefined), undefined);
  t.is(idempotencyKeyOf('k1', undefined), 'k1');
  t.is(idempotencyKeyOf(undefined, 'k2'), 'k2');
  t.is(idempotencyKeyOf('k3', 'k3'), 'k3');
  t.is(t.throws(() => idempotencyKeyOf('k1', 'k2'))?.message.includes('differ'), true);
});

test('a bad window or bound is refused', (t) => {
  const db = openDatabase(':memory:');
  t.throws(() => new IdempotencyStore(db, { windowMs: 0 }), { instanceOf: WarrenError });
  t.throws(() => new IdempotencyStore(db, { maxStoredOutputBytes: -1 }), { instanceOf: WarrenError });
});

test('BoundedBytes keeps the first bytes and counts all', (t) => {
  const b = new BoundedBytes(5);
  b.push(Buffer.from('abc'));
  b.push(Buffer.from('defg'));
  b.push(Buffer.from('hij'));
  t.is(b.bytes().toString(), 'abcde');
  t.is(b.total, 10);
});

test('warren up --idempotency-window takes durations', async (t) => {
  const { parseDurationMs } = await import('../../src/cli/main');
  t.is(parseDurationMs('24h', '--w'), 86_400_000);
  t.is(parseDurationMs('30m', '--w'), 1_800_000);
  t.is(parseDurationMs('90', '--w'), 90_000);
  t.is(parseDurationMs('1.5s', '--w'), 1500);
  t.is(parseDurationMs('500ms', '--w'), 500);
  for (const bad of ['', '0', '-1s', '1w', '31d', 'soon']) t.throws(() => parseDurationMs(bad, '--w'), { message: /--w expects a duration/ });
});

test('after a restart, supervised execs are followed (not interrupted); the others are interrupted with the backend reason', (t) => {
  const db = openDatabase(':memory:');
  const first = new IdempotencyStore(db);
  const h = bodyHash({ cmd: 'sleep 1' });
  first.begin(scope('supervised'), 'exec', h, { run: 'a1b2' });
  first.begin(scope('plain'), 'exec', h, { unsupervised: 'the microvm backend cannot' });
  const second = new IdempotencyStore(db);
  t.is(second.markInterrupted(), 1);
  t.deepEqual(second.runningElsewhere().map((r) => [r.scope.key, r.meta.run]), [['supervised', 'a1b2']]);
  const cut = second.get(scope('plain'))!;
  t.is(cut.state, 'interrupted');
  const err = recordError(cut);
  t.is(err.code, 'IDEMPOTENCY_INTERRUPTED');
  t.true(err.message.endsWith('(the microvm backend cannot)'));
  // Once stored, a supervised run is no longer followed.
  second.finish(scope('supervised'), { exitCode: 0 }, Buffer.alloc(0), Buffer.alloc(0));
  t.deepEqual(second.runningElsewhere(), []);
  t.is(new IdempotencyStore(db).runningElsewhere().length, 0);
});

test('body hashes: key order does not matter; a field named __proto__ or constructor does', (t) => {
  t.is(bodyHash({ a: 1, b: { c: 2, d: 3 } }), bodyHash({ b: { d: 3, c: 2 }, a: 1 }));
  const base = bodyHash({ cmd: 'true', env: {} });
  for (const name of ['__proto__', 'constructor']) {
    const body = JSON.parse(`{"cmd":"true","env":{"${name}":"x"}}`) as unknown;
    t.not(bodyHash(body), base, name);
    t.not(bodyHash(body), bodyHash(JSON.parse(`{"cmd":"true","env":{"${name}":"y"}}`)), `${name}: its value counts`);
  }
});
