import test from 'ava';
import { type BlockContext, type BlockView, committedOf, fitsBlock, limited, roomFor, slackHeld } from '../../src/cluster/quota-blocks';

const q = (maxSandboxes: number | null, maxCpu: number | null = null, maxMemoryMb: number | null = null) => ({ maxSandboxes, maxCpu, maxMemoryMb });
const block = (node: string, sandboxes: number, cpu: number, memoryMb: number, at = 100) => ({ block: { account: 'a', node, sandboxes, cpu, memoryMb, at }, rev: '1' });

test('a block admits while one more sandbox fits in every dimension', (t) => {
  const b = { sandboxes: 3, cpu: 2, memoryMb: 1024 };
  t.true(fitsBlock(b, { sandboxes: 2, cpu: 1, memoryMb: 512 }, { cpu: 1, memoryMb: 512 }));
  t.false(fitsBlock(b, { sandboxes: 3, cpu: 0, memoryMb: 0 }, { cpu: 0.1, memoryMb: 1 }), 'sandboxes');
  t.false(fitsBlock(b, { sandboxes: 1, cpu: 1.5, memoryMb: 0 }, { cpu: 1, memoryMb: 1 }), 'cpu');
  t.false(fitsBlock(b, { sandboxes: 1, cpu: 0, memoryMb: 1000 }, { cpu: 0.1, memoryMb: 64 }), 'memory');
  // fractional cpu adds up without a rounding refusal
  t.true(fitsBlock({ sandboxes: 10, cpu: 0.3, memoryMb: 100 }, { sandboxes: 2, cpu: 0.1 + 0.1, memoryMb: 0 }, { cpu: 0.1, memoryMb: 1 }));
});

test('room is counted in sandboxes of the template, by the tightest limit', (t) => {
  t.is(roomFor(q(null), { sandboxes: 5, cpu: 5, memoryMb: 5 }, { cpu: 1, memoryMb: 1 }), null);
  t.false(limited(q(null)));
  t.true(limited(q(null, 4)));
  t.like(roomFor(q(10, 4), { sandboxes: 2, cpu: 2, memoryMb: 0 }, { cpu: 0.5, memoryMb: 64 }), { room: 4, limit: 'maxCpu' });
  t.like(roomFor(q(3, null, 1024), { sandboxes: 1, cpu: 0, memoryMb: 900 }, { cpu: 1, memoryMb: 256 }), { room: 0, limit: 'maxMemoryMb' });
  t.like(roomFor(q(3), { sandboxes: 5, cpu: 0, memoryMb: 0 }, { cpu: 1, memoryMb: 1 }), { room: 0, limit: 'maxSandboxes', used: 5 }, 'over the quota is no room, never negative');
});

test('what an account holds: per live node its block or its record, whichever is more; slack where a block holds more than its record shows', (t) => {
  const view: BlockView = { account: 'a', epochRev: '7', blocks: new Map([['n1', block('n1', 3, 3, 300)], ['n2', block('n2', 1, 1, 100)], ['gone', block('gone', 9, 9, 900)]]) };
  const records: Record<string, { sandboxes: number; cpu: number; memoryMb: number }> = {
    n1: { sandboxes: 3, cpu: 3, memoryMb: 300 },
    n2: { sandboxes: 2, cpu: 2, memoryMb: 200 },
    n3: { sandboxes: 1, cpu: 0.5, memoryMb: 64 },
  };
  const ctx: BlockContext = {
    live: new Set(['n1', 'n2', 'n3']),
    recorded: (n) => records[n] ?? { sandboxes: 0, cpu: 0, memoryMb: 0 },
  };
  t.deepEqual(committedOf(view, ctx), { sandboxes: 3 + 2 + 1, cpu: 3 + 2 + 0.5, memoryMb: 300 + 200 + 64 });
  t.false(slackHeld(view, ctx), 'every block is in use as far as the records show');
  records.n1 = { sandboxes: 1, cpu: 1, memoryMb: 100 };
  t.true(slackHeld(view, ctx), 'n1 holds two sandboxes more than it has');
});
