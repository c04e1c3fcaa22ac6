import test from 'ava';
import { WarrenError } from '../../src/errors';
import { METHODS, checkArgs, decode, encode, errorFrom, errorJson } from '../../src/shim/remote/wire';

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

test('decode drops prototype keys and refuses bad tags and deep nesting', (t) => {
  const o = decode(JSON.parse('{"__proto__":{"polluted":1},"constructor":2,"ok":3}')) as Record<string, unknown>;
  t.deepEqual(Object.keys(o), ['ok']);
  t.is(Object.getPrototypeOf(o), Object.prototype);
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
  t.throws(() => checkArgs('getSandbox', 'x'), { instanceOf: WarrenError, message: /must be an array/ });
});

test('errors keep their stable code and details across; anything else is UNAVAILABLE', (t) => {
  const e = errorFrom({ error: errorJson(new WarrenError('SANDBOX_NOT_FOUND', 'gone', { id: 'x' })) }, 'fallback');
  t.like(e, { code: 'SANDBOX_NOT_FOUND', message: 'gone', status: 404, details: { id: 'x' } });
  t.is(errorFrom({ error: errorJson(new Error('plain')) }, 'f').code, 'INTERNAL');
  for (const junk of [null, 'x', {}, { error: 'x' }, { error: { code: 1, message: 'm' } }, { error: { code: 'X' } }]) t.like(errorFrom(junk, 'fallback'), { code: 'UNAVAILABLE', message: 'fallback' });
  t.is(errorFrom({ error: { code: 'NO_SUCH_CODE', message: 'm' } }, 'f').code, 'INTERNAL');
});
