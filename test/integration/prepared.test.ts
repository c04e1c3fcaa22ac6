/**
 * Prepared sandboxes (src/shim/prepared.ts) against the real kernel: a claimed one is the sandbox
 * a fresh create of the same request makes (limits on the host, what runs and what is written
 * inside, identity, environment and confinement as seen from inside), shapes never mix, and the
 * node leaves nothing behind, prepared ones included.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ExecutionContext } from 'ava';
import { skipReason } from '../../src/features';
import { native } from '../../src/native';
import type { ShimNode } from '../../src/shim/node';
import type { SandboxSpec } from '../../src/shim/types';
import { WarrenClient } from '../../src/sdk';
import { removeTree } from '../../src/shim/layers/sys';
import { busyboxRootfs, closeTestShim, countHostResources, openTestShim, spec, type ShimFixture } from '../helpers/warren';
import { kill9, startWarrenProcess, stopGracefully } from '../helpers/warren-process';
import { testUnless } from '../helpers/skip';
import { waitFor } from '../helpers/wait';

const it = testUnless(skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces'));

const PREPARED = { perShape: 1, maxShapes: 4, idleMs: 60_000 };

async function withPreparedShim(t: ExecutionContext, fn: (f: ShimFixture) => Promise<void>): Promise<void> {
  const nodeId = `pp${(process.pid % 10000).toString(36)}${Math.floor(Math.random() * 1296).toString(36)}`;
  const f = await openTestShim({ nodeId, prepared: PREPARED });
  const scope = { dataDir: f.dataDir, idPrefix: `${nodeId}-` };
  let closed = false;
  try {
    await fn(f);
    for (const s of f.shim.listSandboxes()) await f.shim.deleteSandbox(s.id);
    await f.shim.close();
    closed = true;
    // the prepared ones went with the node: no process, mount or cgroup of this node is left
    const left = countHostResources(scope);
    t.deepEqual({ processes: left.processes, mounts: left.mounts, cgroups: left.cgroups, netns: left.netns }, { processes: 0, mounts: 0, cgroups: 0, netns: 0 });
    t.deepEqual(readdirSync(join(f.dataDir, 'sandboxes')), [], 'no sandbox directory left');
  } finally {
    if (!closed) await f.shim.close().catch(() => undefined);
    await closeTestShim(f, (l) => t.log(l)).catch(() => undefined);
  }
}

/** The ids ready in the pool now. */
function readyIds(shim: ShimNode): string[] {
  return shim.prepared.report().flatMap((r) => r.ready);
}

async function preparedReady(shim: ShimNode): Promise<string> {
  await waitFor(() => readyIds(shim).length > 0, 20_000, 'a prepared sandbox');
  return readyIds(shim)[0]!;
}

/** The limits the host enforces on sandbox `id`, read from its cgroup files. */
function hostLimits(id: string): Record<string, string> {
  const { version, roots } = native.cgroupLayout();
  const read = (root: string | undefined, file: string) => (root !== undefined && existsSync(join(root, id, file)) ? readFileSync(join(root, id, file), 'utf8').trim() : 'absent');
  if (version === 2) {
    return { cpu: read(roots.unified, 'cpu.max'), memory: read(roots.unified, 'memory.max'), swap: read(roots.unified, 'memory.swap.max'), pids: read(roots.unified, 'pids.max') };
  }
  return {
    quota: read(roots.cpu, 'cpu.cfs_quota_us'),
    period: read(roots.cpu, 'cpu.cfs_period_us'),
    memory: read(roots.memory, 'memory.limit_in_bytes'),
    memsw: read(roots.memory, 'memory.memsw.limit_in_bytes'),
    oomControl: read(roots.memory, 'memory.oom_control').split('\n')[0]!,
    pids: read(roots.pids, 'pids.max'),
  };
}

