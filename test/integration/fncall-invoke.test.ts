/**
 * FnCall invoke through the real gateway and SDK: every status reached by a
 * real program, languages with their compile step, limits (wall vs CPU,
 * memory, pids, output with bounded gateway memory, file size, network), files
 * in and out, non-UTF-8 output, and bad input with stable codes.
 */
import test from 'ava';
import { WarrenError } from '../../src/errors';
import type { InvokeOptions, InvokeResult } from '../../src/sdk/functions';
import { type FnFixture, integrationSkipReason, openFnFixture, rawRequest } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
let f: FnFixture;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  await f.pool({ name: 'p', min: 2, max: 4, limits: { memoryMb: 256, pids: 64, fileSizeBytes: 1024 * 1024, workBytes: 8 * 1024 * 1024 } });
});

test.after.always(async () => {
  if (f) await f.close();
});

const run = (req: InvokeOptions): Promise<InvokeResult> => f.admin.functions.invoke('p', req);

async function expectCode(t: import('ava').ExecutionContext, p: Promise<unknown>, code: string, status: number): Promise<WarrenError> {
  const err = await t.throwsAsync(p);
  t.true(err instanceof WarrenError, String(err));
  t.is((err as WarrenError).code as string, code, (err as Error).message);
  t.is((err as WarrenError).status, status);
  return err as WarrenError;
}

const maybe = testUnless(skip).serial;

maybe('the result has exactly the documented shape', async (t) => {
  const r = await run({ code: 'print("hello")', language: 'python3' });
  for (const k of ['status', 'exitCode', 'signal', 'stdout', 'stderr', 'truncated', 'wallMs', 'cpuMs', 'memPeakBytes']) t.true(k in r, k);
  t.is(r.status, 'ok');
  t.is(r.exitCode, 0);
  t.is(r.signal, null);
  t.is(r.stdout, 'hello\n');
  t.is(r.stderr, '');
  t.false(r.truncated);
  t.true(r.wallMs > 0 && r.cpuMs > 0 && r.memPeakBytes > 0);
});

maybe('languages: python3, bash, C, C++ (compiled ones report their compile step)', async (t) => {
  const py = await run({ code: 'import sys; print(sum(int(x) for x in sys.stdin.read().split()))', language: 'python3', stdin: '1 2 3' });
  t.is(py.stdout, '6\n');
  const sh = await run({ code: 'read a b; echo $((a*b))', language: 'bash', stdin: '6 7\n' });
  t.is(sh.stdout, '42\n');
  const c = await run({ code: '#include <stdio.h>\n#include <math.h>\nint main(){double x; scanf("%lf",&x); printf("%.3f\\n", sqrt(x)); return 0;}', language: 'c', stdin: '2' });
  t.is(c.status, 'ok', JSON.stringify(c));
  t.is(c.stdout, '1.414\n');
  t.is(c.compile?.status, 'ok');
  t.is(c.compile?.exitCode, 0);
  const cpp = await run({ code: '#include <iostream>\n#include <vector>\nint main(){std::vector<int> v{1,2,3}; long s=0; for(int x: v) s+=x; std::cout << s << std::endl;}', language: 'cpp' });
  t.is(cpp.stdout, '6\n', JSON.stringify(cpp));
  t.is(cpp.phase, 'run');
});

maybe('compile error: its own result, phase "compile", no run', async (t) => {
  const r = await run({ code: 'int main( { return 0; }', language: 'c' });
  t.is(r.phase, 'compile');
  t.is(r.status, 'runtime_error');
  t.not(r.compile?.exitCode, 0);
  t.regex(r.compile!.stderr, /error/);
});

maybe('runtime_error: non-zero exit', async (t) => {
  const r = await run({ code: 'raise SystemExit(3)', language: 'python3' });
  t.is(r.status, 'runtime_error');
  t.is(r.exitCode, 3);
});

maybe('signal: a segfault', async (t) => {
  const r = await run({ code: 'int main(){ volatile int *p = 0; *p = 1; return 0; }', language: 'c' });
  t.is(r.status, 'signal');
  t.is(r.signal, 11);
  t.is(r.exitCode, null);
});

