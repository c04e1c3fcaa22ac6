/**
 * Density at a size CI affords: WARREN_DENSITY_N (default 1,000) idle sandboxes alive at once in
 * one real `warren up`, then all deleted, with exact counts before and after: processes, mounts,
 * cgroups and network namespaces on the host, and the gateway's own descriptors (one pidfd per
 * sandbox while they live, none after). A page of the list and an exec in the newest sandbox are
 * served while all of them are alive. `npm run bench` with BENCH_DENSITY=10000 is the full size.
 */
import { mkdtempSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WarrenClient } from '../../src/sdk';
import { skipReason } from '../../src/features';
import { removeTree } from '../../src/shim/layers/sys';
import { busyboxRootfs, countHostResources } from '../helpers/warren';
import { startWarrenProcess, stopNode } from '../helpers/warren-process';
import { testUnless } from '../helpers/skip';

const N = Number(process.env.WARREN_DENSITY_N ?? 1000);
const it = testUnless(skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces'));

/** The gateway's descriptors other than sockets (client connections come and go with the client's pool). */
function fdKinds(pid: number): { total: number; pidfds: number } {
  let total = 0;
  let pidfds = 0;
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      if (target.startsWith('socket:')) continue;
      total++;
      if (target === 'anon_inode:[pidfd]') pidfds++;
    } catch {
      /* closed meanwhile */
    }
  }
  return { total, pidfds };
}

async function pool(count: number, concurrency: number, fn: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let i = next++; i < count; i = next++) await fn(i);
    }),
  );
}

it.serial(`density: ${N} idle sandboxes alive at once, then none; processes, mounts, cgroups, netns and gateway descriptors come back exactly`, async (t) => {
  t.timeout(240_000);
  const nodeId = `dn${process.pid % 10000}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-density-'));
  // Without prepared sandboxes: the counts below are per sandbox, and the node would hold a few
  // more, made in the background (their own counts are test/integration/prepared.test.ts's).
  const w = await startWarrenProcess(dataDir, nodeId, ['--prepared', '0']);
  const client = new WarrenClient({ url: w.url, token: readFileSync(join(dataDir, 'admin.token'), 'utf8').trim() });
  const scope = { dataDir, idPrefix: `${nodeId}-` };
  try {
    await client.images.import('busybox', await busyboxRootfs());
    // the first sandbox mounts the image's layer (a node cache that stays): warm it before counting
    await client.deleteSandbox((await client.createSandbox({ image: 'busybox' })).id);
    const hostBefore = countHostResources(scope);
    const fdsBefore = fdKinds(w.child.pid!);

    const ids: string[] = new Array(N);
    await pool(N, 8, async (i) => {
      ids[i] = (await client.createSandbox({ image: 'busybox', memoryMb: 16, cpu: 0.1, priority: 'idle', diskMb: 16 })).id;
    });
    const during = countHostResources(scope);
    t.is(during.processes - hostBefore.processes, N, 'one process (pid 1) per idle sandbox');
    const cgroupsEach = (during.cgroups - hostBefore.cgroups) / N;
    t.true(Number.isInteger(cgroupsEach) && cgroupsEach >= 1, `the same cgroups for every sandbox (${cgroupsEach} each)`);
    t.is(during.netns - hostBefore.netns, N, 'one network namespace per sandbox');
    const fdsDuring = fdKinds(w.child.pid!);
    t.is(fdsDuring.pidfds - fdsBefore.pidfds, N, 'the gateway holds one pidfd per sandbox');
    t.true(fdsDuring.total - fdsBefore.total <= N + 8, `and little else: ${fdsDuring.total - fdsBefore.total} descriptors for ${N} sandboxes`);

    // per-node calls keep working at this size: a page of the list, the count, an exec
    const page = await client.listSandboxesPage({ limit: 100 });
    t.is(page.sandboxes.length, 100);
    t.truthy(page.next);
    const second = await client.listSandboxesPage({ limit: 100, after: page.next! });
    t.true(second.sandboxes.every((s) => s.id > page.next!), 'the next page starts after the cursor');
    t.is((await client.listSandboxes()).length, N);
    t.is((await client.sandbox(ids[N - 1]!).exec('echo ok')).stdout, 'ok\n');

    await pool(N, 8, async (i) => client.deleteSandbox(ids[i]!));
    t.deepEqual(countHostResources(scope), hostBefore);
    const fdsAfter = fdKinds(w.child.pid!);
    t.is(fdsAfter.pidfds, fdsBefore.pidfds, 'no pidfd left');
    t.is(fdsAfter.total, fdsBefore.total, 'no descriptor left');
    t.is(w.child.exitCode, null);
    // and once the node stops, nothing of it is left: its pool's prepared sandboxes go with it
    await stopNode(w.child);
    const left = countHostResources(scope);
    t.deepEqual({ processes: left.processes, cgroups: left.cgroups, netns: left.netns, mounts: left.mounts }, { processes: 0, cgroups: 0, netns: 0, mounts: 0 });
  } finally {
    for (const s of await client.listSandboxes().catch(() => [])) await client.deleteSandbox(s.id).catch(() => undefined);
    await client.close().catch(() => undefined);
    await stopNode(w.child);
    removeTree(dataDir);
  }
});
