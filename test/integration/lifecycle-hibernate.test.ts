/**
 * Hibernate (CRIU checkpoint to disk, restore on the next request). Runs where
 * the `criu` feature probe passes; elsewhere the real test is skipped with the
 * probe's reason and we check that hibernate is refused with NOT_SUPPORTED
 * (never a silent no-op) and leaves the sandbox running.
 */
import { feature, skipReason } from '../../src/features';
import { WarrenError } from '../../src/errors';
import { spec, withShim } from '../helpers/warren';
import { testUnless } from '../helpers/skip';
import { waitForValue } from '../helpers/wait';

const base = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer');
const criu = skipReason('criu');
testUnless(base ?? criu)(`hibernate checkpoints to disk, releases the memory and restores on the next request`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec());
    await shim.exec(sb.id, { cmd: 'echo kept > /root/f; (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done >/dev/null 2>&1 &)' });
    const h = await shim.hibernateSandbox(sb.id);
    t.is(h.state, 'hibernated');
    t.is(h.reclaim, 'criu');
    t.is(shim.getSandbox(sb.id).state, 'hibernated');
    const c1 = Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout);
    t.is(shim.getSandbox(sb.id).state, 'running');
    const c2 = await waitForValue(async () => Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout), (c) => c > c1, 5000, 'the counter to move on', 50);
    t.true(c2 > c1);
    t.is((await shim.readFile(sb.id, '/root/f', 100)).toString(), 'kept\n');
    await shim.deleteSandbox(sb.id);
  });
});

testUnless(base ?? (criu === null ? 'CRIU works on this kernel, so the refusal path is not reachable' : null))(`without a working CRIU, hibernate is refused with NOT_SUPPORTED and the probe's reason`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec());
    const err = (await t.throwsAsync(shim.hibernateSandbox(sb.id))) as WarrenError;
    t.is(err.code, 'NOT_SUPPORTED');
    t.is(err.status, 501);
    t.true(err.message.includes(feature('criu').reason ?? '???'), err.message);
    t.log(`criu: ${feature('criu').reason}`);
    t.is(shim.getSandbox(sb.id).state, 'running');
    t.is((await shim.exec(sb.id, { cmd: 'echo alive' })).stdout, 'alive\n');
    await shim.deleteSandbox(sb.id);
  });
});