maybe('timeout (CPU): a program that keeps burning CPU is stopped at cpuMs, not at the wall limit', async (t) => {
  const r = await run({ code: 'while True: pass', language: 'python3', cpuMs: 400, timeoutMs: 20_000 });
  t.is(r.status, 'timeout');
  t.is(r.limit, 'cpuMs');
  t.true(r.cpuMs >= 400, `cpu ${r.cpuMs}`);
  // Well before the 20 s wall limit (how far before depends on the machine's load).
  t.true(r.wallMs < 15_000, `wall ${r.wallMs}`);
});

maybe('timeout (wall): a sleeping program hits the wall limit with almost no CPU', async (t) => {
  const r = await run({ cmd: ['sleep', '30'], timeoutMs: 300 });
  t.is(r.status, 'timeout');
  t.is(r.limit, 'wallMs');
  // At the limit, not at the end of the 30 s sleep.
  t.true(r.wallMs >= 300 && r.wallMs < 15_000, `wall ${r.wallMs}`);
  t.true(r.cpuMs < 100, `cpu ${r.cpuMs}`);
});

maybe('memory_limit: OOM is reported as memory_limit', async (t) => {
  const r = await run({ code: 'x = bytearray(400 * 1024 * 1024)\nprint(len(x))', language: 'python3', memoryMb: 64 });
  t.is(r.status, 'memory_limit', JSON.stringify(r));
  t.is(r.limit, 'memoryMb');
  // the pool keeps working with its own limit afterwards
  const ok = await run({ code: 'x = bytearray(100 * 1024 * 1024)\nprint(len(x))', language: 'python3' });
  t.is(ok.status, 'ok', JSON.stringify(ok));
});

maybe('pids: a fork bomb is stopped and the container is clean afterwards', async (t) => {
  const r = await run({ code: 'b(){ b | b & }; b; sleep 5', language: 'bash', timeoutMs: 2000 });
  t.is(r.status, 'timeout');
  t.true(r.wallMs < 10_000);
  t.regex(r.stderr, /fork|Resource temporarily unavailable/);
  const after = await run({ cmd: ['/bin/sh', '-c', 'ls /proc | grep -c "^[0-9]"'] });
  t.is(after.status, 'ok');
  // pid 1, the python3 zygote (when on), the shell, ls and grep at most
  const zygote = f.shim.functions.pool('p').containerList().some((c) => c.zygotePid !== null) ? 1 : 0;
  t.true(Number(after.stdout.trim()) <= 4 + zygote, after.stdout);
});

maybe('output_limit: 1 GB of stdout is cut at maxOutputBytes, flagged, and gateway memory stays bounded', async (t) => {
  global.gc?.();
  const rss0 = process.memoryUsage().rss;
  const r = await run({ cmd: ['head', '-c', '1G', '/dev/zero'], maxOutputBytes: 1024 * 1024, timeoutMs: 60_000 });
  const growth = process.memoryUsage().rss - rss0;
  t.is(r.status, 'output_limit');
  t.is(r.limit, 'maxOutputBytes');
  t.true(r.truncated);
  t.is(r.stdout.length, 1024 * 1024);
  t.log(`gateway RSS growth: ${(growth / 1048576).toFixed(1)} MiB`);
  t.true(growth < 64 * 1024 * 1024, `RSS grew by ${growth} bytes`);
});

maybe('file size: writing past the pool limit (RLIMIT_FSIZE) ends a C program with SIGXFSZ; Python sees EFBIG', async (t) => {
  const c = await run({ code: '#include <stdio.h>\n#include <string.h>\nint main(){ static char b[1<<20]; memset(b, 1, sizeof b); FILE *f = fopen("big", "wb"); for (int i = 0; i < 4; i++) fwrite(b, 1, sizeof b, f); fclose(f); puts("wrote"); }', language: 'c' });
  t.is(c.status, 'signal', JSON.stringify(c));
  t.is(c.signal, 25);
  t.is(c.stdout, '');
  const py = await run({ code: 'open("big", "wb").write(b"0" * (4 * 1024 * 1024))', language: 'python3' });
  t.is(py.status, 'runtime_error');
  t.regex(py.stderr, /File too large/);
});

