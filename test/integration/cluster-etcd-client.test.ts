/**
 * Warren's etcd client (src/cluster/etcd.ts) against a real 3-member etcd:
 * killing the leader costs an election during which every member answers
 * with an error, and a steady stream of reads and writes must ride through
 * it; without a quorum a call must give up with CLUSTER_UNAVAILABLE instead
 * of hanging.
 */
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { WarrenError } from '../../src/errors';
import { keys, openEtcd, store } from '../../src/cluster/etcd';
import { ClusterAccounts } from '../../src/cluster/accounts';
import { JobsCache, type JobSpec } from '../../src/cluster/jobs';
import { generateToken } from '../../src/gateway/auth';
import { EtcdCluster, etcdReason } from '../helpers/cluster';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';
import { waitForValue } from '../helpers/wait';

const test = testUnless(etcdReason, anyTest as TestFn<unknown>);

let root: string;
let cluster: EtcdCluster;

test.before(async () => {
  root = tempDir('warren-etcd-client-');
  cluster = new EtcdCluster(root);
  await cluster.start(3);
});

test.after.always(async () => {
  await cluster?.close();
});

// A gateway's watched copies lag behind what another gateway writes (by an election, at worst).
// These copies are frozen (their watches cancelled) to stand for that lag, deterministically.

test.serial("a job another gateway admitted is read from etcd, not refused from a copy that has not seen it", async (t) => {
  const etcd = openEtcd({ endpoints: cluster.endpoints });
  const cache = new JobsCache(etcd);
  try {
    await cache.start();
    await cache.close();
    const id = 'job-00000000000000aa';
    const spec = { id, owner: 'acct-x', count: 2, shares: [{ node: 'n1', share: 's1', epoch: 1, count: 2, ranges: [{ start: 0, count: 2 }] }], pending: [], handled: [] } as unknown as JobSpec;
    await etcd.put(keys.job(id)).value(JSON.stringify(spec)).exec();
    await etcd.put(keys.jobProgress(id, 'n1', 's1')).value(JSON.stringify({ job: id, share: 's1', node: 'n1', created: 1 })).exec();
    await etcd.put(keys.jobControl(id)).value(JSON.stringify({ state: 'paused', at: Date.now() })).exec();
    t.is(cache.jobs.get(id), undefined, 'the frozen copy does not know the job');
    const j = await cache.fresh(id);
    t.is(j?.spec?.count, 2);
    t.is(j?.control, 'paused');
    t.is(j?.progress.get('n1/s1')?.created, 1);
    await etcd.put(keys.jobControl(id)).value(JSON.stringify({ state: 'running', at: Date.now() })).exec();
    t.is((await cache.fresh(id))?.control, 'running', 'a later write is seen by the next read');
    t.is(await cache.fresh('job-00000000000000bb'), undefined, 'an unknown job stays unknown');
    await etcd.delete().prefix(keys.jobPrefix(id)).exec();
    await etcd.delete().key(keys.jobControl(id)).exec();
  } finally {
    etcd.close();
  }
});

test.serial('a token and a quota written through another gateway are read from etcd before a refusal', async (t) => {
  const e1 = openEtcd({ endpoints: cluster.endpoints });
  const e2 = openEtcd({ endpoints: cluster.endpoints });
  const stale = new ClusterAccounts(e1);
  const other = new ClusterAccounts(e2);
  try {
    await stale.start();
    await stale.close();
    await other.start();
    const { account, token } = await other.create('late', 'runtime');
    t.is(stale.cached(token), null, 'the frozen copy does not know the token');
    t.is((await stale.require(token)).id, account.id);
    const bogus = generateToken();
    await t.throwsAsync(stale.require(bogus), { code: 'UNAUTHENTICATED' } as never);
    await t.throwsAsync(stale.require(bogus), { code: 'UNAUTHENTICATED' } as never, 'and again, from the remembered miss');
    await other.setQuota(account.id, { maxSandboxes: 3 });
    t.deepEqual(await stale.setQuota(account.id, { maxCpu: 4 }), { maxSandboxes: 3, maxCpu: 4, maxMemoryMb: null }, 'a patch through the stale copy keeps the other one');
    t.deepEqual(await other.quota(account.id), { maxSandboxes: 3, maxCpu: 4, maxMemoryMb: null });
  } finally {
    await other.close();
    e1.close();
    e2.close();
  }
});

test.serial("a stream of reads and writes rides through the leader's loss", async (t) => {
  t.timeout(120_000);
  const etcd = openEtcd({ endpoints: cluster.endpoints });
  const leader = await cluster.leader();
  try {
    let stop = false;
    let done = 0;
    let slowest = 0;
    const failures: string[] = [];
    const worker = async (w: number): Promise<void> => {
      for (let i = 0; !stop; i++) {
        const started = Date.now();
        try {
          await store('put', () => etcd.put(`/warren-test/${w}`).value(String(i)).exec());
          const v = await store('read', () => etcd.get(`/warren-test/${w}`).string());
          if (v !== String(i)) failures.push(`worker ${w} read ${v} after writing ${i}`);
          done++;
          slowest = Math.max(slowest, Date.now() - started);
        } catch (err) {
          failures.push(String(err));
        }
      }
    };
    const workers = [0, 1, 2, 3].map(worker);
    const before = done;
    await cluster.kill(leader);
    // the calls go on until a new leader has served writes for a while
    const newLeader = await waitForValue(() => cluster.leader().catch(() => -1), (i) => i >= 0, 60_000, 'a new leader', 50);
    const at = done;
    while (done < at + 50) await etcd.get('/warren-test/0').string();
    stop = true;
    await Promise.all(workers);
    t.deepEqual(failures, []);
    t.not(newLeader, leader);
    t.true(done > before, 'calls completed across the election');
    t.log(`slowest put+read across the election: ${slowest} ms`);
  } finally {
    etcd.close();
    cluster.restart(leader);
    await cluster.waitHealthy(60_000);
  }
});

test.serial('without a quorum a call gives up with CLUSTER_UNAVAILABLE after its retry budget', async (t) => {
  t.timeout(120_000);
  const etcd = openEtcd({ endpoints: cluster.endpoints, retryBudgetMs: 1500 });
  try {
    await cluster.kill(1);
    await cluster.kill(2);
    const started = Date.now();
    const err = await t.throwsAsync(store('put', () => etcd.put('/warren-test/q').value('x').exec()));
    const took = Date.now() - started;
    t.true(err instanceof WarrenError && err.code === 'CLUSTER_UNAVAILABLE', String(err));
    t.true(took >= 1500, `gave up after ${took} ms, before its budget`);
    // one call in flight may finish after the budget (1 s deadline) plus one backoff (1 s)
    t.true(took < 1500 + 1000 + 1000 + 1000, `gave up after ${took} ms`);
  } finally {
    etcd.close();
    cluster.restart(1);
    cluster.restart(2);
    await cluster.waitHealthy(60_000);
  }
});
