/**
 * FnCall pools: nothing leaks between invocations in one container, refill
 * after a container dies (also mid-invocation: internal_error), growth under
 * load and shrinking when idle, 429 + Retry-After on a full queue, the
 * per-account quota, judge verdicts, batch order, and no host leftovers.
 */
import test from 'ava';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { native } from '../../src/native';
import { WarrenClient } from '../../src/sdk';
import { countHostResources } from '../helpers/warren';
import { type FnFixture, integrationSkipReason, openFnFixture, rawRequest } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
let f: FnFixture;
const maybe = testUnless(skip).serial;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
});

test.after.always(async () => {
  if (!f) return;
  const nodeId = f.shim.nodeId;
  const dataDir = f.dataDir;
  await f.close();
  const left = countHostResources({ dataDir, idPrefix: `fn-${nodeId}` });
  if (left.cgroups + left.processes + left.mounts > 0) throw new Error(`pool containers leaked: ${JSON.stringify(left)}`);
});

async function until(cond: () => boolean | Promise<boolean>, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error('condition not met in time');
    await sleep(20);
  }
}

maybe('no leak between invocations in the same container: files, /tmp, /dev/shm, processes, env, SysV IPC', async (t) => {
  await f.pool({ name: 'one', min: 1, max: 1 });
  const pool = f.shim.functions.pool('one');
  const [c0] = pool.containerList();
  const leave = await f.admin.functions.invoke('one', {
    cmd: [
      '/bin/bash',
      '-c',
      [
        'echo secret > /work/leak1; mkdir -p /work/d/e; echo s > /work/d/e/x; chmod 000 /work/d',
        'echo secret > /tmp/leak2; echo s > /dev/shm/leak3',
        // /var/tmp is a scratch directory (writable, emptied after the invocation); the rest of the root is read-only
        'echo s > /var/tmp/leak4',
        'for p in /etc/leak5 /leak6 /usr/leak7; do echo s > $p 2>/dev/null && echo WROTE $p; done',
        'echo "export LEAK=1" >> ~/.bashrc; export LEAK=1',
        'python3 -c "import ctypes; l=ctypes.CDLL(None); print(\'shm\', l.shmget(0x1234, 4096, 0o1666) >= 0)"',
        '(setsid sleep 1000 &); nohup sleep 1000 >/dev/null 2>&1 & disown',
        'echo done',
      ].join('\n'),
    ],
  });
  t.is(leave.status, 'ok', JSON.stringify(leave));
  t.regex(leave.stdout, /shm True\ndone/);
  t.notRegex(leave.stdout, /WROTE/);
  // Host view right after: the container's cgroup holds only its pid 1 (and its python3 zygote, which no invocation can touch).
  const zygote = pool.containerList()[0]!.zygotePid;
  t.deepEqual(native.cgroupProcs(c0!.id).sort(), [c0!.pid, ...(zygote !== null ? [zygote] : [])].sort());
  const look = await f.admin.functions.invoke('one', {
    cmd: [
      '/bin/bash',
      '-c',
      // the processes are counted by bash's own glob: a pipeline would count its members, racing their forks
      'ls -A /work /tmp /dev/shm; echo "LEAK=${LEAK:-unset}"; n=0; for p in /proc/[0-9]*; do n=$((n+1)); done; echo $n; tail -n +2 /proc/sysvipc/shm | wc -l; test -e /var/tmp/leak4 || echo no-var-tmp',
    ],
  });
  t.is(look.status, 'ok', JSON.stringify(look));
  // pid 1, the zygote (not its spare: it is dropped before a run it does not fork) and this bash
  t.is(look.stdout, `/dev/shm:\n\n/tmp:\n\n/work:\nLEAK=unset\n${zygote !== null ? 3 : 2}\n0\nno-var-tmp\n`);
  // Same container both times, and it passed the post-invocation check.
  t.deepEqual(pool.containerList().map((c) => c.id), [c0!.id]);
  t.is(pool.stats().replaced, 0);
});

maybe('pool refill after a container dies (kill -9 of its pid 1)', async (t) => {
  await f.pool({ name: 'r', min: 2, max: 2 });
  const pool = f.shim.functions.pool('r');
  const before = pool.containerList();
  t.is(before.length, 2);
  process.kill(before[0]!.pid, 'SIGKILL');
  await until(() => {
    const now = pool.containerList();
    return now.length === 2 && !now.some((c) => c.id === before[0]!.id) && pool.stats().warm === 2;
  });
  t.true(pool.stats().replaced >= 1);
  const r = await f.admin.functions.invoke('r', { cmd: ['echo', 'ok'] });
  t.is(r.stdout, 'ok\n');
  t.false(native.cgroupExists(before[0]!.id));
});