maybe('disk: the work dir is a tmpfs of limits.workBytes, so many small files cannot fill the host disk', async (t) => {
  const r = await run({ code: 'for i in $(seq 20); do head -c 1000000 /dev/zero > f$i 2>/dev/null || { echo "full at $i"; break; }; done; df -k /work | tail -1', language: 'bash' });
  t.is(r.status, 'ok', JSON.stringify(r));
  t.regex(r.stdout, /^full at (8|9)\n/);
  t.regex(r.stdout, /tmpfs\s+8192\s/);
});

maybe('network is off: only loopback, connects fail', async (t) => {
  const r = await run({
    // the interfaces of the invocation's network namespace (/proc/net follows it; /sys is the
    // node's one sysfs, which shows no network interface: docs/density.md)
    code: 'import os, socket\nprint(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))\ns = socket.socket()\ns.settimeout(2)\ntry:\n  s.connect(("1.1.1.1", 80)); print("connected")\nexcept OSError as e:\n  print("refused", e.errno)',
    language: 'python3',
  });
  t.is(r.status, 'ok', JSON.stringify(r));
  t.regex(r.stdout, /^\['lo'\]\nrefused/);
});

maybe('files in, fetchFiles out; nested paths and /work/ absolute paths', async (t) => {
  const r = await run({
    cmd: ['/bin/sh', '-c', 'cat data/in.txt; tr a-z A-Z < data/in.txt > out.txt; cp /work/bin.dat copy.dat'],
    files: { 'data/in.txt': 'abc', '/work/bin.dat': { base64: Buffer.from([0, 255, 1]).toString('base64') } },
    fetchFiles: ['out.txt', 'copy.dat', 'missing.txt'],
  });
  t.is(r.status, 'ok', JSON.stringify(r));
  t.is(r.stdout, 'abc');
  t.deepEqual(r.files, { 'out.txt': Buffer.from('ABC').toString('base64'), 'copy.dat': Buffer.from([0, 255, 1]).toString('base64') });
  // file names that are Object.prototype members are names like any other
  const odd = await run({ cmd: ['/bin/sh', '-c', 'echo p > __proto__; echo c > constructor'], fetchFiles: ['__proto__', 'constructor', 'toString'] });
  t.deepEqual(Object.keys(odd.files ?? {}).sort(), ['__proto__', 'constructor']);
  t.is(Object.getOwnPropertyDescriptor(odd.files, '__proto__')?.value, Buffer.from('p\n').toString('base64'));
  t.is(Object.getOwnPropertyDescriptor(odd.files, 'constructor')?.value, Buffer.from('c\n').toString('base64'));
});

maybe('environment variables named like Object.prototype members reach the program', async (t) => {
  const env = JSON.parse('{"__proto__":"p","constructor":"c","toString":"t"}') as Record<string, string>;
  for (const req of [{ cmd: ['/bin/sh', '-c', 'env | grep -E "^(__proto__|constructor|toString)=" | sort'] }, { code: 'import os\nfor k in ("__proto__", "constructor", "toString"): print(f"{k}={os.environ.get(k)}")', language: 'python3' }]) {
    const r = await run({ ...req, env } as never);
    t.is(r.status, 'ok', r.stderr);
    t.deepEqual(r.stdout.trim().split('\n').sort(), ['__proto__=p', 'constructor=c', 'toString=t']);
  }
});

maybe('non-UTF-8 output is returned faithfully in stdoutBase64', async (t) => {
  const r = await run({ cmd: ['printf', '\\377\\376ok'] });
  t.is(r.status, 'ok');
  t.is(r.stdoutBase64, Buffer.from([0xff, 0xfe, 0x6f, 0x6b]).toString('base64'));
  t.is(r.stdout, '\ufffd\ufffdok');
  const utf = await run({ cmd: ['printf', 'h\\303\\251'] });
  t.is(utf.stdout, 'hé');
  t.is(utf.stdoutBase64, undefined);
});

