/**
 * The host side of the guest-agent channel against a hostile agent: a fake
 * agent (a unix socket server, as QEMU's chardev would be) that answers with
 * oversized, malformed, endless or no frames. The shim must neither allocate
 * without bound, nor wait forever, nor mistake a reply for another request's.
 */
import test from 'ava';
import net from 'node:net';
import { join } from 'node:path';
import { WarrenError } from '../../src/errors';
import { AgentClient } from '../../src/shim/backends/microvm/agent-client';
import { AGENT_HEADER, AgentDecoder, AgentType, MAX_AGENT_PAYLOAD, encodeFrame, encodeRead } from '../../src/shim/backends/microvm/agent-protocol';
import { tempDir } from '../helpers/tmp';

type Behaviour = (sock: net.Socket, frame: { type: number; chan: number; payload: Buffer }) => void;

async function fakeAgent(behaviour: Behaviour): Promise<{ path: string; close(): Promise<void>; sockets: net.Socket[] }> {
  const path = join(tempDir('warren-agent-'), 'agent.sock');
  const sockets: net.Socket[] = [];
  const server = net.createServer((sock) => {
    sockets.push(sock);
    const dec = new AgentDecoder();
    sock.on('error', () => undefined);
    sock.on('data', (d) => {
      for (const f of dec.push(d)) {
        if (f.type === AgentType.PING) sock.write(encodeFrame(AgentType.HELLO, f.chan, Buffer.from('6.1.0-fake')));
        else behaviour(sock, f);
      }
    });
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    path,
    sockets,
    close: () => new Promise<void>((r) => {
      for (const s of sockets) s.destroy();
      server.close(() => r());
    }),
  };
}

function rawHeader(type: number, chan: number, len: number): Buffer {
  const b = Buffer.alloc(AGENT_HEADER);
  b[0] = type;
  b.writeUInt32LE(chan, 1);
  b.writeUInt32LE(len, 5);
  return b;
}

test('the decoder refuses frames over the limit and never holds more than one frame', (t) => {
  const dec = new AgentDecoder();
  t.throws(() => dec.push(rawHeader(AgentType.OUT, 1, MAX_AGENT_PAYLOAD + 1)), { instanceOf: WarrenError });
  const ok = new AgentDecoder();
  const frames = ok.push(Buffer.concat([encodeFrame(AgentType.OK, 3, Buffer.from('a')), rawHeader(AgentType.OUT, 4, 100), Buffer.alloc(50)]));
  t.is(frames.length, 1);
  t.is(ok.buffered, AGENT_HEADER + 50);
});

test('a hostile agent: oversized frame drops the connection; endless data is cut at what was asked; silence times out; foreign channels are ignored', async (t) => {
  let mode = 'silent';
  const agent = await fakeAgent((sock, f) => {
    if (f.type !== AgentType.READ) return;
    if (mode === 'endless') {
      // far more than the 1000 bytes asked for, in many frames, plus a reply on a channel nobody opened
      sock.write(encodeFrame(AgentType.OK, f.chan + 1000));
      const chunk = encodeFrame(AgentType.OUT, f.chan, Buffer.concat([Buffer.from([1]), Buffer.alloc(60_000, 0x41)]));
      for (let i = 0; i < 40; i++) sock.write(chunk);
    } else if (mode === 'oversized') {
      sock.write(rawHeader(AgentType.OUT, f.chan, 0xffffffff));
    } else if (mode === 'garbage-err') {
      sock.write(encodeFrame(AgentType.ERR, f.chan, Buffer.from([2, 0, 0, 0, 0xff, 0xfe, 0x00, 0x1b])));
    }
  });
  try {
    const client = await AgentClient.connect(agent.path, 5000);
    t.is(client.release, '6.1.0-fake');

    mode = 'silent';
    const started = Date.now();
    const silent = (await t.throwsAsync(client.request((c) => encodeRead(c, '/etc/passwd', 1000), 'read', { timeoutMs: 300, maxData: 1000 }))) as WarrenError;
    t.is(silent.code, 'TIMEOUT');
    t.true(Date.now() - started < 3000);

    mode = 'endless';
    const endless = (await t.throwsAsync(client.request((c) => encodeRead(c, '/x', 1000), 'read', { timeoutMs: 5000, maxData: 1000 }))) as WarrenError;
    t.is(endless.code, 'PAYLOAD_TOO_LARGE');

    mode = 'garbage-err';
    const err = (await t.throwsAsync(client.request((c) => encodeRead(c, '/x', 10), 'read', { timeoutMs: 5000, maxData: 10 }))) as WarrenError;
    t.is(err.code, 'FILE_NOT_FOUND');
    t.false(/[\x00-\x1f\x7f-\xff]/.test(err.message), 'bytes from the guest are not echoed raw');

    mode = 'oversized';
    const broken = (await t.throwsAsync(client.request((c) => encodeRead(c, '/x', 10), 'read', { timeoutMs: 5000, maxData: 10 }))) as WarrenError;
    t.true(broken instanceof WarrenError);
    t.true(client.isClosed, 'a protocol violation ends the connection');
  } finally {
    await agent.close();
  }
});

test('an agent that never says HELLO fails the connect within its deadline', async (t) => {
  const path = join(tempDir('warren-agent-'), 'agent.sock');
  const server = net.createServer((s) => s.on('error', () => undefined));
  await new Promise<void>((r) => server.listen(path, r));
  try {
    const started = Date.now();
    const err = (await t.throwsAsync(AgentClient.connect(path, 500))) as WarrenError;
    t.is(err.code, 'TIMEOUT');
    t.true(Date.now() - started < 3000);
  } finally {
    server.close();
  }
});
