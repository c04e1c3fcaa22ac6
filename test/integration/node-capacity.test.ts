/**
 * A node out of a host resource refuses creates with 503 NODE_AT_CAPACITY and goes on serving
 * everything else; it never crashes. The gateway is a real `warren up` started with a lowered
 * RLIMIT_NOFILE (prlimit) or a lowered cap on host tasks, and filled with sandboxes.
 */
import { mkdtempSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WarrenClient, WarrenError } from '../../src/sdk';
import { skipReason } from '../../src/features';
import { hostTasks } from '../../src/shim/capacity';
import { removeTree } from '../../src/shim/layers/sys';
import { busyboxRootfs, countHostResources } from '../helpers/warren';
import { startWarrenProcess, stopNode, type WarrenProcess } from '../helpers/warren-process';
import { testUnless } from '../helpers/skip';
import { waitForValue } from '../helpers/wait';

const it = testUnless(skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces'));

function pidfdsOf(pid: number): number {
  let n = 0;
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      if (readlinkSync(`/proc/${pid}/fd/${fd}`) === 'anon_inode:[pidfd]') n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}

async function fillUntilRefused(client: WarrenClient, max: number): Promise<{ ids: string[]; refusal: WarrenError | null }> {
  const ids: string[] = [];
  for (let i = 0; i < max; i++) {
    try {
      ids.push((await client.createSandbox({ image: 'busybox', memoryMb: 32 })).id);
    } catch (err) {
      if (err instanceof WarrenError) return { ids, refusal: err };
      throw err;
    }
  }
  return { ids, refusal: null };
}

/** `prepared`: the node keeps prepared sandboxes (the default of `warren up`); without, the counts below are exactly the live sandboxes'. */
async function withGateway(t: { teardown(fn: () => Promise<void> | void): void }, nodeId: string, opts: Parameters<typeof startWarrenProcess>[4], prepared = false): Promise<{ w: WarrenProcess; client: WarrenClient; dataDir: string }> {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-capacity-'));
  const w = await startWarrenProcess(dataDir, nodeId, prepared ? [] : ['--prepared', '0'], undefined, opts);
  const client = new WarrenClient({ url: w.url, token: readFileSync(join(dataDir, 'admin.token'), 'utf8').trim() });
  t.teardown(async () => {
    // a failed assertion must not leave the sandboxes running after the gateway is gone
    for (const s of await client.listSandboxes().catch(() => [])) await client.deleteSandbox(s.id).catch(() => undefined);
    await client.close().catch(() => undefined);
    await stopNode(w.child);
    removeTree(dataDir);
  });
  await client.images.import('busybox', await busyboxRootfs());
  return { w, client, dataDir };
}

async function stillServing(t: import('ava').ExecutionContext, client: WarrenClient, w: WarrenProcess, ids: string[]): Promise<void> {
  // everything but creates goes on: list, get, exec, files, features, delete
  t.is((await client.listSandboxes()).length, ids.length);
  const sb = await client.getSandbox(ids[0]!);
  const r = await sb.exec('echo alive');
  t.is(r.stdout, 'alive\n');
  await sb.writeFile('/tmp/x', 'y');
  t.is((await sb.readFile('/tmp/x')).toString(), 'y');
  t.truthy((await client.features()).capacity);
  t.is(w.child.exitCode, null, 'the gateway is alive');
}

it.serial('descriptors: a gateway at its RLIMIT_NOFILE refuses creates with 503 NODE_AT_CAPACITY (fds) and keeps serving', async (t) => {
  const nodeId = `cf${process.pid % 10000}`;
  const { w, client, dataDir } = await withGateway(t, nodeId, { wrap: ['prlimit', '--nofile=400:400', '--'] });
  const before = pidfdsOf(w.child.pid!);
  const { ids, refusal } = await fillUntilRefused(client, 400);
  t.truthy(refusal, `a create was refused within 400 (made ${ids.length})`);
  t.is(refusal!.status, 503);
  t.is(refusal!.code, 'NODE_AT_CAPACITY');
  t.is((refusal!.details as { resource?: string }).resource, 'fds');
  t.true(ids.length > 10, `sandboxes fit before the reserve: ${ids.length}`);
  // one descriptor per sandbox: pid 1's pidfd, held by the exit watcher
  t.is(pidfdsOf(w.child.pid!) - before, ids.length);
  await stillServing(t, client, w, ids);
  // room again after some deletes
  for (let i = 0; i < 8; i++) await client.deleteSandbox(ids.pop()!);
  ids.push((await client.createSandbox({ image: 'busybox', memoryMb: 32 })).id);
  for (const id of ids) await client.deleteSandbox(id);
  t.is(pidfdsOf(w.child.pid!), before);
  const left = countHostResources({ dataDir, idPrefix: `${nodeId}-` });
  t.is(left.processes, 0);
  t.is(left.cgroups, 0);
});

it.serial('pids: a host at its task cap refuses creates with 503 NODE_AT_CAPACITY (pids) and keeps serving', async (t) => {
  const nodeId = `cp${process.pid % 10000}`;
  // the default reserve is 512 tasks (2% of a larger limit); 150 more tasks than now leaves room for
  // the gateway's own threads and some sandboxes, whatever else starts or ends on the host meanwhile
  const tasksMax = hostTasks() + 512 + 150;
  const { w, client, dataDir } = await withGateway(t, nodeId, { env: { WARREN_HOST_TASKS_MAX: String(tasksMax) } });
  const { ids, refusal } = await fillUntilRefused(client, 600);
  t.truthy(refusal, `a create was refused within 600 (made ${ids.length})`);
  t.is(refusal!.status, 503);
  t.is(refusal!.code, 'NODE_AT_CAPACITY');
  t.is((refusal!.details as { resource?: string }).resource, 'pids');
  t.true(ids.length >= 1, `at least one sandbox fit under the cap (${ids.length})`);
  await stillServing(t, client, w, ids);
  for (const id of ids) await client.deleteSandbox(id);
  const left = countHostResources({ dataDir, idPrefix: `${nodeId}-` });
  t.is(left.processes, 0);
  t.is(left.cgroups, 0);
});

it.serial('pids, with prepared sandboxes: the node gives them back before it refuses a create, so none holds tasks at the cap', async (t) => {
  const nodeId = `cq${process.pid % 10000}`;
  const tasksMax = hostTasks() + 512 + 150;
  const { w, client, dataDir } = await withGateway(t, nodeId, { env: { WARREN_HOST_TASKS_MAX: String(tasksMax) } }, true);
  // the pool has some ready before the node fills up
  await client.deleteSandbox((await client.createSandbox({ image: 'busybox', memoryMb: 32 })).id);
  const ready = async () => ((await client.features()).capacity as { prepared: { ready: number } }).prepared.ready;
  t.true((await waitForValue(ready, (n) => n > 0, 20_000, 'prepared sandboxes made', 50)) > 0);
  const { ids, refusal } = await fillUntilRefused(client, 600);
  t.truthy(refusal, `a create was refused within 600 (made ${ids.length})`);
  t.is(refusal!.code, 'NODE_AT_CAPACITY');
  t.is(await ready(), 0, 'no prepared sandbox is left holding tasks while creates are refused');
  t.is(countHostResources({ dataDir, idPrefix: `${nodeId}-` }).processes, ids.length, 'every process of the node is a live sandbox');
  await stillServing(t, client, w, ids);
  for (const id of ids) await client.deleteSandbox(id);
  // the node's own stop gives back what its pool made since
  await stopNode(w.child);
  const left = countHostResources({ dataDir, idPrefix: `${nodeId}-` });
  t.is(left.processes, 0);
  t.is(left.cgroups, 0);
});
