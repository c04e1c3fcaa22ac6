/**
 * E2B's own `e2b` SDK, unmodified, against a real `warren up` on loopback:
 * the control plane (create, connect, get, list by metadata with paging,
 * timeout, pause/connect, metrics, snapshots, kill), commands (foreground,
 * background with reconnect, stdin, signals, list, timeouts), PTY, the
 * filesystem (text/binary round trips, several files per upload, list with
 * depth, stat, mkdir, rename, remove, watchDir) and the error cases.
 */
import test from 'ava';
import { CommandExitError, FileNotFoundError, FileType, NotFoundError, Sandbox, SandboxError, TimeoutError } from 'e2b';
import { type E2bWarren, startE2bWarren } from './e2b-fixture';

let w: E2bWarren;

test.before(async () => {
  w = await startE2bWarren('e2bsdk');
});

test.after.always(async () => {
  await w?.stop();
});

async function until(what: string, fn: () => Promise<boolean> | boolean, ms = 15_000): Promise<void> {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await fn()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`timed out waiting for ${what}`);
}

test.serial('create with no arguments: bash, user "user" in /home/user, envs, metadata as labels', async (t) => {
  const sb = await Sandbox.create({ ...w.opts, metadata: { suite: 'e2b-sdk', case: 'basic' }, envs: { GREETING: 'hello' } });
  try {
    const r = await sb.commands.run('echo "$GREETING $0"; whoami; pwd; echo oops >&2');
    t.is(r.exitCode, 0);
    t.is(r.stdout, 'hello /bin/bash\nuser\n/home/user\n');
    t.is(r.stderr, 'oops\n');
    const root = await sb.commands.run('whoami', { user: 'root' });
    t.is(root.stdout.trim(), 'root');
    const info = await sb.getInfo();
    t.is(info.sandboxId, sb.sandboxId);
    t.is(info.templateId, 'base');
    t.is(info.state, 'running');
    t.deepEqual(info.metadata, { suite: 'e2b-sdk', case: 'basic' });
    t.true(info.endAt.getTime() > Date.now() + 200_000, 'default timeout is 300 s');
    t.true(await sb.isRunning());
    // The same sandbox through the native API: a label per metadata key.
    const native = await w.api('GET', `/v1/sandboxes/${sb.sandboxId}`);
    t.is(native.status, 200);
    t.is(native.body.labels.case, 'basic');
    const exec = await w.api('POST', `/v1/sandboxes/${sb.sandboxId}/exec`, { cmd: ['id', '-un', 'user'] });
    t.is(exec.body.stdout, 'user\n');
  } finally {
    t.true(await sb.kill());
  }
  t.false(await Sandbox.kill(sb.sandboxId, w.opts), 'a second kill reports the sandbox missing');
});

test.serial('commands: non-zero exit, streaming callbacks, background + reconnect by pid, stdin, list, kill', async (t) => {
  const sb = await Sandbox.create(w.opts);
  try {
    const err = await sb.commands.run('echo out; exit 3').catch((e) => e);
    t.true(err instanceof CommandExitError);
    t.is((err as CommandExitError).exitCode, 3);
    t.is((err as CommandExitError).stdout, 'out\n');

    const seen: string[] = [];
    await sb.commands.run('for i in 1 2 3; do echo line$i; done', { onStdout: (d) => void seen.push(d) });
    t.is(seen.join(''), 'line1\nline2\nline3\n');

    // Background: the handle can disconnect; the process keeps running and is re-attached by pid.
    const bg = await sb.commands.run('for i in $(seq 1 400); do echo tick $i; sleep 0.05; done', { background: true, timeoutMs: 0 });
    t.true(bg.pid > 0);
    await until('first tick', () => bg.stdout.includes('tick 1'));
    await bg.disconnect();
    const listed = await sb.commands.list();
    const mine = listed.find((p) => p.pid === bg.pid);
    t.truthy(mine, 'listed while running');
    t.is(mine!.cmd, '/bin/bash');
    const again: string[] = [];
    const re = await sb.commands.connect(bg.pid, { onStdout: (d) => void again.push(d) });
    await until('output after reconnect', () => again.join('').includes('tick'));
    t.true(await sb.commands.kill(bg.pid));
    const end = await re.wait().catch((e) => e);
    t.true(end instanceof CommandExitError, 'killed: non-zero end');
    t.false(await sb.commands.kill(bg.pid), 'gone after kill');

    // stdin
    const cat = await sb.commands.run('cat', { background: true, stdin: true });
    await sb.commands.sendStdin(cat.pid, 'piped input\n');
    await until('echoed stdin', () => cat.stdout === 'piped input\n');
    await sb.commands.closeStdin(cat.pid);
    const done = await cat.wait();
    t.is(done.exitCode, 0);
    t.is(done.stdout, 'piped input\n');

    // cwd and envs per command, relative cwd against home
    await sb.files.makeDir('work/sub');
    const here = await sb.commands.run('pwd; echo $X', { cwd: 'work/sub', envs: { X: 'y' } });
    t.is(here.stdout, '/home/user/work/sub\ny\n');
  } finally {
    await sb.kill();
  }
});

