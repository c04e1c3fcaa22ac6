/** The holder's socket protocol, spoken raw. */
import test from 'ava';
import net from 'node:net';
import { FrameDecoder, encodeAttach, encodeInfo, parseHolderFrame, type HolderFrame } from '../../src/shim/sessions/holder-protocol';
import { collect, openSession, pidAlive, waitFor } from './session-fixture';
import { sessionInfo } from '../../src/shim/sessions/session-manager';

async function rawConnect(path: string): Promise<{ sock: net.Socket; frames: HolderFrame[]; closed: Promise<void> }> {
  const sock = net.createConnection({ path });
  await new Promise((r) => sock.once('connect', r));
  const frames: HolderFrame[] = [];
  const dec = new FrameDecoder();
  sock.on('data', (c: Buffer) => frames.push(...dec.push(c).map(parseHolderFrame)));
  const closed = new Promise<void>((r) => sock.once('close', () => r()));
  sock.on('error', () => undefined);
  return { sock, frames, closed };
}

test('malformed frames close only the offending connection', async (t) => {
  const { session, pid, socketPath } = await openSession(t);
  const out = collect(session);
  const bad: Buffer[] = [
    Buffer.from([0x7f, 0, 0, 0, 0]), // unknown type
    Buffer.from([0x02, 0, 0, 2, 0]), // INPUT larger than 64 KiB
    Buffer.from([0x01, 4, 0, 0, 0, 1, 2, 3, 4]), // ATTACH with a short payload
    Buffer.concat([encodeAttach(0), encodeAttach(0)]), // ATTACH twice
    Buffer.from([0x04, 3, 0, 0, 0, 9, 1, 0]), // SIGNAL with a long payload
  ];
  for (const b of bad) {
    const c = await rawConnect(socketPath);
    c.sock.write(b);
    await c.closed;
  }
  t.true(pidAlive(pid));
  t.is((await session.run('ok', 'echo still-fine')).exitCode, 0);
  t.is(out.text('stdout'), 'still-fine\n');
});

test('INFO works without ATTACH and several clients see the same live output', async (t) => {
  const { session, socketPath, pid, childPid } = await openSession(t);
  const a = await rawConnect(socketPath);
  a.sock.write(encodeInfo());
  await waitFor(() => a.frames.length > 0, 3000, 'INFO reply');
  const info = a.frames[0]!;
  t.true(info.type === 'info' && info.info.pid === pid && info.info.childPid === childPid && info.info.clients === 2);
  t.true(info.type === 'info' && info.info.mode === 'command' && info.info.alive && info.info.bufferBytes === 1 << 20);

  const b = await rawConnect(socketPath);
  b.sock.write(encodeAttach(session.nextOffset));
  await waitFor(async () => (await sessionInfo(socketPath)).clients >= 4, 5000, 'the second raw client to be attached');
  t.is((await session.run('x', 'echo shared')).exitCode, 0);
  const text = (fs: HolderFrame[]): string => fs.filter((f) => f.type === 'output' && f.stream === 'stdout').map((f) => (f.type === 'output' ? f.data.toString() : '')).join('');
  const hasStatus = (): boolean => b.frames.some((f) => f.type === 'output' && f.stream === 'status' && f.data.toString() === 'x 0\n');
  await waitFor(() => text(b.frames) === 'shared\n' && hasStatus(), 3000, 'second client output and status');
  t.is(text(a.frames), '', 'a client that did not attach gets no output');
  a.sock.destroy();
  b.sock.destroy();
});
