/**
 * Idempotency keys across a gateway kill -9: a real `warren up` in a child
 * process runs keyed execs and keyed shell commands, is killed mid-run, and a
 * second `warren up` on the same data dir answers the retries with the real
 * results, without running anything twice. Every command appends a line to a file, so the line
 * counts prove how often it ran.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { WarrenClient, type Sandbox } from '../../src/sdk';
import { busyboxRootfs, countHostResources } from '../helpers/warren';
import { kill9, startWarrenProcess } from '../helpers/warren-process';
import { removeTree } from '../../src/shim/layers/sys';
import { openDatabase } from '../../src/state/db';
import { testUnless } from '../helpers/skip';
import { elapse, waitFor } from '../helpers/wait';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

/** Files of supervised execs of a sandbox under the data dir. */
function supervisedFiles(dataDir: string, id: string): string[] {
  try {
    return readdirSync(join(dataDir, 'supervised-exec', id));
  } catch {
    return [];
  }
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
  } catch {
    return '(gone)';
  }
}

/** Exec supervisors on the host working for this data dir (their command line names it). */
function supervisors(dataDir: string): number[] {
  const pids: number[] = [];
  for (const p of readdirSync('/proc')) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8').split('\0');
      const i = cmd.indexOf('--supervise');
      if (i >= 0 && cmd[i + 1]?.startsWith(dataDir)) pids.push(Number(p));
    } catch {
      /* gone */
    }
  }
  return pids;
}

async function lines(sb: Sandbox, file: string): Promise<number> {
  return Number((await sb.exec(`cat ${file} 2>/dev/null | wc -l`)).stdout.trim());
}

interface Answer {
  status: number;
  replayed: boolean;
  body: Record<string, unknown> & { error?: { code: string; message: string } };
}

async function execKeyed(url: string, token: string, id: string, key: string, body: Record<string, unknown>, accept?: string): Promise<Answer> {
  const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'idempotency-key': key };
  if (accept) headers.accept = accept;
  const res = await fetch(`${url}/v1/sandboxes/${id}/exec`, { method: 'POST', headers, body: JSON.stringify(body) });
  const text = await res.text();
  const parsed = accept ? { lines: text.trim().split('\n').map((l) => JSON.parse(l) as unknown) } : (JSON.parse(text) as Answer['body']);
  return { status: res.status, replayed: res.headers.get('idempotency-replayed') === 'true', body: parsed as Answer['body'] };
}

