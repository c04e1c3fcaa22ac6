import test from 'ava';
import type { LiveSandbox } from '../../src/shim/lifecycle/manager';
import { SandboxMap } from '../../src/shim/sandbox-map';
import type { SandboxState } from '../../src/shim/types';

function live(id: string, owner: string, cpu: number, memoryMb: number, state: SandboxState): LiveSandbox {
  return { record: { id, spec: { owner, cpu, memoryMb } }, box: null, state } as unknown as LiveSandbox;
}

/** What the usage was before it was kept: a sum over every sandbox of the owner. */
function brute(m: SandboxMap, owner: string) {
  const u = { sandboxes: 0, cpu: 0, memoryMb: 0 };
  for (const l of m.values()) {
    if (l.record.spec.owner !== owner || l.state === 'stopped' || l.state === 'failed') continue;
    u.sandboxes++;
    u.cpu += l.record.spec.cpu;
    u.memoryMb += l.record.spec.memoryMb;
  }
  return u;
}

test('usage follows sets, deletes, replacements and every state change, as the sum over the sandboxes would', (t) => {
  const m = new SandboxMap();
  const states: SandboxState[] = ['creating', 'running', 'paused', 'hibernated', 'stopped', 'failed', 'deleting'];
  const owners = ['a', 'b', 'c'];
  let seed = 7;
  const rnd = (n: number) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) % n);
  const removed: LiveSandbox[] = [];
  for (let i = 0; i < 5000; i++) {
    const id = `s${rnd(60)}`;
    const op = rnd(4);
    if (op === 0) m.set(id, live(id, owners[rnd(3)]!, 1 + rnd(4), 64 * (1 + rnd(8)), states[rnd(states.length)]!));
    else if (op === 1) {
      const l = m.get(id);
      if (l) removed.push(l);
      m.delete(id);
    } else {
      const l = m.get(id);
      if (l) l.state = states[rnd(states.length)]!;
    }
    // a sandbox out of the map no longer moves anything
    if (removed.length > 0) removed[rnd(removed.length)]!.state = states[rnd(states.length)]!;
    if (i % 50 === 0) for (const o of owners) t.deepEqual(m.usageOf(o), brute(m, o), `after op ${i}, owner ${o}`);
  }
  for (const o of owners) t.deepEqual(m.usageOf(o), brute(m, o));
  m.clear();
  for (const o of owners) t.deepEqual(m.usageOf(o), { sandboxes: 0, cpu: 0, memoryMb: 0 });
});

test('a sandbox set again under its id is not counted twice; its state stays a plain value once out of the map', (t) => {
  const m = new SandboxMap();
  const l = live('x', 'a', 2, 128, 'running');
  m.set('x', l);
  m.set('x', l);
  t.deepEqual(m.usageOf('a'), { sandboxes: 1, cpu: 2, memoryMb: 128 });
  t.true(Object.keys(l).includes('state'), 'state stays enumerable (records and JSON see it)');
  m.delete('x');
  t.deepEqual(m.usageOf('a'), { sandboxes: 0, cpu: 0, memoryMb: 0 });
  l.state = 'paused';
  t.is(l.state, 'paused');
  t.deepEqual(Object.getOwnPropertyDescriptor(l, 'state'), { value: 'paused', writable: true, enumerable: true, configurable: true });
});
