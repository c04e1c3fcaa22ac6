/**
 * Placement between a holder and a lazy node, on a real cluster: one etcd
 * member, a registry, one gateway and two on-prem nodes with room for 20
 * sandboxes each. n1 holds an image; n2 mounts layers on demand and pulls a
 * staged image only when a create needs it (`--pull-staged on-demand`), so it
 * is a candidate for the image without holding it: the state in which the
 * holder bonus decides. The bonus (0.1 of utilisation, two sandboxes here)
 * sends creates to the holder until it is that far ahead, and no further.
 */
import { execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { Etcd3 } from 'etcd3';
import { keys } from '../../src/cluster/etcd';
import { DEFAULT_HOLDER_BONUS } from '../../src/cluster/placement';
import { WarrenClient, WarrenError } from '../../src/sdk';
import { lazyUnavailableReason } from '../../src/shim/layers/lazy';
import { ClusterFixture, etcdReason } from '../helpers/cluster';
import { type TestRegistry, registryReason, startRegistry } from '../helpers/registry';
import { testUnless } from '../helpers/skip';
import { busyboxRootfs } from '../helpers/warren';
import { elapse, waitForValue, within } from '../helpers/wait';

const test = testUnless(etcdReason ?? registryReason ?? lazyUnavailableReason(), anyTest as TestFn<unknown>);
const CAPACITY = 20;

let f: ClusterFixture;
let registry: TestRegistry | null = null;

interface Verdict {
  node: string;
  excluded?: string;
  holds: boolean;
  utilisation: number;
}
interface Placed {
  id: string;
  node: string;
  placement: { nodes: Verdict[] };
}
interface ClusterNodes {
  nodes: { id: string; images: string[]; layers: string[]; unloadable?: string[]; used: { sandboxes: number; creating: number } }[];
  staged: string[];
}

test.before(async () => {
  registry = await startRegistry();
  f = new ClusterFixture();
  await f.startEtcd(1);
  await f.startGateway();
  await Promise.all([f.startNode('n1', { maxSandboxes: CAPACITY }), f.startNode('n2', { maxSandboxes: CAPACITY, lazyLayers: true, pullStaged: 'on-demand' })]);
  await f.waitNodes(['n1', 'n2']);
});

test.after.always(async () => {
  await f?.close();
  await registry?.stop();
});

/** A busybox tree with a marker file, imported on n1 only. */
async function importOnN1(name: string, marker: string): Promise<string[]> {
  const dir = join(f.root, name);
  execFileSync('cp', ['-a', `${await busyboxRootfs()}/.`, dir]);
  mkdirSync(join(dir, 'etc/warren-test'), { recursive: true });
  writeFileSync(join(dir, 'etc/warren-test/marker'), marker);
  const n1 = new WarrenClient({ url: f.node('n1').url, token: f.node('n1').adminToken });
  try {
    const img = await n1.images.import(name, dir);
    return img.layers.length > 0 ? img.layers : [img.digest];
  } finally {
    await n1.close();
  }
}

/** The cluster's nodes as the gateway shows them, once `pred` holds. */
function nodesWhen(c: WarrenClient, pred: (r: ClusterNodes) => boolean, what: string): Promise<ClusterNodes> {
  return waitForValue(() => c.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes'), pred, 20_000, what, 100);
}

/** Import `name` on n1, stage it in the registry through the gateway, and wait until the gateway counts its layers as staged. */
async function stageFromN1(c: WarrenClient, name: string, marker: string): Promise<{ layers: string[]; nodes: ClusterNodes }> {
  const layers = await importOnN1(name, marker);
  await nodesWhen(c, (r) => r.nodes.some((n) => n.id === 'n1' && n.images.includes(name)), 'n1 to report the image');
  await c.images.stage(name, `${registry!.host}/pool`);
  return { layers, nodes: await nodesWhen(c, (r) => layers.every((d) => r.staged.includes(d)), 'the gateway to see the staged layers') };
}

async function codeOf(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await p;
    return { code: 'ok', message: '' };
  } catch (err) {
    return err instanceof WarrenError ? { code: err.code, message: err.message } : { code: String(err), message: '' };
  }
}

test.serial('creates go to the holder of their image before a lazy node that would load it, by at most the bonus; the lazy node pulls the image at its first create and then holds it', async (t) => {
  t.timeout(180_000);
  const c = f.client();
  const ids: string[] = [];
  try {
    const { layers, nodes: seen } = await stageFromN1(c, 'hot', 'hot layer\n');
    t.false(seen.nodes.find((n) => n.id === 'n2')!.images.includes('hot'), 'n2 pulls staged images on demand only: it has not pulled this one');

    const placed: Placed[] = [];
    const ROUNDS = 12;
    for (let i = 0; i < ROUNDS; i++) {
      const p = await c.requestJson<Placed>('POST', '/v1/sandboxes', { json: { image: 'hot' }, query: { explain: '1' } });
      placed.push(p);
      ids.push(p.id);
    }
    const first = placed[0]!.placement.nodes;
    const v = (id: string) => first.find((x) => x.node === id)!;
    t.is(v('n1').excluded, undefined);
    t.true(v('n1').holds, 'n1 holds the layers of the image');
    t.is(v('n2').excluded, undefined, 'n2 is a candidate: it can load the staged layers');
    t.false(v('n2').holds, 'n2 does not hold them yet');
    t.is(placed[0]!.node, 'n1', 'with both nodes empty, the holder wins');

    const on = (node: string) => placed.filter((p) => p.node === node).length;
    const lead = Math.round(DEFAULT_HOLDER_BONUS * CAPACITY);
    const order = placed.map((p) => p.node).join(',');
    // The holder takes creates until it is `lead` sandboxes ahead (a tie goes to it too); power-of-two
    // sampling that drew the holder twice can add one or two more. Then n2 takes one, pulls the
    // image, and from its next record on both hold it: the creates alternate.
    const firstOnN2 = placed.findIndex((p) => p.node === 'n2');
    t.true(firstOnN2 >= lead && firstOnN2 <= lead + 3, `the holder leads by its bonus, no more: ${order}`);
    t.true(on('n2') >= 2, `the lazy node takes creates: ${order}`);
    t.true(Math.abs(on('n1') - on('n2')) <= lead + 2, `neither node piles up: ${order}`);

    // n2's sandboxes run the image it pulled on demand, and n2 now lists it
    for (const p of placed.filter((x) => x.node === 'n2')) {
      t.is((await (await c.getSandbox(p.id)).exec(['cat', '/etc/warren-test/marker'])).stdout, 'hot layer\n');
    }
    const after = await nodesWhen(c, (r) => r.nodes.some((n) => n.id === 'n2' && n.images.includes('hot')), 'n2 to report the image it pulled');
    t.true(layers.every((d) => after.nodes.find((n) => n.id === 'n2')!.layers.includes(d)));
    const again = await c.requestJson<Placed>('POST', '/v1/sandboxes', { json: { image: 'hot' }, query: { explain: '1' } });
    ids.push(again.id);
    t.true(again.placement.nodes.find((x) => x.node === 'n2')!.holds, 'a node that pulled the image is a holder like any other');
  } finally {
    for (const id of ids) await c.deleteSandbox(id).catch(() => undefined);
    await c.close();
  }
});

test.serial('a lazy node that cannot load a staged image refuses the create with UNAVAILABLE and lists the layers as unloadable: placement leaves it out, with the reason, and nothing is left on it', async (t) => {
  t.timeout(120_000);
  // A record signed with the cluster's credential, pointing where no registry listens: n2 is a
  // candidate for the image (its layers are staged), but its pull fails.
  const layers = await importOnN1('ghost', 'ghost layer\n');
  const etcd = new Etcd3({ hosts: f.etcd.endpoints });
  const c = f.client();
  const ids: string[] = [];
  try {
    for (const d of layers) await etcd.put(keys.overflowStaged(d)).value('127.0.0.1:9/nowhere/ghost:latest');
    const rec = { image: 'ghost', ref: '127.0.0.1:9/nowhere/ghost:latest', manifestDigest: `sha256:${'0'.repeat(64)}`, layers, at: Date.now() };
    await etcd.put(keys.overflowImage('ghost')).value(JSON.stringify(f.credential.sign(rec)));
    await nodesWhen(c, (r) => r.nodes.some((n) => n.id === 'n1' && n.images.includes('ghost')) && layers.every((d) => r.staged.includes(d)), 'the gateway to see the image and its staged layers');

    // only n2 allowed: its refusal is the answer, with the reason
    const only = await codeOf(c.requestJson('POST', '/v1/sandboxes', { json: { image: 'ghost', placement: { nodes: ['n2'] } } }));
    t.is(only.code, 'UNAVAILABLE', only.message);
    t.regex(only.message, /cannot load the staged image ghost from 127\.0\.0\.1:9/);

    // the gateway learns of it from n2's next record
    await nodesWhen(c, (r) => layers.every((d) => r.nodes.find((n) => n.id === 'n2')?.unloadable?.includes(d) === true), 'n2 to list the layers as unloadable');
    // n2 now lists the layers as unloadable: placement leaves it out, with the reason, even when
    // it is the less loaded node (n1 made busier than its bonus covers); every sandbox is on the holder
    for (let i = 0; i < 4; i++) ids.push((await c.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n1'] } } })).id);
    for (let i = 0; i < 3; i++) {
      const p = await c.requestJson<Placed>('POST', '/v1/sandboxes', { json: { image: 'ghost' }, query: { explain: '1' } });
      ids.push(p.id);
      t.is(p.node, 'n1');
      t.regex(p.placement.nodes.find((v) => v.node === 'n2')!.excluded ?? '', /does not hold ghost, and its last pull of staged layers sha256:\w+ failed/);
      t.is((await (await c.getSandbox(p.id)).exec(['cat', '/etc/warren-test/marker'])).stdout, 'ghost layer\n');
    }
    // asked of n2 again within the window, it answers at once from what it knows, without a pull
    const again = await codeOf(c.requestJson('POST', '/v1/sandboxes', { json: { image: 'ghost', placement: { nodes: ['n2'] } } }));
    t.is(again.code, 'RESOURCE_EXHAUSTED', 'no candidate node: n2 is filtered out by its record');
    // n2 admitted and refused: nothing of it is left counted or alive
    const n2 = new WarrenClient({ url: f.node('n2').url, token: f.node('n2').adminToken });
    try {
      t.false((await n2.images.list()).some((i) => i.name === 'ghost'));
      t.deepEqual((await n2.listSandboxes()).filter((s) => s.image === 'ghost'), []);
    } finally {
      await n2.close();
    }
    await nodesWhen(c, (r) => r.nodes.some((n) => n.id === 'n2' && n.used.creating === 0), 'n2 to count no create in flight');
  } finally {
    for (const id of ids) await c.deleteSandbox(id).catch(() => undefined);
    await etcd.delete().prefix('/warren/overflow/').exec().catch(() => undefined);
    etcd.close();
    await c.close();
  }
});

test.serial('a job share on a lazy node pulls its staged image before its first create; a share it cannot load is refused once, and its sandboxes wait as pending instead of being placed there again, until the image is staged where it can be loaded', async (t) => {
  t.timeout(120_000);
  const c = f.client();
  const jobs: string[] = [];
  try {
    const { layers } = await stageFromN1(c, 'batch', 'batch layer\n');
    const job = await c.jobs.create({ count: 6, template: { image: 'batch' }, placement: { nodes: ['n2'] } });
    jobs.push(job.id);
    const end = await c.jobs.watch(job.id);
    t.is(end.state, 'done', JSON.stringify(end));
    t.is(end.nodes.n2?.created, 6);
    const made = (await c.listSandboxes()).filter((s) => s.labels['warren.job'] === job.id);
    t.is(made.length, 6);
    t.is((await (await c.getSandbox(made[0]!.id)).exec(['cat', '/etc/warren-test/marker'])).stdout, 'batch layer\n');

    // the same image staged again under a ref no registry serves, on a node that lets it go first
    const n2 = new WarrenClient({ url: f.node('n2').url, token: f.node('n2').adminToken });
    try {
      await c.jobs.delete(job.id);
      await waitForValue(() => n2.listSandboxes(), (l) => l.every((s) => s.image !== 'batch'), 30_000, 'the job sandboxes to go', 100);
      await n2.images.delete('batch');
    } finally {
      await n2.close();
    }
    const etcd = new Etcd3({ hosts: f.etcd.endpoints });
    try {
      const rec = { image: 'batch', ref: '127.0.0.1:9/nowhere/batch:latest', manifestDigest: `sha256:${'0'.repeat(64)}`, layers, at: Date.now() };
      await etcd.put(keys.overflowImage('batch')).value(JSON.stringify(f.credential.sign(rec)));
    } finally {
      etcd.close();
    }
    await nodesWhen(c, (r) => !r.nodes.some((n) => n.id === 'n2' && n.images.includes('batch')), 'n2 to drop the image');
    const bad = await c.jobs.create({ count: 3, template: { image: 'batch' }, placement: { nodes: ['n2'] } });
    jobs.push(bad.id);
    // n2 refuses the share (it cannot load the image) and lists the layers as unloadable, so the
    // job's re-placement finds no node for them: they wait as pending, not placed on n2 again and again
    const stuck = await waitForValue(() => c.jobs.get(bad.id), (j) => j.nodes.n2?.state === 'refused' && j.pending === 3, 20_000, 'the share to be refused and its sandboxes pending', 100);
    t.is(stuck.created, 0);
    t.is(stuck.state, 'creating');
    // the record and the share's progress are watched apart: the record may come second
    const record = await nodesWhen(c, (r) => layers.every((d) => r.nodes.find((n) => n.id === 'n2')?.unloadable?.includes(d) === true), 'n2 to list the layers as unloadable');
    const unloadable = record.nodes.find((n) => n.id === 'n2')!.unloadable ?? [];
    t.true(layers.every((d) => unloadable.includes(d)), `n2 lists ${JSON.stringify(unloadable)}`);
    await elapse(3000, 'the job reconciler runs every 500 ms: six rounds that could place the pending sandboxes again');
    const later = await c.jobs.get(bad.id);
    t.is(later.nodes.n2?.assigned, 3, `placed on n2 once, not again while its pull is known to fail: ${JSON.stringify(later.nodes)}`);
    t.is(later.pending, 3);
    // staged again where a registry serves it: n2 tries at once, and the pending sandboxes are made there
    await c.images.stage('batch', `${registry!.host}/pool`);
    const healed = await within(c.jobs.watch(bad.id), 15_000, 'the job to finish on n2 well before the 30 s a failed pull is left alone');
    t.is(healed.created, 3, JSON.stringify(healed));
    t.is(healed.nodes.n2?.created, 3);
  } finally {
    for (const id of jobs) await c.jobs.delete(id).catch(() => undefined);
    const etcd = new Etcd3({ hosts: f.etcd.endpoints });
    await etcd.delete().prefix('/warren/overflow/').exec().catch(() => undefined);
    etcd.close();
    await c.close();
  }
});
