/**
 * Computer-use input at the hypervisor level: a list of actions (keys, chords,
 * typed text, pointer moves, clicks, drags, scrolls, waits) checked against the
 * screen and turned into QMP `input-send-event` batches. Nothing here needs the
 * guest's cooperation: the VM sees a PS/2 keyboard and a virtio tablet
 * (absolute pointer), so it works for any guest OS with those drivers.
 *
 * Errors are the user's: OFF_SCREEN for coordinates outside the screen,
 * UNKNOWN_KEY for keys or characters with no key, LIMIT_OUT_OF_RANGE for
 * absurd counts, INVALID_ARGUMENT for malformed actions.
 */
import { WarrenError } from '../../../errors';
import type { InputAction, MouseButton } from '../../types';
import { lookupTable } from '../../../validation';

export const INPUT_LIMITS = {
  actions: 256,
  textChars: 4096,
  repeat: 100,
  clickCount: 3,
  scroll: 100,
  waitMs: 10_000,
  totalWaitMs: 30_000,
  /** Key and button events one request may send (each typed character is two). */
  events: 20_000,
} as const;

/** One batch for input-send-event, then a pause before the next (the PS/2 queue holds 16 bytes). */
export interface InputStep {
  events: QmpInputEvent[];
  delayMs: number;
}

export type QmpInputEvent =
  | { type: 'key'; data: { down: boolean; key: { type: 'qcode'; data: string } } }
  | { type: 'btn'; data: { down: boolean; button: string } }
  | { type: 'abs'; data: { axis: 'x' | 'y'; value: number } };

const ABS_MAX = 0x7fff;
const KEY_DELAY_MS = 6;
const MOVE_DELAY_MS = 10;

const LETTERS = 'abcdefghijklmnopqrstuvwxyz';
const QCODES = new Set<string>([
  ...LETTERS,
  ...'0123456789',
  ...Array.from({ length: 12 }, (_, i) => `f${i + 1}`),
  'shift', 'shift_r', 'alt', 'alt_r', 'ctrl', 'ctrl_r', 'meta_l', 'meta_r', 'menu',
  'esc', 'minus', 'equal', 'backspace', 'tab', 'bracket_left', 'bracket_right', 'ret', 'semicolon', 'apostrophe', 'grave_accent', 'backslash',
  'comma', 'dot', 'slash', 'spc', 'caps_lock', 'num_lock', 'scroll_lock', 'print', 'sysrq', 'pause',
  'home', 'pgup', 'pgdn', 'end', 'left', 'up', 'down', 'right', 'insert', 'delete',
  'kp_0', 'kp_1', 'kp_2', 'kp_3', 'kp_4', 'kp_5', 'kp_6', 'kp_7', 'kp_8', 'kp_9', 'kp_add', 'kp_subtract', 'kp_multiply', 'kp_divide', 'kp_enter', 'kp_decimal',
  'less', 'audiomute', 'volumeup', 'volumedown',
]);

/** Other names for keys (xdotool / X keysym / browser styles), lower case without '_' '-' ' '. */
const ALIASES: Record<string, string> = lookupTable({
  enter: 'ret', return: 'ret', space: 'spc', escape: 'esc', control: 'ctrl', ctl: 'ctrl', controll: 'ctrl', controlleft: 'ctrl', controlright: 'ctrl_r', ctrlleft: 'ctrl', ctrlright: 'ctrl_r', ctrlr: 'ctrl_r', ctrll: 'ctrl',
  shiftleft: 'shift', shiftright: 'shift_r', shiftl: 'shift', shiftr: 'shift_r', altleft: 'alt', altright: 'alt_r', altl: 'alt', altr: 'alt_r', option: 'alt', altgr: 'alt_r',
  super: 'meta_l', superl: 'meta_l', superr: 'meta_r', meta: 'meta_l', metal: 'meta_l', metar: 'meta_r', win: 'meta_l', windows: 'meta_l', cmd: 'meta_l', command: 'meta_l',
  del: 'delete', ins: 'insert', pageup: 'pgup', pagedown: 'pgdn', prior: 'pgup', next: 'pgdn', bksp: 'backspace', back: 'backspace',
  arrowup: 'up', arrowdown: 'down', arrowleft: 'left', arrowright: 'right', capslock: 'caps_lock', numlock: 'num_lock', scrolllock: 'scroll_lock', printscreen: 'print', prtsc: 'print',
  minus: 'minus', equal: 'equal', equals: 'equal', comma: 'comma', period: 'dot', dot: 'dot', slash: 'slash', backslash: 'backslash', semicolon: 'semicolon', apostrophe: 'apostrophe', quote: 'apostrophe',
  grave: 'grave_accent', graveaccent: 'grave_accent', backquote: 'grave_accent', bracketleft: 'bracket_left', bracketright: 'bracket_right', kpenter: 'kp_enter', contextmenu: 'menu',
});

