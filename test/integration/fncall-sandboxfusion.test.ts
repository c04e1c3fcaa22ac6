/**
 * SandboxFusion-compatible POST /run_code: request and response shapes field by
 * field (files in base64, fetch_files), compile errors, timeouts, auth, and
 * pools declared in <dataDir>/fncall.json.
 */
import test from 'ava';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openTestShim } from '../helpers/warren';
import { type FnFixture, integrationSkipReason, openFnFixture, rawRequest } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
let f: FnFixture;
const maybe = testUnless(skip).serial;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  f.shim.functions.updateConfig({ runCodePool: 'sf' });
  await f.pool({ name: 'sf', min: 2, max: 4 });
});

test.after.always(async () => {
  if (f) await f.close();
});

function post(body: unknown, token: string | null = f.adminToken) {
  return rawRequest(f.url, { method: 'POST', path: '/run_code', token: token ?? undefined, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

const RESPONSE_KEYS = ['compile_result', 'executor_pod_name', 'files', 'message', 'run_result', 'status'];
const RESULT_KEYS = ['execution_time', 'return_code', 'status', 'stderr', 'stdout'];

maybe('Success: exact response shape', async (t) => {
  const r = await post({ code: 'import sys\nprint("hi", sys.stdin.read())', language: 'python', stdin: 'there', run_timeout: 5, compile_timeout: 5, memory_limit_MB: 128, files: {}, fetch_files: [] });
  t.is(r.status, 200);
  t.deepEqual(Object.keys(r.json).sort(), RESPONSE_KEYS);
  t.is(r.json.status, 'Success');
  t.is(r.json.message, '');
  t.is(r.json.compile_result, null);
  t.is(r.json.executor_pod_name, null);
  t.deepEqual(r.json.files, {});
  const run = r.json.run_result;
  t.deepEqual(Object.keys(run).sort(), RESULT_KEYS);
  t.is(run.status, 'Finished');
  t.is(run.return_code, 0);
  t.is(run.stdout, 'hi there\n');
  t.is(run.stderr, '');
  t.is(typeof run.execution_time, 'number');
  t.true(run.execution_time > 0 && run.execution_time < 5);
});

maybe('files (base64) in, fetch_files out (base64)', async (t) => {
  const r = await post({
    code: 'data = open("in/data.bin", "rb").read()\nopen("out.bin", "wb").write(data[::-1])\nprint(len(data))',
    language: 'python',
    files: { 'in/data.bin': Buffer.from([1, 2, 3, 250]).toString('base64'), 'unused.txt': null },
    fetch_files: ['out.bin', 'nope.txt'],
  });
  t.is(r.json.status, 'Success', JSON.stringify(r.json));
  t.is(r.json.run_result.stdout, '4\n');
  t.deepEqual(r.json.files, { 'out.bin': Buffer.from([250, 3, 2, 1]).toString('base64') });
});

maybe('Failed: compile error has compile_result and no run_result', async (t) => {
  const r = await post({ code: 'int main( { }', language: 'cpp' });
  t.is(r.json.status, 'Failed');
  t.deepEqual(Object.keys(r.json.compile_result).sort(), RESULT_KEYS);
  t.is(r.json.compile_result.status, 'Finished');
  t.not(r.json.compile_result.return_code, 0);
  t.regex(r.json.compile_result.stderr, /error/);
  t.is(r.json.run_result, null);
});

maybe('C++ success has both results', async (t) => {
  const r = await post({ code: '#include <cstdio>\nint main(){ puts("cpp"); }', language: 'cpp' });
  t.is(r.json.status, 'Success', JSON.stringify(r.json));
  t.is(r.json.compile_result.status, 'Finished');
  t.is(r.json.compile_result.return_code, 0);
  t.is(r.json.run_result.stdout, 'cpp\n');
});

maybe('Failed: non-zero exit, TimeLimitExceeded, signals as negative return codes', async (t) => {
  const bad = await post({ code: 'import sys; sys.exit(4)', language: 'python' });
  t.is(bad.json.status, 'Failed');
  t.is(bad.json.run_result.status, 'Finished');
  t.is(bad.json.run_result.return_code, 4);
  const slow = await post({ code: 'import time; time.sleep(10)', language: 'python', run_timeout: 0.5 });
  t.is(slow.json.status, 'Failed');
  t.is(slow.json.run_result.status, 'TimeLimitExceeded');
  t.is(slow.json.run_result.return_code, null);
  t.is(slow.json.message, '');
  t.true(slow.json.run_result.execution_time >= 0.5 && slow.json.run_result.execution_time < 3);
  const seg = await post({ code: 'import os; os.kill(os.getpid(), 11)', language: 'python' });
  t.is(seg.json.run_result.return_code, -11);
});

maybe('bad input and auth', async (t) => {
  const lang = await post({ code: 'x', language: 'brainfuck' });
  t.is(lang.status, 400);
  t.is(lang.json.error.code, 'INVALID_ARGUMENT');
  const missing = await post({ language: 'python' });
  t.is(missing.status, 400);
  const esc = await post({ code: 'x', language: 'python', files: { '../x': 'eA==' } });
  t.is(esc.status, 400);
  t.is(esc.json.error.code, 'PATH_ESCAPE');
  const anon = await post({ code: 'print(1)', language: 'python' }, null);
  t.is(anon.status, 401);
  f.shim.functions.updateConfig({ runCodeAnonymous: true });
  try {
    const ok = await post({ code: 'print(1)', language: 'python' }, null);
    t.is(ok.status, 200);
    t.is(ok.json.run_result.stdout, '1\n');
  } finally {
    f.shim.functions.updateConfig({ runCodeAnonymous: false });
  }
});

maybe("verl's default request shape succeeds: memory_limit_MB 1024, its own fields, unknown fields ignored", async (t) => {
  // what verl's sandbox_fusion utils send for a code reward
  const r = await post({
    compile_timeout: 10,
    run_timeout: 30,
    code: 'import numpy, sortedcontainers\nprint(int(numpy.arange(4).sum()), input())',
    stdin: '7',
    memory_limit_MB: 1024,
    language: 'python',
    files: {},
    fetch_files: [],
    extra_field: { anything: true },
    kernel: 'python3',
  });
  t.is(r.status, 200, JSON.stringify(r.json));
  t.is(r.json.status, 'Success', JSON.stringify(r.json));
  t.is(r.json.run_result.stdout, '6 7\n');
  const lower = await post({ code: 'print(1)', language: 'python', memory_limit_mb: 1024, run_timeout: '5' });
  t.is(lower.json.status, 'Success', JSON.stringify(lower.json));
});

maybe('run_timeout: 0 and values above the policy mean the policy maximum; bad values name the request field', async (t) => {
  const zero = await post({ code: 'import time; time.sleep(1.5); print("slept")', language: 'python', run_timeout: 0 });
  t.is(zero.json.status, 'Success', JSON.stringify(zero.json));
  const huge = await post({ code: 'print("ok")', language: 'python', run_timeout: 100000, memory_limit_MB: 65536 });
  t.is(huge.json.status, 'Success', JSON.stringify(huge.json));
  const bad = await post({ code: 'print(1)', language: 'python', run_timeout: 'soon' });
  t.is(bad.status, 400);
  t.is(bad.json.error.details.field, 'run_timeout');
  t.regex(bad.json.error.message, /run_timeout/);
  const neg = await post({ code: 'print(1)', language: 'python', memory_limit_MB: -5 });
  t.is(neg.status, 400);
  t.is(neg.json.error.details.field, 'memory_limit_MB');
  const unknown = await post({ code: 'x', language: 'brainfuck' });
  t.regex(unknown.json.error.message, /available: .*python3.*cpp/);
});

maybe('absolute fetch_files and files, as SandboxFusion allows', async (t) => {
  const r = await post({
    code: 'open("/mnt/b", "w").write(open("/data/in.txt").read().upper())',
    language: 'python',
    files: { '/data/in.txt': Buffer.from('abc').toString('base64') },
    fetch_files: ['/mnt/b'],
  });
  t.is(r.json.status, 'Success', JSON.stringify(r.json));
  t.is(Buffer.from(r.json.files['/mnt/b'], 'base64').toString(), 'ABC');
});

maybe('GET /v1/ping answers pong without a token', async (t) => {
  const r = await rawRequest(f.url, { method: 'GET', path: '/v1/ping' });
  t.is(r.status, 200);
  t.is(r.json, 'pong');
});

testUnless(skip)('pools declared in <dataDir>/fncall.json start with the node', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-fncfg-'));
  writeFileSync(join(dataDir, 'fncall.json'), JSON.stringify({ pools: [{ name: 'cfg', min: 1, max: 1, limits: { memoryMb: 128 } }], accountConcurrency: 8 }));
  const { shim } = await openTestShim({ dataDir });
  try {
    await shim.functions.waitWarm('cfg');
    const [p] = shim.functions.listPools();
    t.is(p!.name, 'cfg');
    t.is(p!.limits.memoryMb, 128);
    t.is(shim.functions.accountConcurrency, 8);
    const r = await shim.functions.invoke('cfg', 'a', { cmd: ['echo', 'cfg'], files: [], stdin: Buffer.alloc(0), env: {}, fetchFiles: [] });
    t.is(r.stdout, 'cfg\n');
  } finally {
    await shim.close();
    shim.layers.unmountUnused();
    await rm(dataDir, { recursive: true, force: true });
  }
});
