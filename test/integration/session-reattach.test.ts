import test from 'ava';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { HolderClient } from '../../src/shim/sessions/holder-client';
import { FrameDecoder, commandWrapper, encodeAttach, encodeMark, encodeInput, parseHolderFrame } from '../../src/shim/sessions/holder-protocol';
import { attachSession, newSessionId, sessionInfo } from '../../src/shim/sessions/session-manager';
import type { CommandResult } from '../../src/shim/types';
import { collect, destroyHolder, openSession, pidAlive, rssKb, socketDir, waitFor } from './session-fixture';
import { elapse } from '../helpers/wait';

const managerJs = resolve(__dirname, '../../src/shim/sessions/session-manager.js');

test('a gateway killed with -9 re-attaches and gets the missed output exactly once, in order', async (t) => {
  const id = newSessionId();
  const socketPath = join(socketDir(), `${id}.sock`);
  // The "gateway": a separate node process that starts the session and runs commands.
  const script = `
    const sm = require(${JSON.stringify(managerJs)});
    const say = (o) => process.stdout.write(JSON.stringify(o) + '\\n');
    (async () => {
      const h = await sm.spawnHolder({ socketPath: ${JSON.stringify(socketPath)}, mode: 'command',
        argv: ['/bin/bash', '--noprofile', '--norc'], bufferBytes: 1 << 20 });
      const s = await sm.attachSession(${JSON.stringify(socketPath)}, 0);
      s.onOutput(() => {});
      await s.run('one', 'echo one');
      say({ pid: h.pid, childPid: h.childPid, seen: s.nextOffset });
      await s.run('two', 'for i in $(seq 1 200); do echo line$i; done');
      s.run('three', 'sleep 0.3; echo after-kill; echo err-after >&2').catch(() => {});
      setTimeout(() => say({ go: true }), 50);
      setInterval(() => {}, 1000);
    })().catch((e) => { console.error(e); process.exit(1); });`;
  const gw = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: gw.stdout! });
  let first: { pid: number; childPid: number; seen: number } | undefined;
  await new Promise<void>((res, rej) => {
    lines.on('line', (l) => {
      const m = JSON.parse(l);
      if (m.pid) first = m;
      if (m.go) res();
    });
    gw.on('exit', (c) => rej(new Error(`gateway process exited early (${c})`)));
  });
  t.teardown(() => destroyHolder(t, { id, socketPath, pid: first!.pid }));
  gw.kill('SIGKILL');
  await new Promise((r) => gw.once('exit', r));

  t.true(pidAlive(first!.pid), 'the holder survived its starter');
  // Command "three" finishes while nobody is attached.
  await waitFor(async () => (await sessionInfo(socketPath)).outputOffset > first!.seen + 1000, 5000, 'output while detached');
  await elapse(400, 'command three (sleep 0.3) ends while nobody is attached');

  const s = await attachSession(socketPath, first!.seen);
  const out = collect(s);
  const done: CommandResult[] = [];
  s.onCommandDone((r) => done.push(r));
  await waitFor(() => done.some((d) => d.commandId === 'three'), 5000, 'command three status');
  const expected = Array.from({ length: 200 }, (_, i) => `line${i + 1}\n`).join('') + 'after-kill\n';
  t.is(out.text('stdout'), expected);
  t.is(out.text('stderr'), 'err-after\n');
  t.deepEqual(done.map((d) => [d.commandId, d.exitCode]), [['two', 0], ['three', 0]]);
  t.is(s.lostBytes, 0);
  // chunks are in order and do not overlap; the first one starts where the old gateway stopped
  t.is(out.chunks[0]!.offset, first!.seen);
  for (let i = 1; i < out.chunks.length; i++) t.true(out.chunks[i]!.offset >= out.chunks[i - 1]!.offset + out.chunks[i - 1]!.data.length);
  // and the session is still usable from the new gateway
  t.is((await s.run('four', 'echo four')).exitCode, 0);
  t.true(out.text('stdout').endsWith('after-kill\nfour\n'));
  await s.close();
});

test('attaching in the middle of a record replays from that exact byte', async (t) => {
  const { session, socketPath } = await openSession(t);
  const out = collect(session);
  await session.run('a', 'printf abcdefghij');
  const start = out.chunks[0]!.offset;
  const s2 = await attachSession(socketPath, start + 4);
  const out2 = collect(s2);
  const done = new Promise<CommandResult>((r) => s2.onCommandDone(r));
  t.is((await done).commandId, 'a');
  t.is(out2.text('stdout'), 'efghij');
  t.is(out2.chunks[0]!.offset, start + 4);
  s2.detach();
});

test('the buffer is bounded: a flood is dropped from the holder, reported as LOST, and RSS stays small', async (t) => {
  const bufferBytes = 1 << 20;
  const { session, pid, socketPath } = await openSession(t, { bufferBytes });
  session.detach(); // nobody reads while the flood runs
  const c = await HolderClient.connect(socketPath);
  const total = 50_000_000;
  const t0 = Date.now();
  c.sendFrames(encodeMark(), encodeInput(commandWrapper('flood', `yes | head -c ${total}`)));
  const statusBytes = 'flood 0\n'.length;
  await waitFor(async () => (await c.info()).outputOffset >= total + statusBytes, 60_000, 'flood to finish');
  const secs = (Date.now() - t0) / 1000;
  t.log(`50 MB through the holder with no reader: ${secs.toFixed(2)} s (${(total / 1e6 / secs).toFixed(0)} MB/s)`);
  const info = await c.info();
  c.destroy();
  t.true(info.oldestOffset > total - bufferBytes);
  const rss = rssKb(pid);
  t.log(`holder VmRSS after 50 MB: ${rss} KiB (buffer ${bufferBytes / 1024} KiB)`);
  t.true(rss < 8 * 1024, `holder RSS ${rss} KiB`);

  const s = await attachSession(socketPath, 0);
  const lost: number[] = [];
  s.onLost((n) => lost.push(n));
  const out = collect(s);
  const done = new Promise<CommandResult>((r) => s.onCommandDone(r));
  t.deepEqual(await done, { commandId: 'flood', exitCode: 0, timedOut: false });
  t.deepEqual(lost, [info.oldestOffset]);
  t.is(out.chunks[0]!.offset, info.oldestOffset);
  t.is(out.bytes('stdout') + info.oldestOffset, total);
  const text = out.text('stdout');
  t.regex(text.startsWith('\n') ? text.slice(1) : text, /^(y\n)+$/);
  t.is(s.nextOffset, total + statusBytes);
  s.detach();
});

