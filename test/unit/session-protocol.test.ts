import { spawnSync } from 'node:child_process';
import test from 'ava';
import { WarrenError } from '../../src/errors';
import {
  FrameDecoder,
  FrameType,
  MAX_INPUT_FRAME,
  commandWrapper,
  encodeAttach,
  encodeHolderFrame,
  encodeInput,
  encodeResize,
  encodeSignal,
  parseHolderFrame,
  parseStatusLine,
  shellQuote,
  validateCommandId,
  type HolderInfo,
  type RawFrame,
} from '../../src/shim/sessions/holder-protocol';
import { newSessionId, sessionSocketPath } from '../../src/shim/sessions/session-manager';

const info: HolderInfo = {
  mode: 'command', pid: 10, childPid: 11, createdAt: '2025-01-01T00:00:00.000Z', outputOffset: 5, oldestOffset: 0,
  bufferBytes: 4096, alive: true, exitCode: null, exitSignal: null, clients: 1, info: { sessionId: 's-a' },
};

function sampleStream(): Buffer {
  return Buffer.concat([
    encodeHolderFrame.lost(123456789012),
    encodeHolderFrame.output('stdout', 2 ** 40, Buffer.from('hello')),
    encodeHolderFrame.output('stderr', 7, Buffer.alloc(70000, 0x61)),
    encodeHolderFrame.output('status', 8, Buffer.from('c1 0\n')),
    encodeHolderFrame.output('pty', 9, Buffer.alloc(0)),
    encodeHolderFrame.exit(3, 0),
    encodeHolderFrame.exit(-1, 9),
    encodeHolderFrame.info(info),
    encodeHolderFrame.closed(),
  ]);
}

test('holder frames round-trip through the decoder', (t) => {
  const frames = new FrameDecoder().push(sampleStream()).map(parseHolderFrame);
  t.is(frames.length, 9);
  t.deepEqual(frames[0], { type: 'lost', bytes: 123456789012 });
  const out = frames[1]!;
  t.true(out.type === 'output' && out.stream === 'stdout' && out.offset === 2 ** 40 && out.data.toString() === 'hello');
  const big = frames[2]!;
  t.true(big.type === 'output' && big.stream === 'stderr' && big.data.length === 70000);
  t.like(frames[3], { type: 'output', stream: 'status', offset: 8 });
  t.like(frames[4], { type: 'output', stream: 'pty', offset: 9 });
  t.deepEqual(frames[5], { type: 'exit', exitCode: 3, signal: null });
  t.deepEqual(frames[6], { type: 'exit', exitCode: null, signal: 9 });
  t.deepEqual(frames[7], { type: 'info', info });
  t.deepEqual(frames[8], { type: 'closed' });
});

test('the decoder handles frames split at every byte and in random chunks', (t) => {
  const whole = sampleStream();
  const expected = new FrameDecoder().push(whole).map((f) => [f.type, f.payload.toString('hex')]);
  // every split point of a small stream
  const small = Buffer.concat([encodeHolderFrame.output('stdout', 1, Buffer.from('ab')), encodeHolderFrame.exit(0, 0), encodeHolderFrame.closed()]);
  const smallExpected = new FrameDecoder().push(small).map((f) => [f.type, f.payload.toString('hex')]);
  for (let i = 0; i <= small.length; i++) {
    for (let j = i; j <= small.length; j++) {
      const d = new FrameDecoder();
      const got: RawFrame[] = [];
      d.push(small.subarray(0, i), got);
      d.push(small.subarray(i, j), got);
      d.push(small.subarray(j), got);
      t.deepEqual(got.map((f) => [f.type, f.payload.toString('hex')]), smallExpected, `split at ${i},${j}`);
      t.is(d.buffered, 0);
    }
  }
  // random chunking of the big stream
  let seed = 42;
  const rnd = (n: number): number => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % n);
  for (let round = 0; round < 20; round++) {
    const d = new FrameDecoder();
    const got: RawFrame[] = [];
    for (let off = 0; off < whole.length; ) {
      const n = 1 + rnd(round % 2 ? 9 : 20000);
      d.push(whole.subarray(off, off + n), got);
      off += n;
    }
    t.deepEqual(got.map((f) => [f.type, f.payload.toString('hex')]), expected);
  }
});

test('the decoder refuses oversized frames and malformed payloads', (t) => {
  const hdr = Buffer.from([FrameType.OUTPUT, 0, 0, 0, 0x10]); // 256 MiB
  t.throws(() => new FrameDecoder().push(hdr), { instanceOf: WarrenError, message: /frame/ });
  const short: RawFrame = { type: FrameType.EXIT, payload: Buffer.alloc(3) };
  t.throws(() => parseHolderFrame(short), { instanceOf: WarrenError });
  t.throws(() => parseHolderFrame({ type: 0x99, payload: Buffer.alloc(0) }), { instanceOf: WarrenError });
  t.throws(() => parseHolderFrame({ type: FrameType.OUTPUT, payload: Buffer.from([9, 0, 0, 0, 0, 0, 0, 0, 0]) }), { instanceOf: WarrenError });
  t.throws(() => parseHolderFrame({ type: FrameType.INFO_REPLY, payload: Buffer.from('{not json') }), { instanceOf: WarrenError });
});

