/**
 * Lifetime policies survive a gateway crash: a real `warren up` is SIGKILLed
 * right after sandboxes with short ttl/idle policies are created; a second
 * `warren up` on the same data dir fires the policies whose deadlines passed
 * while it was down at once, and the others on time. An extension made before
 * the crash is kept.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { WarrenClient } from '../../src/sdk';
import type { SandboxInfo } from '../../src/shim/types';
import { readMountInfo, removeTree } from '../../src/shim/layers/sys';
import { ZramSwap } from '../../src/shim/lifecycle/swap';
import { busyboxRootfs, countHostResources } from '../helpers/warren';
import { withSwapLock, zramSkipReason } from './lifecycle-fixture';
import { kill9, startWarrenProcess } from '../helpers/warren-process';
import { testUnless } from '../helpers/skip';
import { elapse } from '../helpers/wait';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer') ?? zramSkipReason();
const it = testUnless(skip);

function startUp(dataDir: string, nodeId: string, log: string[]) {
  return startWarrenProcess(dataDir, nodeId, ['--zram-swap-mb', '128'], log);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function waitFor(client: WarrenClient, id: string, pred: (s: SandboxInfo) => boolean, ms: number): Promise<SandboxInfo> {
  const until = Date.now() + ms;
  let last: SandboxInfo = (await client.getSandbox(id)).info!;
  while (!pred(last) && Date.now() < until) {
    await sleep(100);
    last = (await client.getSandbox(id)).info!;
  }
  return last;
}

it(`ttl and idle policies fire after a gateway kill -9 and restart`, (t) => withSwapLock(async () => {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-lcrestart-'));
  const nodeId = `l${process.pid.toString(36)}`;
  const log: string[] = [];
  let child: ChildProcess | null = null;
  let client: WarrenClient | null = null;
  try {
    const first = await startUp(dataDir, nodeId, log);
    child = first.child;
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    const zram = JSON.parse(readFileSync(join(dataDir, 'lifecycle', 'zram.json'), 'utf8')) as { device: number };
    t.true(readFileSync('/proc/swaps', 'utf8').includes(`/dev/zram${zram.device}`), 'warren up --zram-swap-mb set up a swap device');
    client = new WarrenClient({ url: first.url, token });
    await client.images.import('busybox', await busyboxRootfs(), { type: 'directory' });

    const ttlLater = await client.createSandbox({ image: 'busybox', ttlSeconds: 9 });
    const idlePause = await client.createSandbox({ image: 'busybox', idleSeconds: 2, onIdle: 'pause' });
    const idleStop = await client.createSandbox({ image: 'busybox', idleSeconds: 2, onIdle: 'stop' });
    const extended = await client.createSandbox({ image: 'busybox', ttlSeconds: 2 });
    const plain = await client.createSandbox({ image: 'busybox' });
    const before = (await extended.extend({ seconds: 600 })).lifecycle!;
    t.true(Date.parse(before.expiresAt!) > Date.now() + 590_000);
    await idlePause.exec('echo state > /root/f; (while :; do sleep 0.1; done &)');
    t.log(`sandboxes: ${[ttlLater, idlePause, idleStop, extended, plain].map((s) => s.id).join(' ')}`);

    await kill9(child);
    child = null;
    await client.close();
    client = null;
    // The idle deadlines (2 s) and the original ttl of `extended` pass while no gateway runs.
    await elapse(3000, 'the idle deadlines and the original ttl pass while no gateway runs');

    const second = await startUp(dataDir, nodeId, log);
    child = second.child;
    client = new WarrenClient({ url: second.url, token });
    t.deepEqual(JSON.parse(readFileSync(join(dataDir, 'lifecycle', 'zram.json'), 'utf8')), { ...zram }, 'the restarted node adopted the same zram device');
    const p = await waitFor(client, idlePause.id, (s) => s.state === 'paused', 5000);
    t.is(p.state, 'paused', 'the idle pause fired after the restart');
    const s = await waitFor(client, idleStop.id, (x) => x.state === 'stopped', 5000);
    t.is(s.state, 'stopped');
    t.is(s.lifecycle?.stopReason, 'idle');
    t.is((await client.getSandbox(extended.id)).state, 'running', 'the extension survived the restart');
    t.is((await client.getSandbox(plain.id)).state, 'running');
    t.is((await client.getSandbox(ttlLater.id)).state, 'running', 'not yet due');
    const tl = await waitFor(client, ttlLater.id, (x) => x.state === 'stopped', 10_000);
    t.is(tl.state, 'stopped', 'the ttl fired in the new process, on time');
    t.is(tl.lifecycle?.stopReason, 'ttl');
    t.true(Date.now() >= Date.parse(ttlLater.info!.createdAt) + 9000);

    // A request to the paused sandbox resumes it transparently.
    const r = await (await client.getSandbox(idlePause.id)).exec('cat /root/f');
    t.is(r.stdout, 'state\n');
    t.is((await client.getSandbox(idlePause.id)).state, 'running');

    for (const sb of [ttlLater, idlePause, idleStop, extended, plain]) await client.deleteSandbox(sb.id);
    const left = countHostResources({ dataDir, idPrefix: `${nodeId}-` });
    t.is(left.processes, 0);
    t.is(left.cgroups, 0);
  } catch (err) {
    t.log(log.join('').slice(-4000));
    throw err;
  } finally {
    if (child) await kill9(child);
    await client?.close();
    // The device outlives gateways by design (paused sandboxes' pages live there): the test removes it.
    await new ZramSwap(join(dataDir, 'lifecycle')).teardown().catch((e) => t.log(`zram teardown: ${e}`));
    // Layer mounts are node state and outlive `warren up`: unmount them with the data dir.
    try {
      removeTree(dataDir);
    } catch (err) {
      t.log(`cleanup of ${dataDir}: ${(err as Error).message}`);
    }
    t.is(readMountInfo().filter((m) => m.mountPoint.startsWith(dataDir)).length, 0, 'no mounts left');
  }
}));
