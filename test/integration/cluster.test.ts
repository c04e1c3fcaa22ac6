/**
 * A real cluster on this machine: 3 etcd members, 3 `warren node` processes
 * (n1 and n2 on-prem, n3 an overflow node), 2 `warren gateway` processes,
 * all on loopback, each node with its own data dir. The tests run in order
 * on one cluster (starting it costs seconds): placement and routing, forged
 * ids and records, a job of 2,000 sandboxes, job pause/resume, quotas,
 * policy distribution, etcd member loss and quorum loss, kill -9 and
 * SIGSTOP of a node, a gateway restart.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { Etcd3 } from 'etcd3';
import { BUNDLED_POLICY_DIR } from '../../src/security/confinement';
import { RemoteShim } from '../../src/shim/remote/client';
import { type JobEvent, type JobStatus, WarrenClient, WarrenError } from '../../src/sdk';
import { lazyUnavailableReason } from '../../src/shim/layers/lazy';
import { ClusterFixture, type NodeNetwork, etcdReason, stopChild } from '../helpers/cluster';
import { type CountingProxy, type TestRegistry, registryReason, startCountingProxy, startRegistry } from '../helpers/registry';
import { type Internet, egressSkipReason, SERVICE_PORT, startInternet } from '../helpers/network';
import { testUnless } from '../helpers/skip';
import { busyboxRootfs, spec } from '../helpers/warren';
import { memhogBinary, memhogSkipReason, withZramSwap, zramSkipReason } from './lifecycle-fixture';
import { elapse, waitFor, waitForValue } from '../helpers/wait';

const test = testUnless(etcdReason, anyTest as TestFn<unknown>);
const JOB_COUNT = 2000;

// The on-prem nodes get sandbox networking, each on its own bridge, when this machine can
// enforce egress; the network test is skipped with the reason otherwise.
const netReason = etcdReason ?? egressSkipReason();
const netTest = testUnless(netReason, anyTest as TestFn<unknown>);
const tag = process.pid.toString(36);
let internet: Internet | null = null;

// The overflow node loads layers on demand from a registry where this machine can (FUSE and
// docker-registry); the staging test is skipped with the reason otherwise.
const lazyReason = etcdReason ?? registryReason ?? lazyUnavailableReason();
const lazyTest = testUnless(lazyReason, anyTest as TestFn<unknown>);
let registry: TestRegistry | null = null;
let proxy: CountingProxy | null = null;

let f: ClusterFixture;

function nodeNetwork(i: number): NodeNetwork | undefined {
  if (internet === null) return undefined;
  return { bridge: `wc${tag}${i}`.slice(0, 15), subnet: `10.${150 + (process.pid % 50)}.${i}.0/24`, nftTable: `wc${tag}${i}`, dnsUpstream: `${internet.zone.address}:${internet.zone.port}` };
}

test.before(async () => {
  if (netReason === null) internet = await startInternet(tag);
  if (lazyReason === null) {
    registry = await startRegistry();
    proxy = await startCountingProxy(registry.host);
  }
  f = new ClusterFixture();
  await f.startEtcd(3);
  await f.startGateway();
  await f.startGateway();
  const [net1, net2] = [nodeNetwork(1), nodeNetwork(2)];
  await Promise.all([
    f.startNode('n1', { labels: { zone: 'a' }, maxSandboxes: 1200, ...(net1 ? { network: net1 } : {}) }),
    f.startNode('n2', { labels: { zone: 'b' }, maxSandboxes: 1200, ...(net2 ? { network: net2 } : {}) }),
    f.startNode('n3', { pool: 'overflow', maxSandboxes: 1000, lazyLayers: lazyReason === null }),
  ]);
  await f.waitNodes(['n1', 'n2', 'n3']);
});

test.after.always(async () => {
  await f?.close();
  await internet?.close();
  await proxy?.close();
  await registry?.stop();
});

async function withClients<T>(fn: (a: WarrenClient, b: WarrenClient) => Promise<T>): Promise<T> {
  const a = f.client(f.gateways[0]);
  const b = f.client(f.gateways[1]);
  try {
    return await fn(a, b);
  } finally {
    await a.close();
    await b.close();
  }
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    return err instanceof WarrenError ? err.code : String(err);
  }
}

interface ClusterNodes {
  nodes: { id: string; epoch: number; fenced: boolean; pool: string; shim: string }[];
  lost: { node: string; epochs: number[] }[];
}

test.serial('creates spread over the on-prem nodes, honour node labels, explain their placement, and route through either gateway (HTTP and shells)', async (t) => {
  await withClients(async (a, b) => {
    type Placed = { id: string; node: string; placement: { nodes: { node: string; excluded?: string; utilisation: number }[]; onpremUtilisation: number; refusedBy?: string[] } };
    const ids: string[] = [];
    try {
      const placed: Placed[] = [];
      // back to back, faster than the nodes' records (about one a second) show the new load
      for (let i = 0; i < 8; i++) {
        placed.push(await a.requestJson<Placed>('POST', '/v1/sandboxes', { json: { image: 'busybox' }, query: { explain: '1' } }));
        ids.push(placed[i]!.id);
      }
      t.deepEqual(placed[0]!.placement.nodes.map((n) => n.node).sort(), ['n1', 'n2', 'n3']);
      const nodes = ids.map((id) => id.split('-')[0]);
      const why = placed.map((p) => `${p.node}: ${JSON.stringify(p.placement.nodes)} refused by ${JSON.stringify(p.placement.refusedBy ?? [])}`).join('\n');
      t.true(nodes.includes('n1') && nodes.includes('n2'), `placed on ${nodes.join(',')}\n${why}`);
      t.false(nodes.includes('n3'), 'the overflow node is not used below the on-prem threshold');
      const zoned = await a.requestJson<{ id: string; node: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodeSelector: { zone: 'b' } } } });
      ids.push(zoned.id);
      t.is(zoned.node, 'n2');
      for (const id of ids) {
        const sb = await b.getSandbox(id);
        t.is((await sb.exec(['sh', '-c', `echo $((6*7)) ${id}`])).stdout, `42 ${id}\n`);
      }
      const shell = await (await b.getSandbox(ids[0]!)).shell({ mode: 'command' });
      const r = await shell.run('cd /tmp && echo through-gateway-$PWD');
      t.is(r.stdout, 'through-gateway-/tmp\n');
      await shell.close();
      const listed = await b.listSandboxes();
      for (const id of ids) t.true(listed.some((s) => s.id === id));
      // pages of 2 across the nodes: in id order, each sandbox once
      const paged: string[] = [];
      let after: string | undefined;
      for (let pages = 0; pages < 50; pages++) {
        const page = await b.listSandboxesPage(after === undefined ? { limit: 2 } : { limit: 2, after });
        t.true(page.sandboxes.length <= 2);
        paged.push(...page.sandboxes.map((s) => s.id));
        if (page.next === undefined) break;
        after = page.next;
      }
      t.deepEqual(paged, listed.map((s) => s.id).sort());
      t.is(new Set(paged).size, paged.length);
      // files go through the cluster gateway to the sandbox's node and back
      const onN2 = await b.getSandbox(zoned.id);
      await onN2.writeFile('/tmp/through-cluster.txt', 'written via the cluster\n');
      t.is((await (await a.getSandbox(zoned.id)).readFile('/tmp/through-cluster.txt')).toString(), 'written via the cluster\n');
      for (const id of ids.splice(0)) await a.deleteSandbox(id);
      t.is(await codeOf(b.getSandbox(placed[1]!.id)), 'SANDBOX_NOT_FOUND');
    } finally {
      // a failed assertion must not leave sandboxes behind for the tests after this one
      for (const id of ids) await a.deleteSandbox(id).catch(() => undefined);
    }
  });
});

test.serial('`warren nodes` and the SDK show the nodes as their records say', async (t) => {
  const c = f.client(f.gateways[1]);
  try {
    const r = await c.clusterNodes();
    t.deepEqual(r.nodes.map((n) => n.id).sort(), ['n1', 'n2', 'n3']);
    t.is(r.nodes.find((n) => n.id === 'n3')!.pool, 'overflow');
    t.true(r.nodes.every((n) => n.images.includes('busybox') && n.shim.startsWith('http://')));
  } finally {
    await c.close();
  }
  const out = execFileSync(process.execPath, [join(__dirname, '../../src/cli/main.js'), 'nodes'], { env: { ...process.env, WARREN_URL: f.gateways[0]!.url, WARREN_TOKEN: f.adminToken }, encoding: 'utf8' });
  const lines = out.trim().split('\n');
  t.regex(lines[0]!, /^NODE\s+POOL\s+EPOCH\s+STATE\s+SANDBOXES/);
  for (const id of ['n1', 'n2', 'n3']) t.true(lines.some((l) => new RegExp(`^${id}\\s+(onprem|overflow)\\s+\\d+\\s+ready\\s+\\d+/\\d+`).test(l)), `${id} in:\n${out}`);
  // the node list is for admins
  const admin = f.client(f.gateways[0]);
  const user = await admin.requestJson<{ token: string }>('POST', '/v1/accounts', { json: { name: 'nodes-reader', role: 'runtime' } });
  await admin.close();
  const u = new WarrenClient({ url: f.gateways[0]!.url, token: user.token });
  t.is(await codeOf(u.clusterNodes()), 'FORBIDDEN');
  await u.close();
});

test.serial('creates faster than the node records show them still balance: the gateway counts what it placed since each record', async (t) => {
  await f.waitIdle(['n1', 'n2']);
  await withClients(async (a) => {
    const ids: string[] = [];
    try {
      // n2 has one sandbox, and its record says so
      ids.push((await a.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n2'] } } })).id);
      type Nodes = { nodes: { id: string; used: { sandboxes: number }; pending: number; recordAgeMs: number }[] };
      await waitForValue(() => a.requestJson<Nodes>('GET', '/v1/cluster/nodes'), (r) => r.nodes.find((n) => n.id === 'n2')?.used.sandboxes === 1, 20_000, 'n2 reports its sandbox', 50);
      // Six back to back: with two nodes both are compared each time, so knowing every create
      // keeps the counts within one of each other (two when a record written just before a
      // create completed arrives after it). Going by the records alone sends them all to the
      // emptier node until its record catches up.
      // What each node held as the creates began, as this gateway counts it: its record, and the
      // creates the record does not show yet.
      const before = await a.requestJson<Nodes>('GET', '/v1/cluster/nodes');
      const held = (id: string) => {
        const n = before.nodes.find((x) => x.id === id);
        return n === undefined ? 0 : n.used.sandboxes + n.pending;
      };
      const placed: string[] = [];
      const why: string[] = [];
      for (let i = 0; i < 6; i++) {
        const sb = await a.requestJson<{ id: string; placement: { nodes: unknown[] } }>('POST', '/v1/sandboxes', { json: { image: 'busybox' }, query: { explain: '1' } });
        ids.push(sb.id);
        placed.push(sb.id.split('-')[0]!);
        why.push(JSON.stringify(sb.placement.nodes));
      }
      const onN1 = placed.filter((n) => n === 'n1').length;
      const onN2 = placed.filter((n) => n === 'n2').length;
      t.is(onN1 + onN2, 6, `placed on ${placed.join(',')}`);
      // Balanced by the end: within two (one record's lag) of each other, counting what each held.
      const seen = before.nodes.map((n) => `${n.id}: ${n.used.sandboxes} in a record ${n.recordAgeMs} ms old, ${n.pending} pending`).join('; ');
      t.true(Math.abs(held('n1') + onN1 - (held('n2') + onN2)) <= 2, `held n1 ${held('n1')}, n2 ${held('n2')} (${seen}); placed on ${placed.join(',')}\n${why.join('\n')}`);
    } finally {
      for (const id of ids) await a.deleteSandbox(id).catch(() => undefined);
    }
  });
});

test.serial('forged ids, unsigned node records and forged tokens are never routed', async (t) => {
  let connections = 0;
  const trap = net.createServer((s) => {
    connections++;
    s.destroy();
  });
  await new Promise<void>((r) => trap.listen(0, '127.0.0.1', () => r()));
  const trapUrl = `http://127.0.0.1:${(trap.address() as net.AddressInfo).port}`;
  const etcd = new Etcd3({ hosts: f.etcd.endpoints });
  try {
    await withClients(async (a) => {
      t.is(await codeOf(a.getSandbox('zz-0123456789abcdef')), 'SANDBOX_NOT_FOUND');
      t.is(await codeOf(a.getSandbox('n1-0123456789abcdef')), 'SANDBOX_NOT_FOUND');
      // the cluster gateway is the standard gateway: a malformed id is refused before any routing
      t.is(await codeOf(a.request('GET', '/v1/sandboxes/..%2f..%2fetc-0123456789abcdef')), 'INVALID_ID');
      // a record written without the cluster credential
      const before = f.gateways[0]!.log.join('').split('without a valid cluster signature').length;
      await etcd.put('/warren/nodes/evil').value(JSON.stringify({ id: 'evil', url: trapUrl, pool: 'onprem', epoch: 1, sig: 'AAAA' })).exec();
      await waitFor(() => f.gateways[0]!.log.join('').split('without a valid cluster signature').length > before, 10_000, 'the gateway saw the unsigned record', 50);
      t.is(await codeOf(a.getSandbox('evil-0123456789abcdef')), 'SANDBOX_NOT_FOUND');
      const nodes = await a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes');
      t.false(nodes.nodes.some((n) => n.id === 'evil'));
      t.is(connections, 0, 'nothing was sent to the host the forged record named');
    });
    // a node's API refuses a forged token (the old gateway-signed assertion form among them); the gateway does not take a node's local token
    const n1 = f.node('n1');
    const forged = new WarrenClient({ url: n1.url, token: `wrc_${Buffer.from(JSON.stringify({ id: 'x', name: 'x', role: 'admin', createdAt: 'x', exp: 1e15 })).toString('base64url')}.AAAA` });
    t.is(await codeOf(forged.listSandboxes()), 'UNAUTHENTICATED');
    await forged.close();
    const local = new WarrenClient({ url: f.gateways[0]!.url, token: n1.adminToken });
    t.is(await codeOf(local.listSandboxes()), 'UNAUTHENTICATED');
    await local.close();
    // a node's shim protocol takes only its own token: not another node's, not the credential itself
    const admin = f.client(f.gateways[0]);
    const shimUrl = (await admin.requestJson<{ nodes: { id: string; shim: string }[] }>('GET', '/v1/cluster/nodes')).nodes.find((n) => n.id === 'n1')!.shim;
    await admin.close();
    t.is(await codeOf(RemoteShim.connect({ url: shimUrl, token: f.credential.shimToken('n2') })), 'UNAUTHENTICATED');
    t.is(await codeOf(RemoteShim.connect({ url: shimUrl, token: readFileSync(f.credentialFile, 'utf8').trim() })), 'UNAUTHENTICATED');
    const own = await RemoteShim.connect({ url: shimUrl, token: f.credential.shimToken('n1') });
    t.is(own.nodeId, 'n1');
    await own.close();
  } finally {
    await etcd.delete().key('/warren/nodes/evil').exec();
    etcd.close();
    trap.close();
  }
});

test.serial(`a job of ${JOB_COUNT} sandboxes completes with streamed progress; past 80% on-prem the rest goes to the overflow node`, async (t) => {
  t.timeout(900_000);
  await withClients(async (a, b) => {
    const job = await a.jobs.create({ count: JOB_COUNT, template: { image: 'busybox', memoryMb: 64 }, labels: { exp: 'burst' }, concurrency: 16 });
    t.is(job.count, JOB_COUNT);
    t.is(job.pending, 0);
    const ids = new Set<string>();
    let progress = 0;
    const end = await b.jobs.watch(job.id, (ev: JobEvent) => {
      if (ev.type === 'sandboxes') for (const id of ev.ids) ids.add(id);
      if (ev.type === 'progress') progress++;
    });
    t.is(end.state, 'done', JSON.stringify({ ...end, failures: end.failures.slice(0, 3) }));
    t.is(end.created, JOB_COUNT);
    t.is(ids.size, JOB_COUNT, 'every sandbox id was streamed once');
    t.true(progress >= 2, `progress lines: ${progress}`);
    const on = (n: string) => end.nodes[n]?.created ?? 0;
    t.log(`placed: n1 ${on('n1')}, n2 ${on('n2')}, n3 (overflow) ${on('n3')}`);
    t.true(on('n1') > 0 && on('n2') > 0);
    // 80% of the 2,400 on-prem places is 1,920: the rest went to the overflow pool
    t.true(on('n3') > 0 && on('n3') <= JOB_COUNT - 1900, `overflow ${on('n3')}`);
    const listed = await a.jobs.sandboxes(job.id);
    t.is(listed.length, JOB_COUNT);
    await a.jobs.delete(job.id);
    const gone = await waitForValue(() => a.jobs.get(job.id), (s) => s.state === 'deleted', 600_000, 'the job deleted on every node', 500);
    t.is(gone.deleted, JOB_COUNT);
    t.is((await a.jobs.sandboxes(job.id)).length, 0);
  });
});

// With a zram swap device, each sandbox holds anonymous memory that only swap can take; without
// one (no zram module here), the amounts are reported but not asserted: clean page cache is all a
// pause could release, and this host's own proactive reclaim may take it first.
const pauseAmountsSkip = zramSkipReason() ?? memhogSkipReason();
const HOG_MIB = 24;

test.serial(`job pause reaches every node (its sandboxes frozen, ${pauseAmountsSkip === null ? `the ${HOG_MIB} MiB each holds given back to the host` : 'what was released reported per node'}) and resume restores them`, async (t) => {
  t.timeout(300_000);
  if (pauseAmountsSkip !== null) t.log(`released amounts not asserted: ${pauseAmountsSkip}`);
  await f.waitIdle(['n1', 'n2']);
  const withSwap = <T>(fn: () => Promise<T>): Promise<T> => (pauseAmountsSkip === null ? withZramSwap(1024, fn) : fn());
  await withSwap(() =>
    withClients(async (a, b) => {
      const job = await a.jobs.create({ count: 8, template: { image: 'busybox', memoryMb: 128 }, placement: { nodes: ['n1', 'n2'] } });
      try {
        const done = await a.jobs.watch(job.id);
        t.is(done.state, 'done');
        t.true((done.nodes.n1?.created ?? 0) > 0 && (done.nodes.n2?.created ?? 0) > 0, JSON.stringify(done.nodes));
        const sbs = await a.jobs.sandboxes(job.id);
        for (const s of sbs) {
          const sb = await a.getSandbox(s.id);
          await sb.exec(['sh', '-c', 'echo kept > /root/mark']);
          if (pauseAmountsSkip !== null) continue;
          // memhog touches its pages every 50 ms: they stay hot until the pause freezes it
          await sb.writeFile('/bin/memhog', memhogBinary(), 0o755);
          await sb.exec(['sh', '-c', `(memhog ${HOG_MIB} /tmp/hog 50 >/dev/null 2>&1 &)`]);
          await waitFor(async () => (await sb.exec(['sh', '-c', 'cat /tmp/hog 2>/dev/null'])).stdout === 'ready\n', 20_000, 'memhog to fill its memory', 50);
        }
        await b.jobs.pause(job.id);
        const paused = await waitForValue(() => a.jobs.get(job.id), (s) => s.state === 'paused' && s.paused === 8, 120_000, 'the job paused', 200);
        t.log(`released: n1 ${paused.nodes.n1?.releasedBytes} B, n2 ${paused.nodes.n2?.releasedBytes} B`);
        for (const n of ['n1', 'n2']) {
          t.is(paused.nodes[n]?.paused, done.nodes[n]?.created, `${n} paused its sandboxes`);
          const released = paused.nodes[n]?.releasedBytes;
          t.true(Number.isSafeInteger(released) && released! >= 0);
          if (pauseAmountsSkip === null) {
            const want = done.nodes[n]!.created * (HOG_MIB - 4) * 1024 * 1024;
            t.true(released! >= want, `${n} gave back ${released} bytes for ${done.nodes[n]!.created} sandboxes of ${HOG_MIB} MiB (at least ${want})`);
          }
        }
        t.is(paused.releasedBytes, Object.values(paused.nodes).reduce((s, x) => s + x.releasedBytes, 0));
        for (const s of sbs) t.is((await b.getSandbox(s.id)).info?.state, 'paused');
        await a.jobs.resume(job.id);
        await waitForValue(() => a.jobs.get(job.id), (s) => s.state === 'done' && s.paused === 0, 120_000, 'the job resumed', 200);
        for (const s of sbs) {
          const sb = await b.getSandbox(s.id);
          t.is(sb.info?.state, 'running');
          t.is((await sb.exec(['cat', '/root/mark'])).stdout, 'kept\n');
          if (pauseAmountsSkip !== null) continue;
          // every page memhog wrote reads back the same after the swap-in
          const check = await sb.exec(['sh', '-c', 'kill -USR1 $(pidof memhog); while ! grep -qE "ok|bad" /tmp/hog; do usleep 10000; done; cat /tmp/hog'], { timeoutMs: 60_000 });
          t.is(check.stdout, 'ok\n', `${s.id}: memory intact after resume`);
        }
      } finally {
        await a.jobs.delete(job.id);
        await waitForValue(() => a.jobs.get(job.id), (s) => s.state === 'deleted', 120_000, 'the job deleted', 200);
      }
    }),
  );
});

test.serial('a job over the account quota is refused whole or admitted up to it; bad templates are refused before placing', async (t) => {
  t.timeout(300_000);
  await withClients(async (a, b) => {
    const acct = await a.requestJson<{ id: string; token: string }>('POST', '/v1/accounts', { json: { name: 'rl-runner', role: 'runtime' } });
    await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxSandboxes: 3 } });
    const user = new WarrenClient({ url: f.gateways[1]!.url, token: acct.token });
    const made: string[] = [];
    try {
      t.is(await codeOf(user.jobs.create({ count: 5, template: { image: 'busybox' } })), 'QUOTA_EXCEEDED');
      const before = (await user.jobs.list()).length;
      t.is(await codeOf(user.jobs.create({ count: 5, template: { image: 'busybox', memoryMb: -1 } })), 'LIMIT_OUT_OF_RANGE');
      t.is(await codeOf(user.jobs.create({ count: 5, template: { image: 'no-such-image' } })), 'IMAGE_NOT_FOUND');
      t.is(await codeOf(user.jobs.create({ count: 40_000, template: { image: 'busybox' } })), 'LIMIT_OUT_OF_RANGE');
      t.is((await user.jobs.list()).length, before, 'nothing was recorded for refused jobs');
      const job = await user.jobs.create({ count: 5, template: { image: 'busybox' }, quota: 'upTo' });
      t.is(job.count, 3);
      t.is(job.requested, 5);
      const end = await user.jobs.watch(job.id);
      t.is(end.created, 3);
      t.is(await codeOf(user.createSandbox({ image: 'busybox' })), 'QUOTA_EXCEEDED');
      // other accounts do not see it
      t.is(await codeOf(user.jobs.get('job-0000000000000000')), 'JOB_NOT_FOUND');
      await user.jobs.delete(job.id);
      await waitForValue(() => user.jobs.get(job.id), (s) => s.state === 'deleted', 60_000, 'deleted', 200);
      t.is((await b.listSandboxes({ owner: acct.id })).length, 0);
      // cpu and memory quotas hold across nodes, also before the node records show the creates
      await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxSandboxes: null, maxCpu: 2, maxMemoryMb: 1024 } });
      // the node records (about a second old, more on a loaded machine) stop counting the job's sandboxes
      await waitForValue(() => user.requestJson<{ usage: { sandboxes: number; cpu: number } }>('GET', '/v1/accounts/me/quota'), (r) => r.usage.sandboxes === 0 && r.usage.cpu === 0, 30_000, 'the records show the job deleted', 100);
      const one = await user.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', cpu: 1, memoryMb: 256, placement: { nodes: ['n1'] } } });
      made.push(one.id);
      const two = await user.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', cpu: 1, memoryMb: 256, placement: { nodes: ['n2'] } } });
      made.push(two.id);
      const third = user.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', cpu: 0.5, memoryMb: 64, placement: { nodes: ['n1'] } } });
      third.then((r) => made.push(r.id)).catch(() => undefined);
      t.is(await codeOf(third), 'QUOTA_EXCEEDED');
      const q = await user.requestJson<{ usage: { sandboxes: number; cpu: number; memoryMb: number } }>('GET', '/v1/accounts/me/quota');
      t.deepEqual(q.usage, { sandboxes: 2, cpu: 2, memoryMb: 512 });
      await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxCpu: null } });
      t.is(await codeOf(user.requestJson('POST', '/v1/sandboxes', { json: { image: 'busybox', memoryMb: 600, placement: { nodes: ['n2'] } } })), 'QUOTA_EXCEEDED');
      for (const id of made.splice(0)) await user.deleteSandbox(id);
      // a job is held to the same cpu quota: refused whole, or cut to what fits
      await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxCpu: 2, maxMemoryMb: null } });
      await waitForValue(() => user.requestJson<{ usage: { cpu: number } }>('GET', '/v1/accounts/me/quota'), (r) => r.usage.cpu === 0, 30_000, 'the records show the deletes', 100);
      t.is(await codeOf(user.jobs.create({ count: 5, template: { image: 'busybox', cpu: 1 } })), 'QUOTA_EXCEEDED');
      const cut = await user.jobs.create({ count: 5, template: { image: 'busybox', cpu: 1 }, quota: 'upTo' });
      t.is(cut.count, 2);
      t.is((await user.jobs.watch(cut.id)).created, 2);
      await user.jobs.delete(cut.id);
      await waitForValue(() => user.jobs.get(cut.id), (s) => s.state === 'deleted', 60_000, 'deleted', 200);
    } finally {
      // a failed assertion must not leave sandboxes behind for the tests that follow
      for (const id of made) await user.deleteSandbox(id).catch(() => undefined);
      await user.close();
    }
  });
});

test.serial('a quota holds exactly when creates race through both gateways: each node admits within its block of the quota, and gives back what it stops using', async (t) => {
  t.timeout(120_000);
  await withClients(async (a) => {
    const acct = await a.requestJson<{ id: string; token: string }>('POST', '/v1/accounts', { json: { name: 'racer', role: 'runtime' } });
    await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxSandboxes: 3 } });
    const users = f.gateways.map((g) => new WarrenClient({ url: g.url, token: acct.token }));
    const made: string[] = [];
    const create = (u: WarrenClient, nodes?: string[]) =>
      u.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', memoryMb: 64, ...(nodes ? { placement: { nodes } } : {}) } }).then((r) => {
        made.push(r.id);
        return r;
      });
    try {
      // twelve at once, six through each gateway: each gateway alone sees room for three
      const results = await Promise.allSettled(Array.from({ length: 12 }, (_, i) => create(users[i % 2]!)));
      const refused = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected').map((r) => (r.reason instanceof WarrenError ? r.reason.code : String(r.reason)));
      t.is(made.length, 3, `admitted ${made.join(', ')}; refused ${refused.join(', ')}`);
      t.deepEqual([...new Set(refused)], ['QUOTA_EXCEEDED']);
      for (const id of made.splice(0)) await users[0]!.deleteSandbox(id);
      // the nodes give their blocks back once unused: the whole quota fits on one node again
      const codes: string[] = [];
      await waitFor(async () => {
        const code = await codeOf(create(users[made.length % 2]!, ['n2']));
        if (code !== 'ok') codes.push(code);
        return made.length === 3;
      }, 30_000, 'n2 to take the whole quota', 200);
      t.deepEqual([...new Set(codes)].filter((c) => c !== 'QUOTA_EXCEEDED'), [], 'refused only for the quota meanwhile');
      t.is(await codeOf(create(users[1]!, ['n1'])), 'QUOTA_EXCEEDED');
      t.is(await codeOf(create(users[0]!)), 'QUOTA_EXCEEDED');
      // without a limit the blocks go, and so do the refusals
      await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxSandboxes: null } });
      t.is(await codeOf(create(users[1]!, ['n2'])), 'ok');
    } finally {
      for (const id of made) await users[0]!.deleteSandbox(id).catch(() => undefined);
      for (const u of users) await u.close();
    }
  });
});

test.serial('a policy applied through a gateway reaches every node by watch; an invalid one is refused there and the last good one stays', async (t) => {
  await withClients(async (a) => {
    const good = readFileSync(join(BUNDLED_POLICY_DIR, 'services.yaml'), 'utf8');
    const applied = await a.requestJson<{ rev: string }>('POST', '/v1/policy/apply', { json: { files: { 'services.yaml': `# distributed through etcd\n${good}` } } });
    type St = { rev: string | null; nodes: Record<string, { rev: string; applied: boolean; error?: string }> };
    await waitForValue(() => a.requestJson<St>('GET', '/v1/policy'), (s) => ['n1', 'n2', 'n3'].every((n) => s.nodes[n]?.rev === applied.rev && s.nodes[n]?.applied), 20_000, 'every node applied the policy', 100);
    const bad = await a.requestJson<{ rev: string }>('POST', '/v1/policy/apply', { json: { files: { 'services.yaml': 'services: [not valid' } } });
    const st = await waitForValue(() => a.requestJson<St>('GET', '/v1/policy'), (s) => ['n1', 'n2', 'n3'].every((n) => s.nodes[n]?.rev === bad.rev), 20_000, 'every node answered the bad policy', 100);
    for (const n of ['n1', 'n2', 'n3']) t.false(st.nodes[n]!.applied, n);
    // the node kept its last good files and policy: it still creates sandboxes
    const sb = await a.createSandbox({ image: 'busybox', placement: { nodes: ['n1'] } } as never);
    t.is((await sb.exec(['true'])).exitCode, 0);
    await sb.delete();
    const restored = await a.requestJson<{ rev: string }>('POST', '/v1/policy/apply', { json: { files: { 'services.yaml': good } } });
    await waitForValue(() => a.requestJson<St>('GET', '/v1/policy'), (s) => ['n1', 'n2', 'n3'].every((n) => s.nodes[n]?.rev === restored.rev && s.nodes[n]?.applied), 20_000, 'restored', 100);
  });
});

netTest.serial('each on-prem node has its own bridge; the services applied through a gateway hold for sandboxes on either node', async (t) => {
  t.timeout(180_000);
  const inet = internet!;
  await withClients(async (a, b) => {
    const services = readFileSync(join(inet.policyDir, 'services.yaml'), 'utf8');
    const applied = await a.requestJson<{ rev: string }>('POST', '/v1/policy/apply', { json: { files: { 'services.yaml': services } } });
    type St = { nodes: Record<string, { rev: string; applied: boolean }> };
    await waitForValue(() => a.requestJson<St>('GET', '/v1/policy'), (s) => ['n1', 'n2'].every((n) => s.nodes[n]?.rev === applied.rev && s.nodes[n]?.applied), 20_000, 'n1 and n2 applied the services', 100);
    const made: string[] = [];
    try {
      const addresses: string[] = [];
      for (const node of ['n1', 'n2']) {
        const sb = await a.requestJson<{ id: string; node: string; network?: { address: string } }>('POST', '/v1/sandboxes', { json: { image: 'busybox', network: { pypi: true }, placement: { nodes: [node] } } });
        made.push(sb.id);
        t.is(sb.node, node);
        t.truthy(sb.network?.address, `${node} gave the sandbox an address`);
        addresses.push(sb.network!.address);
        const s = await b.getSandbox(sb.id);
        // busybox's own resolver (nslookup) asks the node's DNS responder; nc then goes by address
        // (busybox's static wget crashes in glibc's resolver)
        const resolve = async (name: string) => {
          const out = (await s.exec(['sh', '-c', `nslookup ${name} 2>&1`], { timeoutMs: 30_000 })).stdout;
          return /Name:\s*\S+\s+Address:\s*([\d.]+)/.exec(out)?.[1] ?? null;
        };
        const get = async (address: string) => (await s.exec(['sh', '-c', `printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 ${address} ${SERVICE_PORT} 2>&1; echo " exit=$?"`], { timeoutMs: 30_000 })).stdout;
        const pypi = await resolve(inet.names.pypi);
        t.is(pypi, inet.pypi.address, `${node}: the allowed service's name resolves`);
        t.regex(await get(pypi!), /pypi says hello[\s\S]*exit=0/, `${node}: the allowed service answers`);
        t.is(await resolve(inet.names.npm), null, `${node}: a service the sandbox was not given does not resolve`);
        t.notRegex(await get(inet.npm.address), /npm says hello/, `${node}: nor answers by its address`);
        t.notRegex(await get(inet.other.address), /exfiltrated/, `${node}: an address no service names is refused`);
      }
      // two bridges, two subnets: the nodes' sandboxes do not share a network
      const net1 = nodeNetwork(1)!.subnet.split('.').slice(0, 3).join('.');
      const net2 = nodeNetwork(2)!.subnet.split('.').slice(0, 3).join('.');
      t.true(addresses[0]!.startsWith(`${net1}.`), `${addresses[0]} in ${net1}.0/24`);
      t.true(addresses[1]!.startsWith(`${net2}.`), `${addresses[1]} in ${net2}.0/24`);
    } finally {
      for (const id of made) await a.deleteSandbox(id).catch(() => undefined);
    }
  });
});

test.serial('FnCall through the cluster: a pool lands on one node, and either gateway reaches it by name', async (t) => {
  t.timeout(120_000);
  await withClients(async (a, b) => {
    const pool = await a.functions.create({ name: 'cl-echo', image: 'busybox', min: 1, max: 2 } as never);
    try {
      t.is(pool.name, 'cl-echo');
      const r = await b.functions.invoke('cl-echo', { cmd: ['sh', '-c', 'echo from $(hostname)'] });
      t.is(r.exitCode, 0);
      t.regex(r.stdout, /^from /);
      const listed = await b.functions.list();
      t.is(listed.filter((p) => p.name === 'cl-echo').length, 1, 'the pool is on one node');
      t.is(await codeOf(a.functions.create({ name: 'cl-echo', image: 'busybox', min: 0, max: 1 } as never)), 'ALREADY_EXISTS');
      t.is(await codeOf(b.functions.invoke('no-such-pool', { cmd: ['true'] })), 'NOT_FOUND');
    } finally {
      await a.functions.delete('cl-echo').catch(() => undefined);
    }
    t.is(await codeOf(b.functions.invoke('cl-echo', { cmd: ['true'] })), 'NOT_FOUND');
  });
});

lazyTest.serial('an image staged through a gateway is pulled by the overflow node, which then serves it alone, fetching a small part of its layer', async (t) => {
  // An image only n1 holds: busybox and 16 MiB of random data, with a small file to read.
  const dir = join(f.root, 'stagee');
  execFileSync('cp', ['-a', `${await busyboxRootfs()}/.`, dir]);
  mkdirSync(join(dir, 'data'), { recursive: true });
  writeFileSync(join(dir, 'data/big.bin'), randomBytes(16 << 20));
  writeFileSync(join(dir, 'data/small.txt'), 'staged and read on demand\n');
  const n1 = new WarrenClient({ url: f.node('n1').url, token: f.node('n1').adminToken });
  const n3 = new WarrenClient({ url: f.node('n3').url, token: f.node('n3').adminToken });
  const etcd = new Etcd3({ hosts: f.etcd.endpoints });
  try {
    const img = await n1.images.import('stagee', dir);
    await withClients(async (a, b) => {
      await waitForValue(() => a.clusterNodes(), (r) => r.nodes.some((n) => n.id === 'n1' && n.images.includes('stagee')), 20_000, 'n1 to report the image', 100);
      const staged = await a.images.stage('stagee', `${proxy!.host}/overflow`);
      t.deepEqual(staged.layers.map((l) => l.digest), img.layers.length > 0 ? img.layers : [img.digest]);
      // n3 loads layers on demand: it pulls what is staged (metadata only) and lists the image
      await waitForValue(() => b.clusterNodes(), (r) => r.nodes.some((n) => n.id === 'n3' && n.images.includes('stagee')), 30_000, 'n3 to pull the staged image', 100);
      t.true((await n3.images.list()).some((i) => i.name === 'stagee'));
      // n1 lets the image go: no on-prem node holds it, so the overflow node serves it
      await n1.images.delete('stagee');
      await waitForValue(() => a.clusterNodes(), (r) => !r.nodes.some((n) => n.id === 'n1' && n.images.includes('stagee')), 20_000, 'n1 to drop the image', 100);
      await proxy!.reset();
      const sb = await b.createSandbox({ image: 'stagee' });
      try {
        t.true(sb.id.startsWith('n3-'), `placed on ${sb.id}`);
        t.is((await sb.exec(['cat', '/data/small.txt'])).stdout, 'staged and read on demand\n');
        const c = await proxy!.counts();
        const layerBytes = staged.layers.reduce((n, l) => n + l.size, 0);
        t.log(`fetched ${c.blobBytes} of ${layerBytes} layer bytes to start the sandbox and read the file`);
        t.true(c.blobBytes > 0 && c.blobBytes < layerBytes * 0.25, `fetched ${c.blobBytes} of ${layerBytes}`);
      } finally {
        await sb.delete();
      }
    });
  } finally {
    // the rest of this file runs without a staged image
    await etcd.delete().prefix('/warren/overflow/').exec();
    await n3.images.delete('stagee').catch(() => undefined);
    await n1.images.delete('stagee').catch(() => undefined);
    etcd.close();
    await n1.close();
    await n3.close();
  }
});

test.serial('losing one of three etcd members, the leader, changes nothing visible', async (t) => {
  await withClients(async (a, b) => {
    const leader = await f.etcd.leader();
    await f.etcd.kill(leader);
    const made: { delete(): Promise<void> }[] = [];
    let jobId: string | null = null;
    try {
      const x = await a.createSandbox({ image: 'busybox' });
      made.push(x);
      made.push(await b.createSandbox({ image: 'busybox' }));
      t.is((await (await b.getSandbox(x.id)).exec(['echo', 'x'])).stdout, 'x\n');
      // admitted through b, followed through a at once: a's watch may still be catching up
      const job = await b.jobs.create({ count: 4, template: { image: 'busybox' } });
      jobId = job.id;
      t.is((await a.jobs.watch(job.id)).state, 'done');
      await a.jobs.delete(job.id);
      jobId = null;
      for (const sb of made.splice(0)) await sb.delete();
      const nodes = await a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes');
      t.deepEqual(nodes.nodes.map((n) => n.id).sort(), ['n1', 'n2', 'n3']);
    } finally {
      // a failure here must not leave sandboxes for the tests after this one
      if (jobId !== null) await a.jobs.delete(jobId).catch(() => undefined);
      for (const sb of made) await sb.delete().catch(() => undefined);
      f.etcd.restart(leader);
      await f.etcd.waitHealthy();
    }
  });
});

test.serial('without etcd quorum creates answer 503 CLUSTER_UNAVAILABLE while running sandboxes and their shells keep working; nothing is lost', async (t) => {
  t.timeout(180_000);
  await withClients(async (a, b) => {
    const sb = await a.createSandbox({ image: 'busybox' });
    let again: { delete(): Promise<void> } | null = null;
    try {
      const shell = await (await b.getSandbox(sb.id)).shell({ mode: 'command' });
      t.is((await shell.run('echo before')).stdout, 'before\n');
      await f.etcd.kill(1);
      await f.etcd.kill(2);
      try {
        t.is(await codeOf(a.createSandbox({ image: 'busybox' })), 'CLUSTER_UNAVAILABLE');
        t.is(await codeOf(b.jobs.create({ count: 2, template: { image: 'busybox' } })), 'CLUSTER_UNAVAILABLE');
        t.is((await (await a.getSandbox(sb.id)).exec(['echo', 'during'])).stdout, 'during\n');
        t.is((await shell.run('echo during-shell')).stdout, 'during-shell\n');
      } finally {
        f.etcd.restart(1);
        f.etcd.restart(2);
        await f.etcd.waitHealthy(60_000);
      }
      again = await waitForValue(() => a.createSandbox({ image: 'busybox' }).catch(() => null), (s) => s !== null, 30_000, 'creates work again', 200);
      t.is((await shell.run('echo after')).stdout, 'after\n');
      await shell.close();
      const nodes = await a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes');
      t.deepEqual(nodes.nodes.map((n) => n.id).sort(), ['n1', 'n2', 'n3']);
      t.deepEqual(nodes.lost, [], 'no node lost its lease over the quorum loss');
    } finally {
      await again?.delete().catch(() => undefined);
      await sb.delete().catch(() => undefined);
    }
  });
});

test.serial('kill -9 of a node: its sandboxes are lost to their owner and job, the others are untouched; forgetting it removes its lost epoch and quota blocks; it comes back, reconciles and re-registers', async (t) => {
  t.timeout(180_000);
  await f.waitIdle(['n1', 'n2']);
  await withClients(async (a, b) => {
    const job = await a.jobs.create({ count: 6, template: { image: 'busybox' }, placement: { nodes: ['n1', 'n2'] } });
    const done = await a.jobs.watch(job.id);
    const onN2 = done.nodes.n2?.created ?? 0;
    t.true(onN2 > 0 && (done.nodes.n1?.created ?? 0) > 0, JSON.stringify(done.nodes));
    const keep = await a.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n1'] } } });
    const doomed = await a.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n2'] } } });
    // an account with a quota holds a block of it on n2
    const acct = await a.requestJson<{ id: string; token: string }>('POST', '/v1/accounts', { json: { name: 'forgotten', role: 'runtime' } });
    await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxSandboxes: 4 } });
    const user = new WarrenClient({ url: f.gateways[0]!.url, token: acct.token });
    await user.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n2'] } } });
    const n2 = f.node('n2');
    await stopChild(n2.child, 'SIGKILL');
    const lostStatus = await waitForValue(() => b.jobs.get(job.id), (s: JobStatus) => s.lost === onN2, 30_000, 'the job reports the lost sandboxes', 100);
    t.is(lostStatus.state, 'partial');
    t.is(lostStatus.nodes.n2!.state, 'lost');
    t.is(await codeOf(b.getSandbox(doomed.id)), 'SANDBOX_LOST');
    t.is((await (await b.getSandbox(keep.id)).exec(['echo', 'alive'])).stdout, 'alive\n');

    // A node gone for good is forgotten: its lost epoch and its quota block leave etcd. A live
    // node, a name the cluster keeps nothing of and a malformed one are refused.
    const etcd = new Etcd3({ hosts: f.etcd.endpoints });
    try {
      const blockKey = `/warren/quota-blocks/${acct.id}/n2`;
      t.not(await etcd.get(blockKey).string(), null, 'n2 held a quota block');
      // every block n2 holds (earlier tests' accounts keep theirs, given back to what n2 needs) and its lost epochs
      const blocksOfN2 = async () => (await etcd.getAll().prefix('/warren/quota-blocks/').keys()).filter((k) => k.endsWith('/n2'));
      const blocksBefore = (await blocksOfN2()).length;
      const epochsBefore = (await a.clusterNodes()).lost.find((l) => l.node === 'n2')?.epochs.sort((x, y) => x - y) ?? [];
      t.true(epochsBefore.length >= 1, 'n2 has a lost epoch');
      t.is(await codeOf(a.forgetNode('n1')), 'NODE_LIVE');
      t.is(await codeOf(a.forgetNode('n9')), 'NOT_FOUND');
      t.is(await codeOf(a.forgetNode('N2!')), 'INVALID_ID');
      t.is(await codeOf(user.forgetNode('n2')), 'FORBIDDEN');
      const forgot = await b.forgetNode('n2');
      t.deepEqual(forgot, { node: 'n2', lostEpochs: epochsBefore, quotaBlocks: blocksBefore });
      t.is(await etcd.get(blockKey).string(), null, 'the quota block of n2 is gone');
      t.deepEqual(await blocksOfN2(), [], 'no block of n2 is left');
      t.deepEqual(await etcd.getAll().prefix('/warren/lost/n2/').keys(), []);
      // the other gateway learns it by watch: the sandbox is no longer reported lost, only not found
      await waitFor(async () => (await codeOf(a.getSandbox(doomed.id))) === 'SANDBOX_NOT_FOUND', 10_000, 'gateway a to forget n2', 100);
      t.false((await a.clusterNodes()).lost.some((l) => l.node === 'n2'));
      t.is(await codeOf(a.forgetNode('n2')), 'NOT_FOUND', 'nothing is left to forget');
    } finally {
      etcd.close();
      await user.close();
    }
    // the node comes back on its data dir: its lease is gone, so it removes the lost sandboxes and registers anew
    await f.restartNode(n2);
    const back = await waitForValue(() => a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes'), (r) => r.nodes.some((n) => n.id === 'n2' && n.epoch === 2 && !n.fenced), 30_000, 'n2 registered again', 100);
    t.truthy(back);
    const local = new WarrenClient({ url: n2.url, token: n2.adminToken });
    t.is((await local.listSandboxes()).length, 0, 'the lost epoch left nothing behind');
    await local.close();
    const fresh = await a.requestJson<{ id: string; node: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n2'] } } });
    t.is(fresh.node, 'n2');
    await a.deleteSandbox(fresh.id);
    await a.deleteSandbox(keep.id);
    await a.jobs.delete(job.id);
  });
});

test.serial('a node back from a lost epoch gives back its quota blocks before it admits: their room went to other nodes while it was lost', async (t) => {
  t.timeout(180_000);
  await f.waitIdle(['n1', 'n2']);
  await withClients(async (a) => {
    const acct = await a.requestJson<{ id: string; token: string }>('POST', '/v1/accounts', { json: { name: 'comeback', role: 'runtime' } });
    await a.requestJson('PUT', `/v1/accounts/${acct.id}/quota`, { json: { maxSandboxes: 2 } });
    const user = new WarrenClient({ url: f.gateways[0]!.url, token: acct.token });
    const create = (nodes: string[]) => user.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes } } });
    const made: string[] = [];
    const n2 = f.node('n2');
    let direct: RemoteShim | null = null;
    try {
      for (let i = 0; i < 2; i++) made.push((await create(['n2'])).id);
      await stopChild(n2.child, 'SIGKILL');
      await waitFor(async () => !(await a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes')).nodes.some((n) => n.id === 'n2'), 30_000, 'the lease of n2 expired', 100);
      // while n2 is lost its block does not count: the whole quota goes to n1
      for (let i = 0; i < 2; i++) made.push((await create(['n1'])).id);
      await f.restartNode(n2);
      // Straight at the node's own admission (its shim protocol, no gateway and its records in
      // front), from the moment it is registered again: the quota is full, whatever n2's old
      // block said.
      const back = await waitForValue(() => a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes'), (r) => r.nodes.some((n) => n.id === 'n2' && !n.fenced), 60_000, 'n2 registered again', 20);
      direct = await RemoteShim.connect({ url: back.nodes.find((n) => n.id === 'n2')!.shim, token: f.credential.shimToken('n2') });
      const codes = new Set<string>();
      const until = Date.now() + 1500;
      while (Date.now() < until) {
        codes.add(
          await direct.createSandbox(spec({ image: 'busybox', owner: acct.id })).then(
            (x) => {
              made.push(x.id);
              return 'ok';
            },
            (err: unknown) => (err instanceof WarrenError ? err.code : String(err)),
          ),
        );
      }
      t.false(codes.has('ok'), `n2 admitted past the quota: ${[...codes].join(', ')}`);
      t.deepEqual([...codes], ['QUOTA_EXCEEDED']);
    } finally {
      await direct?.close();
      for (const id of made) await a.deleteSandbox(id).catch(() => undefined);
      await user.close();
    }
  });
});

test.serial('a node stopped past its lease fences itself when it wakes: it admits nothing before it knows, removes the lost sandboxes and re-registers', async (t) => {
  t.timeout(120_000);
  await withClients(async (a) => {
    const n1 = f.node('n1');
    const local = new WarrenClient({ url: n1.url, token: n1.adminToken });
    const sb = await a.requestJson<{ id: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n1'] } } });
    const epoch = (await a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes')).nodes.find((n) => n.id === 'n1')!.epoch;
    let early: Promise<unknown> | null = null;
    n1.child.kill('SIGSTOP');
    try {
      await waitFor(async () => !(await a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes')).nodes.some((n) => n.id === 'n1'), 30_000, 'the lease of n1 expired', 100);
      t.is(await codeOf(a.getSandbox(sb.id)), 'SANDBOX_LOST');
      // The node wakes to a create sent to its own API while it was stopped, and etcd says nothing
      // for a moment: the node must not take its silence for a live lease.
      f.etcd.signalAll('SIGSTOP');
      try {
        early = local.createSandbox({ image: 'busybox' });
        early.catch(() => undefined);
        n1.child.kill('SIGCONT');
        await elapse(1500, 'etcd is silent while the woken node reads the create');
      } finally {
        f.etcd.signalAll('SIGCONT');
      }
    } finally {
      n1.child.kill('SIGCONT');
    }
    const made = await early!.then((s) => s as { id: string }, () => null);
    if (made !== null) await local.deleteSandbox(made.id).catch(() => undefined);
    t.is(await codeOf(early!), 'NODE_FENCED', 'a create that reached the node as it woke was not admitted in the lost epoch');
    await waitForValue(() => a.requestJson<ClusterNodes>('GET', '/v1/cluster/nodes'), (r) => r.nodes.some((n) => n.id === 'n1' && n.epoch === epoch + 1), 30_000, 'n1 re-registered', 100);
    await waitFor(() => n1.log.join('').includes('lost its lease'), 5_000, 'n1 logged the fence');
    t.false((await local.listSandboxes()).some((s) => s.id === sb.id), 'the sandbox of the lost epoch is gone');
    await local.close();
  });
});

test.serial('a gateway restart loses nothing', async (t) => {
  await withClients(async (a) => {
    const sb = await a.createSandbox({ image: 'busybox' });
    const job = await a.jobs.create({ count: 3, template: { image: 'busybox' } });
    await a.jobs.watch(job.id);
    // a keyed exec, answered again after the restart without running again
    const count = ['sh', '-c', 'echo run >> /tmp/runs; wc -l < /tmp/runs'];
    t.is((await sb.exec(count, { idempotencyKey: 'restart-1' })).stdout.trim(), '1');
    const gw = f.gateways[0]!;
    await stopChild(gw.child, 'SIGKILL');
    await f.restartGateway(gw);
    const again = f.client(gw);
    try {
      t.is((await again.jobs.get(job.id)).created, 3);
      const same = await again.getSandbox(sb.id);
      t.is((await same.exec(['echo', 'same'])).stdout, 'same\n');
      t.is((await same.exec(count, { idempotencyKey: 'restart-1' })).stdout.trim(), '1', 'the keyed exec was answered from the key');
      t.is((await same.exec(['cat', '/tmp/runs'])).stdout, 'run\n', 'and did not run again');
      await again.jobs.delete(job.id);
      await again.deleteSandbox(sb.id);
    } finally {
      await again.close();
    }
  });
});
