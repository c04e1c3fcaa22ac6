/**
 * `warren gateway`: the cluster's stateless API. Any number of them serve
 * one cluster; everything they know comes from etcd (watched) and from the
 * nodes, so a gateway restart loses nothing.
 *
 * It is the standard gateway (src/gateway: REST, shells, files, lifecycle,
 * the dashboard) over a ClusterShim: every node is reached through its shim
 * protocol, as `warren gateway --node` reaches one node. What a cluster adds:
 *
 * - accounts, tokens and quotas from etcd (ClusterAccounts);
 * - creates placed over the nodes (cluster-shim.ts, placement.ts), and
 *   per-sandbox calls routed by the node each id names;
 * - the cluster's routes: its nodes (`GET /v1/cluster/nodes`), the policy
 *   distributed through etcd, and jobs, admitted (quota, validation,
 *   placement) in one etcd transaction and run by the nodes, which report
 *   progress in etcd.
 * - Without etcd quorum, creates and jobs answer 503 CLUSTER_UNAVAILABLE;
 *   requests to running sandboxes go on (membership and tokens are cached).
 */
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import type { Response, Server } from 'hyper-express';
import { WarrenError } from '../errors';
import { type Account, type Quota, can, principalOf, requirePermission } from '../gateway/auth';
import { type GatewayContext, authed } from '../gateway/context';
import { endChunked, queryOf, queryOne, readJson, rejectUnknownQuery, sendJson, writeChunk } from '../gateway/http';
import { NDJSON_CONTENT_TYPE } from '../gateway/ndjson';
import { createGateway } from '../gateway/server';
import type { BackendName, SandboxUsage } from '../shim/types';
import { openDatabase } from '../state/db';
import { NODE_ID_RE, validateCreateRequest, validatePlacementAsk } from '../validation';
import { ClusterAccounts } from './accounts';
import { ClusterShim } from './cluster-shim';
import type { ClusterCredential } from './credential';
import { type EtcdConfig, type StagedImage, keys, openEtcd, parseJson, readPrefix, store } from './etcd';
import { type CachedJob, JobsCache, type JobSpec, type JobStatus, type ShareRef, isTerminal, jobStatus, validateJobRequest } from './jobs';
import { Membership } from './membership';
import { JOB_LABEL, type JobControlState, type JobShare, type ShareProgress, indicesOf, toRanges } from './node-agent';
import { placeMany, placementRequest } from './placement';
import { type BlockContext, blockGrowth, committedOf, growBlock, limited, readBlocks, roomFor, viewWithRoom, whenUnchanged } from './quota-blocks';

export interface ClusterGatewayOptions {
  etcd: EtcdConfig;
  credential: ClusterCredential;
  host: string;
  port: number;
  /** The operator's admin token (read, or created and written here). */
  adminTokenFile: string;
  overflowThreshold?: number;
  k?: number;
  defaultQuota?: Quota;
  /** Origins allowed to open shells from browsers (the dashboard served elsewhere). */
  allowedOrigins?: string[];
  /**
   * Where this gateway keeps its idempotency keys (`gateway.db`), so that a keyed exec retried
   * after a restart of this gateway is answered, not run again. Without it they live in memory.
   */
  dataDir?: string;
  log?: (line: string) => void;
}

export interface ClusterGateway {
  url: string;
  port: number;
  /** Set when this gateway created the admin token (print it once). */
  adminToken: string | null;
  close(): Promise<void>;
}