test('client frames have the documented layout', (t) => {
  t.deepEqual([...encodeAttach(0x0102030405)], [0x01, 8, 0, 0, 0, 0x05, 0x04, 0x03, 0x02, 0x01, 0, 0, 0]);
  t.deepEqual([...encodeResize(132, 43)], [0x03, 4, 0, 0, 0, 132, 0, 43, 0]);
  t.deepEqual([...encodeSignal(9, 1)], [0x04, 2, 0, 0, 0, 9, 1]);
  t.deepEqual([...encodeInput('hi')], [0x02, 2, 0, 0, 0, 0x68, 0x69]);
  t.throws(() => encodeResize(0, 10), { instanceOf: WarrenError, message: /cols/ });
  t.throws(() => encodeSignal(65, 0), { instanceOf: WarrenError });
  t.throws(() => encodeSignal(2, 4), { instanceOf: WarrenError });
  t.throws(() => encodeAttach(-1), { instanceOf: WarrenError });
});

test('long input is split into INPUT frames of at most 64 KiB', (t) => {
  const data = Buffer.alloc(MAX_INPUT_FRAME * 2 + 10, 7);
  const frames = new FrameDecoder(MAX_INPUT_FRAME).push(encodeInput(data));
  t.deepEqual(frames.map((f) => [f.type, f.payload.length]), [[2, MAX_INPUT_FRAME], [2, MAX_INPUT_FRAME], [2, 10]]);
  t.deepEqual(Buffer.concat(frames.map((f) => f.payload)), data);
});

test('command ids, quoting and the command wrapper', (t) => {
  validateCommandId('a-B_9');
  validateCommandId('x'.repeat(64));
  for (const bad of ['', 'x'.repeat(65), 'a b', 'a;b', "a'", 'é', 5]) {
    t.throws(() => validateCommandId(bad), { instanceOf: WarrenError, message: /command id/ }, String(bad));
  }
  t.is(shellQuote("it's"), "'it'\\''s'");
  t.is(shellQuote(''), "''");
  const w = commandWrapper('c1', "echo 'a'\necho $HOME");
  t.is(
    w,
    `command trap 'command break 999999 2>/dev/null' WINCH; __warren_cmd=c1; for _ in 1; do command eval 'echo '\\''a'\\''\necho $HOME'; done </dev/null 3>&-; ` +
      `__warren_rc=$?; command printf 'c1 %d\\n' "$__warren_rc" >&3\n`,
  );
  const err = t.throws(() => commandWrapper('c1', 'echo \0x'), { instanceOf: WarrenError });
  t.is(err?.code, 'INVALID_ARGUMENT');
  t.throws(() => commandWrapper('bad id', 'true'), { instanceOf: WarrenError });
});

// The shells a session may run: Debian's default image (bash), dash, and busybox images (ash).
const SHELLS = [['bash'], ['dash'], ['busybox', 'sh']].filter(([cmd]) => spawnSync('sh', ['-c', `command -v ${cmd}`]).status === 0);

test('a resumed command runs only if the shell did not start it, and repeats its status otherwise', (t) => {
  t.true(SHELLS.length > 0, 'no shell to try the wrapper in');
  const lines =
    commandWrapper('c1', 'echo ran-c1; false') +
    commandWrapper('c1', 'echo ran-c1-again', true) +
    commandWrapper('c2', 'echo ran-c2; f() { return 3; }; f', true) +
    commandWrapper('c2', 'echo ran-c2-again', true) +
    commandWrapper('c1', 'echo ran-c1-third', true);
  for (const sh of SHELLS) {
    // fd 3 is the status pipe, as in a session
    const r = spawnSync(sh[0]!, sh.slice(1), { input: lines, stdio: ['pipe', 'pipe', 'pipe', 'pipe'], encoding: 'utf8' });
    t.is(r.stdout, 'ran-c1\nran-c2\nran-c1-third\n', `${sh.join(' ')}: what ran`);
    t.is((r.output[3] as string | null) ?? '', 'c1 1\nc1 1\nc2 3\nc2 3\nc1 0\n', `${sh.join(' ')}: the status lines`);
  }
});

test('status lines', (t) => {
  t.deepEqual(parseStatusLine('c1 0'), { commandId: 'c1', exitCode: 0 });
  t.deepEqual(parseStatusLine('a-b_C 255'), { commandId: 'a-b_C', exitCode: 255 });
  t.is(parseStatusLine('c1'), null);
  t.is(parseStatusLine('c1 x'), null);
  t.is(parseStatusLine('c 1 2'), null);
});

test('session ids and socket paths', (t) => {
  const ids = new Set<string>();
  for (let i = 0; i < 200; i++) {
    const id = newSessionId();
    t.regex(id, /^s-[a-z2-7]{16}$/);
    ids.add(id);
  }
  t.is(ids.size, 200);
  t.is(sessionSocketPath('/run/x', 's-abc'), '/run/x/s-abc.sock');
  t.throws(() => sessionSocketPath('/run/x', '../etc'), { instanceOf: WarrenError, message: /session id/ });
});
