/**
 * The conformance suite every backend runs (container, microvm). It speaks
 * only the Backend interface and its facets from src/shim/types.ts: a block
 * for the core (exec, stats, adopt, destroy), then one block per facet. A
 * facet the backend refuses is checked to be refused (NOT_SUPPORTED with the
 * backend's reason), never silently skipped.
 *
 * Most tests share one sandbox (a microVM boot costs seconds of a core under
 * TCG); tests that end a sandbox make their own.
 */
import type { ExecutionContext, TestFn } from 'ava';
import { lstatSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Backend, BackendName, BackendSandbox, FacetName, ResolvedLayer, SandboxRecord, SandboxSpec } from '../../src/shim/types';
import { WarrenError } from '../../src/errors';
import { facet, requireOffered } from '../../src/shim/backends/facets';
import { attachSession, spawnHolder } from '../../src/shim/sessions/session-manager';
import { tempDir } from '../helpers/tmp';
import { within } from '../helpers/wait';

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

async function until(fn: () => Promise<boolean>, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await fn()) return true;
    await new Promise((r) => setTimeout(r, 50));
  }
  return fn();
}

export function backendConformance(test: TestFn, name: BackendName, open: () => Promise<BackendHarness>, skip: string | null): void {
  const t0 = skip === null ? test.serial : test.serial.skip;
  const title = (s: string) => `${name}: ${s}${skip === null ? '' : ` (skipped: ${skip})`}`;
  let harness: BackendHarness;
  let shared: BackendSandbox;

  /** A facet block: `offered` runs when the backend offers it, else the refusal is checked. */
  function facetBlock(f: FacetName, what: string, offered: (t: ExecutionContext) => Promise<void>) {
    t0(title(`facet ${f}: ${what}, or refused with the backend's reason`), async (t) => {
      t.timeout(5 * 60_000); // a guest under TCG on a loaded machine is slow; no facet test measures time
      const status = harness.backend.facets[f];
      if (status.offered) {
        t.true(status.how.length > 0);
        await offered(t);
        return;
      }
      t.true(status.reason.length > 0);
      const err = t.throws(() => requireOffered(harness.backend, f)) as WarrenError;
      t.is(err.code, 'NOT_SUPPORTED');
      t.true(err.message.includes(status.reason), err.message);
      if (f !== 'network') {
        t.is((shared as unknown as Record<string, unknown>)[f], undefined, `a refused ${f} facet has no implementation`);
        const e2 = t.throws(() => facet(harness.backend, shared, f as 'files')) as WarrenError;
        t.is(e2.code, 'NOT_SUPPORTED');
      }
    });
  }

  if (skip === null) {
    test.before(async (t) => {
      // a VM boot under TCG on a loaded machine can take minutes
      t.timeout(10 * 60_000);
      harness = await open();
      shared = await harness.backend.create(harness.newId(), harness.spec, harness.layers);
    });
    test.after.always(async () => {
      if (shared) await shared.destroy().catch(() => harness.cleanup(shared.id));
      await harness?.close();
    });
  }

  // ---------------------------------------------------------------- core

  t0(title('matches interface'), async (t) => {
    t.is(typeof harness.backend.create, 'function');
    t.is(typeof harness.backend.adopt, 'function');
    t.is(typeof harness.backend.cleanup, 'function');
    t.is(harness.backend.name, name);
    for (const m of ['exec', 'execStream', 'stats', 'destroy'] as const) t.is(typeof shared[m], 'function', m);
    t.true(shared.ended instanceof Promise);
    t.is(typeof shared.runtime, 'object');
    for (const [f, s] of Object.entries(harness.backend.facets)) {
      if (f === 'network') continue;
      t.is((shared as unknown as Record<string, unknown>)[f] !== undefined, s.offered, `facet ${f} is implemented exactly when offered`);
    }
  });

  t0(title('exec returns output, stderr and exit codes'), async (t) => {
    const ok = await shared.exec({ cmd: ['echo', 'hello'] });
    t.is(ok.exitCode, 0);
    t.is(ok.stdout, 'hello\n');
    t.is(ok.status, 'ok');
    const fail = await shared.exec({ cmd: 'echo out; echo err >&2; exit 3' });
    t.is(fail.exitCode, 3);
    t.is(fail.stdout, 'out\n');
    t.is(fail.stderr, 'err\n');
    t.is(fail.status, 'error');
    const missing = await shared.exec({ cmd: ['/no/such/binary'] });
    t.is(missing.exitCode, 127);
  });

  t0(title('exec passes stdin, env and cwd'), async (t) => {
    const r = await shared.exec({ cmd: 'cat; echo "$FOO"; pwd', stdin: 'in\n', env: { FOO: 'bar' }, cwd: '/tmp' });
    t.is(r.stdout, 'in\nbar\n/tmp\n');
  });

  t0(title('exec timeout kills the command and keeps the sandbox'), async (t) => {
    const started = Date.now();
    const r = await shared.exec({ cmd: 'sleep 600', timeoutMs: 200 });
    t.is(r.status, 'timeout');
    // far short of the sleep, however slow the guest: the timeout, not the command, ended it
    t.true(Date.now() - started < 300_000, `took ${Date.now() - started} ms`);
    t.is((await shared.exec({ cmd: ['echo', 'alive'] })).stdout, 'alive\n');
  });

  t0(title('output beyond maxOutputBytes is truncated and flagged'), async (t) => {
    const r = await shared.exec({ cmd: 'head -c 100000 /dev/zero', maxOutputBytes: 1000 });
    t.true(r.truncated);
    t.is(r.stdout.length, 1000);
    // At the limit the output stops: the writer is stopped (SIGPIPE) or, if it was already done
    // writing when the stop reached it (a microVM's guest learns of the limit from the host), it
    // has ended on its own; an endless writer is the next test.
    if (r.signal !== 13) t.is(r.exitCode, 0, `neither stopped by SIGPIPE nor ended: ${JSON.stringify({ signal: r.signal, exitCode: r.exitCode })}`);
  });

  t0(title('a writer that never stops is stopped at the output limit, not at its timeout'), async (t) => {
    // the timeout is far beyond any machine's slowness: reaching it means the limit did not stop the writer
    const r = await shared.exec({ cmd: 'yes', maxOutputBytes: 64 * 1024, timeoutMs: 300_000 });
    t.true(r.truncated);
    t.not(r.status, 'timeout');
    // Output exactly at the limit is whole, not truncated.
    const exact = await shared.exec({ cmd: 'printf abcde', maxOutputBytes: 5 });
    t.deepEqual([exact.stdout, exact.truncated, exact.exitCode], ['abcde', false, 0]);
  });

  t0(title('execStream streams stdout and reports the exit'), async (t) => {
    const s = await shared.execStream({ cmd: 'for i in 1 2 3; do echo $i; done' });
    s.stdin.end();
    const chunks: Buffer[] = [];
    s.stdout.on('data', (c: Buffer) => chunks.push(c));
    const ended = new Promise((r) => s.stdout.once('end', r));
    const st = await s.exited;
    if (!s.stdout.readableEnded) await ended;
    t.is(st.exitCode, 0);
    t.is(Buffer.concat(chunks).toString(), '1\n2\n3\n');
  });

  t0(title('stats report live usage'), async (t) => {
    const s = await shared.stats();
    t.true(s.memoryCurrentBytes > 0);
    t.true(s.pidsCurrent >= 1);
    t.is(s.oomKills, 0);
  });

  t0(title('adopt re-attaches to a live sandbox and refuses a dead one'), async (t) => {
    t.timeout(10 * 60_000); // boots a VM of its own
    const id = harness.newId();
    const box = await harness.backend.create(id, harness.spec, harness.layers);
    const record: SandboxRecord = { id, spec: harness.spec, layers: harness.layers.map((l) => l.digest), state: 'running', createdAt: new Date().toISOString(), runtime: box.runtime };
    try {
      const again = await harness.backend.adopt(record);
      t.not(again, null);
      t.is((await again!.exec({ cmd: ['echo', 'adopted'], timeoutMs: 60_000 })).stdout, 'adopted\n');
      t.is(await harness.backend.adopt({ ...record, runtime: { ...record.runtime, startTime: 1 } }), null);
    } finally {
      await box.destroy();
    }
    t.is(await harness.backend.adopt(record), null);
  });

  t0(title('destroy is idempotent and ends the sandbox'), async (t) => {
    t.timeout(10 * 60_000); // boots a VM of its own
    const id = harness.newId();
    const box = await harness.backend.create(id, harness.spec, harness.layers);
    await Promise.all([box.destroy(), box.destroy()]);
    await box.ended;
    const err = await t.throwsAsync(box.exec({ cmd: ['true'] }));
    t.true(err instanceof WarrenError);
    t.is((err as WarrenError).code, 'SANDBOX_NOT_RUNNING');
  });

  // ---------------------------------------------------------------- facets

  facetBlock('files', 'files are confined to the sandbox root', async (t) => {
    const files = facet(harness.backend, shared, 'files');
    await files.writeFile('/root/conf/a.txt', Buffer.from('from host\n'), 0o640);
    t.is((await shared.exec({ cmd: 'cat /root/conf/a.txt; stat -c %a /root/conf/a.txt' })).stdout, 'from host\n640\n');
    await shared.exec({ cmd: 'echo inside > /root/conf/b.txt; ln -sfn / /root/conf/up; ln -sfn ../../../../../../etc /root/conf/dots' });
    t.is((await files.readFile('/root/conf/b.txt', 100)).toString(), 'inside\n');
    t.is((await files.readFile('/root/conf/up/root/conf/b.txt', 100)).toString(), 'inside\n', 'an absolute symlink resolves inside the root');
    const names = (await files.listDir('/root/conf')).map((e) => `${e.name}:${e.type}`).sort();
    t.deepEqual(names, ['a.txt:file', 'b.txt:file', 'dots:symlink', 'up:symlink']);
    t.is(await files.kind('/root/conf'), 'dir');
    t.is(await files.kind('/root/conf/a.txt'), 'file');
    await files.mkdirs('/root/conf/x/y', 0o755);
    t.is(await files.kind('/root/conf/x/y'), 'dir');
    // a file only the host has is not reachable through any path
    const hostDir = tempDir('warren-conf-host-');
    writeFileSync(join(hostDir, 'secret'), 'host only');
    const e = (await t.throwsAsync(files.readFile(join(hostDir, 'secret'), 100))) as WarrenError;
    t.true(['FILE_NOT_FOUND', 'PATH_ESCAPE'].includes(e.code), e.code);
    const viaDots = await files.readFile('/root/conf/dots/hostname', 4096).catch((err: WarrenError) => err);
    if (Buffer.isBuffer(viaDots)) t.is(viaDots.toString(), (await shared.exec({ cmd: 'cat /etc/hostname' })).stdout, '.. stops at the sandbox root');
    else t.true(['FILE_NOT_FOUND', 'PATH_ESCAPE'].includes(viaDots.code));
    const big = (await t.throwsAsync(files.readFile('/root/conf/a.txt', 3))) as WarrenError;
    t.is(big.code, 'PAYLOAD_TOO_LARGE');
  });

  facetBlock('sessions', 'a session holder reaches a shell in the sandbox', async (t) => {
    const sessions = facet(harness.backend, shared, 'sessions');
    const launch = await sessions.shellCommand({ mode: 'command', env: { CONF: 'yes' }, sessionId: 's-conformance' });
    t.is(launch.ptmxPath, undefined);
    const dir = tempDir('warren-conf-sess-');
    const socketPath = join(dir, 's-conformance.sock');
    const holder = await spawnHolder({ ...launch, socketPath, mode: 'command', bufferBytes: 65536, info: { sandboxId: shared.id, sessionId: 's-conformance' } });
    sessions.holderStarted(holder.pid);
    const att = await attachSession(socketPath, 0);
    try {
      const out: Buffer[] = [];
      att.onOutput((o) => out.push(o.data));
      // no timeouts: a guest under TCG on a loaded machine can take many seconds for a first command
      t.is((await att.run('c1', 'echo "$CONF"; cd /tmp')).exitCode, 0);
      t.is((await att.run('c2', 'pwd; false')).exitCode, 1);
      t.true(await until(async () => Buffer.concat(out).toString().includes('/tmp\n'), 60_000));
      t.is(Buffer.concat(out).toString(), 'yes\n/tmp\n', 'env reaches the shell and cwd persists between commands');
    } finally {
      await att.close();
    }
  });

  facetBlock('sessions', 'a signal to the command reaches what it started, never the shell or earlier background jobs; a pty signal reaches the foreground job', async (t) => {
    const sessions = facet(harness.backend, shared, 'sessions');
    const dir = tempDir('warren-conf-sig-');
    const open = async (mode: 'command' | 'pty', sessionId: string) => {
      const launch = await sessions.shellCommand({ mode, env: {}, sessionId });
      const socketPath = join(dir, `${sessionId}.sock`);
      const holder = await spawnHolder({ ...launch, socketPath, mode, bufferBytes: 65536, info: { sandboxId: shared.id, sessionId } });
      sessions.holderStarted(holder.pid);
      const att = await attachSession(socketPath, 0);
      let ended = false;
      att.onExit(() => (ended = true));
      return { att, ended: () => ended };
    };
    const alive = async (pidFile: string) => (await shared.exec({ cmd: `kill -0 "$(cat ${pidFile})"` })).exitCode === 0;
    // whether a `sleep N` runs (GNU grep splits a binary file at its NULs: translate them first)
    const sleeping = async (n: string) => (await shared.exec({ cmd: `for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < "$f" 2>/dev/null; echo; done | grep -q '^sleep ${n} '` })).exitCode === 0;
    // every step has a deadline, and a missed one says which step and what ran in the sandbox then
    const step = async <T>(p: Promise<T>, what: string): Promise<T> => {
      try {
        return await within(p, 120_000, what);
      } catch (err) {
        const ps = await within(shared.exec({ cmd: 'ps -o pid,pgid,args 2>/dev/null || ps' }), 30_000, 'ps').then((r) => r.stdout, (e: Error) => e.message);
        throw new Error(`${(err as Error).message}\n${ps}`);
      }
    };
    const cmd = await step(open('command', 's-conf-signal'), 'the command-mode session opens');
    try {
      t.is((await step(cmd.att.run('bg', 'sleep 600 & echo $! > /tmp/conf-bg.pid'), 'the background job starts')).exitCode, 0);
      const running = cmd.att.run('fg', 'sleep 601');
      t.true(await until(() => sleeping('601'), 120_000), 'the command started');
      cmd.att.signal(15);
      const r = await step(running, 'the SIGTERM ends the command');
      t.is(r.exitCode, 143, 'the command died of the SIGTERM');
      t.false(cmd.ended(), 'the shell is still there');
      t.true(await alive('/tmp/conf-bg.pid'), 'a background job of an earlier command is spared');
      const timed = await step(cmd.att.run('slow', 'sleep 602', 1500), 'the timeout ends the command');
      t.true(timed.timedOut === true && timed.exitCode === null, JSON.stringify(timed));
      t.true(await alive('/tmp/conf-bg.pid'), 'a timeout spares it too');
      t.is((await step(cmd.att.run('after', 'kill "$(cat /tmp/conf-bg.pid)"; echo usable'), 'the session runs the next command')).exitCode, 0, 'the session is usable');
    } finally {
      await step(cmd.att.close(), 'the command-mode session closes');
    }
    const pty = await step(open('pty', 's-conf-pty-signal'), 'the pty session opens');
    try {
      const out: Buffer[] = [];
      pty.att.onOutput((o) => out.push(o.data));
      pty.att.write('sleep 603\n');
      t.true(await until(() => sleeping('603'), 120_000), 'the foreground job started');
      pty.att.signal(2);
      t.true(await until(async () => !(await sleeping('603')), 120_000), 'the SIGINT ended the foreground job');
      pty.att.write('echo "still=$((40+2))"\n');
      t.true(await until(async () => Buffer.concat(out).toString().includes('still=42'), 120_000), 'the shell outlived the foreground job');
      t.false(pty.ended());
    } finally {
      await step(pty.att.close(), 'the pty session closes');
    }
  });

  facetBlock('freeze', 'pause gives memory back, resume keeps processes running', async (t) => {
    const freeze = facet(harness.backend, shared, 'freeze');
    await shared.exec({ cmd: '(i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.tmp; mv /tmp/counter.tmp /tmp/counter; sleep 0.05; done) >/dev/null 2>&1 & echo $! > /tmp/counter.pid' });
    t.true(await until(async () => (await shared.exec({ cmd: 'cat /tmp/counter' })).stdout.trim() !== '', 60_000));
    const limit = harness.spec.memoryMb * 1024 * 1024;
    const report = await freeze.pause(limit);
    t.true(report.memoryBeforeBytes >= 0 && report.releasedBytes >= 0 && report.durationMs >= 0);
    t.is(typeof report.reclaim, 'string');
    await freeze.resume(limit, report.keep);
    const c1 = Number((await shared.exec({ cmd: 'cat /tmp/counter' })).stdout);
    t.true(await until(async () => Number((await shared.exec({ cmd: 'cat /tmp/counter' })).stdout) > c1, 60_000), 'the counter started before the pause goes on');
    await shared.exec({ cmd: 'kill $(cat /tmp/counter.pid)' });
  });

  facetBlock('snapshot', 'checkpoint + restore keep files and processes', async (t) => {
    const id = harness.newId();
    const box = await harness.backend.create(id, harness.spec, harness.layers);
    let restored: BackendSandbox | null = null;
    try {
      await box.exec({ cmd: 'echo kept > /root/snap' });
      const cp = await facet(harness.backend, box, 'snapshot').checkpoint();
      const record: SandboxRecord = { id, spec: harness.spec, layers: harness.layers.map((l) => l.digest), state: 'hibernated', createdAt: new Date().toISOString(), runtime: box.runtime };
      restored = await harness.backend.restore!(record, cp, harness.layers.map((l) => l.path));
      t.is((await restored.exec({ cmd: 'cat /root/snap' })).stdout, 'kept\n');
    } finally {
      await (restored ?? box).destroy().catch(() => harness.cleanup(id));
    }
  });

  facetBlock('export', 'the writable layer exports as an overlay upper dir', async (t) => {
    const exporter = facet(harness.backend, shared, 'export');
    const prep = await shared.exec({ cmd: 'mkdir -p /root/exp && echo exported > /root/exp/f && rm -rf /var/tmp && test ! -e /var/tmp' });
    t.is(prep.exitCode, 0, prep.stderr);
    const dest = join(tempDir('warren-conf-exp-'), 'upper');
    const r = await exporter.exportUpper(dest, false);
    t.true(r.frozenMs >= 0);
    t.is(readFileSync(join(dest, 'root', 'exp', 'f'), 'utf8'), 'exported\n');
    const wh = lstatSync(join(dest, 'var', 'tmp'));
    t.true(wh.isCharacterDevice() && wh.rdev === 0, 'a deleted lower entry is a 0/0 whiteout');
  });

  facetBlock('network', 'network attach', async (t) => {
    // Offered only with a node network; the harness runs without one, so this block is the refusal.
    t.true(harness.backend.facets.network.offered);
  });
}
