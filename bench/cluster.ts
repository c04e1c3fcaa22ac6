/**
 * npm run bench:cluster — the cluster's burst path on this machine, side by side in one run:
 *
 *  1. a job of BENCH_COUNT (default 5,000) idle busybox sandboxes through a
 *     gateway over 3 nodes, then the same count pinned to one node: time to
 *     all-ready and creates/s (all nodes share this machine's cores, so the
 *     ratio measures the cluster path's overhead and parallelism, not 3
 *     machines' worth of capacity);
 *  2. placement cost per sandbox at 32,768 (place only, no create) over 3
 *     and over 160 synthetic nodes;
 *  3. one sandbox at a time (create, first exec, delete) through the gateway
 *     (placed, over the nodes' shim protocol) against the same on one node's
 *     own API, interleaved: the cost of the cluster path for a single create;
 *  4. lazy against eager layer start for a fresh node starting the default
 *     image from a registry: bytes fetched and time to first exec, side by
 *     side (bench/lazy-layers.ts, run here as its own process after the
 *     cluster is stopped; BENCH_LAZY=0 leaves it out).
 *
 * Starts 3 etcd members, 3 `warren node` processes and a `warren gateway` on
 * loopback (test/helpers/cluster.ts); needs root and etcd-server.
 * Conditions first, then tables; JSON goes to bench/results/cluster.json.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { type NodeRecord, placeMany } from '../src/cluster/placement';
import { ClusterFixture, etcdReason } from '../test/helpers/cluster';
import { WarrenClient } from '../src/sdk';
import { conditions, percentile, printTable } from './stats';

const COUNT = Number(process.env.BENCH_COUNT ?? 5000);
const WINDOW = Number(process.env.BENCH_WINDOW ?? 16);

function synthetic(n: number): NodeRecord[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `n${i}`,
    url: 'http://127.0.0.1:1',
    shim: 'http://127.0.0.1:2',
    pool: i % 10 === 9 ? 'overflow' : 'onprem',
    labels: {},
    epoch: 1,
    capacity: { sandboxes: 2000, cpus: 64, memoryMb: 512_000 },
    used: { sandboxes: Math.floor(Math.random() * 200), creating: 0, memoryAvailableMb: 0, load1: 0 },
    backends: ['container'],
    images: [{ name: 'busybox', digest: 'sha256:bb', kind: 'base', layers: ['sha256:bb'] }],
    layers: i % 3 === 0 ? ['sha256:bb'] : [],
    lazy: true,
    accounts: {},
    fenced: false,
    at: 0,
  }));
}

function placementCost(nodes: number): { nodes: number; totalMs: number; perSandboxUs: number } {
  const recs = synthetic(nodes);
  const req = { backend: 'container' as const, image: 'busybox', workspaces: [], toolkits: [] };
  placeMany(recs, req, 1000, { staged: new Set(['sha256:bb']) }); // warm the JIT
  const runs: number[] = [];
  for (let i = 0; i < 5; i++) {
    const t0 = performance.now();
    const r = placeMany(recs, req, 32_768, { staged: new Set(['sha256:bb']) });
    runs.push(performance.now() - t0);
    if (r.unplaced > 0 && nodes > 20) throw new Error(`placement left ${r.unplaced} unplaced`);
  }
  runs.sort((a, b) => a - b);
  const med = runs[2]!;
  return { nodes, totalMs: med, perSandboxUs: (med * 1000) / 32_768 };
}

async function burst(f: ClusterFixture, nodes: string[]): Promise<{ nodes: string; seconds: number; perSecond: number; failed: number; firstReadyMs: number }> {
  const c = f.client();
  try {
    const t0 = performance.now();
    const job = await c.jobs.create({ count: COUNT, template: { image: 'busybox', memoryMb: 64 }, concurrency: WINDOW, placement: { nodes } });
    let first = 0;
    const end = await c.jobs.watch(job.id, (ev) => {
      if (ev.type === 'sandboxes' && first === 0) first = performance.now() - t0;
    });
    const s = (performance.now() - t0) / 1000;
    const out = { nodes: nodes.join('+'), seconds: s, perSecond: end.created / s, failed: end.failed, firstReadyMs: first };
    await c.jobs.delete(job.id);
    const deadline = Date.now() + 30 * 60_000;
    while ((await c.jobs.get(job.id)).state !== 'deleted') {
      if (Date.now() > deadline) throw new Error('the job was not deleted in time');
      await new Promise((r) => setTimeout(r, 500));
    }
    return out;
  } finally {
    await c.close();
  }
}

const SINGLE = Number(process.env.BENCH_SINGLE ?? 100);

/** Create → first exec → delete, one at a time, alternating the gateway and a node's own API. */
async function singles(f: ClusterFixture): Promise<Array<{ path: string; createExecP50: number; createExecP99: number; deleteP50: number }>> {
  const gw = f.client();
  const n1 = f.node('n1');
  const direct = new WarrenClient({ url: n1.url, token: n1.adminToken });
  const samples = new Map<string, { ce: number[]; del: number[] }>([
    ['gateway (placed, shim protocol)', { ce: [], del: [] }],
    ['node n1 API (no cluster)', { ce: [], del: [] }],
  ]);
  try {
    for (let i = 0; i < SINGLE * 2; i++) {
      const [path, c] = i % 2 === 0 ? (['gateway (placed, shim protocol)', gw] as const) : (['node n1 API (no cluster)', direct] as const);
      const t0 = performance.now();
      const sb = await c.createSandbox({ image: 'busybox', memoryMb: 64 });
      await sb.exec(['true']);
      const t1 = performance.now();
      await sb.delete();
      const t2 = performance.now();
      samples.get(path)!.ce.push(t1 - t0);
      samples.get(path)!.del.push(t2 - t1);
    }
  } finally {
    await gw.close();
    await direct.close();
  }
  return [...samples].map(([path, s]) => ({ path, createExecP50: percentile(s.ce, 50), createExecP99: percentile(s.ce, 99), deleteP50: percentile(s.del, 50) }));
}

