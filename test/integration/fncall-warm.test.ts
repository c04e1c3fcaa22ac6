/**
 * With the zygote off (WARREN_FNCALL_ZYGOTE=0), python3 invocations run in an interpreter started
 * ahead of time, after the container's reset (PoolContainer.prewarmPython). It must be indistinguishable from `python3 -B main.py` started
 * on demand, must never carry anything from one invocation to the next, and must never sit next
 * to another invocation's processes.
 */
import test from 'ava';
import type { InvokeOptions, InvokeResult } from '../../src/sdk/functions';
import { type FnFixture, integrationSkipReason, openFnFixture } from './fncall-fixture';
import { testUnless } from '../helpers/skip';
import { waitFor } from '../helpers/wait';

// The prewarmed interpreter is the fallback when python3 does not fork from a zygote.
process.env.WARREN_FNCALL_ZYGOTE = '0';
const skip = integrationSkipReason();
let f: FnFixture;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  // one container: every invocation lands in the same one, after its reset
  await f.pool({ name: 'w', min: 1, max: 1 });
});

test.after.always(async () => {
  if (f) await f.close();
});

const run = (req: InvokeOptions): Promise<InvokeResult> => f.admin.functions.invoke('w', req);
/** The same program started on demand, exactly as the language runs it, for comparison. */
const onDemand = (code: string, stdin?: string): Promise<InvokeResult> => run({ cmd: ['python3', '-B', 'main.py'], files: { 'main.py': code }, ...(stdin !== undefined ? { stdin } : {}) } as never);
/**
 * Runs python3 invocations until an idle container of the pool holds a started interpreter, so the
 * next python3 invocation is served by it (the pool prewarms only while python3 is most of its
 * recent traffic, so after other kinds of invocation it takes a few).
 */
async function interpreterReady(): Promise<void> {
  for (let i = 0; i < 6; i++) {
    await run({ code: 'pass', language: 'python3' });
    const ready = await waitFor(() => f.shim.functions.pool('w').stats().interpreters >= 1, 2000, 'a prewarmed interpreter', 20).then(() => true, () => false);
    if (ready) return;
  }
  throw new Error('the pool kept no interpreter waiting after six python3 invocations');
}
const warm = async (code: string, stdin?: string, extra: Partial<InvokeOptions> = {}): Promise<InvokeResult> => {
  await interpreterReady();
  return run({ code, language: 'python3', ...(stdin !== undefined ? { stdin } : {}), ...extra });
};
const same = (a: InvokeResult) => ({ status: a.status, exitCode: a.exitCode, signal: a.signal, stdout: a.stdout, stderr: a.stderr });

const maybe = testUnless(skip).serial;

maybe('a prewarmed interpreter behaves exactly like python3 -B main.py: argv, __file__, __main__, sys.path, stdin, exit codes, tracebacks', async (t) => {
  const programs: [string, string?][] = [
    ['import sys, __main__\nprint(sys.argv, __file__, __name__, sys.path[0], __main__.__dict__ is globals(), __spec__, __cached__)\n'],
    ['import sys\nfor line in sys.stdin: print(line.strip()[::-1])\n', 'abc\ndef\n'],
    ['import sys\nprint("partial", end="")\nsys.exit(3)\n'],
    ['def f():\n    return 1 / 0\nf()\n'],
    ['x = (\n'],
    ['import atexit\natexit.register(lambda: print("atexit ran"))\nprint("main")\n'],
    ['import threading, time\ndef w():\n    time.sleep(0.05)\n    print("thread done", flush=True)\nthreading.Thread(target=w).start()\nprint("main done")\n'],
    ['f = open("out.txt", "w")\nf.write("unflushed")\n'],
  ];
  for (const [code, stdin] of programs) {
    const a = await onDemand(code, stdin);
    const b = await warm(code, stdin);
    t.deepEqual(same(b), same(a), code);
  }
  const files = await run({ code: 'f = open("out.txt", "w")\nf.write("unflushed")\n', language: 'python3', fetchFiles: ['out.txt'] } as never);
  t.is(Buffer.from(files.files!['out.txt']!, 'base64').toString(), 'unflushed', 'buffered files are flushed at exit, as in a normal run');
});

maybe('nothing carries over: interpreter state, /tmp and /work are fresh for every invocation', async (t) => {
  await run({ code: 'import builtins, sys\nbuiltins.LEAK = 1\nsys.modules["leak"] = object()\nopen("/tmp/x", "w").write("x")\nopen("/work/y", "w").write("y")\n', language: 'python3' });
  await interpreterReady();
  const r = await run({ code: 'import builtins, os, sys\nprint(hasattr(builtins, "LEAK"), "leak" in sys.modules, os.path.exists("/tmp/x"), os.listdir("/work"))\n', language: 'python3' });
  t.is(r.stdout, "False False False ['main.py']\n");
});

maybe('another invocation never runs next to a waiting interpreter', async (t) => {
  await interpreterReady();
  const r = await run({ cmd: ['sh', '-c', 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline; echo; done'] });
  t.false(r.stdout.includes('python3'), r.stdout);
  const mine = await run({ code: 'import os\nprint(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))', language: 'python3' });
  t.true(JSON.parse(mine.stdout).length <= 2, `only pid 1 and the program itself: ${mine.stdout}`);
});

maybe('CPU limits still hold, and the interpreter start-up is not billed to the invocation', async (t) => {
  const burn = await warm('while True: pass\n', undefined, { timeoutMs: 5000, cpuMs: 500 });
  t.is(burn.status, 'timeout');
  t.is(burn.limit, 'cpuMs');
  // best of three each way: the machine may be busy with other tests
  const fresh: number[] = [];
  const prewarmed: number[] = [];
  for (let i = 0; i < 3; i++) {
    fresh.push((await onDemand('print(1)\n')).cpuMs);
    const quick = await warm('print(1)\n');
    t.is(quick.status, 'ok');
    prewarmed.push(quick.cpuMs);
  }
  t.log(`cpuMs: on demand ${fresh.join(', ')}; prewarmed ${prewarmed.join(', ')}`);
  // The interpreter's start-up is most of an on-demand run's CPU (about 90% of it for print(1)) and
  // is not charged to the invocation, even when the invocation comes right after the interpreter was
  // started: it is offered only once it waits for its script. CPU time, unlike wall time, does not
  // grow with the machine's load, so a factor of two is safe to assert.
  t.true(Math.min(...prewarmed) * 2 < Math.min(...fresh), 'the start-up is not billed to the invocation');
});