maybe("python3 loads the image's byte-code caches: none is stale in the layer", async (t) => {
  // -B: nothing is written; -v: each import says which cache it took, or why it did not
  const r = await run({ cmd: ['python3', '-B', '-v', '-c', 'import json, collections, email.parser'] });
  t.is(r.status, 'ok', r.stderr.slice(-2000));
  t.regex(r.stderr, /code object from '\/usr\/lib\/python3\.\d+\/json\/__pycache__\/__init__\.cpython-\d+\.pyc'/);
  t.regex(r.stderr, /code object from '\/usr\/lib\/python3\.\d+\/collections\/__pycache__/);
  t.notRegex(r.stderr, /bytecode is stale/, 'a stale cache makes Python compile the module at every start');
});

maybe('command not found is a runtime_error with exit code 127', async (t) => {
  const r = await run({ cmd: ['no-such-program'] });
  t.is(r.status, 'runtime_error');
  t.is(r.exitCode, 127);
});

maybe('bad input: clear 4xx with stable codes, and the pool keeps serving', async (t) => {
  const fn = f.admin.functions;
  const e1 = await expectCode(t, fn.invoke('p', { code: 'x', language: 'cobol' }), 'INVALID_ARGUMENT', 400);
  t.regex(e1.message, /unknown language/);
  await expectCode(t, fn.invoke('p', { language: 'python3' }), 'INVALID_ARGUMENT', 400);
  await expectCode(t, fn.invoke('p', {}), 'INVALID_ARGUMENT', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], code: 'x', language: 'bash' }), 'INVALID_ARGUMENT', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], timeoutMs: 0 }), 'LIMIT_OUT_OF_RANGE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], timeoutMs: 1e12 }), 'LIMIT_OUT_OF_RANGE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], memoryMb: 100_000 }), 'LIMIT_OUT_OF_RANGE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], memoryMb: 1024 }), 'LIMIT_OUT_OF_RANGE', 400); // above the pool's 256
  await expectCode(t, fn.invoke('p', { cmd: ['true'], timeoutMs: 120_000 }), 'LIMIT_OUT_OF_RANGE', 400); // above the pool's ceiling
  await expectCode(t, fn.invoke('p', { cmd: ['true'], cpuMs: -1 }), 'LIMIT_OUT_OF_RANGE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], files: { '../escape': 'x' } }), 'PATH_ESCAPE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], files: { 'a/../../b': 'x' } }), 'PATH_ESCAPE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], files: { '/etc/passwd': 'x' } }), 'PATH_ESCAPE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], fetchFiles: ['/etc/shadow'] }), 'PATH_ESCAPE', 400);
  await expectCode(t, fn.invoke('p', { cmd: ['true'], ...({ bogus: 1 } as object) }), 'UNKNOWN_FIELD', 400);
  await expectCode(t, fn.invoke('nope', { cmd: ['true'] }), 'NOT_FOUND', 404);
  await expectCode(t, fn.invoke('Bad_Name', { cmd: ['true'] }), 'INVALID_ID', 400);
  const raw = await rawRequest(f.url, { method: 'POST', path: '/v1/functions/p/invoke', token: f.adminToken, headers: { 'content-type': 'application/json' }, body: '{not json' });
  t.is(raw.status, 400);
  t.is(raw.json.error.code, 'INVALID_ARGUMENT');
  const ok = await run({ cmd: ['echo', 'still fine'] });
  t.is(ok.stdout, 'still fine\n');
});

maybe('a span per invocation and live stats', async (t) => {
  const stats = await f.admin.functions.get('p');
  t.is(stats.state, 'ready');
  t.true(stats.invocations > 10);
  t.true(stats.p50Ms !== null && stats.p99Ms !== null && stats.p99Ms >= stats.p50Ms);
  t.true(stats.warm + stats.busy >= 2);
});
