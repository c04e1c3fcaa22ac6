/**
 * The conformance suite every backend runs (container now; microvm, vm and
 * fncall later). It speaks only the Backend interface from src/shim/types.ts.
 */
import type { ExecutionContext, TestFn } from 'ava';
import type { Backend, BackendName, BackendSandbox, ResolvedLayer, SandboxRecord, SandboxSpec } from '../../src/shim/types';
import { WarrenError } from '../../src/errors';

export interface BackendHarness {
  backend: Backend;
  /** Layers of a busybox-like image (sh, echo, cat, sleep, tar). */
  layers: ResolvedLayer[];
  spec: SandboxSpec;
  newId(): string;
  /** Remove whatever the backend left for `id` (after a failed test). */
  cleanup(id: string): Promise<void>;
  close(): Promise<void>;
}

export function backendConformance(test: TestFn, name: BackendName, open: () => Promise<BackendHarness>, skip: string | null): void {
  const t0 = skip === null ? test.serial : test.serial.skip;
  const title = (s: string) => `${name}: ${s}${skip === null ? '' : ` (skipped: ${skip})`}`;
  let harness: BackendHarness;

  async function withSandbox(t: ExecutionContext, fn: (box: BackendSandbox) => Promise<void>) {
    const id = harness.newId();
    const box = await harness.backend.create(id, harness.spec, harness.layers);
    try {
      await fn(box);
    } catch (err) {
      t.log(`sandbox ${id} failed the test`);
      throw err;
    } finally {
      await box.destroy().catch(() => harness.cleanup(id));
    }
  }

  if (skip === null) {
    test.before(async () => {
      harness = await open();
    });
    test.after.always(async () => {
      await harness?.close();
    });
  }

  t0(title('matches interface'), async (t) => {
    t.is(typeof harness.backend.create, 'function');
    t.is(typeof harness.backend.adopt, 'function');
    t.is(harness.backend.name, name);
    await withSandbox(t, async (box) => {
      for (const m of ['exec', 'execStream', 'rootPath', 'stats', 'destroy'] as const) t.is(typeof box[m], 'function', m);
      t.true(box.ended instanceof Promise);
      t.is(typeof box.runtime, 'object');
    });
  });

  t0(title('exec returns output, stderr and exit codes'), async (t) => {
    await withSandbox(t, async (box) => {
      const ok = await box.exec({ cmd: ['echo', 'hello'] });
      t.is(ok.exitCode, 0);
      t.is(ok.stdout, 'hello\n');
      t.is(ok.status, 'ok');
      const fail = await box.exec({ cmd: 'echo out; echo err >&2; exit 3' });
      t.is(fail.exitCode, 3);
      t.is(fail.stdout, 'out\n');
      t.is(fail.stderr, 'err\n');
      t.is(fail.status, 'error');
      const missing = await box.exec({ cmd: ['/no/such/binary'] });
      t.is(missing.exitCode, 127);
    });
  });

  t0(title('exec passes stdin, env and cwd'), async (t) => {
    await withSandbox(t, async (box) => {
      const r = await box.exec({ cmd: 'cat; echo "$FOO"; pwd', stdin: 'in\n', env: { FOO: 'bar' }, cwd: '/tmp' });
      t.is(r.stdout, 'in\nbar\n/tmp\n');
    });
  });

  t0(title('exec timeout kills the command and keeps the sandbox'), async (t) => {
    await withSandbox(t, async (box) => {
      const started = Date.now();
      const r = await box.exec({ cmd: 'sleep 30', timeoutMs: 200 });
      t.is(r.status, 'timeout');
      t.true(Date.now() - started < 5000);
      t.is((await box.exec({ cmd: ['echo', 'alive'] })).stdout, 'alive\n');
    });
  });

  t0(title('output beyond maxOutputBytes is truncated and flagged'), async (t) => {
    await withSandbox(t, async (box) => {
      const r = await box.exec({ cmd: 'head -c 100000 /dev/zero', maxOutputBytes: 1000 });
      t.true(r.truncated);
      t.is(r.stdout.length, 1000);
      // At the limit the output pipe is closed: the writer is stopped (SIGPIPE), it does not run on unread.
      t.is(r.signal, 13);
    });
  });

  t0(title('a writer that never stops is stopped at the output limit, not at its timeout'), async (t) => {
    await withSandbox(t, async (box) => {
      const started = Date.now();
      const r = await box.exec({ cmd: 'yes', maxOutputBytes: 64 * 1024, timeoutMs: 30_000 });
      t.true(r.truncated);
      t.not(r.status, 'timeout');
      t.true(Date.now() - started < 20_000, `took ${Date.now() - started} ms`);
      // Output exactly at the limit is whole, not truncated.
      const exact = await box.exec({ cmd: 'printf abcde', maxOutputBytes: 5 });
      t.deepEqual([exact.stdout, exact.truncated, exact.exitCode], ['abcde', false, 0]);
    });
  });

  t0(title('execStream streams stdout and reports the exit'), async (t) => {
    await withSandbox(t, async (box) => {
      const s = await box.execStream({ cmd: 'for i in 1 2 3; do echo $i; done' });
      s.stdin.end();
      const chunks: Buffer[] = [];
      s.stdout.on('data', (c: Buffer) => chunks.push(c));
      const st = await s.exited;
      if (!s.stdout.readableEnded) await new Promise((r) => s.stdout.once('end', r));
      t.is(st.exitCode, 0);
      t.is(Buffer.concat(chunks).toString(), '1\n2\n3\n');
    });
  });

  t0(title('stats report live usage'), async (t) => {
    await withSandbox(t, async (box) => {
      const s = await box.stats();
      t.true(s.memoryCurrentBytes > 0);
      t.true(s.pidsCurrent >= 1);
      t.is(s.oomKills, 0);
    });
  });

  t0(title('adopt re-attaches to a live sandbox and refuses a dead one'), async (t) => {
    const id = harness.newId();
    const box = await harness.backend.create(id, harness.spec, harness.layers);
    const record: SandboxRecord = { id, spec: harness.spec, layers: harness.layers.map((l) => l.digest), state: 'running', createdAt: new Date().toISOString(), runtime: box.runtime };
    try {
      const again = await harness.backend.adopt(record);
      t.not(again, null);
      t.is((await again!.exec({ cmd: ['echo', 'adopted'] })).stdout, 'adopted\n');
      t.is(await harness.backend.adopt({ ...record, runtime: { ...record.runtime, startTime: 1 } }), null);
    } finally {
      await box.destroy();
    }
    t.is(await harness.backend.adopt(record), null);
  });

  t0(title('destroy is idempotent and ends the sandbox'), async (t) => {
    const id = harness.newId();
    const box = await harness.backend.create(id, harness.spec, harness.layers);
    await Promise.all([box.destroy(), box.destroy()]);
    await box.ended;
    const err = await t.throwsAsync(box.exec({ cmd: ['true'] }));
    t.true(err instanceof WarrenError);
    t.is((err as WarrenError).code, 'SANDBOX_NOT_RUNNING');
  });
}