export async function startClusterGateway(opts: ClusterGatewayOptions): Promise<ClusterGateway> {
  const log = opts.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  const etcd = openEtcd(opts.etcd);
  const credential = opts.credential;
  const members = new Membership(etcd, credential, log);
  const accounts = new ClusterAccounts(etcd);
  const jobs = new JobsCache(etcd);
  let adminToken: string | null = null;
  const closeState = async () => {
    await members.close();
    await accounts.close();
    await jobs.close();
    etcd.close();
  };
  try {
    await store('start', async () => {
      await members.start();
      await accounts.start();
      await jobs.start();
    });
    const admin = await accounts.ensureAdmin(opts.adminTokenFile);
    if (admin.created) {
      writeFileSync(opts.adminTokenFile, `${admin.token}\n`, { mode: 0o600, flag: 'wx' });
      adminToken = admin.token;
    }
  } catch (err) {
    await closeState();
    throw err;
  }
  const placementOpts = () => ({ k: opts.k ?? 2, overflowThreshold: opts.overflowThreshold ?? 0.8, staged: members.staged });

  /** A read that needs the etcd leader: without quorum it fails within the retry budget. */
  async function probeQuorum(): Promise<void> {
    await store('quorum check', () => etcd.get(keys.settings).exec());
  }

  /**
   * An account's sandboxes across the cluster, and the cpu and memory they
   * were given: what the node records say (about a second old), but per node
   * at least what its live jobs made there (the records lag behind a burst),
   * plus job work not created yet. Creates through this gateway since the
   * records are added by the ClusterShim, creates in flight by the create
   * route.
   */
  function usage(accountId: string): SandboxUsage {
    const u: SandboxUsage = { sandboxes: 0, cpu: 0, memoryMb: 0 };
    const byJobs = new Map<string, SandboxUsage>();
    for (const j of jobs.jobs.values()) {
      if (!j.spec || j.spec.owner !== accountId || j.control === 'deleted') continue;
      const st = jobStatus(j.spec, j.control, j.progress, (nd, e) => members.isLost(nd, e));
      const { cpu, memoryMb } = j.spec.spec;
      for (const [node, ns] of Object.entries(st.nodes)) {
        const b = byJobs.get(node) ?? { sandboxes: 0, cpu: 0, memoryMb: 0 };
        b.sandboxes += ns.created;
        b.cpu += ns.created * cpu;
        b.memoryMb += ns.created * memoryMb;
        byJobs.set(node, b);
      }
      if (!isTerminal(st.state)) {
        const todo = Math.max(0, st.count - st.created - st.failed - st.lost);
        u.sandboxes += todo;
        u.cpu += todo * cpu;
        u.memoryMb += todo * memoryMb;
      }
    }
    for (const rec of members.nodes.values()) {
      const b = byJobs.get(rec.id);
      const r = rec.resources?.[accountId];
      u.sandboxes += Math.max(rec.accounts[accountId] ?? 0, b?.sandboxes ?? 0);
      u.cpu += Math.max(r?.cpu ?? 0, b?.cpu ?? 0);
      u.memoryMb += Math.max(r?.memoryMb ?? 0, b?.memoryMb ?? 0);
    }
    return u;
  }



  /** The nodes whose blocks count, and what each node's record says an account holds there. */
  const blockCtx =
    (account: string) =>
    (): BlockContext => ({
      live: new Set(members.live().map((n) => n.id)),
      recorded: (node) => {
        const rec = members.nodes.get(node);
        const r = rec?.resources?.[account];
        return { sandboxes: rec?.accounts[account] ?? 0, cpu: r?.cpu ?? 0, memoryMb: r?.memoryMb ?? 0 };
      },
    });
  // The create route has just read the quota (a quorum read): the block check reuses it for a second.
  const quotaCache = new Map<string, { q: Quota; at: number }>();
  async function recentQuota(account: string): Promise<Quota> {
    const c = quotaCache.get(account);
    if (c !== undefined && Date.now() - c.at < 1000) return c.q;
    const q = await accounts.quota(account, opts.defaultQuota);
    if (quotaCache.size > 10_000) quotaCache.clear();
    quotaCache.set(account, { q, at: Date.now() });
    return q;
  }
  /** Blocks this gateway has seen exist (account/node), for a few seconds: a create there needs no etcd read. */
  const knownBlocks = new Map<string, number>();
  const blocks: NonNullable<ConstructorParameters<typeof ClusterShim>[0]['blocks']> = {
    async ensure(owner, node, spec) {
      const q = await recentQuota(owner);
      if (!limited(q)) return;
      const k = `${owner}/${node}`;
      if (Date.now() - (knownBlocks.get(k) ?? 0) < 5000) return;
      const v = await store('read quota block', () => etcd.get(keys.quotaBlock(owner, node)).exec());
      if (v.kvs.length === 0) await growBlock(etcd, credential, { account: owner, node, quota: q, spec, ctx: blockCtx(owner) });
      if (knownBlocks.size > 10_000) knownBlocks.clear();
      knownBlocks.set(k, Date.now());
    },
    async grow(owner, node, spec) {
      const q = await accounts.quota(owner, opts.defaultQuota);
      if (limited(q)) await growBlock(etcd, credential, { account: owner, node, quota: q, spec, ctx: blockCtx(owner) });
    },
  };

  const shimOpts: ConstructorParameters<typeof ClusterShim>[0] = { members, credential, usageOf: usage, blocks, log };
  // The layers first: by the time a lazy node sees the image and pulls it, placement counts them as staged.
  shimOpts.recordStaged = (r) =>
    store('stage record', async () => {
      const layers = r.layers.map((l) => l.digest);
      await Promise.all(layers.map((d) => etcd.put(keys.overflowStaged(d)).value(r.ref).exec()));
      const staged: StagedImage = { image: r.image, ref: r.ref, manifestDigest: r.manifestDigest, layers, at: Date.now() };
      await etcd.put(keys.overflowImage(r.image)).value(JSON.stringify(credential.sign(staged))).exec();
    });
  if (opts.k !== undefined) shimOpts.k = opts.k;
  if (opts.overflowThreshold !== undefined) shimOpts.overflowThreshold = opts.overflowThreshold;
  const shim = new ClusterShim(shimOpts);

  // ---------------------------------------------------------------- jobs

  function signShare(s: JobShare): string {
    return JSON.stringify(credential.sign(s));
  }

  function sharesFor(spec: JobSpec, counts: Map<string, number>, indices: number[]): { refs: ShareRef[]; ops: { key: string; value: string }[] } {
    const refs: ShareRef[] = [];
    const ops: { key: string; value: string }[] = [];
    let at = 0;
    for (const [nodeId, n] of counts) {
      const rec = members.nodes.get(nodeId)!;
      const ranges = toRanges(indices.slice(at, at + n));
      at += n;
      const share = `s${randomBytes(4).toString('hex')}`;
      refs.push({ node: nodeId, share, epoch: rec.epoch, count: n, ranges });
      const s: JobShare = { job: spec.id, share, node: nodeId, epoch: rec.epoch, spec: spec.spec, principal: spec.principal, ranges, count: n, concurrency: spec.concurrency };
      ops.push({ key: keys.jobShare(spec.id, nodeId, share), value: signShare(s) });
    }
    return { refs, ops };
  }

  async function createJob(account: Account, body: unknown, explain: boolean): Promise<{ status: number; body: unknown }> {
    requirePermission(account, 'sandboxes');
    const jr = validateJobRequest(body);
    const tmpl = jr.template as Record<string, unknown>;
    const { placement: tmplPlacement, ...tmplRest } = typeof tmpl === 'object' && tmpl !== null && !Array.isArray(tmpl) ? tmpl : { placement: undefined };
    const ask = { ...validatePlacementAsk(tmplPlacement), ...jr.placement };
    const features = await shim.features();
    const availableBackends = (Object.keys(features.backends) as BackendName[]).filter((b) => features.backends[b]?.available);
    const spec = validateCreateRequest(tmplRest, { owner: account.id, host: features.host ?? { cpus: 1, memoryMb: 256 }, availableBackends });
    spec.labels = { ...spec.labels, ...jr.labels };
    const req = placementRequest(spec, ask);
    // the same content check as a single create, before anything is placed: the image must be one the account may use
    const live = members.live();
    if (live.length === 0) throw new WarrenError('RESOURCE_EXHAUSTED', 'no node is registered in the cluster', { retryAfterS: 1 });
    await shim.authorizeContent(principalOf(account), spec);
    const quota = await accounts.quota(account.id, opts.defaultQuota);
    const epochKey = keys.quotaEpoch(account.id);
    // A limited account's job is held to its quota by blocks (quota-blocks.ts): what the nodes
    // hold or reserve for the account leaves room for so many of this template; the admission
    // grows the blocks of the nodes it places on, in the same transaction.
    const isLimited = limited(quota);
    for (let attempt = 0; attempt < 5; attempt++) {
      let count = jr.count;
      let blockView: Awaited<ReturnType<typeof viewWithRoom>> | null = null;
      let rev: string;
      if (isLimited) {
        blockView = await viewWithRoom(etcd, credential, account.id, quota, spec, count, blockCtx(account.id));
        rev = blockView.view.epochRev;
        const tight = blockView.room;
        if (tight !== null && tight.room < count) {
          if (jr.quota === 'all' || tight.room === 0) {
            const asked = tight.limit === 'maxSandboxes' ? count : tight.limit === 'maxCpu' ? count * spec.cpu : count * spec.memoryMb;
            throw new WarrenError('QUOTA_EXCEEDED', `account quota exceeded: ${tight.limit} (limit ${tight.max}, in use or reserved ${tight.used}, requested ${asked} for ${count} sandboxes)`, { quota: tight.limit, limit: tight.max, used: tight.used, requested: asked });
          }
          count = tight.room;
        }
      } else {
        const cur = await store('quota', () => etcd.get(epochKey).exec());
        rev = cur.kvs[0]?.mod_revision ?? '0';
      }
      const id = `job-${randomBytes(8).toString('hex')}`;
      const placed = placeMany(members.live(), req, count, { ...placementOpts(), reserved: shim.reservedNow() });
      const indices = Array.from({ length: count }, (_, i) => i);
      const jspec: JobSpec = {
        id,
        owner: account.id,
        count,
        spec,
        principal: principalOf(account),
        labels: jr.labels,
        concurrency: jr.concurrency,
        placement: ask,
        createdAt: new Date().toISOString(),
        shares: [],
        pending: [],
        handled: [],
      };
      const placedTotal = count - placed.unplaced;
      const { refs, ops } = sharesFor(jspec, placed.counts, indices.slice(0, placedTotal));
      jspec.shares = refs;
      jspec.pending = toRanges(indices.slice(placedTotal));
      if (explain) jspec.explain = placed.explain;
      const growth = blockView === null ? { compares: [[epochKey, rev]] as [string, string][], puts: [etcd.put(epochKey).value(id)] } : blockGrowth(etcd, credential, blockView.view, blockView.ctx, placed.counts, spec);
      const puts = [
        ...growth.puts,
        etcd.put(keys.job(id)).value(JSON.stringify(jspec)),
        etcd.put(keys.jobControl(id)).value(JSON.stringify({ state: 'running' })),
        ...ops.map((o) => etcd.put(o.key).value(o.value)),
      ];
      const res = await store('admit job', () => whenUnchanged(etcd, growth.compares).then(...puts).commit());
      if (!res.succeeded) continue; // another job of this account was admitted meanwhile: count again
      jobs.admitted(jspec, res.header.revision);
      return {
        status: 202,
        body: { id, count, requested: jr.count, placed: Object.fromEntries(placed.counts), pending: placed.unplaced, ...(explain ? { explain: placed.explain } : {}) },
      };
    }
    throw new WarrenError('CLUSTER_UNAVAILABLE', 'could not admit the job: its account kept changing (retry)');
  }

  function cachedJobFor(account: Account, id: string, j: CachedJob | undefined): { job: { spec: JobSpec } & CachedJob; status: JobStatus } {
    if (!j || !j.spec || (j.spec.owner !== account.id && !can(account, 'allSandboxes'))) throw new WarrenError('JOB_NOT_FOUND', `job "${id}" not found`, { id });
    return { job: j as { spec: JobSpec } & CachedJob, status: jobStatus(j.spec, j.control, j.progress, (n, e) => members.isLost(n, e)) };
  }

  /** One job as etcd has it now, whichever gateway wrote it last. */
  async function jobFor(account: Account, id: string): Promise<{ job: { spec: JobSpec } & CachedJob; status: JobStatus }> {
    return cachedJobFor(account, id, await jobs.fresh(id));
  }

  async function setControl(id: string, state: JobControlState): Promise<void> {
    await store('job control', () => etcd.put(keys.jobControl(id)).value(JSON.stringify({ state, at: Date.now() })).exec());
  }

  /**
   * Place again what is pending: indices no node had room for, refused by a
   * node, or never made on a node that was lost. Guarded by the job spec's
   * revision, so that with several gateways only one of them does it.
   */
  async function reconcileJobs(): Promise<void> {
    for (const [id, j] of jobs.jobs) {
      if (!j.spec || j.control !== 'running') continue;
      const spec = j.spec;
      const again: number[] = [...indicesOf(spec.pending)];
      const handled: string[] = [];
      for (const ref of spec.shares) {
        const key = `${ref.node}/${ref.share}`;
        if (spec.handled.includes(key)) continue;
        const p = j.progress.get(key);
        if (members.isLost(ref.node, ref.epoch)) continue; // below
        if (p && p.refused > 0 && p.state !== 'creating') {
          again.push(...indicesOf(p.refusedRanges ?? []));
          handled.push(key);
        }
      }
      // a lost node's share: the sandboxes it made are lost; the ones it never made are placed again
      for (const ref of spec.shares) {
        const key = `${ref.node}/${ref.share}`;
        if (spec.handled.includes(key) || handled.includes(key) || !members.isLost(ref.node, ref.epoch)) continue;
        const p = j.progress.get(key);
        const done = (p?.created ?? 0) + (p?.failed ?? 0);
        again.push(...[...indicesOf(ref.ranges)].slice(done));
        handled.push(key);
      }
      if (again.length === 0) continue;
      again.sort((a, b) => a - b);
      // a limited account's re-placed work needs room in its quota: blocks grown where it goes
      const quota = await accounts.quota(spec.owner, opts.defaultQuota);
      let want = again.length;
      let view: Awaited<ReturnType<typeof readBlocks>> | null = null;
      const ctx = blockCtx(spec.owner)();
      if (limited(quota)) {
        view = await readBlocks(etcd, credential, spec.owner);
        want = Math.min(want, roomFor(quota, committedOf(view, ctx), spec.spec)?.room ?? want);
      }
      const placed = placeMany(members.live(), placementRequest(spec.spec, spec.placement), want, { ...placementOpts(), reserved: shim.reservedNow() });
      const n = want - placed.unplaced;
      if (n === 0 && handled.length === 0) continue;
      const { refs, ops } = sharesFor(spec, placed.counts, again.slice(0, n));
      const next: JobSpec = { ...spec, shares: [...spec.shares, ...refs], pending: toRanges(again.slice(n)), handled: [...spec.handled, ...handled] };
      const growth = view === null ? { compares: [] as [string, string][], puts: [] } : blockGrowth(etcd, credential, view, ctx, placed.counts, spec.spec);
      await whenUnchanged(etcd, [[keys.job(id), j.specRev], ...growth.compares])
        .then(etcd.put(keys.job(id)).value(JSON.stringify(next)), ...ops.map((o) => etcd.put(o.key).value(o.value)), ...growth.puts)
        .commit()
        .catch(() => undefined);
    }
  }
  let reconciling = false;
  const reconcileTimer = setInterval(() => {
    if (reconciling) return;
    reconciling = true;
    void reconcileJobs()
      .catch(() => undefined)
      .finally(() => (reconciling = false));
  }, 500);
  reconcileTimer.unref();

  /** A job's progress as NDJSON until it ends: its status, the ids as they are made, progress, lost nodes, then `done`. */
  async function followJob(res: Response, account: Account, id: string): Promise<void> {
    const { job } = await jobFor(account, id);
    res.status(200);
    res.header('content-type', NDJSON_CONTENT_TYPE);
    res.header('cache-control', 'no-store');
    // lines go out in order; a slow reader only delays its own stream
    let chain: Promise<unknown> = Promise.resolve();
    const write = (obj: unknown) => {
      const line = `${JSON.stringify(obj)}\n`;
      chain = chain.then(() => writeChunk(res, line)).catch(() => false);
    };
    const seen = new Map<string, number>();
    const reportedLost = new Set<string>();
    const statusNow = () => jobStatus(job.spec!, job.control, job.progress, (n, e) => members.isLost(n, e));
    write({ type: 'status', ...statusNow() });
    // Each progress record carries only the ids of its latest batch. A stream does not see every
    // write: the batches written before it started, and any write the cache skipped (a read of
    // the job through any route jumps it to etcd's latest record). So every id goes out once,
    // from the batches as they come and from the job's sandboxes as the nodes list them: at the
    // start, when a batch number shows one was missed, and before `done`.
    let timer: NodeJS.Timeout | null = null;
    let ended = false;
    /** The client went away: nothing more is listed for it. */
    let gone = false;
    const emitted = new Set<string>();
    const emit = (node: string, ids: readonly string[]) => {
      const fresh = ids.filter((i) => !emitted.has(i));
      for (const i of fresh) emitted.add(i);
      if (fresh.length > 0) write({ type: 'sandboxes', node, ids: fresh });
    };
    const listed = async () => {
      const list = await shim.listSandboxes({ labels: { [JOB_LABEL]: job.spec!.id }, owner: job.spec!.owner }).catch(() => null);
      if (list === null || gone) return;
      const byNode = new Map<string, string[]>();
      for (const sb of list) {
        const ids = byNode.get(sb.node);
        if (ids) ids.push(sb.id);
        else byNode.set(sb.node, [sb.id]);
      }
      for (const [node, ids] of byNode) emit(node, ids.sort());
    };
    let catchingUp: Promise<void> | null = null;
    const catchUp = () => (catchingUp ??= listed().finally(() => (catchingUp = null)));
    for (const [key, p] of job.progress) seen.set(key, p.batch.seq);
    await listed();
    const checkLost = () => {
      for (const ref of job.spec!.shares) {
        const key = `${ref.node}/${ref.epoch}`;
        if (!reportedLost.has(key) && members.isLost(ref.node, ref.epoch)) {
          reportedLost.add(key);
          const made = [...job.progress.values()].filter((p) => p.node === ref.node && p.epoch === ref.epoch).reduce((s, p) => s + p.created, 0);
          write({ type: 'lost', node: ref.node, epoch: ref.epoch, count: made });
        }
      }
    };
    const tick = () => {
      timer = null;
      if (ended) return;
      checkLost();
      const st = statusNow();
      write({ type: 'progress', state: st.state, created: st.created, failed: st.failed, lost: st.lost, pending: st.pending, paused: st.paused, count: st.count });
      if (isTerminal(st.state)) finish(st);
    };
    const schedule = () => {
      timer ??= setTimeout(tick, 200);
    };
    const onProgress = (p: ShareProgress) => {
      const key = `${p.node}/${p.share}`;
      const last = seen.get(key) ?? 0;
      if (p.batch.seq > last) {
        seen.set(key, p.batch.seq);
        emit(p.node, p.batch.ids);
        // a batch between the last one seen and this one never reached this stream
        if (p.batch.seq > last + (p.batch.ids.length > 0 ? 1 : 0)) void catchUp();
      }
      schedule();
    };
    const onAny = () => schedule();
    const cleanup = () => {
      ended = true;
      if (timer) clearTimeout(timer);
      jobs.off(`progress:${id}`, onProgress);
      jobs.off(`job:${id}`, onAny);
      members.off('lost', onAny);
    };
    const finish = (st: JobStatus) => {
      cleanup();
      // the ids no batch brought here, then the end
      void (catchingUp ?? Promise.resolve())
        .then(() => listed())
        .then(() => {
          write({ type: 'done', ...st });
          return chain.then(() => endChunked(res));
        });
    };
    jobs.on(`progress:${id}`, onProgress);
    jobs.on(`job:${id}`, onAny);
    members.on('lost', onAny);
    res.once('close', () => {
      gone = true;
      cleanup();
    });
    schedule();
  }


  // ---------------------------------------------------------------- the cluster's routes

  function registerClusterRoutes(app: Server, ctx: GatewayContext): void {
    app.get(
      '/v1/cluster/nodes',
      authed(ctx, (req, res, account) => {
        rejectUnknownQuery(queryOf(req), []);
        requirePermission(account, 'allSandboxes');
        // `pending`: the creates this gateway counts on top of the record (in flight, or done
        // since the record was written); `recordAgeMs`: how old the record is by this clock
        const pending = shim.reservedNow();
        const now = Date.now();
        sendJson(res, 200, {
          nodes: members.live().map((n) => ({ ...n, images: n.images.map((i) => i.name), pending: pending.get(n.id) ?? 0, recordAgeMs: now - n.at })),
          lost: [...members.lost].map(([node, epochs]) => ({ node, epochs: [...epochs] })),
          staged: [...members.staged],
        });
      }),
    );

    app.delete(
      '/v1/cluster/nodes/:id',
      authed(ctx, async (req, res, account) => {
        rejectUnknownQuery(queryOf(req), []);
        requirePermission(account, 'allSandboxes');
        const id = req.path_parameters.id ?? '';
        if (!NODE_ID_RE.test(id)) throw new WarrenError('INVALID_ID', `invalid node id: ${JSON.stringify(id.slice(0, 40))}`, { field: 'id' });
        sendJson(res, 200, await members.forget(id));
      }),
    );

    app.post(
      '/v1/jobs',
      authed(ctx, async (req, res, account) => {
        const q = queryOf(req);
        rejectUnknownQuery(q, ['explain']);
        const r = await createJob(account, await readJson(req), queryOne(q, 'explain') === '1');
        sendJson(res, r.status, r.body);
      }),
    );
    app.get(
      '/v1/jobs',
      authed(ctx, (req, res, account) => {
        rejectUnknownQuery(queryOf(req), []);
        const out: JobStatus[] = [];
        for (const [id, j] of jobs.jobs) if (j.spec && (j.spec.owner === account.id || can(account, 'allSandboxes'))) out.push(cachedJobFor(account, id, j).status);
        sendJson(res, 200, { jobs: out });
      }),
    );
    app.get(
      '/v1/jobs/:id',
      authed(ctx, async (req, res, account) => {
        const q = queryOf(req);
        rejectUnknownQuery(q, ['follow', 'explain']);
        const id = jobId(req.path_parameters.id);
        if (queryOne(q, 'follow') === '1') return followJob(res, account, id);
        const { job, status } = await jobFor(account, id);
        sendJson(res, 200, queryOne(q, 'explain') === '1' ? { ...status, explain: job.spec.explain ?? null, shares: job.spec.shares.map((s) => ({ node: s.node, count: s.count, epoch: s.epoch })) } : status);
      }),
    );
    app.get(
      '/v1/jobs/:id/sandboxes',
      authed(ctx, async (req, res, account) => {
        rejectUnknownQuery(queryOf(req), []);
        const { job } = await jobFor(account, jobId(req.path_parameters.id));
        const labels = { 'warren.job': job.spec.id };
        const list = await shim.listSandboxes({ labels, owner: job.spec.owner });
        sendJson(res, 200, { sandboxes: list, ...(list.unreachable ? { unreachable: list.unreachable } : {}) });
      }),
    );
    for (const action of ['pause', 'resume', 'cancel'] as const) {
      app.post(
        `/v1/jobs/:id/${action}`,
        authed(ctx, async (req, res, account) => {
          rejectUnknownQuery(queryOf(req), []);
          const id = jobId(req.path_parameters.id);
          const { status } = await jobFor(account, id);
          if (status.state === 'deleted' || status.state === 'deleting') throw new WarrenError('SANDBOX_NOT_RUNNING', `job ${id} is ${status.state}`);
          // Cancel stops creating: a job that has ended creating keeps the state it ended in.
          if (action === 'cancel' && isTerminal(status.state)) {
            sendJson(res, 200, { id, state: status.state });
            return;
          }
          const state = action === 'pause' ? 'paused' : action === 'resume' ? 'running' : 'cancelled';
          await setControl(id, state);
          sendJson(res, 202, { id, state });
        }),
      );
    }
    app.delete(
      '/v1/jobs/:id',
      authed(ctx, async (req, res, account) => {
        rejectUnknownQuery(queryOf(req), []);
        const id = jobId(req.path_parameters.id);
        await jobFor(account, id);
        await setControl(id, 'deleted');
        sendJson(res, 202, { id, state: 'deleting' });
      }),
    );
  }

  /** The policy of a cluster is etcd's: applied through any gateway, taken by every node through a watch. */
  function registerClusterPolicy(app: Server, ctx: GatewayContext): void {
    app.get(
      '/v1/policy',
      authed(ctx, async (req, res, account) => {
        requirePermission(account, 'policy');
        rejectUnknownQuery(queryOf(req), []);
        const cur = parseJson<{ rev: string }>(await store('policy', () => etcd.get(keys.policy).string()));
        const st = await store('policy', () => readPrefix(etcd, keys.policyStatus('')));
        sendJson(res, 200, { rev: cur?.rev ?? null, nodes: Object.fromEntries(st.kvs.map((kv) => [kv.key.slice(keys.policyStatus('').length), parseJson(kv.value)])) });
      }),
    );
    app.post(
      '/v1/policy/apply',
      authed(ctx, async (req, res, account) => {
        requirePermission(account, 'policy');
        rejectUnknownQuery(queryOf(req), []);
        const b = (await readJson(req)) as { files?: unknown };
        if (typeof b !== 'object' || b === null || typeof b.files !== 'object' || b.files === null || Array.isArray(b.files)) {
          throw new WarrenError('INVALID_ARGUMENT', 'body must be {"files": {"<name>.yaml": "<text>", ...}}', { field: 'files' });
        }
        const files: Record<string, string> = {};
        for (const [n, t] of Object.entries(b.files as Record<string, unknown>)) {
          if (!/^[a-z][a-z0-9-]*\.yaml$/.test(n) || typeof t !== 'string') throw new WarrenError('INVALID_ARGUMENT', `files.${n}: a policy file name (x.yaml) with its text`, { field: `files.${n}` });
          files[n] = t;
        }
        const rev = `${Date.now()}-${randomBytes(3).toString('hex')}`;
        await store('policy', () => etcd.put(keys.policy).value(JSON.stringify(credential.sign({ rev, files }))).exec());
        sendJson(res, 202, { rev, nodes: members.nodes.size });
      }),
    );
  }

  // Nothing of the cluster is kept here; only idempotency keys, in the data dir when given, else in memory.
  const db = opts.dataDir === undefined ? new Database(':memory:') : openDatabase(join(opts.dataDir, 'gateway.db'));
  let gateway: Awaited<ReturnType<typeof createGateway>>;
  try {
    const gwOpts: Parameters<typeof createGateway>[0] = {
      shim,
      db,
      dataDir: opts.dataDir ?? '',
      host: opts.host,
      port: opts.port,
      auth: accounts,
      log,
      extension: {
        policyRoutes: registerClusterPolicy,
        routes: registerClusterRoutes,
        health: async () => ({
          role: 'gateway',
          etcd: await probeQuorum().then(
            () => 'ok',
            () => 'unavailable',
          ),
          nodes: members.nodes.size,
        }),
        soleGateway: false,
      },
    };
    if (opts.defaultQuota !== undefined) gwOpts.defaultQuota = opts.defaultQuota;
    if (opts.allowedOrigins !== undefined) gwOpts.allowedOrigins = opts.allowedOrigins;
    gateway = await createGateway(gwOpts);
  } catch (err) {
    clearInterval(reconcileTimer);
    await shim.close();
    db.close();
    await closeState();
    throw err;
  }
  let closing: Promise<void> | null = null;
  return {
    url: gateway.url,
    port: gateway.port,
    adminToken,
    close() {
      closing ??= (async () => {
        clearInterval(reconcileTimer);
        await gateway.close();
        await shim.close();
        db.close();
        await closeState();
      })();
      return closing;
    },
  };
}

/** A job id from a path: anything else is JOB_NOT_FOUND, as for a job of another account. */
function jobId(raw: unknown): string {
  const id = String(raw);
  if (!/^job-[0-9a-f]{16}$/.test(id)) throw new WarrenError('JOB_NOT_FOUND', `job "${id.slice(0, 80)}" not found`, { id: id.slice(0, 80) });
  return id;
}
