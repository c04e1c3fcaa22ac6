/**
 * kotlin_script through the real node: the script is compiled by kotlinc (with
 * its own compile limit) and run in a plain JVM, so run_timeout measures the
 * script, not the compiler's start-up. Hello, stdin and args, a runtime error
 * (exit code and an exception with its trace), a compile error, a timeout and
 * the JVM's heap limit, each reaching its exact status; the JVM's memory stays
 * within the invocation's limit.
 *
 * The kotlin toolkit is lazy (about 190 MiB over java, built on first use):
 * these tests run with WARREN_TEST_LAZY_LANGS=1.
 */
import test from 'ava';
import type { InvokeResult } from '../../src/shim/fncall/types';
import { type FnFixture, integrationSkipReason, openFnFixture } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason() ?? (process.env.WARREN_TEST_LAZY_LANGS === '1' ? null : 'the kotlin toolkit is lazy (built only on demand): set WARREN_TEST_LAZY_LANGS=1');
let f: FnFixture;
const maybe = testUnless(skip).serial;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  await f.pool({ name: 'kt', layers: ['kotlin'], min: 1, max: 2, limits: { memoryMb: 512, timeoutMs: 60_000, maxTimeoutMs: 180_000 } });
});

test.after.always(async () => {
  if (f) await f.close();
});

const inv = (code: string, extra: Record<string, unknown> = {}) => f.admin.functions.invoke('kt', { code, language: 'kotlin_script', ...extra });
const why = (r: InvokeResult) => JSON.stringify({ status: r.status, phase: r.phase, exitCode: r.exitCode, stdout: r.stdout.slice(0, 300), stderr: r.stderr.slice(0, 600), compile: r.compile && { status: r.compile.status, wallMs: r.compile.wallMs, stderr: r.compile.stderr.slice(0, 600) } });

maybe('hello, stdin and args, declarations and imports; the run step is a plain JVM', async (t) => {
  const r = await inv('import kotlin.math.sqrt\nclass P(val x: Int)\nfun twice(n: Int) = n * 2\nprintln("got " + readLine() + " " + args.size)\nprintln(sqrt(16.0))\nprintln(twice(P(21).x))', { stdin: 'line one\n' });
  t.is(r.status, 'ok', why(r));
  t.is(r.phase, 'run');
  t.is(r.stdout, 'got line one 0\n4.0\n42\n');
  t.is(r.compile?.status, 'ok');
});

maybe('runtime errors (exit code, exception with its trace), a compile error, a timeout, the heap limit', async (t) => {
  const [exit, thrown, ce, loop, mem] = await Promise.all([
    inv('kotlin.system.exitProcess(3)'),
    inv('fun f(): Int = error("boom")\nprintln(f())'),
    inv('val x: Int = "s"'),
    inv('while (true) {}', { timeoutMs: 3000 }),
    inv('val a = LongArray(400_000_000)\nprintln(a.size)', { memoryMb: 128 }),
  ]);
  t.is(exit.status, 'runtime_error', why(exit));
  t.is(exit.exitCode, 3);
  t.is(thrown.status, 'runtime_error', why(thrown));
  t.regex(thrown.stderr, /IllegalStateException: boom/);
  t.regex(thrown.stderr, /main\.kts:1/);
  t.is(ce.phase, 'compile', why(ce));
  t.is(ce.status, 'runtime_error', why(ce));
  t.regex(ce.stderr + (ce.compile?.stderr ?? ''), /type mismatch/);
  t.is(loop.status, 'timeout', why(loop));
  t.is(loop.phase, 'run', 'the timeout is the script\'s, not the compiler\'s');
  t.is(mem.status, 'runtime_error', why(mem));
  t.regex(mem.stderr, /OutOfMemoryError/);
});

maybe('SandboxFusion kotlin_script: a short compile_timeout does not cut the compiler off (it has its own floor)', async (t) => {
  const r = await inv('println("sf")', { compileTimeoutMs: 1000, timeoutMs: 5000 });
  t.is(r.status, 'ok', why(r));
  t.is(r.stdout, 'sf\n');
});