/** What a program inside sees, with the sandbox's own id taken out. */
const PROBE = [
  'echo "shell pid $$"',
  'id',
  'hostname',
  'env | sort',
  // the shell's own glob: no child of it is alive while it lists
  'echo "processes:" /proc/[0-9]*',
  'cat /proc/1/cmdline | tr "\\0" " "; echo',
  'ls -A /tmp /work /root 2>&1',
  'grep -E "^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):" /proc/self/status',
  'ulimit -n; ulimit -f',
  'touch /usr/probe 2>&1; echo "write /usr: $?"',
  'touch /tmp/probe && echo "write /tmp: $?" && rm /tmp/probe',
  'mount | wc -l',
].join('; ');

async function probe(shim: ShimNode, id: string): Promise<string> {
  const r = await shim.exec(id, { cmd: PROBE, user: '1000:1000' });
  return `exit ${r.exitCode}\n${r.stdout}${r.stderr}`.split(id).join('<id>');
}

it.serial('a claimed prepared sandbox is the sandbox a fresh create makes: limits, processes, files, identity, env and confinement', async (t) => {
  t.timeout(120_000);
  await withPreparedShim(t, async ({ shim, dataDir }) => {
    // the first create of the shape is fresh, and asks the pool for one like it
    const first = await shim.createSandbox(spec({ cpu: 1, memoryMb: 256, pids: 256 }));
    const ready = await preparedReady(shim);
    t.false(readyIds(shim).includes(first.id));

    // another request of the same shape, with everything a claim sets different
    const request: SandboxSpec = spec({ cpu: 0.5, memoryMb: 96, pids: 40, env: { PROBE_VAR: 'claimed' }, labels: { k: 'v' } });
    const claimed = await shim.createSandbox(request);
    t.is(claimed.id, ready, 'the create took the prepared sandbox');
    t.false(readyIds(shim).includes(claimed.id));
    t.deepEqual(claimed.labels, { k: 'v' });

    // the same request made fresh: empty the pool first
    await shim.prepared.flush();
    const fresh = await shim.createSandbox(request);
    t.not(fresh.id, ready);

    // the host enforces the request's limits on both, exactly as on a fresh one
    t.deepEqual(hostLimits(claimed.id), hostLimits(fresh.id));
    const limits = hostLimits(claimed.id);
    if (native.cgroupLayout().version === 1) {
      t.is(limits.quota, '50000');
      t.is(limits.memory, String(96 * 1024 * 1024));
      t.is(limits.pids, '40');
    } else {
      t.is(limits.cpu, '50000 100000');
      t.is(limits.memory, String(96 * 1024 * 1024));
      t.is(limits.pids, '40');
    }

    // nothing ran in it before: the first exec sees what it sees in a fresh sandbox
    const [inClaimed, inFresh] = [await probe(shim, claimed.id), await probe(shim, fresh.id)];
    t.is(inClaimed, inFresh);
    t.regex(inClaimed, /^exit 0\n/);
    t.regex(inClaimed, /PROBE_VAR=claimed/);
    t.regex(inClaimed, /uid=1000 gid=1000/);
    t.regex(inClaimed, /write \/usr: 1/, 'the image stays read-only');
    t.regex(inClaimed, /write \/tmp: 0/);

    // and its writable layer holds what a fresh one holds
    const upper = (id: string) => readdirSync(join(dataDir, 'sandboxes', id, 'upper')).sort();
    t.deepEqual(upper(claimed.id), upper(fresh.id));

    // the claimed sandbox is an ordinary one from here on: stats, delete
    t.true((await shim.sandboxStats(claimed.id))!.pidsCurrent >= 1);
    await shim.deleteSandbox(claimed.id);
    t.false(existsSync(join(dataDir, 'sandboxes', claimed.id)));
  });
});