/** Characters of a US keyboard: the key, and whether shift is held. */
const CHARS: Record<string, [string, boolean]> = (() => {
  const m: Record<string, [string, boolean]> = Object.create(null);
  for (const c of LETTERS) {
    m[c] = [c, false];
    m[c.toUpperCase()] = [c, true];
  }
  for (const c of '0123456789') m[c] = [c, false];
  const plain: Record<string, string> = { ' ': 'spc', '\n': 'ret', '\t': 'tab', '-': 'minus', '=': 'equal', '[': 'bracket_left', ']': 'bracket_right', '\\': 'backslash', ';': 'semicolon', "'": 'apostrophe', '`': 'grave_accent', ',': 'comma', '.': 'dot', '/': 'slash' };
  for (const [c, k] of Object.entries(plain)) m[c] = [k, false];
  const shifted: Record<string, string> = { '!': '1', '@': '2', '#': '3', $: '4', '%': '5', '^': '6', '&': '7', '*': '8', '(': '9', ')': '0', _: 'minus', '+': 'equal', '{': 'bracket_left', '}': 'bracket_right', '|': 'backslash', ':': 'semicolon', '"': 'apostrophe', '~': 'grave_accent', '<': 'comma', '>': 'dot', '?': 'slash' };
  for (const [c, k] of Object.entries(shifted)) m[c] = [k, true];
  return m;
})();

/** A key name to [qcode, shift needed]; UNKNOWN_KEY when there is none. */
export function keyCode(name: string): [string, boolean] {
  if (typeof name !== 'string' || name.length === 0 || name.length > 32) throw new WarrenError('UNKNOWN_KEY', `key names are strings of 1 to 32 characters (got ${JSON.stringify(String(name).slice(0, 40))})`, { key: String(name).slice(0, 40) });
  if (name.length === 1 && CHARS[name]) return CHARS[name]!;
  const n = name.toLowerCase();
  if (QCODES.has(n)) return [n, false];
  const a = ALIASES[n.replace(/[_\- ]/g, '')];
  if (a !== undefined) return [a, false];
  throw new WarrenError('UNKNOWN_KEY', `unknown key ${JSON.stringify(name)} (names are QEMU qcodes like "ret", "ctrl", "f5", "a", or aliases like "Enter", "Escape", "PageUp")`, { key: name });
}

/** "ctrl+alt+t" or ["ctrl", "alt", "t"] to the keys of the chord, modifiers first as given. */
function chordKeys(keys: unknown): string[] {
  let list: unknown[];
  if (typeof keys === 'string') list = keys.length > 1 && keys.includes('+') ? keys.split('+') : [keys];
  else if (Array.isArray(keys)) list = keys;
  else throw new WarrenError('INVALID_ARGUMENT', 'key.keys must be a string ("ctrl+c") or a list of key names', { field: 'keys' });
  if (list.length === 0 || list.length > 8) throw new WarrenError('LIMIT_OUT_OF_RANGE', 'a chord has 1 to 8 keys', { field: 'keys', max: 8 });
  const out: string[] = [];
  for (const k of list) {
    const [code, shift] = keyCode(k as string);
    if (shift && !out.includes('shift')) out.push('shift');
    if (!out.includes(code)) out.push(code);
  }
  return out;
}

function int(a: Record<string, unknown>, field: string, min: number, max: number, dflt?: number, code: 'LIMIT_OUT_OF_RANGE' | 'OFF_SCREEN' = 'LIMIT_OUT_OF_RANGE'): number {
  const v = a[field];
  if (v === undefined && dflt !== undefined) return dflt;
  if (typeof v !== 'number' || !Number.isInteger(v)) throw new WarrenError('INVALID_ARGUMENT', `${field} must be an integer`, { field });
  if (v < min || v > max) throw new WarrenError(code, `${field} ${v} is out of range (${min}..${max})`, { field, min, max, value: v });
  return v;
}

