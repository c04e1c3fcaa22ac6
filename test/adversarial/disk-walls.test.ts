/**
 * One disk budget per sandbox: with diskMb: 32, everything the sandbox can
 * write - the writable layer (/, /root, /tmp, /work), /dev/shm and /dev itself
 * - holds at most 32 MiB together, in whatever order it is filled.
 */
import { testUnless } from '../helpers/skip';
import { rootSkipReason, spec, withShim } from '../helpers/warren';

const skip = rootSkipReason();
const it = testUnless(skip).serial;

const MiB = 1024 * 1024;
const PLACES = ['/root/fill', '/dev/shm/fill', '/dev/fill', '/tmp/fill', '/work/fill', '/fill'];

/** Fill `path` until the disk says no; returns the bytes it holds. */
async function fill(shim: import('../../src/shim/node').ShimNode, id: string, path: string): Promise<number> {
  const r = await shim.exec(id, { cmd: `dd if=/dev/zero of=${path} bs=1048576 count=128 2>/dev/null; wc -c < ${path} 2>/dev/null || echo 0` });
  return Number(r.stdout.trim());
}

it(`diskMb: 32 holds 32 MiB in all writable places together, filled in any order`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec({ diskMb: 32, memoryMb: 512 }));
    for (const order of [PLACES, [...PLACES].reverse(), ['/dev/shm/fill', '/dev/fill', '/root/fill']]) {
      const held: Record<string, number> = {};
      for (const p of order) held[p] = await fill(shim, sb.id, p);
      const total = Object.values(held).reduce((a, b) => a + b, 0);
      t.log(`${order[0]} first: ${JSON.stringify(Object.fromEntries(Object.entries(held).map(([k, v]) => [k, Math.round(v / 1024) + 'k'])))}`);
      t.true(total <= 32 * MiB, `together ${total} bytes > 32 MiB`);
      t.true(total >= 30 * MiB, `the budget is usable: ${total} bytes`);
      t.true(held['/dev/fill']! <= 64 * 1024, `/dev holds ${held['/dev/fill']} bytes`);
      await shim.exec(sb.id, { cmd: `rm -f ${order.join(' ')}` });
    }
    // Alone, shared memory may use the whole budget (it is the same budget, not a smaller one).
    t.true((await fill(shim, sb.id, '/dev/shm/fill')) >= 30 * MiB);
    await shim.deleteSandbox(sb.id);
  });
});