test('a client that does not read never blocks the holder or other clients', async (t) => {
  const { session, socketPath } = await openSession(t, { bufferBytes: 1 << 20 });
  const out = collect(session);
  // The slow client attaches at the current end and then stops reading.
  const slow = net.createConnection({ path: socketPath });
  await new Promise((r) => slow.once('connect', r));
  slow.write(encodeAttach(session.nextOffset));
  await waitFor(async () => (await sessionInfo(socketPath)).clients >= 3, 5000, 'the slow client to be attached');
  slow.pause();

  const total = 20_000_000;
  const t0 = Date.now();
  const r = await session.run('big', `head -c ${total} /dev/zero | tr '\\0' x`, 60_000);
  t.is(r.exitCode, 0);
  t.log(`20 MB to the fast client with a stalled one attached: ${Date.now() - t0} ms`);
  t.is(out.bytes('stdout'), total);
  t.is(session.lostBytes, 0);
  t.is((await session.run('after', 'echo after')).exitCode, 0);

  // The slow client, once it reads, learns what it lost and continues with well-formed frames.
  const dec = new FrameDecoder();
  let lost = 0;
  let sawAfter = false;
  slow.on('data', (chunk: Buffer) => {
    for (const f of dec.push(chunk).map(parseHolderFrame)) {
      if (f.type === 'lost') lost += f.bytes;
      if (f.type === 'output' && f.data.toString().includes('after')) sawAfter = true;
    }
  });
  slow.resume();
  await waitFor(() => sawAfter, 10_000, 'the slow client to catch up');
  t.true(lost > 0, 'the slow client was told it lost bytes');
  slow.destroy();
});

test('a replayed status line never settles a new command that reuses its id', async (t) => {
  const { session, socketPath } = await openSession(t);
  t.is((await session.run('dup', 'echo first')).exitCode, 0);
  session.detach();
  const s2 = await attachSession(socketPath, 0);
  const out = collect(s2);
  const done: CommandResult[] = [];
  s2.onCommandDone((r) => done.push(r));
  const r = await s2.run('dup', 'sleep 0.3; echo second; (exit 5)');
  t.is(r.exitCode, 5);
  t.is(out.text('stdout'), 'first\nsecond\n');
  t.deepEqual(done.map((d) => d.exitCode), [0, 5]);
  s2.detach();
});

test('a paused attachment whose command status fell out of the ring still gets the exit code (holder INFO keeps recent status lines)', async (t) => {
  const { session, socketPath } = await openSession(t, { bufferBytes: 64 * 1024 });
  const out = collect(session);
  const lost: Array<[number, number]> = [];
  session.onLost((bytes, next) => lost.push([bytes, next]));
  // Back-pressure: this attachment takes nothing while its command runs; the
  // command's status line is followed by more output than the ring holds.
  session.pauseOutput();
  const run = session.run('paused', `head -c 300000 /dev/zero | tr '\\0' x; (sleep 0.3; head -c 300000 /dev/zero | tr '\\0' y) & (exit 7)`);
  const watcher = await HolderClient.connect(socketPath);
  t.teardown(() => watcher.destroy());
  await waitFor(async () => (await watcher.info()).outputOffset > 600_000, 20_000, 'the background writer to finish');
  const info = await watcher.info();
  t.true(info.oldestOffset > 300_000, `the ring dropped the status line (oldest ${info.oldestOffset})`);
  t.true((info.recentStatus ?? []).some((l) => l.startsWith('paused 7 ')), JSON.stringify(info.recentStatus));
  session.resumeOutput();
  const r = await run;
  t.deepEqual(r, { commandId: 'paused', exitCode: 7, timedOut: false });
  t.true(lost.length > 0 && lost[0]![0] > 0, `LOST reported: ${JSON.stringify(lost)}`);
  await waitFor(() => out.text('stdout').endsWith('y'), 10_000, 'the tail of the output');
  // The session goes on normally afterwards.
  t.is((await session.run('next', 'echo next')).exitCode, 0);
});

test('recent status lines only answer for commands that ended after the given offset (ids repeat across attachments)', async (t) => {
  const { session } = await openSession(t);
  t.is((await session.run('same', '(exit 3)')).exitCode, 3);
  const first = await session.recentStatus('same', 0);
  t.is(first?.exitCode, 3);
  t.is(await session.recentStatus('same', first!.endOffset), null, 'a line that ended at or before the offset does not count');
  t.is(await session.recentStatus('other', 0), null);
  t.is((await session.run('same', '(exit 4)')).exitCode, 4);
  t.is((await session.recentStatus('same', first!.endOffset))?.exitCode, 4);
});