test.serial('commands: the request timeout kills the process (TimeoutError)', async (t) => {
  const sb = await Sandbox.create(w.opts);
  try {
    const started = Date.now();
    const err = await sb.commands.run('sleep 600', { timeoutMs: 700 }).catch((e) => e);
    t.true(err instanceof TimeoutError, String(err));
    t.true(Date.now() - started < 300_000, 'the timeout, not the command, ended it');
    await until('process gone', async () => (await sb.commands.list()).length === 0);
  } finally {
    await sb.kill();
  }
});

test.serial('pty: create, input, resize, output, kill', async (t) => {
  const sb = await Sandbox.create(w.opts);
  try {
    let out = '';
    const dec = new TextDecoder();
    const pty = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => void (out += dec.decode(d)), timeoutMs: 0 });
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'));
    await until('pty output', () => out.includes('pty-42'));
    t.regex(out, /24 80/);
    await sb.pty.resize(pty.pid, { cols: 100, rows: 30 });
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'));
    await until('resized', () => out.includes('30 100'));
    t.true(await sb.pty.kill(pty.pid));
    await pty.wait().catch(() => undefined);
    await until('pty gone', async () => !(await sb.commands.list()).some((p) => p.pid === pty.pid));
    // Its shell session (holder) is closed, not left lingering.
    await until('session closed', async () => ((await w.api('GET', `/v1/sandboxes/${sb.sandboxId}/sessions`)).body.sessions as { alive: boolean }[]).every((s) => !s.alive));
  } finally {
    await sb.kill();
  }
});

test.serial('files: text and binary round trips, several files per write, list depth, stat, mkdir, rename, remove', async (t) => {
  const sb = await Sandbox.create(w.opts);
  try {
    const bin = new Uint8Array(256 * 1024);
    for (let i = 0; i < bin.length; i++) bin[i] = (i * 31 + 7) & 0xff;
    const wi = await sb.files.write('/tmp/blob.bin', bin.buffer);
    t.is(wi.path, '/tmp/blob.bin');
    const back = await sb.files.read('/tmp/blob.bin', { format: 'bytes' });
    t.deepEqual(Buffer.from(back), Buffer.from(bin));
    t.is(await sb.files.read('/tmp/blob.bin', { format: 'blob' }).then((b) => b.size), bin.length);
    t.is(await sb.files.write('empty.txt', '').then((x) => x.path), '/home/user/empty.txt');
    t.is(await sb.files.read('empty.txt'), '');

    const many = await sb.files.write([
      { path: 'proj/a.txt', data: 'A' },
      { path: 'proj/deep/b.txt', data: 'B' },
      { path: '/home/user/proj/c.txt', data: new Blob(['C']) },
    ]);
    t.deepEqual(many.map((f) => f.path).sort(), ['/home/user/proj/a.txt', '/home/user/proj/c.txt', '/home/user/proj/deep/b.txt']);
    const owner = await sb.commands.run('stat -c %U proj/deep/b.txt');
    t.is(owner.stdout.trim(), 'user', 'files are written as the user');

    const top = await sb.files.list('proj');
    t.deepEqual(top.map((e) => e.name).sort(), ['a.txt', 'c.txt', 'deep']);
    t.is(top.find((e) => e.name === 'deep')!.type, FileType.DIR);
    const deep = await sb.files.list('proj', { depth: 2 });
    t.true(deep.some((e) => e.path === '/home/user/proj/deep/b.txt' && e.type === FileType.FILE && e.size === 1));

    const st = await sb.files.getInfo('proj/a.txt');
    t.is(st.type, FileType.FILE);
    t.is(st.size, 1);
    t.is(st.owner, 'user');
    t.true(st.modifiedTime instanceof Date);
    t.true(await sb.files.exists('proj/a.txt'));
    t.false(await sb.files.exists('proj/none'));

    t.true(await sb.files.makeDir('newdir/x'));
    t.false(await sb.files.makeDir('newdir/x'), 'already exists');
    const moved = await sb.files.rename('proj/a.txt', 'newdir/a2.txt');
    t.is(moved.path, '/home/user/newdir/a2.txt');
    t.is(await sb.files.read('newdir/a2.txt'), 'A');
    await sb.files.remove('proj');
    t.false(await sb.files.exists('proj'));

    await t.throwsAsync(sb.files.read('nope.txt'), { instanceOf: FileNotFoundError });
    await t.throwsAsync(sb.files.getInfo('/nope/nope'), { instanceOf: FileNotFoundError });
    await t.throwsAsync(sb.files.read('/etc/shadow'), { instanceOf: SandboxError }, 'the user cannot read it');
    await t.throwsAsync(sb.files.write('../../etc/x', 'x'), { message: /\.\./ });
  } finally {
    await sb.kill();
  }
});

