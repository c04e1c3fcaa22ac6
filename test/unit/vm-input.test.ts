import test from 'ava';
import { WarrenError } from '../../src/errors';
import { INPUT_LIMITS, compileActions, keyCode } from '../../src/shim/backends/vm/input';
import { encodePng, parsePpm, pngSize, scaleDown } from '../../src/shim/backends/vm/png';
import { decodePng, pixel } from '../helpers/png';

const W = 1024;
const H = 768;
const code = (fn: () => unknown) => {
  try {
    fn();
  } catch (err) {
    return (err as WarrenError).code;
  }
  return 'no error';
};

test('typed text becomes key presses with shift where a US keyboard needs it', (t) => {
  const steps = compileActions([{ type: 'type', text: 'aB!\n' }], W, H);
  const keys = steps.flatMap((s) => s.events).map((e) => (e.type === 'key' ? `${e.data.down ? '+' : '-'}${e.data.key.data}` : '?'));
  t.deepEqual(keys, ['+a', '-a', '+shift', '+b', '-b', '-shift', '+shift', '+1', '-1', '-shift', '+ret', '-ret']);
});

test('chords press in order and release in reverse; names and aliases resolve', (t) => {
  const steps = compileActions([{ type: 'key', keys: 'Control+Alt+Delete' }], W, H);
  t.deepEqual(steps[0]!.events.map((e) => (e.type === 'key' ? e.data.key.data : '')), ['ctrl', 'alt', 'delete']);
  t.deepEqual(steps[1]!.events.map((e) => (e.type === 'key' ? e.data.key.data : '')), ['delete', 'alt', 'ctrl']);
  t.deepEqual(keyCode('Enter'), ['ret', false]);
  t.deepEqual(keyCode('Page_Up'), ['pgup', false]);
  t.deepEqual(keyCode('F5'), ['f5', false]);
  t.deepEqual(keyCode('?'), ['slash', true]);
  t.is(compileActions([{ type: 'key', keys: ['ctrl', 'c'], repeat: 3 }], W, H).length, 6);
});

test('pointer coordinates map onto the absolute axis, corners exactly', (t) => {
  const [move] = compileActions([{ type: 'move', x: W - 1, y: 0 }], W, H);
  t.deepEqual(move!.events, [
    { type: 'abs', data: { axis: 'x', value: 0x7fff } },
    { type: 'abs', data: { axis: 'y', value: 0 } },
  ]);
  const drag = compileActions([{ type: 'drag', from: { x: 0, y: 0 }, to: { x: 512, y: 384 } }], W, H);
  t.true(drag.some((s) => s.events.some((e) => e.type === 'btn' && e.data.down)));
  t.true(drag.some((s) => s.events.some((e) => e.type === 'btn' && !e.data.down)));
  const scroll = compileActions([{ type: 'scroll', dy: 2 }], W, H).flatMap((s) => s.events);
  t.is(scroll.filter((e) => e.type === 'btn' && e.data.button === 'wheel-down' && e.data.down).length, 2);
  const click = compileActions([{ type: 'click', x: 10, y: 10, button: 'right', count: 2 }], W, H).flatMap((s) => s.events);
  t.is(click.filter((e) => e.type === 'btn' && e.data.button === 'right').length, 4);
});

test('bad input is refused with stable codes before anything is sent', (t) => {
  t.is(code(() => compileActions([{ type: 'move', x: W, y: 0 }], W, H)), 'OFF_SCREEN');
  t.is(code(() => compileActions([{ type: 'click', x: -1, y: 5 }], W, H)), 'OFF_SCREEN');
  t.is(code(() => compileActions([{ type: 'drag', from: { x: 0, y: 0 }, to: { x: 5, y: H + 10 } }], W, H)), 'OFF_SCREEN');
  t.is(code(() => compileActions([{ type: 'key', keys: 'hyperspace' }], W, H)), 'UNKNOWN_KEY');
  t.is(code(() => compileActions([{ type: 'type', text: 'héllo' }], W, H)), 'UNKNOWN_KEY');
  t.is(code(() => compileActions([{ type: 'key', keys: 'a', repeat: 1_000_000 }], W, H)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => compileActions([{ type: 'click', count: 50 }], W, H)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => compileActions([{ type: 'scroll', dy: 10_000 }], W, H)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => compileActions([{ type: 'wait', ms: 10_000 }, { type: 'wait', ms: 10_000 }, { type: 'wait', ms: 10_000 }, { type: 'wait', ms: 10 }], W, H)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => compileActions(Array.from({ length: INPUT_LIMITS.actions + 1 }, () => ({ type: 'move', x: 1, y: 1 })), W, H)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => compileActions([{ type: 'type', text: 'a'.repeat(INPUT_LIMITS.textChars + 1) }], W, H)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => compileActions([{ type: 'teleport' }], W, H)), 'INVALID_ARGUMENT');
  t.is(code(() => compileActions([{ type: 'move', x: 1, y: 1, z: 3 }], W, H)), 'UNKNOWN_FIELD');
  t.is(code(() => compileActions([{ type: 'move', x: 1.5, y: 1 }], W, H)), 'INVALID_ARGUMENT');
  t.is(code(() => compileActions([], W, H)), 'INVALID_ARGUMENT');
  t.is(code(() => compileActions('click', W, H)), 'INVALID_ARGUMENT');
});

test('PPM to PNG round trip, scaled by averaging', (t) => {
  const w = 8;
  const h = 4;
  const header = Buffer.from(`P6\n${w} ${h}\n255\n`, 'latin1');
  const px = Buffer.alloc(w * h * 3);
  for (let y = 0; y < h; y++) for (let x = 0; x < w; x++) px.set(x < 4 ? [255, 0, 0] : [0, 0, 255], (y * w + x) * 3);
  const img = parsePpm(Buffer.concat([header, px]));
  const png = encodePng(img);
  t.deepEqual(pngSize(png), { width: w, height: h });
  const back = decodePng(png);
  t.deepEqual(back.rgb, px);
  const half = decodePng(encodePng(scaleDown(img, 4, 2)));
  t.deepEqual(pixel(half, 0, 0), [255, 0, 0]);
  t.deepEqual(pixel(half, 3, 1), [0, 0, 255]);
  t.throws(() => parsePpm(Buffer.from('P6\n100000 100000\n255\n')), { code: 'INTERNAL' } as never);
  t.throws(() => parsePpm(Buffer.concat([header, px.subarray(0, 10)])), { code: 'INTERNAL' } as never);
});

test('names of Object.prototype members are no keys and no action types', (t) => {
  for (const name of ['constructor', 'toString', '__proto__', 'valueOf']) {
    t.throws(() => keyCode(name), { instanceOf: WarrenError, code: 'UNKNOWN_KEY' } as never, name);
    t.throws(() => compileActions([{ type: name } as never], W, H), { instanceOf: WarrenError, code: 'INVALID_ARGUMENT' } as never, name);
    t.throws(() => compileActions([{ type: 'key', keys: name }], W, H), { instanceOf: WarrenError, code: 'UNKNOWN_KEY' } as never, name);
  }
});
