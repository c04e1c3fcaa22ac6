import test from 'ava';
import { WarrenError } from '../../src/errors';
import { InputNumbering, ackBatcher, validateSeq, validateWriter } from '../../src/shim/sessions/input-numbering';

test('each number of a writer is taken once, in any order of repeats; writers are independent', (t) => {
  const n = new InputNumbering();
  t.deepEqual([1, 2, 2, 1, 3].map((s) => n.take('a', s)), [true, true, false, false, true]);
  t.true(n.take('b', 1), 'another writer numbers from 1');
  // a gap (frames that never came) does not block what follows
  t.true(n.take('a', 7));
  t.false(n.take('a', 5));
  n.forget('a');
  t.true(n.take('a', 1), 'a forgotten writer starts again');
});

test('past its bound the writer heard from least recently is forgotten first', (t) => {
  const n = new InputNumbering(3);
  n.take('a', 1);
  n.take('b', 1);
  n.take('c', 1);
  n.take('a', 2); // a is now the most recent
  n.take('d', 1); // b goes
  t.is(n.size, 3);
  t.false(n.take('a', 2));
  t.false(n.take('c', 1));
  t.true(n.take('b', 1), 'b was forgotten');
});

test('acknowledgements are coalesced to one per turn, for the highest number', async (t) => {
  const sent: number[] = [];
  const ack = ackBatcher((s) => sent.push(s));
  ack(1);
  ack(3);
  ack(2);
  t.deepEqual(sent, []);
  await new Promise((r) => setImmediate(r));
  t.deepEqual(sent, [3]);
  ack(3);
  await new Promise((r) => setImmediate(r));
  t.deepEqual(sent, [3, 3]);
});

test('writer names and numbers are validated', (t) => {
  t.is(validateWriter('abcDEF12_-'), 'abcDEF12_-');
  for (const bad of ['short', 'x'.repeat(65), 'has space!', 42, null]) t.is(t.throws(() => validateWriter(bad), { instanceOf: WarrenError })?.code, 'INVALID_ARGUMENT', String(bad));
  t.is(validateSeq(1), 1);
  for (const bad of [0, -1, 1.5, '1', Number.MAX_SAFE_INTEGER + 2, null]) t.is(t.throws(() => validateSeq(bad), { instanceOf: WarrenError })?.code, 'INVALID_ARGUMENT', String(bad));
});
