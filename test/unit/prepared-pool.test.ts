import test from 'ava';
import { type Prepared, PreparedPool, type PreparedOptions } from '../../src/shim/prepared';
import type { BackendSandbox } from '../../src/shim/types';
import { waitFor } from '../helpers/wait';

/**
 * The pool's bookkeeping over a host that makes plain objects: what it keeps, hands out, makes
 * and gives back. The kernel side (a prepared sandbox is a fresh one once claimed) is
 * test/integration/prepared.test.ts.
 */
interface Box {
  prepared: Prepared;
  end(): void;
}

function harness(opts: Partial<PreparedOptions> = {}, fail: (shape: string) => boolean = () => false) {
  let clock = 1_000_000;
  let n = 0;
  const made: string[] = [];
  const discarded: string[] = [];
  const boxes = new Map<string, Box>();
  const logs: string[] = [];
  let gate: Promise<void> | null = null;
  const started: string[] = [];
  const pool = new PreparedPool<string>(
    { perShape: 2, maxShapes: 2, idleMs: 60_000, ...opts },
    {
      make: async (shape) => {
        started.push(shape);
        if (gate) await gate;
        if (fail(shape)) throw new Error(`no ${shape}`);
        const id = `${shape}-${n++}`;
        let end!: () => void;
        const ended = new Promise<void>((r) => (end = r));
        const prepared: Prepared = { id, box: { id, ended } as unknown as BackendSandbox, digests: [shape] };
        boxes.set(id, { prepared, end });
        made.push(id);
        return prepared;
      },
      discard: async (p) => {
        discarded.push(p.id);
      },
      log: (l) => logs.push(l),
    },
    () => clock,
  );
  return {
    pool,
    started,
    made,
    discarded,
    boxes,
    logs,
    advance: (ms: number) => (clock += ms),
    hold: () => {
      let release!: () => void;
      gate = new Promise((r) => (release = r));
      return () => {
        gate = null;
        release();
      };
    },
  };
}

test('the first create of a shape finds nothing; the pool then makes perShape of it, one at a time, and hands each out once', async (t) => {
  const h = harness();
  t.is(h.pool.take('a', 'a'), undefined);
  await waitFor(() => h.pool.size === 2, 2000, 'two prepared of shape a');
  t.deepEqual(h.made, ['a-0', 'a-1']);
  const first = h.pool.take('a', 'a');
  const second = h.pool.take('a', 'a');
  t.is(first?.id, 'a-0');
  t.is(second?.id, 'a-1');
  // refilled after the takes, never more than perShape
  await waitFor(() => h.pool.size === 2, 2000, 'the pool refilled');
  t.deepEqual(h.made, ['a-0', 'a-1', 'a-2', 'a-3']);
  t.is(h.pool.take('b', 'b'), undefined, 'another shape gets nothing of a');
  await h.pool.close();
});

test('a pool with perShape 0 is off: it takes nothing and makes nothing', async (t) => {
  const h = harness({ perShape: 0 });
  t.false(h.pool.enabled);
  t.is(h.pool.take('a', 'a'), undefined);
  await h.pool.close();
  t.deepEqual(h.made, []);
});

test('at most maxShapes are kept: asking for a new one gives back the least recently asked', async (t) => {
  const h = harness({ perShape: 1, maxShapes: 2 });
  h.pool.take('a', 'a');
  await waitFor(() => h.pool.size === 1, 2000, 'a made');
  h.pool.take('b', 'b');
  await waitFor(() => h.pool.size === 2, 2000, 'b made');
  h.pool.take('a', 'a'); // a is now the most recent; b the oldest
  await waitFor(() => h.pool.size === 2, 2000, 'a made again');
  h.pool.take('c', 'c');
  await waitFor(() => h.discarded.includes('b-1'), 2000, 'b given back');
  t.deepEqual(
    h.pool.report().map((r) => r.shape),
    ['a', 'c'],
  );
  await h.pool.close();
});

test('a shape nobody asked for in idleMs is given back', async (t) => {
  const h = harness({ idleMs: 10_000 });
  h.pool.take('a', 'a');
  await waitFor(() => h.pool.size === 2, 2000, 'a made');
  h.advance(9_000);
  h.pool.expireIdle();
  t.is(h.pool.size, 2, 'not idle yet');
  h.advance(2_000);
  h.pool.expireIdle();
  t.is(h.pool.size, 0);
  await waitFor(() => h.discarded.length === 2, 2000, 'both given back');
  t.deepEqual(h.discarded.sort(), ['a-0', 'a-1']);
  await h.pool.close();
});

test('a prepared sandbox whose pid 1 ends leaves the pool and is given back', async (t) => {
  const h = harness({ perShape: 1 });
  h.pool.take('a', 'a');
  await waitFor(() => h.pool.size === 1, 2000, 'a made');
  h.boxes.get('a-0')!.end();
  await waitFor(() => h.discarded.includes('a-0'), 2000, 'the dead one given back');
  // and replaced
  await waitFor(() => h.made.includes('a-1') && h.pool.size === 1, 2000, 'a replacement made');
  t.is(h.pool.take('a', 'a')?.id, 'a-1');
  await h.pool.close();
});

test('a failed make is logged and its shape rests before the next try', async (t) => {
  let failing = true;
  const h = harness({ perShape: 1 }, () => failing);
  h.pool.take('a', 'a');
  await waitFor(() => h.logs.some((l) => l.includes('no a')), 2000, 'the failure logged');
  failing = false;
  h.pool.take('a', 'a');
  // resting: nothing is made until the retry time has passed
  t.is(h.pool.size, 0);
  h.advance(6_000);
  h.pool.take('a', 'a');
  await waitFor(() => h.pool.size === 1, 2000, 'made after the rest');
  await h.pool.close();
});

test('flush gives back everything held; close also waits for a make in flight and gives it back', async (t) => {
  const h = harness({ perShape: 2 });
  h.pool.take('a', 'a');
  await waitFor(() => h.pool.size === 2, 2000, 'a made');
  await h.pool.flush();
  t.is(h.pool.size, 0);
  t.deepEqual(h.discarded.sort(), ['a-0', 'a-1']);
  const release = h.hold();
  h.pool.take('b', 'b');
  await waitFor(() => h.started.includes('b'), 2000, 'a make of b started');
  const closing = h.pool.close();
  release();
  await closing;
  t.is(h.pool.size, 0);
  t.is(h.pool.take('b', 'b'), undefined, 'a closed pool hands nothing out');
  t.deepEqual(h.made.filter((id) => !h.discarded.includes(id)), [], 'everything made was given back');
});

test('a make in flight counts as holding, and flush resolves only once it has landed and been given back', async (t) => {
  const h = harness({ perShape: 1 });
  t.false(h.pool.holding, 'an empty pool holds nothing');
  const release = h.hold();
  h.pool.take('a', 'a');
  await waitFor(() => h.started.includes('a'), 2000, 'a make of a started');
  t.is(h.pool.size, 0, 'nothing is ready yet');
  t.true(h.pool.holding, 'the make under way holds what it is making');
  let flushed = false;
  const flushing = h.pool.flush().then(() => (flushed = true));
  await Promise.resolve();
  t.false(flushed, 'flush waits for the make');
  release();
  await flushing;
  t.deepEqual(h.made, ['a-0']);
  t.deepEqual(h.discarded, ['a-0'], 'the make landed in a flushed pool and was given back before flush resolved');
  t.false(h.pool.holding);
  await h.pool.close();
});
