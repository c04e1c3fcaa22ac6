/**
 * `warren gateway`: the cluster's stateless API. Any number of them serve
 * one cluster; everything they know comes from etcd (watched) and from the
 * nodes, so a gateway restart loses nothing.
 *
 * - Auth: accounts and tokens from etcd (ClusterAccounts).
 * - Creates: validated like on a node, placed (placement.ts), sent to the
 *   chosen node; a refusal (full, fenced) is placed again elsewhere.
 * - Everything about one sandbox is routed by the node its id names: the
 *   node must be a registered member (a record signed with the cluster
 *   credential), else 404 (410 SANDBOX_LOST for a node that lost its lease).
 *   The node is called as the account, with a signed assertion; HTTP and
 *   WebSocket (shells) pass through with back-pressure.
 * - Jobs: admitted (quota, validation, placement) in one etcd transaction;
 *   the nodes run their shares and report progress in etcd.
 * - Without etcd quorum, creates and jobs answer 503 CLUSTER_UNAVAILABLE;
 *   requests to running sandboxes go on (the membership is cached).
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import http from 'node:http';
import net from 'node:net';
import type { Duplex } from 'node:stream';
import type { Etcd3 } from 'etcd3';
import { request as undiciRequest, Agent as UndiciAgent } from 'undici';
import { WarrenError, asWarrenError } from '../errors';
import { type Account, type Quota, bearerFromHeader, bearerFromSubprotocols, can, checkQuota, principalOf, requirePermission } from '../gateway/auth';
import { errorBody } from '../gateway/http';
import { type HostCapacity, validateAccountRequest, validateCreateRequest, validateQuotaRequest } from '../validation';
import { warrenVersion } from '../gateway/server';
import type { BackendName, ImageInfo, SandboxInfo } from '../shim/types';
import { ClusterAccounts } from './accounts';
import type { ClusterCredential } from './credential';
import { type EtcdConfig, RecentMisses, keys, nextRevision, openEtcd, parseJson, readPrefix, store } from './etcd';
import { type CachedJob, JobsCache, type JobSpec, type JobStatus, type PlacementAsk, type ShareRef, isTerminal, jobStatus, validateJobRequest, validatePlacementAsk } from './jobs';
import { type JobControlState, type JobShare, type ShareProgress, indicesOf, toRanges } from './node-agent';
import { type NodeRecord, type PlacementRequest, nodeOfSandbox, placeMany } from './placement';

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
  log?: (line: string) => void;
}

export interface ClusterGateway {
  url: string;
  port: number;
  /** Set when this gateway created the admin token (print it once). */
  adminToken: string | null;
  close(): Promise<void>;
}

const JSON_LIMIT = 1024 * 1024;

class Membership extends EventEmitter {
  readonly nodes = new Map<string, NodeRecord>();
  /** node -> lost epochs */
  readonly lost = new Map<string, Set<number>>();
  readonly staged = new Set<string>();
  /**
   * Sandboxes this gateway created on a node that the node's latest record does not count yet,
   * by their creation time on the node's clock. A record is about a second old: without these,
   * every create in that second sees the same load and power-of-k choices herd them onto
   * whichever node looked least loaded. A record counts every create admitted before its `at`
   * (as being created or as live), so one that arrives before or after the create's answer
   * neither drops nor double-counts it.
   */
  private readonly placedSince = new Map<string, number[]>();
  private watchers: { cancel(): Promise<void> }[] = [];

  constructor(
    private readonly etcd: Etcd3,
    private readonly credential: ClusterCredential,
    private readonly log: (line: string) => void,
  ) {
    super();
  }

  async start(): Promise<void> {
    const nodes = await readPrefix(this.etcd, keys.nodes);
    for (const kv of nodes.kvs) this.putNode(kv.value);
    const w = await this.etcd.watch().prefix(keys.nodes).startRevision(nextRevision(nodes.revision)).create();
    w.on('put', (kv) => this.putNode(kv.value.toString('utf8')));
    w.on('delete', (kv) => this.dropNode(kv.key.toString('utf8').slice(keys.nodes.length)));
    this.watchers.push(w);
    const lost = await readPrefix(this.etcd, keys.lostAll);
    for (const kv of lost.kvs) this.putLost(kv.key);
    const lw = await this.etcd.watch().prefix(keys.lostAll).startRevision(nextRevision(lost.revision)).create();
    lw.on('put', (kv) => this.putLost(kv.key.toString('utf8')));
    this.watchers.push(lw);
    const staged = await readPrefix(this.etcd, keys.overflowStagedAll);
    for (const kv of staged.kvs) this.staged.add(kv.key.slice(keys.overflowStagedAll.length));
    const sw = await this.etcd.watch().prefix(keys.overflowStagedAll).startRevision(nextRevision(staged.revision)).create();
    sw.on('put', (kv) => this.staged.add(kv.key.toString('utf8').slice(keys.overflowStagedAll.length)));
    sw.on('delete', (kv) => this.staged.delete(kv.key.toString('utf8').slice(keys.overflowStagedAll.length)));
    this.watchers.push(sw);
  }

