/** Swap for paused sandboxes: a real zram device (adopted across restarts, removed by teardown) and zswap toggling. */
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ZramSwap, setZswap } from '../../src/shim/lifecycle/swap';
import { rootSkipReason } from '../helpers/warren';
import { withSwapLock, zramSkipReason } from './lifecycle-fixture';
import { testUnless } from '../helpers/skip';

const skip = rootSkipReason() ?? zramSkipReason();
const it = testUnless(skip).serial;
const swaps = () => readFileSync('/proc/swaps', 'utf8');

it(`a zram swap device is created, adopted by a restarted node, and removed without a trace`, (t) => withSwapLock(async () => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-zramtest-'));
  const first = new ZramSwap(dir);
  try {
    const st = await first.setup({ sizeBytes: 64 * 1024 * 1024 });
    const dev = `/dev/zram${st.device}`;
    t.true(swaps().includes(dev));
    t.is(Number(readFileSync(`/sys/block/zram${st.device}/disksize`, 'utf8')), 64 * 1024 * 1024);
    // a restarted gateway (same state dir) adopts the device instead of adding another
    const second = new ZramSwap(dir);
    t.is((await second.setup({ sizeBytes: 64 * 1024 * 1024 })).device, st.device);
    await second.teardown();
    t.false(swaps().includes(dev));
    t.false(existsSync(`/sys/block/zram${st.device}`));
    t.false(existsSync(join(dir, 'zram.json')));
    await first.teardown(); // idempotent
  } finally {
    await first.teardown().catch(() => undefined);
    rmSync(dir, { recursive: true, force: true });
  }
}));

testUnless(skip ?? (existsSync('/sys/module/zswap/parameters/enabled') ? null : 'this kernel has no zswap')).serial(`zswap can be turned on and put back`, async (t) => {
  const before = await setZswap(true);
  try {
    t.regex(readFileSync('/sys/module/zswap/parameters/enabled', 'utf8'), /^[Y1]/);
  } finally {
    await setZswap(before);
  }
  t.is(/^[Y1]/.test(readFileSync('/sys/module/zswap/parameters/enabled', 'utf8')), before);
});
