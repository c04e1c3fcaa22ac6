/**
 * The shim protocol (src/shim/remote, docs/shim-protocol.md) against a real
 * node: the same contract calls answer the same over LocalShim and
 * RemoteShim; a peer without the token, a malformed request and a hostile or
 * broken node are refused with stable codes and bounded work; a gateway that
 * goes away kills its live execs and only detaches its sessions; nothing is
 * left open afterwards. The gateway test files run again over this binding
 * in test/integration/remote.
 */
import test from 'ava';
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { request } from 'undici';
import WebSocket from 'ws';
import { WarrenError } from '../../src/errors';
import { LocalShim } from '../../src/shim/local';
import { RemoteShim } from '../../src/shim/remote/client';
import { type ShimServer, serveShim } from '../../src/shim/remote/server';
import { FRAME, frame } from '../../src/shim/remote/wire';
import type { Shim } from '../../src/shim/types';
import { testUnless } from '../helpers/skip';
import { elapse, waitFor, waitForValue, within } from '../helpers/wait';
import { type ShimFixture, closeTestShim, openTestShim, rootSkipReason, spec } from '../helpers/warren';

const skip = rootSkipReason();
const it = testUnless(skip).serial;

let f: ShimFixture;
let server: ShimServer;
let remote: RemoteShim;
let local: LocalShim;
const token = randomBytes(24).toString('hex');

test.before(async () => {
  if (skip) return;
  f = await openTestShim();
  local = new LocalShim(f.shim);
  server = await serveShim({ shim: local, token, host: '127.0.0.1', port: 0, maxRawBytes: 4 * 1024 * 1024 });
  remote = await RemoteShim.connect({ url: server.url, token });
});

test.after.always(async () => {
  if (skip) return;
  await remote?.close();
  await server?.close();
  if (f) await closeTestShim(f);
});

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    return err instanceof WarrenError ? err.code : `not a WarrenError: ${String(err)}`;
  }
  return 'resolved';
}