test.serial('watchDir reports creates, writes and removes', async (t) => {
  const sb = await Sandbox.create(w.opts);
  try {
    await sb.files.makeDir('watched/sub');
    const events: { name: string; type: string }[] = [];
    const h = await sb.files.watchDir('watched', (e) => void events.push({ name: e.name, type: e.type }), { recursive: true, timeoutMs: 0 });
    await sb.files.write('watched/one.txt', '1');
    await sb.commands.run('echo more >> watched/one.txt; echo x > watched/sub/two.txt; rm watched/one.txt');
    await until('events', () => events.some((e) => e.name === 'one.txt' && e.type === 'remove') && events.some((e) => e.name === 'sub/two.txt'));
    t.true(events.some((e) => e.name === 'one.txt' && e.type === 'create'));
    t.true(events.some((e) => e.name === 'one.txt' && e.type === 'write'));
    await h.stop();
  } finally {
    await sb.kill();
  }
});

test.serial('pause then connect keeps state; list by metadata and state with paging; set timeout; metrics', async (t) => {
  const tag = `p${Date.now()}`;
  const a = await Sandbox.create({ ...w.opts, metadata: { group: tag, n: '1' } });
  const b = await Sandbox.create({ ...w.opts, metadata: { group: tag, n: '2' } });
  const c = await Sandbox.create({ ...w.opts, metadata: { group: tag, n: '3' } });
  try {
    await a.commands.run('echo kept > state.txt; sleep 600 >/dev/null 2>&1 &');
    t.true(await a.pause());
    t.false(await a.pause(), 'already paused (409)');
    t.is((await a.getInfo()).state, 'paused');
    await t.throwsAsync(a.commands.run('true'), { instanceOf: SandboxError }, 'a paused sandbox does not answer until connected');

    const paged = Sandbox.list({ ...w.opts, query: { metadata: { group: tag } }, limit: 2 });
    const page1 = await paged.nextItems();
    t.is(page1.length, 2);
    t.true(paged.hasNext);
    const page2 = await paged.nextItems();
    t.is(page2.length, 1);
    t.false(paged.hasNext);
    t.deepEqual([...page1, ...page2].map((s) => s.metadata.n).sort(), ['1', '2', '3']);
    const pausedOnly = await Sandbox.list({ ...w.opts, query: { metadata: { group: tag }, state: ['paused'] } }).nextItems();
    t.deepEqual(pausedOnly.map((s) => s.sandboxId), [a.sandboxId]);
    const one = await Sandbox.list({ ...w.opts, query: { metadata: { group: tag, n: '2' } } }).nextItems();
    t.deepEqual(one.map((s) => s.sandboxId), [b.sandboxId]);

    const resumed = await Sandbox.connect(a.sandboxId, w.opts);
    t.is((await resumed.getInfo()).state, 'running');
    t.is(await resumed.files.read('state.txt'), 'kept\n');
    t.regex((await resumed.commands.run("grep -lx sleep /proc/[0-9]*/comm || true")).stdout, /\/proc\/\d+\/comm/, 'processes survived the pause');

    await b.setTimeout(3_600_000);
    t.true((await b.getInfo()).endAt.getTime() > Date.now() + 3_000_000);
    const m = await c.getMetrics();
    t.true(m.length >= 1);
    t.true(m[0]!.memUsed > 0);
    t.is(m[0]!.memTotal, 512 * 1024 * 1024);
  } finally {
    await Promise.all([a.kill(), b.kill(), c.kill()]);
  }
});

