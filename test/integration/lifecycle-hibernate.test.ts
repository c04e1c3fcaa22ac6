/**
 * Hibernate (CRIU checkpoint to disk, restore on the next request). Runs where
 * the `criu` feature probe passes; elsewhere the real test is skipped with the
 * probe's reason and we check that hibernate is refused with NOT_SUPPORTED
 * (never a silent no-op) and leaves the sandbox running.
 */
import test from 'ava';
import { feature, skipReason } from '../../src/features';
import { WarrenError } from '../../src/errors';
import { spec, withShim } from '../helpers/warren';

const base = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer');
const criu = skipReason('criu');
const it = base === null && criu === null ? test : test.skip;
const why = base ?? criu;

it(`hibernate checkpoints to disk, releases the memory and restores on the next request${why ? ` (skipped: ${why})` : ''}`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec());
    await shim.exec(sb.id, { cmd: 'echo kept > /root/f; (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done >/dev/null 2>&1 &)' });
    const h = await shim.hibernateSandbox(sb.id);
    t.is(h.state, 'hibernated');
    t.is(h.reclaim, 'criu');
    t.is(shim.getSandbox(sb.id).state, 'hibernated');
    const c1 = Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout);
    t.is(shim.getSandbox(sb.id).state, 'running');
    await new Promise((r) => setTimeout(r, 300));
    t.true(Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout) > c1);
    t.is((await shim.readFile(sb.id, '/root/f', 100)).toString(), 'kept\n');
    await shim.deleteSandbox(sb.id);
  });
});

(base === null && criu !== null ? test : test.skip)(`without a working CRIU, hibernate is refused with NOT_SUPPORTED and the probe's reason`, async (t) => {
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