async function main(): Promise<void> {
  if (etcdReason) throw new Error(`bench:cluster cannot run: ${etcdReason}`);
  const cond = { ...conditions(), loadavg: os.loadavg().map((l) => l.toFixed(1)).join(' '), count: String(COUNT), createWindow: `${WINDOW} per node`, cluster: '3 etcd members, 3 nodes, 1 gateway, all on this machine (loopback)' };
  console.log('# conditions');
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);

  console.log('\n# placement cost at 32,768 sandboxes (place only)');
  const place = [placementCost(3), placementCost(160)];
  printTable(place.map((p) => ({ nodes: String(p.nodes), 'total ms': p.totalMs.toFixed(1), 'µs per sandbox': p.perSandboxUs.toFixed(2) })));

  const f = new ClusterFixture();
  const bursts: Awaited<ReturnType<typeof burst>>[] = [];
  const results: { single?: Awaited<ReturnType<typeof singles>> } = {};
  try {
    await f.startEtcd(3);
    await f.startGateway();
    const per = COUNT + 100;
    for (const id of ['n1', 'n2', 'n3']) await f.startNode(id, { maxSandboxes: per, createWindow: WINDOW, leaseTtlS: 5 });
    await f.waitNodes(['n1', 'n2', 'n3']);
    console.log(`\n# one sandbox at a time: create → first exec, then delete (${SINGLE} each, interleaved)`);
    const single = await singles(f);
    printTable(single.map((r) => ({ path: r.path, 'create→exec p50 ms': r.createExecP50.toFixed(1), 'p99 ms': r.createExecP99.toFixed(1), 'delete p50 ms': r.deleteP50.toFixed(1) })));
    console.log(`ratio gateway ÷ node (create→exec p50): ${(single[0]!.createExecP50 / single[1]!.createExecP50).toFixed(2)}×`);
    results.single = single;
    console.log(`\n# burst of ${COUNT} sandboxes (job → all ready)`);
    bursts.push(await burst(f, ['n1', 'n2', 'n3']));
    bursts.push(await burst(f, ['n1']));
    printTable(bursts.map((b) => ({ nodes: b.nodes, 'all ready s': b.seconds.toFixed(1), 'creates/s': b.perSecond.toFixed(1), 'first ready ms': b.firstReadyMs.toFixed(0), failed: String(b.failed) })));
    console.log(`ratio 3 nodes ÷ 1 node (creates/s): ${(bursts[0]!.perSecond / bursts[1]!.perSecond).toFixed(2)}×`);
  } finally {
    await f.close();
  }
  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'cluster.json'), JSON.stringify({ conditions: cond, placement: place, ...results, bursts }, null, 2));
  if (process.env.BENCH_LAZY !== '0') {
    console.log('\n# lazy against eager layer start (a fresh node, the default image from a registry)');
    const r = spawnSync(process.execPath, [join(__dirname, 'lazy-layers.js')], { stdio: 'inherit' });
    if (r.status !== 0) throw new Error(`the lazy-layer section failed (exit ${r.status ?? r.signal})`);
  }
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