  private putNode(value: string): void {
    const rec = this.credential.verify(parseJson<NodeRecord & { sig: string }>(value));
    if (rec === null) {
      this.log('cluster: ignoring a node record without a valid cluster signature');
      return;
    }
    this.nodes.set(rec.id, rec);
    const placed = this.placedSince.get(rec.id);
    if (placed !== undefined) {
      const left = placed.filter((at) => at >= rec.at);
      if (left.length > 0) this.placedSince.set(rec.id, left);
      else this.placedSince.delete(rec.id);
    }
    this.emit('change');
  }

  private readonly misses = new RecentMisses();

  /**
   * A node record as etcd has it now, for a node this copy does not know: it may have registered
   * through a watch event still on its way. Misses are remembered ({@link RecentMisses}), so ids
   * naming nodes that do not exist cost etcd one read per node name and second at most.
   */
  async readNode(id: string): Promise<NodeRecord | undefined> {
    if (this.misses.has(id)) return undefined;
    const v = await store('read node', () => this.etcd.get(keys.node(id)).string());
    if (v !== null) this.putNode(v);
    const rec = this.nodes.get(id);
    if (rec === undefined) this.misses.add(id);
    return rec;
  }

  /** This gateway created a sandbox on `node` (its createdAt, from the node). */
  notePlaced(node: string, createdAt: string): void {
    const at = Date.parse(createdAt);
    const rec = this.nodes.get(node);
    if (rec !== undefined && rec.at > at) return; // the latest record counts it already
    const list = this.placedSince.get(node);
    if (list) list.push(at);
    else this.placedSince.set(node, [at]);
  }

  /** Per node, the creates of this gateway its latest record does not count. */
  *uncountedCreates(): Iterable<[string, number]> {
    for (const [n, l] of this.placedSince) yield [n, l.length];
  }

  private putLost(key: string): void {
    const m = /\/lost\/([^/]+)\/(\d+)$/.exec(key);
    if (!m) return;
    let s = this.lost.get(m[1]!);
    if (!s) this.lost.set(m[1]!, (s = new Set()));
    s.add(Number(m[2]));
    this.emit('lost', m[1]!, Number(m[2]));
  }

  /** The lease of a node expired: its sandboxes are lost. One gateway records it (create-if-absent). */
  private dropNode(id: string): void {
    const prev = this.nodes.get(id);
    this.nodes.delete(id);
    this.placedSince.delete(id);
    this.emit('change');
    if (!prev) return;
    const key = keys.lost(id, prev.epoch);
    this.log(`cluster: node ${id} lost its lease (epoch ${prev.epoch}); its sandboxes are lost`);
    this.putLost(key);
    void this.etcd
      .if(key, 'Create', '==', 0)
      .then(this.etcd.put(key).value(JSON.stringify({ node: id, epoch: prev.epoch, at: Date.now(), by: 'gateway' })))
      .commit()
      .catch((err: Error) => this.log(`cluster: cannot record the loss of ${id}: ${err.message}`));
  }

  isLost(node: string, epoch: number): boolean {
    return this.lost.get(node)?.has(epoch) ?? false;
  }

  live(): NodeRecord[] {
    return [...this.nodes.values()];
  }

  async close(): Promise<void> {
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)));
  }
}

// ------------------------------------------------------------------ http helpers

function send(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function sendError(res: http.ServerResponse, err: unknown, log: (l: string) => void): void {
  const e = asWarrenError(err);
  if (e.status >= 500 && e.code !== 'CLUSTER_UNAVAILABLE' && e.code !== 'UNAVAILABLE') log(`cluster gateway: ${e.code}: ${e.message}`);
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const text = errorBody(e);
  res.writeHead(e.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...(e.status === 429 ? { 'retry-after': '1' } : {}) });
  res.end(text);
}