test.serial('the sandbox timeout fires: kill (lifecycle ttl) and pause (autoPause)', async (t) => {
  const killed = await Sandbox.create({ ...w.opts, timeoutMs: 2_000 });
  const paused = await Sandbox.create({ ...w.opts, timeoutMs: 2_000, lifecycle: { onTimeout: 'pause' } });
  try {
    await until('killed by its timeout', async () => !(await killed.isRunning().catch(() => false)), 20_000);
    await t.throwsAsync(killed.getInfo(), { instanceOf: NotFoundError });
    await until('paused by its timeout', async () => (await paused.getInfo()).state === 'paused', 20_000);
    const back = await Sandbox.connect(paused.sandboxId, { ...w.opts, timeoutMs: 60_000 });
    t.is((await back.commands.run('echo alive')).stdout, 'alive\n');
  } finally {
    await Sandbox.kill(killed.sandboxId, w.opts).catch(() => undefined);
    await w.api('DELETE', `/v1/sandboxes/${killed.sandboxId}`);
    await paused.kill();
  }
});

test.serial('snapshots are templates new sandboxes start from; fork copies the files', async (t) => {
  const src = await Sandbox.create(w.opts);
  const started: Sandbox[] = [];
  try {
    await src.files.write('snap.txt', 'from the snapshot');
    const snap = await src.createSnapshot({ name: `snap-${Date.now()}` });
    t.truthy(snap.snapshotId);
    const listed = await src.listSnapshots().nextItems();
    t.true(listed.some((s) => s.snapshotId === snap.snapshotId));
    const child = await Sandbox.create(snap.snapshotId, w.opts);
    started.push(child);
    t.is(await child.files.read('snap.txt'), 'from the snapshot');
    t.is((await child.getInfo()).templateId, snap.snapshotId);
    const forks = await src.fork();
    t.is(forks.length, 1);
    const f = forks[0]!;
    t.false(f instanceof Error, String(f));
    started.push(f as Sandbox);
    t.is(await (f as Sandbox).files.read('snap.txt'), 'from the snapshot');
  } finally {
    await src.kill();
    for (const s of started) await s.kill();
  }
});