it('idempotency keys: a retry after a gateway kill -9 never runs the command twice; stored results, 422 on reuse, expiry', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-idem-'));
  const nodeId = `i${process.pid.toString(36)}`;
  let child: ChildProcess | null = null;
  let client: WarrenClient | null = null;
  try {
    const first = await startWarrenProcess(dataDir, nodeId);
    child = first.child;
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    client = new WarrenClient({ url: first.url, token });
    await client.images.import('busybox', await busyboxRootfs(), { type: 'directory' });
    const sb = await client.createSandbox({ image: 'busybox', labels: { test: 'idem' } });

    // A client that goes away mid-run (JSON and NDJSON alike) does not stop a keyed exec: the retry attaches to it.
    for (const accept of [undefined, 'application/x-ndjson']) {
      const key = `gone-${accept ? 'nd' : 'json'}`;
      const file = `/tmp/gone-${accept ? 'nd' : 'json'}`;
      const gone = { cmd: `echo run >> ${file}; sleep 1; echo survived` };
      const abort = new AbortController();
      const headers: Record<string, string> = { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'idempotency-key': key };
      if (accept) headers.accept = accept;
      const cut = fetch(`${first.url}/v1/sandboxes/${sb.id}/exec`, { method: 'POST', headers, body: JSON.stringify(gone), signal: abort.signal }).then(
        async (res) => res.text(),
        (err: Error) => err.name,
      );
      await waitFor(async () => (await lines(sb, file)) === 1, 10_000, 'the exec to start', 20);
      abort.abort();
      t.is(await cut, 'AbortError');
      const back = await execKeyed(first.url, token, sb.id, key, gone);
      t.is(back.status, 200);
      t.is(back.body.stdout, 'survived\n', `${accept ?? 'json'}: the retry got the first run's result`);
      t.is(await lines(sb, file), 1);
    }

    // A shell client that detaches mid-run: on re-attach the retry follows the same run to its end.
    {
      const sh = await sb.shell({ mode: 'command' });
      const cmdText = 'echo run >> /tmp/detached; sleep 1; echo after-detach; (exit 4)';
      const gone = sh.run(cmdText, { idempotencyKey: 'shell-detach' }).catch((err: { code?: string }) => err.code);
      await waitFor(async () => (await lines(sb, '/tmp/detached')) === 1, 10_000, 'the shell command to start', 20);
      const [session, offset] = [sh.session, sh.offset];
      await sh.detach();
      t.is(await gone, 'UNAVAILABLE');
      const back = await sb.shell({ mode: 'command', session, offset });
      const r = await back.run(cmdText, { idempotencyKey: 'shell-detach' });
      t.deepEqual([r.exitCode, r.stdout, r.replayed], [4, 'after-detach\n', true]);
      t.is(await lines(sb, '/tmp/detached'), 1);
      await back.close();
    }

    // Keyed execs cut by the kill: one still running after the restart (it waits for /tmp/go), one that
    // ends while the gateway is down, one whose timeout passes while it is down.
    const execCmd = 'echo run >> /tmp/exec-runs; echo before; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo finished; echo on-err >&2; exit 3';
    const pendingExec = sb.exec(execCmd, { idempotencyKey: 'exec-1', retryForMs: 0 }).then(
      () => 'answered',
      (err: { code?: string }) => err.code,
    );
    const fastCmd = 'echo run >> /tmp/fast-runs; while [ ! -e /tmp/go-fast ]; do sleep 0.05; done; echo fast-done';
    const pendingFast = sb.exec(fastCmd, { idempotencyKey: 'exec-fast', retryForMs: 0 }).then(
      () => 'answered',
      (err: { code?: string }) => err.code,
    );
    const sleepyCmd = 'echo run >> /tmp/sleepy-runs; sleep 30; echo never';
    const pendingSleepy = sb.exec(sleepyCmd, { idempotencyKey: 'exec-timeout', timeoutMs: 3000, retryForMs: 0 }).then(
      () => 'answered',
      (err: { code?: string }) => err.code,
    );
    const shell = await sb.shell({ mode: 'command', reconnect: false });
    await shell.run('cd /tmp');
    const sessionId = shell.session;
    const offset = shell.offset;
    const shellCmd = 'echo run >> /tmp/shell-runs; sleep 1.5; echo shell-out; echo shell-err >&2; (exit 7)';
    const pendingShell = shell.run(shellCmd, { idempotencyKey: 'shell-1' }).catch((err: { code?: string }) => err.code);
    // A keyed shell command with a timeout that runs past the restart: the timeout still holds.
    const slow = await sb.shell({ mode: 'command', reconnect: false });
    const slowCmd = 'echo run >> /tmp/slow-runs; sleep 30; echo never';
    const pendingSlow = slow.run(slowCmd, { idempotencyKey: 'shell-timeout', timeoutMs: 2500 }).catch((err: { code?: string }) => err.code);
    await waitFor(
      async () =>
        (await lines(sb, '/tmp/exec-runs')) === 1 &&
        (await lines(sb, '/tmp/fast-runs')) === 1 &&
        (await lines(sb, '/tmp/sleepy-runs')) === 1 &&
        (await lines(sb, '/tmp/shell-runs')) === 1 &&
        (await lines(sb, '/tmp/slow-runs')) === 1,
      10_000,
      'the five commands to start',
      20,
    );

    const initPid = sb.info?.pid;
    if (initPid === undefined) throw new Error('the admin sees the sandbox pid');
    await kill9(child);
    child = null;
    // While the gateway is down, one of them ends (released through the sandbox's root) and its supervisor writes its result.
    writeFileSync(`/proc/${initPid}/root/tmp/go-fast`, '');
    await waitFor(() => supervisedFiles(dataDir, sb.id).filter((run) => existsSync(join(dataDir, 'supervised-exec', sb.id, run, 'result'))).length === 1, 10_000, 'the released exec to end', 20);
    t.is(await pendingExec, 'UNAVAILABLE');
    t.is(await pendingFast, 'UNAVAILABLE');
    t.is(await pendingSleepy, 'UNAVAILABLE');
    t.is(await pendingShell, 'UNAVAILABLE');
    t.is(await pendingSlow, 'UNAVAILABLE');
    await client.close();

    // New keys expire after 3 s on the restarted gateway (the keys above keep the window they were given).
    const second = await startWarrenProcess(dataDir, nodeId, ['--idempotency-window', '3s']);
    child = second.child;
    const url = second.url;
    client = new WarrenClient({ url, token });
    const again = await client.getSandbox(sb.id);

    // The keyed execs ran under supervisors of their own: the restarted gateway follows them.
    // Still running: the retry attaches and gets the real exit code and all of the output.
    const attached = execKeyed(url, token, sb.id, 'exec-1', { cmd: execCmd });
    const attachedSdk = again.exec(execCmd, { idempotencyKey: 'exec-1' });
    await again.exec('touch /tmp/go');
    const cut = await attached;
    t.is(cut.status, 200);
    t.deepEqual([cut.body.exitCode, cut.body.signal, cut.body.status, cut.body.stdout, cut.body.stderr], [3, null, 'error', 'before\nfinished\n', 'on-err\n']);
    const viaSdk = await attachedSdk;
    t.deepEqual([viaSdk.exitCode, viaSdk.stdout], [3, 'before\nfinished\n']);
    t.is(await lines(again, '/tmp/exec-runs'), 1, 'the exec cut by the kill ran once');
    // Ended while the gateway was down: its stored result.
    const fast = await execKeyed(url, token, sb.id, 'exec-fast', { cmd: fastCmd });
    t.deepEqual([fast.status, fast.replayed, fast.body.exitCode, fast.body.stdout], [200, true, 0, 'fast-done\n']);
    t.is(await lines(again, '/tmp/fast-runs'), 1);
    // Its timeout passed while the gateway was down: the supervisor stopped it.
    const sleepy = await execKeyed(url, token, sb.id, 'exec-timeout', { cmd: sleepyCmd, timeoutMs: 3000 });
    t.deepEqual([sleepy.status, sleepy.body.status, sleepy.body.exitCode, sleepy.body.signal, sleepy.body.stdout], [200, 'timeout', null, 9, '']);
    t.is(await lines(again, '/tmp/sleepy-runs'), 1);

    // Keyed execs keep exec's semantics: output limit (the writer is stopped by SIGPIPE), stdin, signals, streaming.
    const yes = await execKeyed(url, token, sb.id, 'yes-1', { cmd: ['yes'], maxOutputBytes: 1000 });
    t.deepEqual([yes.body.status, yes.body.signal, yes.body.truncated, String(yes.body.stdout).length], ['killed', 13, true, 1000]);
    const plainYes = await again.exec(['yes'], { maxOutputBytes: 1000 });
    t.deepEqual([plainYes.status, plainYes.signal, plainYes.truncated], ['killed', 13, true], 'the same as an exec without a key');
    const fed = await execKeyed(url, token, sb.id, 'stdin-1', { cmd: 'cat; echo; tr a b', stdin: 'abc' });
    t.deepEqual([fed.body.exitCode, fed.body.stdout], [0, 'abc\n']);
    const term = await execKeyed(url, token, sb.id, 'sig-1', { cmd: 'kill -TERM $$' });
    t.deepEqual([term.body.status, term.body.exitCode, term.body.signal], ['killed', null, 15]);
    const stopped = await execKeyed(url, token, sb.id, 'to-1', { cmd: 'echo started; sleep 30', timeoutMs: 300 });
    t.deepEqual([stopped.body.status, stopped.body.exitCode, stopped.body.stdout], ['timeout', null, 'started\n']);
    const nd = await execKeyed(url, token, sb.id, 'nd-1', { cmd: 'echo one; sleep 0.2; echo two >&2; exit 5' }, 'application/x-ndjson');
    const ndTypes = (nd.body as unknown as { lines: Array<{ type: string; exitCode?: number }> }).lines;
    t.deepEqual(ndTypes.map((l) => l.type), ['stdout', 'stderr', 'exit']);
    t.is(ndTypes[2]!.exitCode, 5);
    const missing = await execKeyed(url, token, sb.id, 'nf-1', { cmd: ['/no/such/cmd'] });
    t.is(missing.body.exitCode, 127);
    // Nothing of the finished runs is left on the host: no files, no supervisors.
    // (the node removes a run once its result is read, which the supervisor writes just before it exits)
    await waitFor(() => supervisedFiles(dataDir, sb.id).length === 0, 5000, 'the supervised runs to be removed', 20);
    await waitFor(() => supervisors(dataDir).length === 0, 5000, 'the supervisors to exit', 20).catch(() => undefined);
    t.deepEqual(supervisors(dataDir).map((pid) => `${pid}: ${cmdline(pid)}`), []);

    // The shell command lives in the session holder: the retry gets its real result.
    const reattached = await again.shell({ mode: 'command', session: sessionId, offset });
    const r = await reattached.run(shellCmd, { idempotencyKey: 'shell-1' });
    t.is(r.exitCode, 7);
    t.is(r.stdout, 'shell-out\n');
    t.is(r.stderr, 'shell-err\n');
    t.true(r.replayed);
    const r2 = await reattached.run(shellCmd, { idempotencyKey: 'shell-1' });
    t.deepEqual([r2.exitCode, r2.stdout, r2.replayed], [7, 'shell-out\n', true]);
    t.is((await reattached.run('cat /tmp/shell-runs | wc -l')).stdout.trim(), '1', 'the shell command ran once');
    // Same key, another command: refused.
    await t.throwsAsync(reattached.run('echo other', { idempotencyKey: 'shell-1' }), { code: 'IDEMPOTENCY_KEY_REUSED' as never });
    await t.throwsAsync(reattached.run('true', { idempotencyKey: 'bad key' }), { code: 'INVALID_ARGUMENT' as never });
    await reattached.close();
    const slowBack = await again.shell({ mode: 'command', session: slow.session, offset: slow.offset });
    const timedOut = await slowBack.run(slowCmd, { idempotencyKey: 'shell-timeout', timeoutMs: 2500 });
    t.deepEqual([timedOut.timedOut, timedOut.exitCode, timedOut.replayed, timedOut.stdout], [true, null, true, ''], 'the first run was stopped at its timeout');
    t.is((await slowBack.run('echo alive; cat /tmp/slow-runs | wc -l')).stdout, 'alive\n1\n', 'the session goes on; the command ran once');
    await slowBack.close();

    // Retry after completion: the stored result, nothing runs.
    const once = { cmd: 'echo run >> /tmp/once; printf "hello\\377"', maxOutputBytes: 1024 };
    const a = await execKeyed(url, token, sb.id, 'k-2', once);
    t.is(a.status, 200);
    t.false(a.replayed);
    const b = await execKeyed(url, token, sb.id, 'k-2', { maxOutputBytes: 1024, cmd: once.cmd, encoding: 'base64' });
    t.is(b.status, 200);
    t.true(b.replayed);
    t.is(Buffer.from(String(b.body.stdout), 'base64').toString('latin1'), 'hello\xff', 'the exact bytes were stored');
    t.is(b.body.exitCode, 0);
    const c = await execKeyed(url, token, sb.id, 'k-2', once, 'application/x-ndjson');
    const ndLines = (c.body as unknown as { lines: Array<{ type: string; data?: string; encoding?: string; exitCode?: number }> }).lines;
    t.true(c.replayed);
    t.deepEqual(ndLines.map((l) => l.type), ['stdout', 'exit']);
    t.is(Buffer.from(ndLines[0]!.data!, ndLines[0]!.encoding === 'base64' ? 'base64' : 'utf8').toString('latin1'), 'hello\xff');
    t.is(await lines(again, '/tmp/once'), 1, 'three answers, one run');

    // Same key, different body: 422; the key in the body works like the header; bad keys: 400.
    const d = await execKeyed(url, token, sb.id, 'k-2', { cmd: 'echo other' });
    t.is(d.status, 422);
    t.is(d.body.error?.code, 'IDEMPOTENCY_KEY_REUSED');
    const bad = await fetch(`${url}/v1/sandboxes/${sb.id}/exec`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'idempotency-key': 'has space' },
      body: JSON.stringify({ cmd: 'true' }),
    });
    t.is(bad.status, 400);
    t.is(((await bad.json()) as { error: { code: string } }).error.code, 'INVALID_ARGUMENT');
    const mismatch = await execKeyed(url, token, sb.id, 'k-x', { cmd: 'true', idempotencyKey: 'k-y' });
    t.is(mismatch.status, 400);

    // Concurrent duplicates attach to the running one (JSON and NDJSON alike).
    const conc = { cmd: 'echo run >> /tmp/conc; sleep 0.5; echo done-once' };
    const [x, y, z] = await Promise.all([
      execKeyed(url, token, sb.id, 'k-3', conc),
      execKeyed(url, token, sb.id, 'k-3', conc),
      execKeyed(url, token, sb.id, 'k-3', conc, 'application/x-ndjson'),
    ]);
    t.deepEqual([x.status, y.status, z.status], [200, 200, 200]);
    t.is(x.body.stdout, 'done-once\n');
    t.is(y.body.stdout, 'done-once\n');
    t.is(await lines(again, '/tmp/conc'), 1, 'three concurrent requests, one run');

    // The window passes: the key is free, the command runs again.
    await elapse(3200, 'the 3 s idempotency window of k-2 passes');
    const e = await execKeyed(url, token, sb.id, 'k-2', { cmd: 'echo other-now' });
    t.is(e.status, 200);
    t.false(e.replayed);
    t.is(e.body.stdout, 'other-now\n');

    const keysOf = (id: string): number => {
      const db = openDatabase(join(dataDir, 'warren.db'));
      try {
        return (db.prepare('SELECT COUNT(*) AS n FROM idempotency_keys WHERE sandbox = ?').get(id) as { n: number }).n;
      } finally {
        db.close();
      }
    };
    t.true(keysOf(sb.id) > 0, 'the keys are in the node database');
    // A keyed exec still running when its sandbox is deleted: the supervisor goes with it, and its files.
    const lingering = execKeyed(url, token, sb.id, 'linger', { cmd: 'echo run >> /tmp/linger; sleep 30' });
    await waitFor(async () => (await lines(again, '/tmp/linger')) === 1, 10_000, 'the lingering exec to start', 20);
    t.is(supervisors(dataDir).length, 1);
    await client.deleteSandbox(sb.id);
    await lingering;
    t.deepEqual(supervisors(dataDir), []);
    t.false(existsSync(join(dataDir, 'supervised-exec', sb.id)), 'the sandbox supervised-exec files went with it');
    const left = countHostResources({ dataDir, idPrefix: `${nodeId}-` });
    t.is(left.processes, 0);
    t.is(left.cgroups, 0);
    // The deleted sandbox's keys went with it.
    await kill9(child);
    child = null;
    t.is(keysOf(sb.id), 0);
  } finally {
    if (child) await kill9(child);
    await client?.close();
    removeTree(dataDir);
  }
});