maybe('a container dying mid-invocation gives internal_error, and the pool refills', async (t) => {
  const pool = f.shim.functions.pool('r');
  const p = f.admin.functions.invoke('r', { cmd: ['sleep', '30'], timeoutMs: 20_000 });
  // the container running the sleep (not one still being reset after the previous test)
  const running = () => pool.containerList().find((c) => !c.idle && native.cgroupProcs(c.id).length > (c.zygotePid !== null ? 2 : 1));
  await until(() => running() !== undefined);
  const busy = running()!;
  process.kill(busy.pid, 'SIGKILL');
  const r = await p;
  t.is(r.status, 'internal_error');
  t.truthy(r.message);
  await until(() => pool.stats().warm === 2);
});

maybe('grows under load up to max, shrinks back to min when idle', async (t) => {
  await f.pool({ name: 'g', min: 1, max: 3, idleSeconds: 1 });
  const pool = f.shim.functions.pool('g');
  let peak = 0;
  const watcher = setInterval(() => (peak = Math.max(peak, pool.containerList().length)), 10);
  const rs = await Promise.all([0, 1, 2, 3, 4, 5].map(() => f.admin.functions.invoke('g', { cmd: ['sleep', '0.5'] })));
  clearInterval(watcher);
  t.true(rs.every((r) => r.status === 'ok'));
  t.is(peak, 3);
  await until(() => pool.containerList().length === 1, 10_000);
  t.is(pool.stats().warm, 1);
});

maybe('a full queue answers 429 RESOURCE_EXHAUSTED with Retry-After', async (t) => {
  await f.pool({ name: 'q', min: 1, max: 1, maxQueue: 1 });
  const body = JSON.stringify({ cmd: ['sleep', '1'] });
  const calls = [0, 1, 2, 3].map(() => rawRequest(f.url, { method: 'POST', path: '/v1/functions/q/invoke', token: f.adminToken, headers: { 'content-type': 'application/json' }, body }));
  const rs = await Promise.all(calls);
  const refused = rs.filter((r) => r.status === 429);
  const served = rs.filter((r) => r.status === 200);
  t.true(refused.length >= 1, rs.map((r) => r.status).join(','));
  t.true(served.length >= 2);
  t.is(refused[0]!.json.error.code, 'RESOURCE_EXHAUSTED');
  t.regex(String(refused[0]!.headers['retry-after']), /^\d+$/);
  t.true(f.shim.functions.pool('q').stats().rejected >= 1);
});

maybe('per-account concurrency quota', async (t) => {
  f.shim.functions.updateConfig({ accountConcurrency: 1 });
  try {
    const { token } = f.auth.createAccount('quota-user', 'runtime');
    const c = new WarrenClient({ url: f.url, token });
    const first = c.functions.invoke('g', { cmd: ['sleep', '0.5'] });
    await until(() => f.shim.functions.pool('g').stats().busy >= 1, 5000);
    const second = await rawRequest(f.url, { method: 'POST', path: '/v1/functions/g/invoke', token, headers: { 'content-type': 'application/json' }, body: JSON.stringify({ cmd: ['true'] }) });
    t.is(second.status, 429);
    t.is(second.json.error.code, 'RESOURCE_EXHAUSTED');
    t.truthy(second.headers['retry-after']);
    // another account is not affected
    const other = await f.admin.functions.invoke('g', { cmd: ['true'] });
    t.is(other.status, 'ok');
    t.is((await first).status, 'ok');
    await c.close();
  } finally {
    f.shim.functions.updateConfig({ accountConcurrency: 64 });
  }
});

const SOLUTION = `#include <bits/stdc++.h>
int main(){ long n; if(!(std::cin>>n)) return 2;
  if(n==3){ volatile long x=0; for(;;) x++; }
  if(n==4){ std::vector<char> v(300u<<20, 1); std::cout << (int)v[12345] << std::endl; return 0; }
  if(n==5) return 1;
  if(n==6){ std::cout << 999 << std::endl; return 0; }
  std::cout << n*2 << "\\n"; }`;

