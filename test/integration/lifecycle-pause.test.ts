/**
 * Pause gives memory back (freeze + reclaim into a real zram swap device) and
 * resume restores everything: processes (a memory pattern intact, a background
 * counter that keeps counting), files and shell sessions. Requests to a paused
 * sandbox resume it transparently; a label selector pauses a whole job.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { countHostResources, spec, withShim } from '../helpers/warren';
import { memhogBinary, memhogCheck, memhogSkipReason, startMemhog, withZramSwap, zramSkipReason } from './lifecycle-fixture';
import { testUnless } from '../helpers/skip';
import { elapse, waitFor, waitForValue } from '../helpers/wait';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer') ?? zramSkipReason() ?? memhogSkipReason();
const it = testUnless(skip).serial;
const MIB = 1024 * 1024;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

it(`pause releases the memory of a sandbox holding 200 MiB and resume restores it exactly`, async (t) => {
  await withZramSwap(1024, async (swap) => {
    await withShim(t, async ({ shim, dataDir }) => {
      const sb = await shim.createSandbox(spec({ memoryMb: 512 }));
      t.log(`sandbox ${sb.id}`);
      await shim.writeFile(sb.id, '/bin/memhog', memhogBinary(), 0o755);
      await shim.exec(sb.id, { cmd: '(memhog 200 /tmp/hog 50 >/dev/null 2>&1 &); (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done >/dev/null 2>&1 &); echo keep > /root/file' });
      for (let i = 0; i < 200 && (await shim.exec(sb.id, { cmd: 'cat /tmp/hog 2>/dev/null' })).stdout !== 'ready\n'; i++) await sleep(50);
      const session = await shim.openSession(sb.id, { mode: 'command' });
      t.is((await session.run('c1', 'cd /root && export PAUSED=no')).exitCode, 0);

      const paused = await shim.pauseSandbox(sb.id);
      t.log(`pause: ${JSON.stringify(paused)}`);
      t.is(paused.state, 'paused');
      t.is(paused.reclaim === 'limit' || paused.reclaim === 'memory.reclaim', true);
      t.true(paused.memoryBeforeBytes > 200 * MIB, `before: ${paused.memoryBeforeBytes}`);
      t.true(paused.releasedBytes > 180 * MIB, `released ${(paused.releasedBytes / MIB).toFixed(1)} MiB`);
      t.true(paused.memoryAfterBytes < 24 * MIB, `after: ${(paused.memoryAfterBytes / MIB).toFixed(1)} MiB`);
      t.is(shim.getSandbox(sb.id).state, 'paused');
      // The sandbox's own swap count (memsw - usage of its cgroup): the swap spreads pages over every
      // device of the same priority, and another test may have one of its own at the same moment.
      t.true(paused.swapBytes !== null && paused.swapBytes > 150 * MIB, `swapped: ${paused.swapBytes}`);
      const usage = await swap.usage();
      t.true(usage !== null && usage.origDataBytes > 0, `zram holds ${JSON.stringify(usage)}`);

      // Frozen: the counter does not move while paused (read from the host, which does not resume it).
      const upperCount = () => readFileSync(join(dataDir, 'sandboxes', sb.id, 'upper', 'tmp', 'count'), 'utf8');
      const frozenAt = upperCount();
      await elapse(300, 'a running loop would have written several times by now');
      t.is(upperCount(), frozenAt, 'nothing runs while paused');
      t.is(shim.getSandbox(sb.id).state, 'paused', 'reading metadata does not resume');
      t.true(Number((await shim.readFile(sb.id, '/tmp/count', 100)).toString()) >= Number(frozenAt));
      t.is(shim.getSandbox(sb.id).state, 'running', 'a file request resumed it transparently');

      // Pause again and let a session command resume it.
      await shim.pauseSandbox(sb.id);
      const count1 = Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout);
      const count2 = await waitForValue(async () => Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout), (c) => c > count1, 5000, 'the counter to move after the resume', 50);
      t.true(count2 > count1, `the background counter keeps counting after resume (${count1} -> ${count2})`);
      t.is(await memhogCheck(shim, sb.id), 'ok\n', 'all 200 MiB came back intact');
      t.is((await shim.readFile(sb.id, '/root/file', 100)).toString(), 'keep\n');

      await shim.pauseSandbox(sb.id);
      const out: string[] = [];
      session.onOutput((o) => void out.push(o.data.toString()));
      const r = await session.run('c2', 'pwd; echo $PAUSED');
      t.is(r.exitCode, 0);
      await waitFor(() => out.join('').includes('/root\nno\n'), 5000, 'the command output').catch(() => undefined);
      t.true(out.join('').includes('/root\nno\n'), `session state survived: ${JSON.stringify(out.join(''))}`);
      t.is(shim.getSandbox(sb.id).state, 'running');
      session.detach();

      const resumed = await shim.resumeSandbox(sb.id);
      t.false(resumed.changed);
      await shim.deleteSandbox(sb.id);
    });
  });
});

it(`pausing again at once after a resume, its memory just read back and the prefetch still reading, gives it all back and kills nothing`, async (t) => {
  await withZramSwap(1024, async () => {
    await withShim(t, async ({ shim }) => {
      const sb = await shim.createSandbox(spec({ memoryMb: 512 }));
      const pid = await startMemhog(shim, sb.id, 200);
      t.regex(pid, /^\d+$/);
      for (let i = 0; i < 3; i++) {
        const p = await shim.pauseSandbox(sb.id);
        t.true(p.swapBytes !== null && p.swapBytes > 150 * MIB, `pause ${i}: ${JSON.stringify(p)}`);
        await shim.resumeSandbox(sb.id); // its prefetch reads 200 MiB back in the background
      }
      t.is((await shim.exec(sb.id, { cmd: 'pidof memhog' })).stdout.trim(), pid, 'memhog is still the same process');
      t.is(await memhogCheck(shim, sb.id), 'ok\n');
      await shim.deleteSandbox(sb.id);
    });
  });
});

it(`swapping off the device that holds a paused sandbox's pages brings them back, killing nothing`, async (t) => {
  await withZramSwap(512, async (swap) => {
    await withShim(t, async ({ shim }) => {
      const sb = await shim.createSandbox(spec({ memoryMb: 256 }));
      const pid = await startMemhog(shim, sb.id, 64);
      const p = await shim.pauseSandbox(sb.id);
      t.true(p.swapBytes !== null && p.swapBytes > 48 * MIB, JSON.stringify(p));
      // as another test, or an operator, would: the swap goes away while the sandbox is paused
      await swap.teardown();
      t.is(shim.getSandbox(sb.id).state, 'paused');
      t.is((await shim.exec(sb.id, { cmd: 'pidof memhog' })).stdout.trim(), pid, 'memhog is still the same process');
      t.is(await memhogCheck(shim, sb.id), 'ok\n');
      await shim.deleteSandbox(sb.id);
    });
  });
});

it(`a label selector pauses and resumes every sandbox of a job`, async (t) => {
  await withZramSwap(256, async () => {
    await withShim(t, async ({ shim, dataDir }) => {
      const a = await shim.createSandbox(spec({ labels: { job: 'j1' } }));
      const b = await shim.createSandbox(spec({ labels: { job: 'j1' } }));
      const c = await shim.createSandbox(spec({ labels: { job: 'j2' } }));
      const results = await shim.pauseSandboxes({ labels: { job: 'j1' } });
      t.deepEqual(results.map((r) => r.id).sort(), [a.id, b.id].sort());
      t.is(shim.getSandbox(a.id).state, 'paused');
      t.is(shim.getSandbox(b.id).state, 'paused');
      t.is(shim.getSandbox(c.id).state, 'running');
      const again = await shim.pauseSandboxes({ labels: { job: 'j1' } });
      t.true(again.every((r) => !r.changed));
      const resumed = await shim.resumeSandboxes({ labels: { job: 'j1' } });
      t.true(resumed.every((r) => r.changed && r.state === 'running'));
      // Deleting a paused sandbox works and leaves nothing.
      await shim.pauseSandbox(a.id);
      for (const s of [a, b, c]) await shim.deleteSandbox(s.id);
      const left = countHostResources({ dataDir, idPrefix: `${a.id.split('-')[0]}-` });
      t.is(left.processes, 0);
      t.is(left.cgroups, 0);
    });
  });
});

it(`idle reclaim gives the cold memory of a running sandbox back, keeps it running with its memory intact, and again after activity`, async (t) => {
  t.timeout(5 * 60_000);
  await withZramSwap(512, async (swap) => {
    await withShim(t, async ({ shim }) => {
      const sb = await shim.createSandbox(spec({ memoryMb: 256, lifetime: { idleSeconds: 1, onIdle: 'reclaim' } }));
      await shim.writeFile(sb.id, '/bin/memhog', memhogBinary(), 0o755);
      // 96 MiB written once and then left alone: cold; the counter keeps a few pages hot
      await shim.exec(sb.id, { cmd: '(memhog 96 /tmp/hog 50 >/dev/null 2>&1 &); (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done >/dev/null 2>&1 &)' });
      await waitFor(async () => (await shim.exec(sb.id, { cmd: 'cat /tmp/hog 2>/dev/null' })).stdout === 'ready\n', 30_000, 'memhog ready');
      const first = await waitForValue(() => shim.getSandbox(sb.id).lifecycle?.coldReclaim, (r) => r !== undefined, 60_000, 'the idle reclaim', 100);
      t.log(`idle reclaim: ${JSON.stringify(first)}`);
      t.is(shim.getSandbox(sb.id).state, 'running', 'reclaim does not pause');
      t.true(first!.coldBytes > 48 * MIB, `cold: ${(first!.coldBytes / MIB).toFixed(1)} MiB`);
      t.true(first!.releasedBytes > 48 * MIB, `released ${(first!.releasedBytes / MIB).toFixed(1)} MiB`);
      // where the pages went is the swap's business (other tests' devices have the same priority): the
      // released bytes above and the pages read back intact below are this sandbox's own account
      t.true(((await swap.usage())?.origDataBytes ?? 0) > 0, 'zram received pages');
      // still running: the counter moves, and every page of the hog comes back intact
      const c1 = Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout);
      await waitFor(async () => Number((await shim.exec(sb.id, { cmd: 'cat /tmp/count' })).stdout) > c1, 30_000, 'the counter to keep counting');
      t.is(await memhogCheck(shim, sb.id), 'ok\n', 'the cold pages came back intact');
      // that activity started a new idle period: it is reclaimed again once idle
      const second = await waitForValue(() => shim.getSandbox(sb.id).lifecycle?.coldReclaim, (r) => r !== undefined && r.at !== first!.at, 60_000, 'a second idle reclaim', 100);
      t.true(Date.parse(second!.at) > Date.parse(first!.at));
      t.is(shim.getSandbox(sb.id).state, 'running');
      await shim.deleteSandbox(sb.id);
    });
  });
});