async function readJson(req: http.IncomingMessage): Promise<unknown> {
  const len = Number(req.headers['content-length'] ?? 0);
  if (len > JSON_LIMIT) throw new WarrenError('PAYLOAD_TOO_LARGE', `request body too large (${len} > ${JSON_LIMIT} bytes)`);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of req) {
    size += (c as Buffer).length;
    if (size > JSON_LIMIT) throw new WarrenError('PAYLOAD_TOO_LARGE', `request body too large (> ${JSON_LIMIT} bytes)`);
    chunks.push(c as Buffer);
  }
  if (size === 0) return {};
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
  } catch {
    throw new WarrenError('INVALID_ARGUMENT', 'request body is not valid JSON');
  }
}

const HOP_HEADERS = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'host', 'authorization', 'te', 'trailer']);

// ------------------------------------------------------------------ the gateway

export async function startClusterGateway(opts: ClusterGatewayOptions): Promise<ClusterGateway> {
  const log = opts.log ?? ((l: string) => process.stderr.write(`${l}\n`));
  const etcd = openEtcd(opts.etcd);
  const credential = opts.credential;
  const members = new Membership(etcd, credential, log);
  const accounts = new ClusterAccounts(etcd);
  const jobs = new JobsCache(etcd);
  let adminToken: string | null = null;
  try {
    await store('start', async () => {
      await members.start();
      await accounts.start();
      await jobs.start();
    });
    const admin = await accounts.ensureAdmin(opts.adminTokenFile);
    if (admin.created) {
      const { writeFileSync } = await import('node:fs');
      writeFileSync(opts.adminTokenFile, `${admin.token}\n`, { mode: 0o600, flag: 'wx' });
      adminToken = admin.token;
    }
  } catch (err) {
    await members.close();
    await accounts.close();
    await jobs.close();
    etcd.close();
    throw err;
  }
  const dispatcher = new UndiciAgent({ connections: 64, keepAliveTimeout: 10_000 });
  const httpAgent = new http.Agent({ keepAlive: true, maxSockets: 256 });
  /** Creates this gateway has sent and the node's record does not show yet. */
  const inflight = new Map<string, number>();
  const inflightByAccount = new Map<string, number>();
  const placementOpts = () => ({ k: opts.k ?? 2, overflowThreshold: opts.overflowThreshold ?? 0.8, staged: members.staged });
  /** What the node records do not show yet: creates in flight and those done since each node's last record. */
  const reservedNow = (): Map<string, number> => {
    const r = new Map(inflight);
    for (const [n, c] of members.uncountedCreates()) r.set(n, (r.get(n) ?? 0) + c);
    return r;
  };

  const asAccount = (a: Account) => `Bearer ${credential.assertion(a)}`;

  async function callNode<T>(node: NodeRecord, method: 'GET' | 'POST' | 'DELETE', path: string, account: Account, body?: unknown): Promise<T> {
    let res;
    try {
      res = await undiciRequest(new URL(path, node.url), {
        method,
        dispatcher,
        headers: { authorization: asAccount(account), ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
        ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
        headersTimeout: 60_000,
        bodyTimeout: 60_000,
      });
    } catch (err) {
      throw new WarrenError('UNAVAILABLE', `node ${node.id} is unreachable: ${(err as Error).message}`, { node: node.id });
    }
    const text = await res.body.text();
    const json = text === '' ? null : (JSON.parse(text) as unknown);
    if (res.statusCode >= 400) {
      const e = (json as { error?: { code?: string; message?: string; details?: Record<string, unknown> } } | null)?.error;
      throw new WarrenError((e?.code ?? 'INTERNAL') as never, e?.message ?? `node ${node.id} answered ${res.statusCode}`, { ...(e?.details ?? {}), node: node.id });
    }
    return json as T;
  }

  /** A read that needs the etcd leader: without quorum it fails within the retry budget. */
  async function probeQuorum(): Promise<void> {
    await store('quorum check', () => etcd.get(keys.settings).exec());
  }

  function hostCapacity(): HostCapacity {
    let cpus = 1;
    let memoryMb = 256;
    for (const n of members.nodes.values()) {
      cpus = Math.max(cpus, n.capacity.cpus);
      memoryMb = Math.max(memoryMb, n.capacity.memoryMb);
    }
    return { cpus, memoryMb };
  }

  function backends(): BackendName[] {
    const s = new Set<BackendName>();
    for (const n of members.nodes.values()) for (const b of n.backends) s.add(b);
    return s.size === 0 ? ['container'] : [...s];
  }

  /**
   * Sandboxes of an account across the cluster: what the node records say
   * (about a second old), but at least what its live jobs made there (the
   * records lag behind a burst), plus job work not created yet and this
   * gateway's creates in flight.
   */
  function usage(accountId: string): number {
    let n = inflightByAccount.get(accountId) ?? 0;
    const byJobs = new Map<string, number>();
    for (const j of jobs.jobs.values()) {
      if (!j.spec || j.spec.owner !== accountId || j.control === 'deleted') continue;
      const st = jobStatus(j.spec, j.control, j.progress, (nd, e) => members.isLost(nd, e));
      for (const [node, ns] of Object.entries(st.nodes)) byJobs.set(node, (byJobs.get(node) ?? 0) + ns.created);
      if (!isTerminal(st.state)) n += Math.max(0, st.count - st.created - st.failed - st.lost);
    }
    for (const rec of members.nodes.values()) n += Math.max(rec.accounts[accountId] ?? 0, byJobs.get(rec.id) ?? 0);
    return n;
  }

  function placementRequest(spec: { backend: BackendName; image: string; workspaces: string[]; toolkits: string[] }, ask: PlacementAsk): PlacementRequest {
    const r: PlacementRequest = { backend: spec.backend, image: spec.image, workspaces: spec.workspaces, toolkits: spec.toolkits };
    if (ask.nodeSelector) r.nodeSelector = ask.nodeSelector;
    if (ask.nodes) r.nodes = ask.nodes;
    return r;
  }

  /** The node a sandbox id names; one this gateway's copy does not know yet (just registered) is read from etcd. */
  async function routeNode(id: string): Promise<NodeRecord> {
    const nodeId = nodeOfSandbox(id);
    const notFound = new WarrenError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`, { id });
    if (nodeId === null) throw notFound;
    const rec = members.nodes.get(nodeId) ?? (members.lost.has(nodeId) ? undefined : await members.readNode(nodeId));
    if (rec) return rec;
    if (members.lost.has(nodeId)) throw new WarrenError('SANDBOX_LOST', `sandbox "${id}" was on node ${nodeId}, which lost its cluster lease: the sandbox is lost`, { id, node: nodeId });
    throw notFound;
  }

  // ---------------------------------------------------------------- creates

  async function createOne(account: Account, body: Record<string, unknown>, explain: boolean): Promise<{ info: SandboxInfo; explain?: unknown }> {
    const { placement, ...rest } = body;
    const ask = validatePlacementAsk(placement);
    const spec = validateCreateRequest(rest, { owner: account.id, host: hostCapacity(), availableBackends: backends() });
    // the quota read is also the quorum check: without quorum nothing new is placed
    checkQuota(await accounts.quota(account.id, opts.defaultQuota), { sandboxes: usage(account.id), cpu: 0, memoryMb: 0 }, { cpu: 0, memoryMb: 0 });
    const exclude = new Set<string>();
    const req = placementRequest(spec, ask);
    let lastErr: WarrenError | null = null;
    for (let attempt = 0; attempt < 5; attempt++) {
      const placed = placeMany(members.live(), req, 1, { ...placementOpts(), reserved: reservedNow(), exclude });
      const nodeId = [...placed.counts.keys()][0];
      if (nodeId === undefined) {
        if (lastErr) throw lastErr;
        throw new WarrenError('RESOURCE_EXHAUSTED', 'no node can take this sandbox now', { explain: placed.explain, retryAfterS: 1 });
      }
      const node = members.nodes.get(nodeId)!;
      inflight.set(nodeId, (inflight.get(nodeId) ?? 0) + 1);
      inflightByAccount.set(account.id, (inflightByAccount.get(account.id) ?? 0) + 1);
      try {
        const info = await callNode<SandboxInfo>(node, 'POST', '/v1/sandboxes', account, rest);
        members.notePlaced(nodeId, info.createdAt);
        return explain ? { info, explain: { ...placed.explain, attempts: attempt + 1, refusedBy: [...exclude] } } : { info };
      } catch (err) {
        const e = asWarrenError(err);
        if (e.code !== 'RESOURCE_EXHAUSTED' && e.code !== 'NODE_FENCED' && e.code !== 'UNAVAILABLE') throw e;
        exclude.add(nodeId);
        lastErr = e;
      } finally {
        inflight.set(nodeId, (inflight.get(nodeId) ?? 1) - 1);
        inflightByAccount.set(account.id, (inflightByAccount.get(account.id) ?? 1) - 1);
      }
    }
    throw lastErr ?? new WarrenError('RESOURCE_EXHAUSTED', 'no node admitted the sandbox');
  }

  async function fanOut<T>(account: Account, path: string, method: 'GET' | 'POST' = 'GET'): Promise<{ results: T[]; unreachable: string[] }> {
    const results: T[] = [];
    const unreachable: string[] = [];
    await Promise.all(
      members.live().map(async (n) => {
        try {
          results.push(await callNode<T>(n, method, path, account));
        } catch (err) {
          if (asWarrenError(err).code === 'UNAVAILABLE') unreachable.push(n.id);
          else throw err;
        }
      }),
    );
    return { results, unreachable };
  }

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
    const spec = validateCreateRequest(tmplRest, { owner: account.id, host: hostCapacity(), availableBackends: backends() });
    spec.labels = { ...spec.labels, ...jr.labels };
    const req = placementRequest(spec, ask);
    // the same content check as a single create, before anything is placed: the image must be one the account may use
    const live = members.live();
    if (live.length === 0) throw new WarrenError('RESOURCE_EXHAUSTED', 'no node is registered in the cluster', { retryAfterS: 1 });
    const probe = live.find((n) => n.images.some((i) => i.name === spec.image || i.digest === spec.image)) ?? live[0]!;
    const visible = await callNode<{ images: ImageInfo[] }>(probe, 'GET', '/v1/images', account);
    for (const ref of [spec.image, ...spec.workspaces, ...spec.toolkits]) {
      if (!visible.images.some((i) => i.name === ref || i.digest === ref || `${i.name}:latest` === ref)) {
        throw new WarrenError('IMAGE_NOT_FOUND', `image ${ref} not found (or not usable by this account)`, { image: ref });
      }
    }
    const quota = await accounts.quota(account.id, opts.defaultQuota);
    const epochKey = keys.quotaEpoch(account.id);
    for (let attempt = 0; attempt < 5; attempt++) {
      const cur = await store('quota', () => etcd.get(epochKey).exec());
      const rev = cur.kvs[0]?.mod_revision ?? '0';
      let count = jr.count;
      if (quota.maxSandboxes !== null) {
        const used = usage(account.id);
        const room = Math.max(0, quota.maxSandboxes - used);
        if (room < count) {
          if (jr.quota === 'all' || room === 0) {
            throw new WarrenError('QUOTA_EXCEEDED', `account quota exceeded: maxSandboxes (limit ${quota.maxSandboxes}, in use ${used}, requested ${count})`, { quota: 'maxSandboxes', limit: quota.maxSandboxes, used, requested: count });
          }
          count = room;
        }
      }
      const id = `job-${randomBytes(8).toString('hex')}`;
      const placed = placeMany(members.live(), req, count, { ...placementOpts(), reserved: reservedNow() });
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
      const puts = [
        etcd.put(epochKey).value(id),
        etcd.put(keys.job(id)).value(JSON.stringify(jspec)),
        etcd.put(keys.jobControl(id)).value(JSON.stringify({ state: 'running' })),
        ...ops.map((o) => etcd.put(o.key).value(o.value)),
      ];
      const res = await store('admit job', () => etcd.if(epochKey, 'Mod', '==', rev).then(...puts).commit());
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
      const placed = placeMany(members.live(), placementRequest(spec.spec, spec.placement), again.length, { ...placementOpts(), reserved: reservedNow() });
      const n = again.length - placed.unplaced;
      if (n === 0 && handled.length === 0) continue;
      const { refs, ops } = sharesFor(spec, placed.counts, again.slice(0, n));
      const next: JobSpec = { ...spec, shares: [...spec.shares, ...refs], pending: toRanges(again.slice(n)), handled: [...spec.handled, ...handled] };
      await etcd
        .if(keys.job(id), 'Mod', '==', j.specRev)
        .then(etcd.put(keys.job(id)).value(JSON.stringify(next)), ...ops.map((o) => etcd.put(o.key).value(o.value)))
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

  async function followJob(res: http.ServerResponse, account: Account, id: string): Promise<void> {
    const { job } = await jobFor(account, id);
    res.writeHead(200, { 'content-type': 'application/x-ndjson', 'cache-control': 'no-store' });
    const write = (obj: unknown) => res.write(`${JSON.stringify(obj)}\n`);
    const seen = new Map<string, number>();
    const reportedLost = new Set<string>();
    const statusNow = () => jobStatus(job.spec!, job.control, job.progress, (n, e) => members.isLost(n, e));
    write({ type: 'status', ...statusNow() });
    // the ids already made (a stream that starts late still gets every sandbox)
    for (const [key, p] of job.progress) seen.set(key, p.batch.seq);
    let timer: NodeJS.Timeout | null = null;
    let ended = false;
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
      if (p.batch.ids.length > 0 && p.batch.seq > (seen.get(key) ?? 0)) {
        seen.set(key, p.batch.seq);
        write({ type: 'sandboxes', node: p.node, ids: p.batch.ids });
      }
      if (p.failures.length > 0) schedule();
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
      write({ type: 'done', ...st });
      cleanup();
      res.end();
    };
    jobs.on(`progress:${id}`, onProgress);
    jobs.on(`job:${id}`, onAny);
    members.on('lost', onAny);
    res.on('close', cleanup);
    schedule();
  }

  // ---------------------------------------------------------------- proxy

  function proxy(req: http.IncomingMessage, res: http.ServerResponse, node: NodeRecord, account: Account): void {
    const target = new URL(req.url ?? '/', node.url);
    const headers: http.OutgoingHttpHeaders = {};
    for (const [k, v] of Object.entries(req.headers)) if (!HOP_HEADERS.has(k) && v !== undefined) headers[k] = v;
    headers.authorization = asAccount(account);
    const up = http.request(target, { method: req.method, headers, agent: httpAgent }, (ur) => {
      const out: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(ur.headers)) if (!HOP_HEADERS.has(k) && v !== undefined) out[k] = v;
      res.writeHead(ur.statusCode ?? 502, out);
      ur.pipe(res);
    });
    up.on('error', (err) => sendError(res, new WarrenError('UNAVAILABLE', `node ${node.id} is unreachable: ${err.message}`, { node: node.id }), log));
    res.on('close', () => {
      if (!res.writableFinished) up.destroy();
    });
    req.pipe(up);
  }

  async function tunnel(req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const refuse = (e: WarrenError) => {
      const body = errorBody(e);
      socket.end(`HTTP/1.1 ${e.status} ${http.STATUS_CODES[e.status] ?? ''}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`);
    };
    // the client may close while its token is being looked up
    socket.on('error', () => undefined);
    try {
      const url = new URL(req.url ?? '/', 'http://x');
      const m = /^\/v1\/sandboxes\/([^/]+)\/shell$/.exec(url.pathname);
      if (!m) throw new WarrenError('NOT_FOUND', `no WebSocket route ${url.pathname}`);
      const proto = bearerFromSubprotocols(req.headers['sec-websocket-protocol']);
      const account = await accounts.require(bearerFromHeader(req.headers.authorization) ?? proto.token);
      const node = await routeNode(decodeURIComponent(m[1]!));
      if (socket.destroyed) return;
      const target = new URL(node.url);
      const up = net.connect(Number(target.port), target.hostname);
      const lines = [`${req.method} ${req.url} HTTP/1.1`, `host: ${target.host}`, `authorization: ${asAccount(account)}`];
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        const k = req.rawHeaders[i]!;
        const lk = k.toLowerCase();
        let v = req.rawHeaders[i + 1]!;
        if (lk === 'host' || lk === 'authorization') continue;
        if (lk === 'sec-websocket-protocol') {
          // the caller's token stays here: the node is called with the assertion
          v = v
            .split(',')
            .map((p) => p.trim())
            .filter((p) => !p.startsWith('bearer.'))
            .join(', ');
          if (v === '') continue;
        }
        lines.push(`${k}: ${v}`);
      }
      up.on('connect', () => {
        up.write(`${lines.join('\r\n')}\r\n\r\n`);
        if (head.length > 0) up.write(head);
        socket.pipe(up);
        up.pipe(socket);
      });
      const close = () => {
        up.destroy();
        socket.destroy();
      };
      up.on('error', () => refuse(new WarrenError('UNAVAILABLE', `node ${node.id} is unreachable`)));
      up.on('close', close);
      socket.on('error', close);
      socket.on('close', close);
    } catch (err) {
      refuse(asWarrenError(err));
    }
  }

  // ---------------------------------------------------------------- routes

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://x');
    const path = url.pathname;
    const method = req.method ?? 'GET';
    const q = url.searchParams;
    if (path === '/v1/health' && method === 'GET') {
      const etcdOk = await probeQuorum().then(
        () => true,
        () => false,
      );
      return send(res, 200, { ok: true, role: 'gateway', version: warrenVersion(), etcd: etcdOk ? 'ok' : 'unavailable', nodes: members.nodes.size });
    }
    const account = await accounts.require(bearerFromHeader(req.headers.authorization));

    if (path === '/v1/cluster/nodes' && method === 'GET') {
      requirePermission(account, 'allSandboxes');
      // `pending`: the creates this gateway counts on top of the record (in flight, or done
      // since the record was written); `recordAgeMs`: how old the record is by this clock
      const pending = reservedNow();
      const now = Date.now();
      return send(res, 200, {
        nodes: members.live().map((n) => ({ ...n, images: n.images.map((i) => i.name), pending: pending.get(n.id) ?? 0, recordAgeMs: now - n.at })),
        lost: [...members.lost].map(([node, epochs]) => ({ node, epochs: [...epochs] })),
        staged: [...members.staged],
      });
    }
    if (path === '/v1/accounts/me' && method === 'GET') return send(res, 200, account);
    if (path === '/v1/accounts' && method === 'POST') {
      requirePermission(account, 'accounts');
      const b = validateAccountRequest(await readJson(req));
      const c = await accounts.create(b.name, b.role);
      return send(res, 201, { ...c.account, token: c.token });
    }
    if (path === '/v1/accounts' && method === 'GET') {
      requirePermission(account, 'accounts');
      return send(res, 200, { accounts: accounts.list() });
    }
    const qm = /^\/v1\/accounts\/([^/]+)\/quota$/.exec(path);
    if (qm) {
      const id = decodeURIComponent(qm[1]!);
      if (method === 'GET') {
        if (id !== account.id) requirePermission(account, 'quotas');
        return send(res, 200, { account: id, quota: await accounts.quota(id, opts.defaultQuota), usage: { sandboxes: usage(id) } });
      }
      if (method === 'PUT') {
        requirePermission(account, 'quotas');
        const patch = validateQuotaRequest(await readJson(req));
        return send(res, 200, { account: id, quota: await accounts.setQuota(id, patch) });
      }
    }
    if (path === '/v1/images' && method === 'GET') {
      const { results } = await fanOut<{ images: ImageInfo[] }>(account, '/v1/images');
      const byDigest = new Map<string, ImageInfo>();
      for (const r of results) for (const i of r.images) byDigest.set(`${i.name}@${i.digest}`, i);
      return send(res, 200, { images: [...byDigest.values()] });
    }
    if (path === '/v1/policy' && method === 'GET') {
      requirePermission(account, 'policy');
      const cur = parseJson<{ rev: string }>(await store('policy', () => etcd.get(keys.policy).string()));
      const st = await store('policy', () => readPrefix(etcd, keys.policyStatus('')));
      return send(res, 200, { rev: cur?.rev ?? null, nodes: Object.fromEntries(st.kvs.map((kv) => [kv.key.slice(keys.policyStatus('').length), parseJson(kv.value)])) });
    }
    if (path === '/v1/policy/apply' && method === 'POST') {
      requirePermission(account, 'policy');
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
      return send(res, 202, { rev, nodes: members.nodes.size });
    }

    // ---- sandboxes
    if (path === '/v1/sandboxes' && method === 'POST') {
      requirePermission(account, 'sandboxes');
      const body = await readJson(req);
      if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new WarrenError('INVALID_ARGUMENT', 'body must be a JSON object');
      const r = await createOne(account, body as Record<string, unknown>, q.get('explain') === '1');
      return send(res, 201, r.explain ? { ...r.info, placement: r.explain } : r.info);
    }
    if (path === '/v1/sandboxes' && method === 'GET') {
      const { results, unreachable } = await fanOut<{ sandboxes: SandboxInfo[] }>(account, `/v1/sandboxes${url.search}`);
      return send(res, 200, { sandboxes: results.flatMap((r) => r.sandboxes), ...(unreachable.length > 0 ? { unreachable } : {}) });
    }
    if ((path === '/v1/sandboxes/pause' || path === '/v1/sandboxes/resume') && method === 'POST') {
      const { results, unreachable } = await fanOut<{ sandboxes: unknown[] }>(account, `${path}${url.search}`, 'POST');
      return send(res, 200, { sandboxes: results.flatMap((r) => r.sandboxes), ...(unreachable.length > 0 ? { unreachable } : {}) });
    }
    const sm = /^\/v1\/sandboxes\/([^/]+)(?:\/.*)?$/.exec(path);
    if (sm) return proxy(req, res, await routeNode(decodeURIComponent(sm[1]!)), account);

    // ---- jobs
    if (path === '/v1/jobs' && method === 'POST') {
      const r = await createJob(account, await readJson(req), q.get('explain') === '1');
      return send(res, r.status, r.body);
    }
    if (path === '/v1/jobs' && method === 'GET') {
      const out: JobStatus[] = [];
      for (const [id, j] of jobs.jobs) if (j.spec && (j.spec.owner === account.id || can(account, 'allSandboxes'))) out.push(cachedJobFor(account, id, j).status);
      return send(res, 200, { jobs: out });
    }
    const jm = /^\/v1\/jobs\/(job-[0-9a-f]{16})(?:\/(pause|resume|cancel|sandboxes))?$/.exec(path);
    if (jm) {
      const id = jm[1]!;
      const action = jm[2];
      if (method === 'GET' && action === undefined) {
        if (q.get('follow') === '1') return followJob(res, account, id);
        const { job, status } = await jobFor(account, id);
        return send(res, 200, q.get('explain') === '1' ? { ...status, explain: job.spec.explain ?? null, shares: job.spec.shares.map((s) => ({ node: s.node, count: s.count, epoch: s.epoch })) } : status);
      }
      if (method === 'GET' && action === 'sandboxes') {
        const { job } = await jobFor(account, id);
        const { results, unreachable } = await fanOut<{ sandboxes: SandboxInfo[] }>(account, `/v1/sandboxes?label=${encodeURIComponent(`warren.job=${id}`)}${can(account, 'allSandboxes') ? `&owner=${encodeURIComponent(job.spec.owner)}` : ''}`);
        return send(res, 200, { sandboxes: results.flatMap((r) => r.sandboxes), ...(unreachable.length > 0 ? { unreachable } : {}) });
      }
      if (method === 'POST' && action !== undefined && action !== 'sandboxes') {
        const { status } = await jobFor(account, id);
        if (status.state === 'deleted' || status.state === 'deleting') throw new WarrenError('SANDBOX_NOT_RUNNING', `job ${id} is ${status.state}`);
        await setControl(id, action === 'pause' ? 'paused' : action === 'resume' ? 'running' : 'cancelled');
        return send(res, 202, { id, state: action === 'pause' ? 'paused' : action === 'resume' ? 'running' : 'cancelled' });
      }
      if (method === 'DELETE' && action === undefined) {
        await jobFor(account, id);
        await setControl(id, 'deleted');
        return send(res, 202, { id, state: 'deleting' });
      }
    }
    throw new WarrenError('NOT_FOUND', `no route for ${method} ${path}`);
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err) => {
      // an unread body is not buffered after an error
      if (!req.complete) res.setHeader('connection', 'close');
      sendError(res, err, log);
    });
  });
  server.on('upgrade', (req, socket, head) => void tunnel(req, socket, head));
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((resolve, reject) => {
    server.once('error', (err) => reject(new WarrenError('UNAVAILABLE', `cannot listen on ${opts.host}:${opts.port}: ${err.message}`)));
    server.listen(opts.port, opts.host, () => resolve());
  });
  const port = (server.address() as net.AddressInfo).port;
  const url = `http://${opts.host.includes(':') ? `[${opts.host}]` : opts.host === '0.0.0.0' ? '127.0.0.1' : opts.host}:${port}`;
  let closing: Promise<void> | null = null;
  return {
    url,
    port,
    adminToken,
    close() {
      closing ??= (async () => {
        clearInterval(reconcileTimer);
        server.closeAllConnections();
        await new Promise<void>((r) => server.close(() => r()));
        await members.close();
        await accounts.close();
        await jobs.close();
        httpAgent.destroy();
        await dispatcher.close();
        etcd.close();
      })();
      return closing;
    },
  };
}