maybe('judge: AC, WA, TLE, MLE, RE per test, CE, checkers, stop at first failure', async (t) => {
  const tests = [1, 3, 4, 5, 6, 7].map((n) => ({ stdin: `${n}\n`, expected: `${n * 2}\n` }));
  const r = await f.admin.functions.judge('g', { code: SOLUTION, language: 'cpp', tests, checker: 'tokens', timeoutMs: 1000, memoryMb: 64 });
  t.deepEqual(r.tests.map((x) => x.verdict), ['AC', 'TLE', 'MLE', 'RE', 'WA', 'AC'], JSON.stringify(r.tests));
  t.is(r.verdict, 'TLE');
  t.is(r.passed, 2);
  t.is(r.total, 6);
  t.is(r.compile?.status, 'ok');
  const stop = await f.admin.functions.judge('g', { code: SOLUTION, language: 'cpp', tests, checker: 'exact', stopOnFirstFailure: true, timeoutMs: 1000 });
  t.is(stop.ran, 2);
  t.is(stop.verdict, 'TLE');
  const ce = await f.admin.functions.judge('g', { code: 'int main( {', language: 'c', tests });
  t.is(ce.verdict, 'CE');
  t.is(ce.ran, 0);
  t.regex(ce.compile!.stderr, /error/);
  const fl = await f.admin.functions.judge('g', { code: 'print(1/3)', language: 'python3', tests: [{ expected: '0.3333334' }], checker: 'float(1e-6)' });
  t.is(fl.verdict, 'AC');
  const fl2 = await f.admin.functions.judge('g', { code: 'print(1/3)', language: 'python3', tests: [{ expected: '0.334' }], checker: 'float(1e-6)' });
  t.is(fl2.verdict, 'WA');
  const ex = await f.admin.functions.judge('g', { code: 'print("a  b")', language: 'python3', tests: [{ expected: 'a b' }], checker: 'exact' });
  t.is(ex.verdict, 'WA');
});

maybe('batch: concurrent, results in request order', async (t) => {
  const invocations = Array.from({ length: 24 }, (_, i) => ({ cmd: ['/bin/sh', '-c', `sleep 0.0$((${i} % 5)); echo ${i}`] }));
  const results = await f.admin.functions.batch('g', invocations, { concurrency: 3 });
  t.is(results.length, 24);
  results.forEach((r, i) => t.is('stdout' in r ? r.stdout : JSON.stringify(r), `${i}\n`));
});

maybe('pools stack toolkit layers over the image', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-fn-tool-'));
  try {
    mkdirSync(join(dir, 'usr', 'local', 'bin'), { recursive: true });
    writeFileSync(join(dir, 'usr', 'local', 'bin', 'fn-tool'), '#!/bin/sh\necho "tool says $1"\n', { mode: 0o755 });
    await f.shim.importImage({ name: 'fn-tool', kind: 'toolkit', source: { type: 'directory', path: dir } });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  await f.pool({ name: 'tool', layers: ['fn-tool'], min: 1, max: 1 });
  const r = await f.admin.functions.invoke('tool', { cmd: ['fn-tool', 'hi'] });
  t.is(r.stdout, 'tool says hi\n');
  t.deepEqual((await f.admin.functions.get('tool')).layers, ['fn-tool']);
  const missing = await t.throwsAsync(f.admin.functions.create({ name: 'nolayer', layers: ['no-such-layer'] }));
  t.regex((missing as { code?: string }).code ?? '', /NOT_FOUND/);
  await f.admin.functions.delete('tool');
});

maybe('pools: list, get, delete; config pools from <dataDir>/fncall.json', async (t) => {
  const list = await f.admin.functions.list();
  t.true(['one', 'r', 'g', 'q'].every((n) => list.some((p) => p.name === n)));
  const g = list.find((p) => p.name === 'g')!;
  for (const k of ['warm', 'busy', 'queued', 'p50Ms', 'p99Ms', 'starting', 'min', 'max']) t.true(k in g, k);
  await f.admin.functions.delete('one');
  await t.throwsAsync(f.admin.functions.get('one'), { message: /no pool/ });
  const dup = await t.throwsAsync(f.admin.functions.create({ name: 'g' }));
  t.is((dup as { code?: string }).code, 'ALREADY_EXISTS');
  const { token } = f.auth.createAccount('not-builder', 'runtime');
  const c = new WarrenClient({ url: f.url, token });
  const forbidden = await t.throwsAsync(c.functions.create({ name: 'x' }));
  t.is((forbidden as { code?: string }).code, 'FORBIDDEN');
  await c.close();
  // the pool containers live under <dataDir>/fncall, one dir each
  const dirs = readdirSync(join(f.dataDir, 'fncall'));
  t.is(dirs.length, f.shim.functions.listPools().reduce((n, p) => n + p.warm + p.busy, 0));
});