test.serial('bad input: unknown template, foreign ids, bad tokens, bad keys, hostile uploads, oversized bodies', async (t) => {
  const err = await Sandbox.create('no-such-template', w.opts).catch((e) => e);
  t.true(err instanceof SandboxError);
  t.regex(String(err.message), /404.*not found/);
  await t.throwsAsync(Sandbox.create({ ...w.opts, apiKey: 'wrn_bogus' }), { message: /Unauthorized/ });
  await t.throwsAsync(Sandbox.create({ ...w.opts, network: { allowOut: ['0.0.0.0/0'] } }), { message: /CIDR|service/ });
  // This node runs without sandbox networking: "no internet" is what every sandbox has; asking for a service says why not.
  const offline = await Sandbox.create({ ...w.opts, allowInternetAccess: false });
  t.is((await offline.commands.run('echo offline')).stdout, 'offline\n');
  await offline.kill();
  await t.throwsAsync(Sandbox.create({ ...w.opts, network: { allowOut: ['pypi.org'] } }), { message: /501.*network/ });
  await t.throwsAsync(Sandbox.connect('nope-123', w.opts), { instanceOf: NotFoundError });
  await t.throwsAsync(Sandbox.getInfo('../../etc', w.opts), { instanceOf: NotFoundError });

  // Another account's sandbox looks missing on both planes.
  const acct = await w.api('POST', '/v1/accounts', { name: `other${Date.now()}`, role: 'runtime' });
  t.is(acct.status, 201);
  const mine = await Sandbox.create(w.opts);
  try {
    const other = { ...w.opts, apiKey: acct.body.token as string };
    await t.throwsAsync(Sandbox.getInfo(mine.sandboxId, other), { instanceOf: NotFoundError });
    t.false(await Sandbox.kill(mine.sandboxId, other));
    t.is((await Sandbox.list({ ...other }).nextItems()).length, 0);
    t.is((await mine.getInfo()).state, 'running');
    // Quotas hold on this surface too: 429, which the SDK reports as a rate limit.
    t.is((await w.api('PUT', `/v1/accounts/${acct.body.id}/quota`, { maxSandboxes: 0 })).status, 200);
    await t.throwsAsync(Sandbox.create({ ...other, retries: 0 }), { message: /Rate limit|quota/i });

    // Sandbox plane without, and with a wrong, access token.
    const base = `${w.e2bUrl}/process.Process/List`;
    const h = { 'content-type': 'application/json', 'e2b-sandbox-id': mine.sandboxId, 'e2b-sandbox-port': '49983' };
    let r = await fetch(base, { method: 'POST', headers: h, body: '{}' });
    t.is(r.status, 401);
    t.is(((await r.json()) as { code: string }).code, 'unauthenticated');
    r = await fetch(base, { method: 'POST', headers: { ...h, 'x-access-token': 'e2ba_wrong' }, body: '{}' });
    t.is(r.status, 401);
    // An unknown id with a made-up token is refused the same way (ids do not leak).
    r = await fetch(base, { method: 'POST', headers: { ...h, 'e2b-sandbox-id': 'e2bsdk-0000000000000000', 'x-access-token': 'e2ba_x' }, body: '{}' });
    t.is(r.status, 401);

    // Hostile multipart filenames and oversized uploads.
    const info = await fetch(`${w.e2bUrl}/e2b/sandboxes/${mine.sandboxId}`, { headers: { 'x-api-key': w.token } }).then((x) => x.json() as Promise<{ envdAccessToken: string }>);
    const tok = info.envdAccessToken as string;
    const fd = new FormData();
    fd.append('file', new Blob(['x']), '../../../../etc/passwd');
    r = await fetch(`${w.e2bUrl}/files?username=user`, { method: 'POST', headers: { 'e2b-sandbox-id': mine.sandboxId, 'x-access-token': tok }, body: fd });
    t.is(r.status, 400);
    t.regex(((await r.json()) as { message: string }).message, /\.\./);
    const fd2 = new FormData();
    fd2.append('file', new Blob(['x']), '/etc/passwd');
    r = await fetch(`${w.e2bUrl}/files?username=user`, { method: 'POST', headers: { 'e2b-sandbox-id': mine.sandboxId, 'x-access-token': tok }, body: fd2 });
    t.is(r.status, 403, 'the user may not write /etc');
    const fd3 = new FormData();
    fd3.append('file', new Blob(['x']), 'a\u0000b');
    r = await fetch(`${w.e2bUrl}/files?username=user`, { method: 'POST', headers: { 'e2b-sandbox-id': mine.sandboxId, 'x-access-token': tok }, body: fd3 });
    t.is(r.status, 400);
    // A chunked body past the upload limit is cut off with 413 (the body never ends on its own).
    let sent = 0;
    const endless = new ReadableStream({
      pull(c) {
        if (sent >= 1024 * 1024 * 1024) return c.close();
        sent += 1024 * 1024;
        c.enqueue(new Uint8Array(1024 * 1024));
      },
    });
    r = await fetch(`${w.e2bUrl}/files?path=/tmp/big`, {
      method: 'POST',
      headers: { 'e2b-sandbox-id': mine.sandboxId, 'x-access-token': tok, 'content-type': 'application/octet-stream' },
      body: endless,
      duplex: 'half',
    } as RequestInit).catch((e) => e);
    if (r instanceof Response) t.is(r.status, 413);
    else t.regex(String((r as Error).cause ?? r), /closed|reset|terminated|EPIPE/i, 'the server hung up after its 413');
    t.true(sent > 256 * 1024 * 1024 && sent < 1024 * 1024 * 1024, `stopped reading near the limit (${sent} bytes sent)`);
    t.is((await mine.commands.run('echo still fine')).stdout, 'still fine\n');
  } finally {
    await mine.kill();
  }
});

test.serial('nothing is left behind: every sandbox these tests made is gone', async (t) => {
  const left = (await w.api('GET', '/v1/sandboxes')).body.sandboxes as { id: string; state: string }[];
  t.deepEqual(left.map((s) => `${s.id}:${s.state}`), []);
});