const ACTION_FIELDS: Record<InputAction['type'], string[]> = lookupTable({
  key: ['keys', 'repeat'],
  type: ['text'],
  move: ['x', 'y'],
  click: ['x', 'y', 'button', 'count'],
  down: ['x', 'y', 'button'],
  up: ['x', 'y', 'button'],
  drag: ['from', 'to', 'button'],
  scroll: ['x', 'y', 'dx', 'dy'],
  wait: ['ms'],
});

/**
 * Check `actions` against a `width` x `height` screen and compile them to
 * QMP batches. Throws before anything is sent: a bad action anywhere in the
 * list sends nothing.
 */
export function compileActions(actions: unknown, width: number, height: number): InputStep[] {
  if (!Array.isArray(actions)) throw new WarrenError('INVALID_ARGUMENT', 'actions must be a list', { field: 'actions' });
  if (actions.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'actions must not be empty', { field: 'actions' });
  if (actions.length > INPUT_LIMITS.actions) throw new WarrenError('LIMIT_OUT_OF_RANGE', `at most ${INPUT_LIMITS.actions} actions per request (got ${actions.length})`, { field: 'actions', max: INPUT_LIMITS.actions });
  const steps: InputStep[] = [];
  let events = 0;
  let waited = 0;
  const push = (evs: QmpInputEvent[], delayMs: number) => {
    events += evs.length;
    if (events > INPUT_LIMITS.events) throw new WarrenError('LIMIT_OUT_OF_RANGE', `one request may send at most ${INPUT_LIMITS.events} input events`, { field: 'actions', max: INPUT_LIMITS.events });
    steps.push({ events: evs, delayMs });
  };
  const abs = (x: number, y: number): QmpInputEvent[] => [
    { type: 'abs', data: { axis: 'x', value: width > 1 ? Math.round((x * ABS_MAX) / (width - 1)) : 0 } },
    { type: 'abs', data: { axis: 'y', value: height > 1 ? Math.round((y * ABS_MAX) / (height - 1)) : 0 } },
  ];
  const key = (code: string, down: boolean): QmpInputEvent => ({ type: 'key', data: { down, key: { type: 'qcode', data: code } } });
  const btn = (button: string, down: boolean): QmpInputEvent => ({ type: 'btn', data: { down, button } });
  const point = (a: Record<string, unknown>, xf: string, yf: string, optional: boolean): [number, number] | null => {
    if (optional && a[xf] === undefined && a[yf] === undefined) return null;
    return [int(a, xf, 0, width - 1, undefined, 'OFF_SCREEN'), int(a, yf, 0, height - 1, undefined, 'OFF_SCREEN')];
  };
  const button = (a: Record<string, unknown>): MouseButton => {
    const b = a.button ?? 'left';
    if (b !== 'left' && b !== 'middle' && b !== 'right') throw new WarrenError('INVALID_ARGUMENT', 'button must be "left", "middle" or "right"', { field: 'button' });
    return b;
  };
  actions.forEach((raw, i) => {
    if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) throw new WarrenError('INVALID_ARGUMENT', `actions[${i}] must be an object`, { field: `actions[${i}]` });
    const a = raw as Record<string, unknown>;
    const type = a.type as InputAction['type'];
    const fields = ACTION_FIELDS[type];
    if (typeof type !== 'string' || fields === undefined) throw new WarrenError('INVALID_ARGUMENT', `actions[${i}].type must be one of ${Object.keys(ACTION_FIELDS).join(', ')}`, { field: `actions[${i}].type` });
    for (const k of Object.keys(a)) if (k !== 'type' && !fields.includes(k)) throw new WarrenError('UNKNOWN_FIELD', `actions[${i}] (${type}) has no field ${JSON.stringify(k)}`, { field: `actions[${i}].${k}` });
    switch (type) {
      case 'key': {
        const keys = chordKeys(a.keys);
        const repeat = int(a, 'repeat', 1, INPUT_LIMITS.repeat, 1);
        for (let r = 0; r < repeat; r++) {
          push(keys.map((k) => key(k, true)), KEY_DELAY_MS);
          push([...keys].reverse().map((k) => key(k, false)), KEY_DELAY_MS);
        }
        break;
      }
      case 'type': {
        const text = a.text;
        if (typeof text !== 'string') throw new WarrenError('INVALID_ARGUMENT', `actions[${i}].text must be a string`, { field: 'text' });
        if (text.length > INPUT_LIMITS.textChars) throw new WarrenError('LIMIT_OUT_OF_RANGE', `text is at most ${INPUT_LIMITS.textChars} characters`, { field: 'text', max: INPUT_LIMITS.textChars });
        for (const c of text) {
          const m = CHARS[c];
          if (m === undefined) throw new WarrenError('UNKNOWN_KEY', `character ${JSON.stringify(c)} has no key on the VM's US keyboard (type takes printable ASCII, newline and tab)`, { key: c });
          const [code, shift] = m;
          push(shift ? [key('shift', true), key(code, true)] : [key(code, true)], KEY_DELAY_MS);
          push(shift ? [key(code, false), key('shift', false)] : [key(code, false)], KEY_DELAY_MS);
        }
        break;
      }
      case 'move': {
        const [x, y] = point(a, 'x', 'y', false)!;
        push(abs(x, y), MOVE_DELAY_MS);
        break;
      }
      case 'click': {
        const p = point(a, 'x', 'y', true);
        const b = button(a);
        const count = int(a, 'count', 1, INPUT_LIMITS.clickCount, 1);
        if (p) push(abs(p[0], p[1]), MOVE_DELAY_MS);
        for (let c = 0; c < count; c++) {
          push([btn(b, true)], MOVE_DELAY_MS);
          push([btn(b, false)], 40);
        }
        break;
      }
      case 'down':
      case 'up': {
        const p = point(a, 'x', 'y', true);
        if (p) push(abs(p[0], p[1]), MOVE_DELAY_MS);
        push([btn(button(a), type === 'down')], MOVE_DELAY_MS);
        break;
      }
      case 'drag': {
        const pt = (v: unknown, f: string): [number, number] => {
          if (v === null || typeof v !== 'object') throw new WarrenError('INVALID_ARGUMENT', `actions[${i}].${f} must be {x, y}`, { field: f });
          return point(v as Record<string, unknown>, 'x', 'y', false)!;
        };
        const from = pt(a.from, 'from');
        const to = pt(a.to, 'to');
        const b = button(a);
        push(abs(from[0], from[1]), MOVE_DELAY_MS);
        push([btn(b, true)], MOVE_DELAY_MS);
        const n = 8;
        for (let s = 1; s <= n; s++) push(abs(Math.round(from[0] + ((to[0] - from[0]) * s) / n), Math.round(from[1] + ((to[1] - from[1]) * s) / n)), MOVE_DELAY_MS);
        push([btn(b, false)], MOVE_DELAY_MS);
        break;
      }
      case 'scroll': {
        const p = point(a, 'x', 'y', true);
        const dx = int(a, 'dx', -INPUT_LIMITS.scroll, INPUT_LIMITS.scroll, 0);
        const dy = int(a, 'dy', -INPUT_LIMITS.scroll, INPUT_LIMITS.scroll, 0);
        if (dx === 0 && dy === 0) throw new WarrenError('INVALID_ARGUMENT', `actions[${i}]: scroll needs dx or dy`, { field: 'dy' });
        if (p) push(abs(p[0], p[1]), MOVE_DELAY_MS);
        const wheel = (name: string, n: number) => {
          for (let s = 0; s < n; s++) {
            push([btn(name, true)], 0);
            push([btn(name, false)], MOVE_DELAY_MS);
          }
        };
        wheel(dy > 0 ? 'wheel-down' : 'wheel-up', Math.abs(dy));
        wheel(dx > 0 ? 'wheel-right' : 'wheel-left', Math.abs(dx));
        break;
      }
      case 'wait': {
        const ms = int(a, 'ms', 0, INPUT_LIMITS.waitMs);
        waited += ms;
        if (waited > INPUT_LIMITS.totalWaitMs) throw new WarrenError('LIMIT_OUT_OF_RANGE', `waits add up to at most ${INPUT_LIMITS.totalWaitMs} ms per request`, { field: 'ms', max: INPUT_LIMITS.totalWaitMs });
        if (steps.length > 0) steps[steps.length - 1]!.delayMs += ms;
        else steps.push({ events: [], delayMs: ms });
        break;
      }
    }
  });
  return steps;
}
