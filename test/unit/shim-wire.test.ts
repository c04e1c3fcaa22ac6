import test from 'ava';
import { WarrenError } from '../../src/errors';
import { FRAME, FrameReader, MAX_FRAME_BYTES, METHODS, OPTIONAL_METHODS, checkArgs, decode, encode, errorFrom, errorJson, frame } from '../../src/shim/remote/wire';

test('values round-trip through JSON: buffers, sets, nesting; undefined fields are left out', (t) => {
  const v = { a: Buffer.from([0, 1, 255]), s: new Set(['x', 'y']), list: [Buffer.from('hi'), { deep: new Uint8Array([7]) }], skip: undefined, n: null };
  const back = decode(JSON.parse(JSON.stringify(encode(v)))) as Record<string, unknown>;
  t.true(Buffer.isBuffer(back.a) && (back.a as Buffer).equals(Buffer.from([0, 1, 255])));
  t.deepEqual([...(back.s as Set<string>)], ['x', 'y']);
  t.is(((back.list as unknown[])[0] as Buffer).toString(), 'hi');
  t.deepEqual([...((back.list as Array<{ deep: Buffer }>)[1]!.deep)], [7]);
  t.false('skip' in back);
  t.is(back.n, null);
});

test('decode keeps prototype-named keys as plain data, never as a prototype, and refuses bad tags and deep nesting', (t) => {
  const o = decode(JSON.parse('{"__proto__":{"polluted":1},"constructor":2,"ok":3}')) as Record<string, unknown>;
  t.deepEqual(Object.keys(o), ['__proto__', 'constructor', 'ok']);
  t.is(Object.getPrototypeOf(o), Object.prototype);
  t.deepEqual(Object.getOwnPropertyDescriptor(o, '__proto__')?.value, { polluted: 1 });
  t.is(Object.getOwnPropertyDescriptor(o, 'constructor')?.value, 2);
  t.is((o as { polluted?: unknown }).polluted, undefined);
  // and they survive the round trip both ways
  const files = JSON.parse('{"__proto__":"cA==","constructor":"Yw=="}') as Record<string, string>;
  const back = decode(JSON.parse(JSON.stringify(encode({ files })))) as { files: Record<string, string> };
  t.deepEqual(Object.entries(back.files), [['__proto__', 'cA=='], ['constructor', 'Yw==']]);
  t.is(({} as Record<string, unknown>).polluted, undefined);
  t.throws(() => decode({ $b: 5 }), { instanceOf: WarrenError, message: /\$b/ });
  t.throws(() => decode({ $set: 'x' }), { instanceOf: WarrenError, message: /\$set/ });
  let deep: unknown = 'x';
  for (let i = 0; i < 100; i++) deep = [deep];
  t.throws(() => decode(deep), { instanceOf: WarrenError, message: /nested too deeply/ });
  // an object with $b and other keys is an ordinary object
  t.deepEqual(decode({ $b: 'x', other: 1 }), { $b: 'x', other: 1 });
});

test('checkArgs holds every method to its arity', (t) => {
  for (const [name, m] of Object.entries(METHODS)) {
    const min = m.args - (m.optional ?? 0);
    t.is(checkArgs(name, new Array(m.args).fill(null)).length, m.args, name);
    if (min > 0) t.throws(() => checkArgs(name, new Array(min - 1).fill(null)), { instanceOf: WarrenError }, name);
    t.throws(() => checkArgs(name, new Array(m.args + 1).fill(null)), { instanceOf: WarrenError }, name);
  }
  t.throws(() => checkArgs('nope', []), { instanceOf: WarrenError, message: /no method/ });
  for (const name of ['constructor', 'toString', '__proto__']) t.throws(() => checkArgs(name, []), { instanceOf: WarrenError, message: /no method/ }, name);
  t.throws(() => checkArgs('getSandbox', 'x'), { instanceOf: WarrenError, message: /must be an array/ });
});

test('raw-in methods name the argument their body fills, among their required ones; optional methods are methods', (t) => {
  const raw = Object.entries(METHODS).filter(([, m]) => m.kind === 'raw-in');
  t.deepEqual(raw.map(([n]) => n).sort(), ['uploadTar', 'writeFile']);
  for (const [name, m] of raw) t.true(Number.isInteger(m.raw) && m.raw! >= 0 && m.raw! < m.args - (m.optional ?? 0), name);
  for (const [name, m] of Object.entries(METHODS)) if (m.kind !== 'raw-in') t.is(m.raw, undefined, name);
  for (const name of OPTIONAL_METHODS) t.not(METHODS[name], undefined, name);
});

test('errors keep their stable code and details across; anything else is UNAVAILABLE', (t) => {
  const e = errorFrom({ error: errorJson(new WarrenError('SANDBOX_NOT_FOUND', 'gone', { id: 'x' })) }, 'fallback');
  t.like(e, { code: 'SANDBOX_NOT_FOUND', message: 'gone', status: 404, details: { id: 'x' } });
  t.is(errorFrom({ error: errorJson(new Error('plain')) }, 'f').code, 'INTERNAL');
  for (const junk of [null, 'x', {}, { error: 'x' }, { error: { code: 1, message: 'm' } }, { error: { code: 'X' } }]) t.like(errorFrom(junk, 'fallback'), { code: 'UNAVAILABLE', message: 'fallback' });
  t.like(errorFrom({ error: { code: 'NO_SUCH_CODE', message: 'm', details: { a: 1 } } }, 'f'), { code: 'INTERNAL', status: 500, message: 'the node answered NO_SUCH_CODE: m', details: { a: 1, nodeCode: 'NO_SUCH_CODE' } });
  t.is(errorFrom({ error: { code: 'toString', message: 'm' } }, 'f').code, 'INTERNAL', 'prototype names are not codes');
});

test('frames come out whole whatever the chunking, and a bad header fails before its payload is kept', (t) => {
  const stream = Buffer.concat([frame(FRAME.stdout, 'hello'), frame(FRAME.stderr, Buffer.alloc(100_000, 7)), frame(FRAME.json, '{"done":1}'), frame(FRAME.stdout, '')]);
  for (const step of [1, 3, 5, 4096, stream.length]) {
    const got: Array<[number, number]> = [];
    const r = new FrameReader((type, p) => got.push([type, p.length]));
    for (let i = 0; i < stream.length; i += step) r.push(stream.subarray(i, i + step));
    t.deepEqual(got, [[FRAME.stdout, 5], [FRAME.stderr, 100_000], [FRAME.json, 10], [FRAME.stdout, 0]], `chunks of ${step}`);
    t.is(r.pending, 0);
  }
  const cut = new FrameReader(() => undefined);
  cut.push(frame(FRAME.stdout, 'abcdef').subarray(0, 8));
  t.is(cut.pending, 8, 'a cut answer leaves bytes pending');
  const head = Buffer.alloc(5);
  head[0] = FRAME.stdout;
  head.writeUInt32BE(MAX_FRAME_BYTES + 1, 1);
  t.throws(() => new FrameReader(() => undefined).push(head), { instanceOf: WarrenError, message: /bound/ });
  t.throws(() => new FrameReader(() => undefined).push(frame(9, 'x')), { instanceOf: WarrenError, message: /unknown type/ });
});