it.serial('shapes never mix: another disk quota, scheduling class or image is made fresh; network sandboxes are never prepared', async (t) => {
  t.timeout(120_000);
  await withPreparedShim(t, async ({ shim }) => {
    await shim.createSandbox(spec({ diskMb: 64 }));
    const ready = await preparedReady(shim);
    for (const other of [spec({ diskMb: 128 }), spec({ diskMb: 64, priority: 'idle' }), spec({ diskMb: null })]) {
      const info = await shim.createSandbox(other);
      t.not(info.id, ready, `not from the prepared one: ${JSON.stringify({ diskMb: other.diskMb, priority: other.priority })}`);
    }
    t.true(readyIds(shim).includes(ready), 'the prepared one is still there for its own shape');
    const same = await shim.createSandbox(spec({ diskMb: 64, memoryMb: 128 }));
    t.is(same.id, ready);

    const container = shim.backends.get('container');
    t.is(container.preparedShape!(spec({ network: { pypi: true } } as Partial<SandboxSpec>), ['sha256:x']), null);
    t.not(container.preparedShape!(spec(), ['sha256:x']), container.preparedShape!(spec(), ['sha256:y']), 'the layers are part of the shape');
  });
});

it.serial('removing an image gives back the prepared sandboxes that hold its layers instead of answering IMAGE_IN_USE', async (t) => {
  t.timeout(120_000);
  await withPreparedShim(t, async ({ shim }) => {
    await shim.deleteSandbox((await shim.createSandbox(spec())).id);
    await preparedReady(shim);
    const removed = await shim.removeImage('busybox');
    t.is(removed.name, 'busybox');
    t.deepEqual(readyIds(shim), []);
  });
});

it.serial('a prepared sandbox whose pid 1 is killed is never handed out; creates of its shape go on working', async (t) => {
  t.timeout(120_000);
  await withPreparedShim(t, async ({ shim }) => {
    await shim.deleteSandbox((await shim.createSandbox(spec())).id);
    const ready = await preparedReady(shim);
    native.cgroupKill(ready);
    await waitFor(() => !readyIds(shim).includes(ready), 10_000, 'the dead one out of the pool');
    const info = await shim.createSandbox(spec());
    t.not(info.id, ready);
    t.is((await shim.exec(info.id, { cmd: 'echo alive' })).stdout, 'alive\n');
  });
});

it.serial('a node killed with -9 while it holds prepared sandboxes removes them when it starts again; the claimed one is re-adopted', async (t) => {
  t.timeout(180_000);
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-prepared-kill-'));
  const nodeId = `pk${(process.pid % 10000).toString(36)}`;
  const scope = { dataDir, idPrefix: `${nodeId}-` };
  const log: string[] = [];
  let child: ChildProcess | null = null;
  try {
    const first = await startWarrenProcess(dataDir, nodeId, ['--prepared', '2'], log);
    child = first.child;
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    let client = new WarrenClient({ url: first.url, token });
    await client.images.import('busybox', await busyboxRootfs(), { type: 'directory' });
    const kept = await client.createSandbox({ image: 'busybox' });
    await waitFor(async () => ((await client.features()).capacity as { prepared?: { ready: number } } | undefined)?.prepared?.ready === 2, 30_000, 'two prepared sandboxes', 100);
    const before = countHostResources(scope);
    t.true(before.processes >= 3, `the sandbox and two prepared ones run: ${JSON.stringify(before)}`);
    await kill9(child);
    child = null;
    await client.close();
    const second = await startWarrenProcess(dataDir, nodeId, ['--prepared', '0'], log);
    child = second.child;
    client = new WarrenClient({ url: second.url, token });
    t.deepEqual((await client.listSandboxes()).map((s) => `${s.id} ${s.state}`), [`${kept.id} running`]);
    t.is((await client.getSandbox(kept.id)).info!.state, 'running');
    t.deepEqual(readdirSync(join(dataDir, 'sandboxes')), [kept.id], 'the prepared ones are gone from disk');
    const after = countHostResources(scope);
    t.is(after.processes, 1, `only the kept sandbox's pid 1 is left: ${JSON.stringify(after)}`);
    t.is(log.join('').match(/left on the host without a record/g)?.length, 2, 'both prepared sandboxes were found and removed');
    await client.deleteSandbox(kept.id);
    await client.close();
    await stopGracefully(child);
    child = null;
    const left = countHostResources(scope);
    t.deepEqual({ processes: left.processes, mounts: left.mounts, cgroups: left.cgroups, netns: left.netns }, { processes: 0, mounts: 0, cgroups: 0, netns: 0 });
  } finally {
    if (child) await kill9(child);
    removeTree(dataDir);
  }
});