/** Processes in the sandbox whose command line contains `needle` (from the node's side). */
async function procs(id: string, needle: string): Promise<string[]> {
  const r = await f.shim.exec(id, { cmd: 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline 2>/dev/null; echo; done' });
  return r.stdout.split('\n').filter((l) => l.includes(needle) && !l.includes('/proc/[0-9]'));
}

it('the same calls answer the same over both bindings, errors with the same codes', async (t) => {
  const both: Array<[string, Shim]> = [
    ['local', local],
    ['remote', remote],
  ];
  t.is(remote.nodeId, f.shim.nodeId);
  for (const [name, s] of both) {
    const sb = await s.createSandbox(spec({ labels: { via: name } }));
    t.is((await s.getSandbox(sb.id)).labels.via, name);
    // no host pid crosses the protocol (the in-process binding keeps it for the node's admins)
    const pids = [sb.pid, (await s.getSandbox(sb.id)).pid, ...(await s.listSandboxes({ labels: { via: name } })).map((x) => x.pid), ...(await s.listSandboxesPage({ labels: { via: name } }, { limit: 10 })).sandboxes.map((x) => x.pid)];
    if (name === 'remote') t.deepEqual(pids, [undefined, undefined, undefined, undefined]);
    else t.true(pids.every((p) => typeof p === 'number' && p > 1), `${name}: ${JSON.stringify(pids)}`);
    const es = await s.execStream(sb.id, { cmd: ['true'] });
    t.is(es.pid === undefined, name === 'remote', `${name}: execStream pid ${es.pid}`);
    es.stdin.end();
    await es.exited;
    t.deepEqual((await s.listSandboxes({ labels: { via: name } })).map((x) => x.id), [sb.id]);
    const r = await s.exec(sb.id, { cmd: ['sh', '-c', 'cat; echo err >&2; exit 3'], stdin: Buffer.from('in\u00e9') });
    t.like(r, { exitCode: 3, stdout: 'in\u00e9', stderr: 'err\n', status: 'error' }, name);
    const bytes = randomBytes(300_000);
    await s.writeFile(sb.id, '/tmp/blob', bytes, 0o600);
    t.true((await s.readFile(sb.id, '/tmp/blob', 1 << 20)).equals(bytes), `${name}: a binary file round-trips`);
    t.is(await codeOf(s.readFile(sb.id, '/tmp/blob', 1000)), 'PAYLOAD_TOO_LARGE', `${name}: the read bound holds`);
    t.is((await s.listDir(sb.id, '/tmp')).find((e) => e.name === 'blob')?.mode, 0o600);
    const cap = await s.execCaptured(sb.id, { cmd: 'head -c 200000 /dev/zero | tr "\\0" x', maxOutputBytes: 100_000 });
    t.is(cap.stdout.size, 100_000);
    t.true(cap.stdout.truncated);
    t.is(Buffer.concat([...cap.stdout.chunks(3000)]).length, 100_000);
    cap.release();
    t.is(await codeOf(s.getSandbox(`${f.shim.nodeId}-0000000000000000`)), 'SANDBOX_NOT_FOUND', name);
    t.is(await codeOf(s.readFile(sb.id, '/../../etc/shadow', 10)), await codeOf(local.readFile(sb.id, '/../../etc/shadow', 10)), name);
    t.is(await codeOf(s.exec(sb.id, { cmd: 'true', user: 'nobody-here' })), await codeOf(local.exec(sb.id, { cmd: 'true', user: 'nobody-here' })), name);
    t.deepEqual(await s.sweepSupervised(sb.id, new Set(['x'])), 0);
    await s.deleteSandbox(sb.id);
    t.is(await codeOf(s.deleteSandbox(sb.id)), 'SANDBOX_NOT_FOUND', name);
  }
  const [rf, lf] = [await remote.features(), await local.features()];
  t.is(rf.node, lf.node);
  t.deepEqual(rf.backends, lf.backends);
  t.deepEqual(rf.features, lf.features);
  t.deepEqual(rf.host, lf.host);
  t.true((rf.host?.cpus ?? 0) >= 1 && (rf.host?.memoryMb ?? 0) > 0);
  const images = (l: Awaited<ReturnType<Shim['listImages']>>) => l.map((i) => `${i.name}@${i.digest}`).sort();
  t.deepEqual(images(await remote.listImages()), images(await local.listImages()));
});

it('directory watches report creates, writes and removes over both bindings, and end with their connection', async (t) => {
  for (const [name, s] of [
    ['local', local],
    ['remote', remote],
  ] as const) {
    const sb = await s.createSandbox(spec());
    try {
      await s.exec(sb.id, { cmd: 'mkdir -p /tmp/w/sub' });
      const w = await s.watchDir(sb.id, '/tmp/w', { recursive: true });
      const seen: string[] = [];
      w.onEvent((e) => seen.push(`${e.type} ${e.name}`));
      // the recursive watch of /tmp/w/sub is set up from a listing: wait until it reports
      await waitFor(async () => {
        await s.exec(sb.id, { cmd: 'touch /tmp/w/sub/probe' });
        return seen.some((l) => l.endsWith(' sub/probe'));
      }, 10_000, `${name}: the watch of /tmp/w/sub`);
      // One step at a time: a create is told apart from a remove by looking at the directory
      // after the event, so a file created and removed at once may be reported removed only.
      for (const [cmd, event] of [
        ['echo 1 > /tmp/w/a', 'create a'],
        ['echo 2 >> /tmp/w/a', 'write a'],
        ['rm /tmp/w/a', 'remove a'],
        ['echo 3 > /tmp/w/sub/b', 'create sub/b'],
      ] as const) {
        await s.exec(sb.id, { cmd });
        await waitFor(() => seen.includes(event), 10_000, `${name}: ${event} after ${cmd}, got ${seen.join(', ')}`);
      }
      t.true(seen.length >= 5, `${name}: ${seen.join(', ')}`);
      w.close();
      await s.exec(sb.id, { cmd: 'echo 4 > /tmp/w/c' });
      // a write to /tmp/w/a before the close arrived within milliseconds; this one must not arrive at all
      await elapse(500, 'events of /tmp/w/c, were the watch still open');
      t.deepEqual(seen.filter((l) => l.endsWith(' c')), [], `${name}: nothing after close`);
      t.is(await codeOf(s.watchDir(sb.id, '/no/such/dir', { recursive: false })), 'FILE_NOT_FOUND', name);
      t.is(await codeOf(s.watchDir(sb.id, '/../../..', { recursive: false })), await codeOf(local.watchDir(sb.id, '/../../..', { recursive: false })), name);
    } finally {
      await s.deleteSandbox(sb.id);
    }
  }
});

it('a live exec streams as it runs; killing it from the gateway ends the process on the node', async (t) => {
  const sb = await remote.createSandbox(spec());
  try {
    const live = await remote.execLive(sb.id, { cmd: 'echo started; exec sleep 1000' });
    const first = await within(new Promise<string>((r) => live.stdout.once('data', (c: Buffer) => r(c.toString()))), 10_000, 'first output');
    t.is(first, 'started\n');
    t.is((await procs(sb.id, 'sleep 1000')).length, 1);
    live.kill();
    const outcome = await within(live.done, 10_000, 'outcome after kill');
    t.is(outcome.status, 'killed');
    await waitFor(async () => (await procs(sb.id, 'sleep 1000')).length === 0, 10_000, 'the sleep to be gone on the node');
    t.deepEqual(await procs(sb.id, 'sleep 1000'), []);
  } finally {
    await remote.deleteSandbox(sb.id);
  }
});

it('execStream carries stdin and megabytes of output with back-pressure, and the exit status', async (t) => {
  const sb = await remote.createSandbox(spec());
  try {
    const s = await remote.execStream(sb.id, { cmd: ['sh', '-c', 'cat; head -c 8388608 /dev/zero; echo bye >&2; exit 7'] });
    const out: Buffer[] = [];
    let err = '';
    s.stdout.on('data', (c: Buffer) => out.push(c));
    s.stderr.on('data', (c: Buffer) => (err += c.toString()));
    s.stdin.write('hello ');
    s.stdin.end('world');
    const st = await within(s.exited, 60_000, 'execStream exit');
    t.deepEqual(st, { exitCode: 7, signal: null });
    const all = Buffer.concat(out);
    t.is(all.subarray(0, 11).toString(), 'hello world');
    t.is(all.length, 11 + 8 * 1024 * 1024);
    t.is(err, 'bye\n');
  } finally {
    await remote.deleteSandbox(sb.id);
  }
});

it('a gateway that goes away kills its live execs and only detaches its sessions', async (t) => {
  const sb = await remote.createSandbox(spec());
  const g = await RemoteShim.connect({ url: server.url, token });
  try {
    const live = await g.execLive(sb.id, { cmd: 'echo up; exec sleep 2000' });
    await within(new Promise((r) => live.stdout.once('data', r)), 10_000, 'first output');
    const att = await g.openSession(sb.id, { mode: 'command' });
    att.onOutput(() => undefined);
    await att.run('one', 'echo one');
    await g.close();
    await waitFor(async () => (await procs(sb.id, 'sleep 2000')).length === 0, 10_000, 'the live exec to be killed');
    const sessions = await remote.listSessions(sb.id);
    t.true(sessions.some((s) => s.id === att.info.id && s.alive), 'the session outlives the gateway');
    // Another gateway re-attaches and gets the output from offset 0 again.
    const again = await remote.attachSession(sb.id, att.info.id, 0);
    const seen: string[] = [];
    again.onOutput((o) => seen.push(o.data.toString()));
    await waitFor(() => seen.join('').includes('one'), 10_000, 'replayed output');
    await again.close();
    t.false((await remote.listSessions(sb.id)).some((s) => s.id === att.info.id && s.alive));
  } finally {
    await g.close();
    await remote.deleteSandbox(sb.id);
  }
});

it('input reaches a session exactly once across broken connections: what was in flight is sent again, and the node applies it once', async (t) => {
  const sb = await remote.createSandbox(spec());
  try {
    const att = await remote.openSession(sb.id, { mode: 'pty', cols: 80, rows: 24 });
    const out: Buffer[] = [];
    att.onOutput((o) => out.push(o.data));
    const text = () => Buffer.concat(out).toString();
    await waitFor(() => text().includes('# '), 10_000, 'the prompt');
    const n = (i: number) => String(i * 1000 + 7);
    for (let i = 0; i < 6; i++) {
      // even: cut right after the frame went to the socket (it may or may not have arrived);
      // odd: cut first, then typed while the connection is made again
      if (i % 2 === 0) {
        att.write(`echo n-$((${i}*1000+7))\r`);
        t.true(remote.cutStreams() >= 1);
      } else {
        t.true(remote.cutStreams() >= 1);
        att.write(`echo n-$((${i}*1000+7))\r`);
      }
      await waitFor(() => text().includes(`n-${n(i)}`), 15_000, `the output of command ${i} (${JSON.stringify(text().slice(-300))})`);
    }
    att.write('echo end-$((2+2))\r');
    await waitFor(() => text().includes('end-4'), 15_000, 'the last command');
    for (let i = 0; i < 6; i++) t.is(text().split(/\r?\n/).filter((l) => l === `n-${n(i)}`).length, 1, `command ${i} ran once: ${JSON.stringify(text())}`);
    await att.close();
  } finally {
    await remote.deleteSandbox(sb.id);
  }
});

it('numbered input frames are applied once per writer and acknowledged; malformed numbering is refused', async (t) => {
  const sb = await remote.createSandbox(spec());
  const wsUrl = (method: string, args: unknown[]) => `${server.url.replace('http', 'ws')}/shim/v1/ws/${method}?args=${Buffer.from(JSON.stringify(args)).toString('base64url')}`;
  const connect = async (method: string, args: unknown[]) => {
    const ws = new WebSocket(wsUrl(method, args), { headers: { authorization: `Bearer ${token}` } });
    const frames: Record<string, unknown>[] = [];
    ws.on('message', (d: Buffer) => frames.push(JSON.parse(d.toString()) as Record<string, unknown>));
    await waitFor(() => frames.some((f) => 'info' in f), 10_000, 'the session info');
    const output = () => Buffer.concat(frames.filter((f) => 'out' in f).map((f) => Buffer.from((f.out as { d: string }).d, 'base64'))).toString();
    return { ws, frames, output };
  };
  try {
    const a = await connect('openSession', [sb.id, { mode: 'pty' }]);
    const info = a.frames.find((f) => 'info' in f)!.info as { id: string };
    a.ws.send(JSON.stringify({ op: 'writer', w: 'writer-one' }));
    const line = Buffer.from('echo x-$((40+2))\r').toString('base64');
    a.ws.send(JSON.stringify({ op: 'write', d: line, seq: 1 }));
    a.ws.send(JSON.stringify({ op: 'write', d: line, seq: 1 }));
    await waitFor(() => a.frames.some((f) => f.ack === 1), 10_000, 'the acknowledgement');
    // the same writer on a new connection: frames up to 1 were applied, 2 is new
    a.ws.terminate();
    const b = await connect('attachSession', [sb.id, info.id, 0]);
    b.ws.send(JSON.stringify({ op: 'writer', w: 'writer-one' }));
    b.ws.send(JSON.stringify({ op: 'write', d: line, seq: 1 }));
    b.ws.send(JSON.stringify({ op: 'write', d: Buffer.from('echo y-$((40+3))\r').toString('base64'), seq: 2 }));
    await waitFor(() => b.output().includes('y-43'), 10_000, 'the second command');
    t.is(b.output().split(/\r?\n/).filter((l) => l === 'x-42').length, 1, b.output());
    // another writer numbers its own input from 1
    b.ws.send(JSON.stringify({ op: 'writer', w: 'writer-two' }));
    b.ws.send(JSON.stringify({ op: 'write', d: Buffer.from('echo z-$((40+4))\r').toString('base64'), seq: 1 }));
    await waitFor(() => b.output().includes('z-44'), 10_000, 'the other writer');
    for (const bad of [{ op: 'write', d: line, seq: 0 }, { op: 'write', d: line, seq: 1.5 }, { op: 'write', d: line, seq: 'one' }, { op: 'writer', w: 'short' }, { op: 'writer', w: 'has spaces in it' }]) {
      b.ws.send(JSON.stringify({ ...bad, rid: 99 }));
      const f = await waitForValue(() => b.frames.find((x) => x.rid === 99), (x) => x !== undefined, 10_000, `the answer to ${JSON.stringify(bad)}`);
      t.is((f!.error as { code: string }).code, 'INVALID_ARGUMENT', JSON.stringify(bad));
      b.frames.splice(b.frames.indexOf(f!), 1);
    }
    t.is(b.output().split(/\r?\n/).filter((l) => l === 'x-42').length, 1, 'nothing refused was applied');
    b.ws.close(1000);
  } finally {
    await remote.deleteSandbox(sb.id);
  }
});

it('without the token nothing is answered: HTTP 401, WebSocket refused, connect fails UNAUTHENTICATED', async (t) => {
  for (const auth of [undefined, 'Bearer wrong', `Bearer ${token}x`, `Basic ${token}`]) {
    const res = await request(`${server.url}/shim/v1/call/listSandboxes`, { method: 'POST', headers: { 'content-type': 'application/json', ...(auth ? { authorization: auth } : {}) }, body: '{"args":[]}' });
    t.is(res.statusCode, 401, String(auth));
    t.is(((await res.body.json()) as { error: { code: string } }).error.code, 'UNAUTHENTICATED');
  }
  const status = await new Promise<number>((resolve) => {
    const ws = new WebSocket(`${server.url.replace('http', 'ws')}/shim/v1/ws/openSession?args=${Buffer.from('["x",{"mode":"command"}]').toString('base64url')}`, { headers: { authorization: 'Bearer nope' } });
    ws.on('unexpected-response', (_req, res) => resolve(res.statusCode ?? 0));
    ws.on('open', () => resolve(101));
    ws.on('error', () => undefined);
  });
  t.is(status, 401);
  t.is(await codeOf(RemoteShim.connect({ url: server.url, token: 'a'.repeat(48) })), 'UNAUTHENTICATED');
  await t.throwsAsync(serveShim({ shim: local, token: 'short', host: '127.0.0.1', port: 0 }), { message: /at least 16 bytes/ });
});

it('methods a node does not offer are absent on its remote shim too, and refused if called anyway', async (t) => {
  // the same node's contract without its layer report and screenshots
  const partial = Object.create(local, { layerStates: { value: undefined }, screenshot: { value: undefined } }) as Shim;
  const s2 = await serveShim({ shim: partial, token, host: '127.0.0.1', port: 0 });
  const g = await RemoteShim.connect({ url: s2.url, token });
  try {
    t.is(typeof remote.layerStates, 'function', 'the full node offers it');
    t.is(g.layerStates, undefined);
    t.is(g.screenshot, undefined);
    t.is(typeof g.sandboxStats, 'function', 'what the node offers stays');
    const res = await request(`${s2.url}/shim/v1/call/layerStates`, { method: 'POST', headers: { authorization: `Bearer ${token}` }, body: '{"args":[]}' });
    t.is(res.statusCode, 501);
    t.is(((await res.body.json()) as { error: { code: string } }).error.code, 'NOT_SUPPORTED');
  } finally {
    await g.close();
    await s2.close();
  }
});

it('malformed requests get stable codes before they reach the node', async (t) => {
  const call = async (path: string, body: string | Buffer, headers: Record<string, string> = {}) => {
    const res = await request(`${server.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', ...headers }, body });
    const json = (await res.body.json().catch(() => null)) as { error?: { code: string; message: string } } | null;
    return { status: res.statusCode, code: json?.error?.code, message: json?.error?.message ?? '' };
  };
  t.like(await call('/shim/v1/call/noSuchMethod', '{"args":[]}'), { status: 404, code: 'NOT_FOUND' });
  t.like(await call('/shim/v1/call/close', '{"args":[]}'), { status: 404, code: 'NOT_FOUND' }, 'close is not a remote call');
  t.like(await call('/shim/v1/call/openSession', '{"args":[]}'), { status: 404, code: 'NOT_FOUND' }, 'streams are WebSockets');
  t.like(await call('/shim/v1/call/getSandbox', 'not json'), { status: 400, code: 'INVALID_ARGUMENT' });
  t.like(await call('/shim/v1/call/getSandbox', '{"args":"x"}'), { status: 400, code: 'INVALID_ARGUMENT' });
  t.like(await call('/shim/v1/call/getSandbox', '{"args":[]}'), { status: 400, code: 'INVALID_ARGUMENT' });
  t.like(await call('/shim/v1/call/getSandbox', '{"args":["a","b"]}'), { status: 400, code: 'INVALID_ARGUMENT' });
  t.like(await call('/shim/v1/call/getSandbox', '{"args":[{"$b":5}]}'), { status: 400, code: 'INVALID_ARGUMENT' });
  let deep = '"x"';
  for (let i = 0; i < 200; i++) deep = `[${deep}]`;
  t.like(await call('/shim/v1/call/getSandbox', `{"args":[${deep}]}`), { status: 400, code: 'INVALID_ARGUMENT' });
  t.like(await call('/shim/v1/call/getSandbox', Buffer.alloc(17 * 1024 * 1024, 0x20)), { status: 413, code: 'PAYLOAD_TOO_LARGE' });
  t.like(await call('/shim/v1/call/writeFile', Buffer.alloc(5 * 1024 * 1024), { 'x-shim-args': Buffer.from('["x","/a",null]').toString('base64url'), 'content-type': 'application/octet-stream' }), { status: 413, code: 'PAYLOAD_TOO_LARGE' });
  t.like(await call('/shim/v1/call/writeFile', Buffer.alloc(4)), { status: 400, code: 'INVALID_ARGUMENT' }, 'raw calls need x-shim-args');
  // A prototype key in a peer's JSON is dropped, never merged into an object.
  const sb = await remote.createSandbox(spec());
  try {
    // Merged, its timeoutMs of 1 would be read through the prototype and time the command out.
    const body = `{"args":[${JSON.stringify(sb.id)},{"cmd":"sleep 0.2; echo ok","__proto__":{"timeoutMs":1}}]}`;
    const res = await request(`${server.url}/shim/v1/call/exec`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body });
    t.is(res.statusCode, 200);
    t.like(((await res.body.json()) as { result: Record<string, unknown> }).result, { stdout: 'ok\n', status: 'ok' });
  } finally {
    await remote.deleteSandbox(sb.id);
  }
});

/** A "node" that answers whatever `answer` writes: the gateway must not believe or wait forever on it. */
async function hostileNode(answer: (req: http.IncomingMessage, res: http.ServerResponse) => void): Promise<{ url: string; close(): Promise<void> }> {
  const srv = http.createServer((req, res) => {
    if (req.url === '/shim/v1/hello') {
      res.setHeader('content-type', 'application/json');
      return void res.end(JSON.stringify({ protocol: 1, nodeId: 'evil', functions: true, optional: [] }));
    }
    req.resume();
    answer(req, res);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`,
    close: () =>
      new Promise<void>((r) => {
        srv.closeAllConnections();
        srv.close(() => r());
      }),
  };
}

it('a hostile node: garbage, oversized and endless answers are UNAVAILABLE within their bounds', async (t) => {
  const cases: Array<[string, (req: http.IncomingMessage, res: http.ServerResponse) => void, (s: RemoteShim) => Promise<unknown>]> = [
    ['not JSON', (_q, res) => res.end('<html>'), (s) => s.getSandbox('x')],
    ['an error body without a code', (_q, res) => ((res.statusCode = 500), res.end('{"error":{"message":1}}')), (s) => s.getSandbox('x')],
    ['a readFile answer past its bound', (_q, res) => res.end(Buffer.alloc(64 * 1024)), (s) => s.readFile('x', '/a', 1024)],
    ['a JSON answer that never ends', (_q, res) => {
      res.write('{"result":"');
      const t0 = setInterval(() => res.write('x'.repeat(1 << 20)), 1);
      res.on('close', () => clearInterval(t0));
    }, (s) => s.getSandbox('x')],
    ['a frame header past the bound', (_q, res) => {
      res.writeHead(200);
      res.end(Buffer.from([1, 0xff, 0xff, 0xff, 0xff]));
    }, (s) => s.execCaptured('x', { cmd: 'true' })],
    ['more output than the exec may have', (_q, res) => {
      res.writeHead(200);
      const t0 = setInterval(() => res.write(frame(FRAME.stdout, Buffer.alloc(64 * 1024))), 1);
      res.on('close', () => clearInterval(t0));
    }, (s) => s.execCaptured('x', { cmd: 'true', maxOutputBytes: 1000 })],
    ['a frame of an unknown type', (_q, res) => {
      res.writeHead(200);
      res.end(frame(9, 'x'));
    }, async (s) => (await s.execLive('x', { cmd: 'true' })).done],
    ['a live exec that stops without its outcome', (_q, res) => {
      res.writeHead(200);
      res.end(frame(FRAME.stdout, 'hi'));
    }, async (s) => (await s.execLive('x', { cmd: 'true' })).done],
    ['a frame that is not an object', (_q, res) => {
      res.writeHead(200, { 'content-type': 'application/x-ndjson' });
      res.end('[1,2]\n');
    }, (s) => s.importImage({ name: 'x', source: { type: 'debootstrap' } })],
  ];
  for (const [what, answer, call] of cases) {
    const node = await hostileNode(answer);
    const s = await RemoteShim.connect({ url: node.url, token });
    try {
      const code = await within(codeOf(call(s)), 30_000, what);
      t.is(code, 'UNAVAILABLE', what);
    } finally {
      await s.close();
      await node.close();
    }
  }
  // A node that is not there at all.
  const gone = await hostileNode(() => undefined);
  const url = gone.url;
  await gone.close();
  t.is(await codeOf(RemoteShim.connect({ url, token })), 'UNAVAILABLE');
});

it('after closing, the server holds no connection and the node no stream', async (t) => {
  const s2 = await serveShim({ shim: local, token, host: '127.0.0.1', port: 0 });
  const g = await RemoteShim.connect({ url: s2.url, token });
  const sb = await g.createSandbox(spec());
  const live = await g.execLive(sb.id, { cmd: 'exec sleep 3000' });
  const att = await g.openSession(sb.id, { mode: 'command' });
  t.truthy(att.info.id);
  await s2.close();
  // Every stream of the closed server ended: the exec was killed, the session detached (still alive).
  const outcome = await within(live.done.then((o) => o.status, (e: WarrenError) => e.code), 10_000, 'the live exec after the server closed');
  t.is(outcome, 'UNAVAILABLE', 'the gateway is told its node went away');
  await waitFor(async () => (await procs(sb.id, 'sleep 3000')).length === 0, 10_000, 'the sleep to be killed');
  t.true((await local.listSessions(sb.id)).some((s) => s.id === att.info.id && s.alive));
  await g.close();
  t.true((await local.listSandboxes()).some((x) => x.id === sb.id));
  await local.deleteSandbox(sb.id);
});
