/**
 * The whole cluster as one Shim: what `warren gateway` serves the standard
 * API (REST, shells, files, lifecycle, the dashboard) over. It holds one
 * RemoteShim per node, to the node's shim protocol, and
 *
 * - routes everything about a sandbox by the node its id names, with no
 *   lookup: the node must be a member (a record signed with the cluster
 *   credential), else SANDBOX_NOT_FOUND; a node that lost its lease answers
 *   SANDBOX_LOST for every id it named;
 * - places creates (placement.ts) and places a refusal (full, fenced,
 *   unreachable) again on another node;
 * - fans lists, usage and label-selector pauses out over the live nodes and
 *   merges their answers (pages stay sorted by id across nodes). A node that
 *   does not answer is left out of a list, and named in the log.
 *
 * Nothing here reaches a node in any other way, so a node is exactly what
 * its shim protocol offers (docs/shim-protocol.md).
 */
import type { Duplex, Readable } from 'node:stream';
import { WarrenError, asWarrenError } from '../errors';
import type { Principal } from '../shim/access';
import { RemoteShim } from '../shim/remote/client';
import type {
  BackendName,
  BackendStatus,
  CapturedExec,
  ContentRefs,
  CreateOptions,
  DirWatch,
  EnvironmentInfo,
  ExecRequest,
  ExecResult,
  ExecStream,
  FeatureReport,
  FileEntry,
  FnCallApi,
  ImageInfo,
  ImagePushResult,
  ImageRemoval,
  ImportImageRequest,
  ImportProgress,
  LiveExec,
  OpenSessionOptions,
  PackRequest,
  PackResult,
  PauseResult,
  ResumeResult,
  SandboxFilter,
  SandboxInfo,
  SandboxList,
  SandboxNetworkInfo,
  SandboxSpec,
  SandboxStats,
  SandboxUsage,
  SessionAttachment,
  SessionInfo,
  Shim,
} from '../shim/types';
import { ClusterFnCall } from './cluster-fncall';
import type { ClusterCredential } from './credential';
import { type NodeRecord, imageMatches, nodeOfSandbox, placeMany, placementRequest } from './placement';

/**
 * What a ClusterShim knows of the nodes. In `warren gateway` it is the
 * Membership kept from etcd; any other source of signed node records works
 * the same way.
 */
export interface NodeDirectory {
  /** The live node records by id (verified ones only). */
  readonly nodes: ReadonlyMap<string, NodeRecord>;
  /** Node -> the epochs it lost its lease in. */
  readonly lost: ReadonlyMap<string, ReadonlySet<number>>;
  /** Layer digests staged for the overflow pool. */
  readonly staged: ReadonlySet<string>;
  live(): NodeRecord[];
  /** A record this copy does not hold yet (a node that has just registered), or undefined. */
  readNode(id: string): Promise<NodeRecord | undefined>;
  /** This gateway created sandbox `info` on `node` (its createdAt is the node's clock). */
  notePlaced(node: string, info: Pick<SandboxInfo, 'createdAt' | 'owner' | 'limits'>): void;
  /** Per node, the creates of this gateway its latest record does not count. */
  uncountedCreates(): Iterable<[string, number]>;
  /** What the creates of `owner` through this gateway add to the node records, which do not count them yet. */
  uncountedUsage(owner: string): SandboxUsage;
}

export interface ClusterShimOptions {
  /** The name the cluster answers as (`nodeId`, in /v1/health); default "cluster". */
  name?: string;
  members: NodeDirectory;
  credential: ClusterCredential;
  /** Power-of-k choices (default 2). */
  k?: number;
  /** On-prem utilisation above which eligible requests go to the overflow pool (default 0.8). */
  overflowThreshold?: number;
  /** An account's sandboxes across the cluster, with their cpu and memory (node records and jobs: the gateway's count). */
  usageOf: (owner: string) => SandboxUsage;
  /** How long a node may take to answer its part of a list before it is left out as unreachable (default 5 s). */
  fanOutTimeoutMs?: number;
  /** Told of every image staged through this shim: the cluster records its layers as staged and lazy nodes pull it. */
  recordStaged?: (r: ImagePushResult) => Promise<void>;
  /**
   * The accounts' quota blocks (quota-blocks.ts): `ensure` before a create is sent to a node
   * (a limited account gets a block there first), `grow` when the node refused for want of room
   * in its block. Both throw QUOTA_EXCEEDED when the quota has no room.
   */
  blocks?: {
    ensure(owner: string, node: string, spec: SandboxSpec): Promise<void>;
    grow(owner: string, node: string, spec: SandboxSpec): Promise<void>;
  };
  log: (line: string) => void;
}

/** Times a create grows its account's block on one node before it takes the node's refusal. */
const BLOCK_GROWS = 3;

/** Refusals a create is placed again for: the node is full, fenced or did not answer. */
const REPLACEABLE = new Set(['RESOURCE_EXHAUSTED', 'NODE_AT_CAPACITY', 'NODE_FENCED', 'UNAVAILABLE']);
/** Nodes a create tries before it gives up. */
const MAX_ATTEMPTS = 5;

interface Connection {
  url: string;
  epoch: number;
  shim: Promise<RemoteShim>;
  /** Set once connected. */
  ready: RemoteShim | null;
}

/** How old a node's feature report may be before it is asked again. */
const FEATURES_MAX_AGE_MS = 30_000;

export class ClusterShim implements Shim {
  readonly nodeId: string;
  /** FnCall pools, each on one node (cluster-fncall.ts). */
  readonly functions: FnCallApi;
  private readonly conns = new Map<string, Connection>();
  private readonly reports = new Map<string, { epoch: number; at: number; report: FeatureReport }>();
  private refreshing: Promise<void> | null = null;
  /** Creates this gateway has sent to a node and not seen answered. */
  private readonly inflight = new Map<string, number>();
  private closed = false;

  constructor(private readonly opts: ClusterShimOptions) {
    this.nodeId = opts.name ?? 'cluster';
    this.functions = new ClusterFnCall({
      live: () => opts.members.live(),
      record: (id) => opts.members.nodes.get(id),
      node: (rec) => this.node(rec),
      everyNode: (what, fn, deadlineMs) => this.everyNode(what, fn, deadlineMs),
    });
  }

  // ---------------------------------------------------------------- nodes

  /** The node a sandbox id names; one this gateway's copy does not know yet (just registered) is read from etcd. */
  async nodeOf(id: string): Promise<NodeRecord> {
    const m = this.opts.members;
    const nodeId = nodeOfSandbox(id);
    const notFound = new WarrenError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`, { id });
    if (nodeId === null) throw notFound;
    const rec = m.nodes.get(nodeId) ?? (m.lost.has(nodeId) ? undefined : await m.readNode(nodeId));
    if (rec) return rec;
    if (m.lost.has(nodeId)) throw new WarrenError('SANDBOX_LOST', `sandbox "${id}" was on node ${nodeId}, which lost its cluster lease: the sandbox is lost`, { id, node: nodeId });
    throw notFound;
  }

  /**
   * The shim of node `rec`, connected once per registration. A node that
   * registers again (a new epoch, or a new address) gets a new connection; a
   * connection that failed is not kept, so the next call tries again.
   */
  node(rec: NodeRecord): Promise<RemoteShim> {
    if (this.closed) return Promise.reject(new WarrenError('UNAVAILABLE', 'the gateway is shutting down'));
    const cur = this.conns.get(rec.id);
    if (cur && cur.url === rec.shim && cur.epoch === rec.epoch) return cur.shim;
    if (cur) void cur.shim.then((s) => s.close()).catch(() => undefined);
    // a new connection is rare: the moment to close those of nodes that left the cluster
    for (const [id, c] of this.conns) {
      if (this.opts.members.nodes.has(id)) continue;
      this.conns.delete(id);
      void c.shim.then((s) => s.close()).catch(() => undefined);
    }
    const shim = (async () => {
      if (typeof rec.shim !== 'string' || rec.shim === '') throw new WarrenError('UNAVAILABLE', `node ${rec.id} does not advertise a shim protocol URL (an older node?)`, { node: rec.id });
      const s = await RemoteShim.connect({ url: rec.shim, token: this.opts.credential.shimToken(rec.id) });
      if (s.nodeId !== rec.id) {
        await s.close();
        throw new WarrenError('UNAVAILABLE', `the shim protocol at ${rec.shim} is node ${s.nodeId}, not ${rec.id}`, { node: rec.id });
      }
      return s;
    })();
    const conn: Connection = { url: rec.shim, epoch: rec.epoch, shim, ready: null };
    this.conns.set(rec.id, conn);
    shim.then(
      (s) => {
        conn.ready = s;
        // closed while it connected: nobody holds it
        if (this.closed) void s.close();
      },
      () => {
        if (this.conns.get(rec.id) === conn) this.conns.delete(rec.id);
      },
    );
    return shim;
  }

  /** Run `fn` on the node sandbox `id` is on. */
  private async on<T>(id: string, fn: (s: RemoteShim) => Promise<T>): Promise<T> {
    return fn(await this.node(await this.nodeOf(id)));
  }

  /**
   * `fn` on every live node; the nodes that did not answer are logged, left
   * out, and named in `unreachable`. A node that accepts connections but does
   * not answer (stopped, partitioned before its lease runs out) is given up
   * on after `deadlineMs`, so that one node cannot hold every list up; what
   * may rightly take long (pausing a node's share of a job) passes none.
   */
  private async everyNode<T>(what: string, fn: (s: RemoteShim, rec: NodeRecord) => Promise<T>, deadlineMs: number | null = this.opts.fanOutTimeoutMs ?? 5000): Promise<T[] & { unreachable?: string[] }> {
    const out: T[] = [];
    const unreachable: string[] = [];
    await Promise.all(
      this.opts.members.live().map(async (rec) => {
        const call = (async () => fn(await this.node(rec), rec))();
        let timer: NodeJS.Timeout | undefined;
        try {
          out.push(
            deadlineMs === null
              ? await call
              : await Promise.race([
                  call,
                  new Promise<never>((_, reject) => {
                    timer = setTimeout(() => reject(new WarrenError('UNAVAILABLE', `node ${rec.id} did not answer within ${deadlineMs} ms`, { node: rec.id })), deadlineMs);
                  }),
                ]),
          );
        } catch (err) {
          if (asWarrenError(err).code !== 'UNAVAILABLE') throw err;
          call.catch(() => undefined);
          unreachable.push(rec.id);
        } finally {
          clearTimeout(timer);
        }
      }),
    );
    if (unreachable.length === 0) return out;
    unreachable.sort();
    this.opts.log(`cluster: ${what}: node${unreachable.length > 1 ? 's' : ''} ${unreachable.join(', ')} did not answer and ${unreachable.length > 1 ? 'are' : 'is'} left out`);
    return Object.assign(out, { unreachable });
  }

  /** What the node records do not show yet: creates in flight and those done since each node's last record. */
  reservedNow(): Map<string, number> {
    const r = new Map(this.inflight);
    for (const [n, c] of this.opts.members.uncountedCreates()) r.set(n, (r.get(n) ?? 0) + c);
    return r;
  }

  // ---------------------------------------------------------------- the node-wide calls

  /**
   * The nodes' own feature reports, asked again when older than 30 s (in the
   * background: creates read features on every call). Only a node never
   * asked is waited for.
   */
  private async nodeReports(live: NodeRecord[]): Promise<Array<[NodeRecord, FeatureReport]>> {
    const now = Date.now();
    const stale = live.filter((n) => {
      const c = this.reports.get(n.id);
      return c === undefined || c.epoch !== n.epoch || now - c.at > FEATURES_MAX_AGE_MS;
    });
    if (stale.length > 0) {
      this.refreshing ??= Promise.all(
        stale.map(async (rec) => {
          try {
            this.reports.set(rec.id, { epoch: rec.epoch, at: Date.now(), report: await (await this.node(rec)).features() });
          } catch (err) {
            this.opts.log(`cluster: features of node ${rec.id}: ${asWarrenError(err).message}`);
          }
        }),
      ).then(
        () => void (this.refreshing = null),
        () => void (this.refreshing = null),
      );
      if (stale.some((n) => !this.reports.has(n.id))) await this.refreshing;
    }
    for (const id of this.reports.keys()) if (!live.some((n) => n.id === id)) this.reports.delete(id);
    return live.flatMap((n) => {
      const c = this.reports.get(n.id);
      return c ? [[n, c.report] as [NodeRecord, FeatureReport]] : [];
    });
  }

  /**
   * The cluster's features: what every live node reports, merged. A kernel
   * feature is supported when every node supports it (else the reason names
   * the nodes); a backend is available when some node offers it (placement
   * sends it there); the host is the largest machine, so a create bigger than
   * every node is refused before it is placed. Per node: GET /v1/cluster/nodes.
   */
  async features(): Promise<FeatureReport> {
    const live = this.opts.members.live();
    const reports = await this.nodeReports(live);
    let cpus = 1;
    let memoryMb = 256;
    for (const n of live) {
      cpus = Math.max(cpus, n.capacity.cpus);
      memoryMb = Math.max(memoryMb, n.capacity.memoryMb);
    }
    const backends = {} as Record<BackendName, BackendStatus>;
    for (const b of ['container', 'microvm', 'vm'] as const) {
      const holders = live.filter((n) => n.backends.includes(b)).map((n) => n.id);
      const status = reports.find(([n, r]) => holders.includes(n.id) && r.backends[b]?.available)?.[1].backends[b];
      if (holders.length > 0) backends[b] = { ...(status ?? {}), available: true };
      else backends[b] = { available: false, reason: live.length === 0 ? 'no node is registered in the cluster' : (reports.find(([, r]) => r.backends[b]?.reason)?.[1].backends[b]?.reason ?? 'no registered node offers it') };
    }
    const features: FeatureReport['features'] = {};
    const names = new Set(reports.flatMap(([, r]) => Object.keys(r.features)));
    for (const name of names) {
      const missing = reports.filter(([, r]) => r.features[name]?.supported !== true);
      if (missing.length === 0) {
        features[name] = { supported: true };
        continue;
      }
      const first = missing[0]![1].features[name];
      const on = missing.map(([n]) => n.id).join(', ');
      features[name] = { supported: false, reason: `${first?.reason ?? 'not reported'} (on ${on})`, ...(first?.action ? { action: first.action } : {}) };
    }
    const common = (values: string[], what: string): string => {
      const distinct = [...new Set(values)];
      if (distinct.length === 1) return distinct[0]!;
      if (distinct.length === 0) return `${what}: no node reported`;
      return `mixed: ${reports.map(([n, r]) => `${n.id}: ${what === 'kernel' ? r.kernel : r.enforcer}`).join('; ')}`;
    };
    return {
      node: this.nodeId,
      kernel: common(reports.map(([, r]) => r.kernel), 'kernel'),
      cgroup: reports[0]?.[1].cgroup ?? { version: 2, controllers: [], bpfHierarchy: null },
      features,
      backends,
      functions: reports.some(([, r]) => r.functions.available) ? { available: true } : { available: false, reason: reports.find(([, r]) => r.functions.reason)?.[1].functions.reason ?? 'no registered node has FnCall pools' },
      enforcer: common(reports.map(([, r]) => r.enforcer), 'enforcer'),
      host: { cpus, memoryMb },
    };
  }

  async createSandbox(spec: SandboxSpec, principal?: Principal, opts: CreateOptions = {}): Promise<SandboxInfo> {
    const req = placementRequest(spec, opts.placement ?? {});
    const exclude = new Set<string>();
    let lastErr: WarrenError | null = null;
    for (let attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
      const placed = placeMany(this.opts.members.live(), req, 1, { k: this.opts.k ?? 2, overflowThreshold: this.opts.overflowThreshold ?? 0.8, staged: this.opts.members.staged, reserved: this.reservedNow(), exclude });
      const nodeId = [...placed.counts.keys()][0];
      if (nodeId === undefined) {
        if (lastErr) throw lastErr;
        throw new WarrenError('RESOURCE_EXHAUSTED', 'no node can take this sandbox now', { explain: placed.explain, retryAfterS: 1 });
      }
      const rec = this.opts.members.nodes.get(nodeId)!;
      this.inflight.set(nodeId, (this.inflight.get(nodeId) ?? 0) + 1);
      try {
        const info = await this.createWithinBlock(rec, spec, principal);
        this.opts.members.notePlaced(nodeId, info);
        return opts.explain ? { ...info, placement: { ...placed.explain, attempts: attempt + 1, refusedBy: [...exclude] } } : info;
      } catch (err) {
        const e = asWarrenError(err);
        if (!REPLACEABLE.has(e.code)) throw e;
        exclude.add(nodeId);
        lastErr = e;
      } finally {
        const n = (this.inflight.get(nodeId) ?? 1) - 1;
        if (n > 0) this.inflight.set(nodeId, n);
        else this.inflight.delete(nodeId);
      }
    }
    throw lastErr ?? new WarrenError('RESOURCE_EXHAUSTED', 'no node admitted the sandbox');
  }

  /** A create on one node, within its account's quota block there (grown when the node says it is full). */
  private async createWithinBlock(rec: NodeRecord, spec: SandboxSpec, principal?: Principal): Promise<SandboxInfo> {
    const blocks = this.opts.blocks;
    await blocks?.ensure(spec.owner, rec.id, spec);
    for (let grows = 0; ; grows++) {
      try {
        return await (await this.node(rec)).createSandbox(spec, principal);
      } catch (err) {
        const e = asWarrenError(err);
        if (blocks === undefined || e.code !== 'QUOTA_EXCEEDED' || (e.details as { block?: unknown } | undefined)?.block !== true || grows >= BLOCK_GROWS) throw e;
        await blocks.grow(spec.owner, rec.id, spec);
      }
    }
  }

  async listSandboxes(filter?: SandboxFilter): Promise<SandboxList> {
    const lists = await this.everyNode('list', (s) => s.listSandboxes(filter));
    const all: SandboxList = lists.flat().sort(byId);
    if (lists.unreachable) all.unreachable = lists.unreachable;
    return all;
  }

  /** A page across the nodes: each node's page after the same id, merged by id, cut at the limit. */
  async listSandboxesPage(filter: SandboxFilter, page: { limit: number; after?: string }): Promise<{ sandboxes: SandboxInfo[]; next?: string; unreachable?: string[] }> {
    const pages = await this.everyNode('list', (s) => s.listSandboxesPage(filter, page));
    const all = pages.flatMap((p) => p.sandboxes).sort(byId);
    const more = all.length > page.limit || pages.some((p) => p.next !== undefined);
    const sandboxes = all.slice(0, page.limit);
    const last = sandboxes.at(-1);
    return { sandboxes, ...(more && last !== undefined ? { next: last.id } : {}), ...(pages.unreachable ? { unreachable: pages.unreachable } : {}) };
  }

  /**
   * An account's usage across the cluster, for its quota: the gateway's
   * count from the node records and jobs (`usageOf`), plus what the account
   * created through this gateway since those records. The creates in flight
   * are added by the create route.
   */
  async sandboxUsage(owner: string): Promise<SandboxUsage> {
    const u = this.opts.members.uncountedUsage(owner);
    const r = this.opts.usageOf(owner);
    return { sandboxes: u.sandboxes + r.sandboxes, cpu: u.cpu + r.cpu, memoryMb: u.memoryMb + r.memoryMb };
  }

  async pauseSandboxes(filter: { labels: Record<string, string>; owner?: string }): Promise<PauseResult[]> {
    return (await this.everyNode('pause', (s) => s.pauseSandboxes(filter), null)).flat();
  }

  async resumeSandboxes(filter: { labels: Record<string, string>; owner?: string }): Promise<ResumeResult[]> {
    return (await this.everyNode('resume', (s) => s.resumeSandboxes(filter), null)).flat();
  }

  /** Images across the nodes, one entry per name and digest. */
  async listImages(principal?: Principal): Promise<ImageInfo[]> {
    const byDigest = new Map<string, ImageInfo>();
    for (const list of await this.everyNode('images', (s) => s.listImages(principal))) for (const i of list) byDigest.set(`${i.name}@${i.digest}`, i);
    return [...byDigest.values()];
  }

  /**
   * An import runs on every live node (a directory path must then exist on
   * each; a registry ref is pulled by each). Layers are content-addressed, so
   * the same content gives the same digests everywhere; a build that is not
   * reproducible (debootstrap) gives each node its own, under the same name.
   * The first failure fails the import, naming its node.
   */
  async importImage(req: ImportImageRequest, onProgress?: (p: ImportProgress) => void): Promise<ImageInfo> {
    const live = this.opts.members.live();
    if (live.length === 0) throw new WarrenError('RESOURCE_EXHAUSTED', 'no node is registered in the cluster', { retryAfterS: 1 });
    const fractions = new Map<string, number>();
    const results = await Promise.allSettled(
      live.map(async (rec) =>
        (await this.node(rec)).importImage(req, (p) => {
          if (typeof p.fraction === 'number') fractions.set(rec.id, p.fraction);
          const all = [...fractions.values()];
          const ev: ImportProgress = { phase: p.phase, message: live.length > 1 ? `${rec.id}: ${p.message}` : p.message };
          if (all.length > 0) ev.fraction = all.reduce((x, y) => x + y, 0) / live.length;
          onProgress?.(ev);
        }),
      ),
    );
    for (const [i, r] of results.entries()) {
      if (r.status === 'rejected') {
        const e = asWarrenError(r.reason);
        throw live.length > 1 ? namingNode(live[i]!.id, e) : e;
      }
    }
    return (results[0] as PromiseFulfilledResult<ImageInfo>).value;
  }

  /**
   * Staging pushes the image from an on-prem node that holds it into the
   * overflow pool's registry, then records it: its layers count as staged for
   * placement, and nodes that load layers on demand pull it (its metadata;
   * the data comes on read).
   */
  async stageImage(req: { image: string; repository: string }, onProgress?: (p: ImportProgress) => void): Promise<ImagePushResult> {
    const holders = this.holdersOf(req.image);
    const from = holders.find((n) => n.pool === 'onprem' && !n.lazy) ?? holders[0];
    if (from === undefined) throw new WarrenError('IMAGE_NOT_FOUND', `no node of the cluster holds image ${req.image}`, { ref: req.image });
    const shim = await this.node(from);
    if (shim.stageImage === undefined) throw new WarrenError('NOT_SUPPORTED', `node ${from.id} cannot stage images`, { node: from.id });
    const r = await shim.stageImage(req, onProgress);
    await this.opts.recordStaged?.(r);
    return r;
  }

  /**
   * Removal runs on every live node whose record holds the image. Each node
   * refuses while its own sandboxes use it (IMAGE_IN_USE, naming the node);
   * the nodes that had no such sandbox have removed it by then.
   */
  async removeImage(name: string): Promise<ImageRemoval> {
    const holders = this.holdersOf(name);
    if (holders.length === 0) throw new WarrenError('IMAGE_NOT_FOUND', `image ${JSON.stringify(name)} not found on any node`, { ref: name });
    const results = await Promise.allSettled(
      holders.map(async (rec) => {
        const s = await this.node(rec);
        if (s.removeImage === undefined) throw new WarrenError('NOT_SUPPORTED', `node ${rec.id} cannot remove images`, { node: rec.id });
        return s.removeImage(name);
      }),
    );
    const removed = new Set<string>();
    let removedName = name;
    for (const [i, r] of results.entries()) {
      if (r.status === 'rejected') {
        const e = asWarrenError(r.reason);
        // a node whose record was older than the removal has nothing left to remove
        if (e.code === 'IMAGE_NOT_FOUND') continue;
        throw namingNode(holders[i]!.id, e);
      }
      removedName = r.value.name;
      for (const d of r.value.removedLayers) removed.add(d);
    }
    return { name: removedName, removedLayers: [...removed].sort() };
  }

  /** The live nodes whose records hold `image`. */
  private holdersOf(image: string): NodeRecord[] {
    return this.opts.members.live().filter((n) => n.images.some((i) => imageMatches(i, image)));
  }

  /** A node that can check `refs` for `principal`: one whose record holds the image, else any live one. */
  private probe(image: string | undefined): NodeRecord {
    const live = this.opts.members.live();
    if (live.length === 0) throw new WarrenError('RESOURCE_EXHAUSTED', 'no node is registered in the cluster', { retryAfterS: 1 });
    return (image !== undefined ? this.holdersOf(image)[0] : undefined) ?? live[0]!;
  }

  /** Checked on a node that holds the image; the node a create lands on checks again for itself. */
  async authorizeContent(principal: Principal, refs: ContentRefs): Promise<void> {
    await (await this.node(this.probe(refs.image))).authorizeContent(principal, refs);
  }

  async environment(ref: string, principal?: Principal): Promise<EnvironmentInfo | null> {
    for (const e of await this.everyNode('environments', (s) => s.environment(ref, principal))) if (e !== null) return e;
    return null;
  }

  async listEnvironments(principal?: Principal): Promise<EnvironmentInfo[]> {
    const byDigest = new Map<string, EnvironmentInfo>();
    for (const list of await this.everyNode('environments', (s) => s.listEnvironments(principal))) for (const e of list) byDigest.set(`${e.name}@${e.digest}`, e);
    return [...byDigest.values()];
  }

  /** Packs live on the node that made them: the first node that knows the name publishes it. */
  async publishEnvironment(name: string, published: boolean): Promise<EnvironmentInfo> {
    let lastErr: unknown = new WarrenError('NOT_FOUND', `no environment ${JSON.stringify(name).slice(0, 80)}`);
    for (const rec of this.opts.members.live()) {
      try {
        return await (await this.node(rec)).publishEnvironment(name, published);
      } catch (err) {
        const code = asWarrenError(err).code;
        if (code !== 'NOT_FOUND' && code !== 'IMAGE_NOT_FOUND' && code !== 'UNAVAILABLE') throw err;
        lastErr = err;
      }
    }
    throw lastErr;
  }

  // ---------------------------------------------------------------- one sandbox: routed by its id

  getSandbox(id: string): Promise<SandboxInfo> {
    return this.on(id, (s) => s.getSandbox(id));
  }
  deleteSandbox(id: string): Promise<void> {
    return this.on(id, (s) => s.deleteSandbox(id));
  }
  exec(id: string, req: ExecRequest): Promise<ExecResult> {
    return this.on(id, (s) => s.exec(id, req));
  }
  execCaptured(id: string, req: ExecRequest): Promise<CapturedExec> {
    return this.on(id, (s) => s.execCaptured(id, req));
  }
  execLive(id: string, req: ExecRequest): Promise<LiveExec> {
    return this.on(id, (s) => s.execLive(id, req));
  }
  execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    return this.on(id, (s) => s.execStream(id, req));
  }
  supervisedReason(id: string): Promise<string | null> {
    return this.on(id, (s) => s.supervisedReason(id));
  }
  execSupervised(id: string, req: ExecRequest, runId: string): Promise<LiveExec> {
    return this.on(id, (s) => s.execSupervised(id, req, runId));
  }
  followSupervised(id: string, runId: string): Promise<LiveExec | null> {
    return this.on(id, (s) => s.followSupervised(id, runId));
  }
  dropSupervised(id: string, runId: string): Promise<void> {
    return this.on(id, (s) => s.dropSupervised(id, runId));
  }
  sweepSupervised(id: string, keep: ReadonlySet<string>): Promise<number> {
    return this.on(id, (s) => s.sweepSupervised(id, keep));
  }
  readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    return this.on(id, (s) => s.readFile(id, path, maxBytes));
  }
  writeFile(id: string, path: string, data: Buffer, mode?: number): Promise<void> {
    return this.on(id, (s) => s.writeFile(id, path, data, mode));
  }
  listDir(id: string, path: string): Promise<FileEntry[]> {
    return this.on(id, (s) => s.listDir(id, path));
  }
  watchDir(id: string, path: string, opts: { recursive: boolean }): Promise<DirWatch> {
    return this.on(id, (s) => s.watchDir(id, path, opts));
  }
  uploadTar(id: string, dir: string, tar: Buffer): Promise<{ entries: number }> {
    return this.on(id, (s) => s.uploadTar(id, dir, tar));
  }
  downloadTar(id: string, path: string): Promise<Readable> {
    return this.on(id, (s) => s.downloadTar(id, path));
  }
  screenshot(id: string, opts?: { width?: number }): Promise<{ png: Buffer; width: number; height: number }> {
    return this.on(id, (s) => offered(s, 'screenshot')(id, opts));
  }
  sendInput(id: string, actions: unknown): Promise<{ actions: number; events: number }> {
    return this.on(id, (s) => offered(s, 'sendInput')(id, actions));
  }
  openVnc(id: string): Promise<Duplex> {
    return this.on(id, (s) => offered(s, 'openVnc')(id));
  }
  openSession(id: string, opts: OpenSessionOptions): Promise<SessionAttachment> {
    return this.on(id, (s) => s.openSession(id, opts));
  }
  attachSession(id: string, sessionId: string, fromOffset: number): Promise<SessionAttachment> {
    return this.on(id, (s) => s.attachSession(id, sessionId, fromOffset));
  }
  listSessions(id: string): Promise<SessionInfo[]> {
    return this.on(id, (s) => s.listSessions(id));
  }
  pauseSandbox(id: string): Promise<PauseResult> {
    return this.on(id, (s) => s.pauseSandbox(id));
  }
  resumeSandbox(id: string): Promise<ResumeResult> {
    return this.on(id, (s) => s.resumeSandbox(id));
  }
  hibernateSandbox(id: string): Promise<PauseResult> {
    return this.on(id, (s) => s.hibernateSandbox(id));
  }
  extendSandbox(id: string, req: { seconds?: number; ttlSeconds?: number }): Promise<SandboxInfo> {
    return this.on(id, (s) => s.extendSandbox(id, req));
  }
  packSandbox(id: string, req: PackRequest, owner: string): Promise<PackResult> {
    return this.on(id, (s) => s.packSandbox(id, req, owner));
  }
  updateNetwork(id: string, change: Record<string, boolean>): Promise<SandboxNetworkInfo> {
    return this.on(id, (s) => s.updateNetwork(id, change));
  }
  networkInfo(id: string): Promise<SandboxNetworkInfo> {
    return this.on(id, (s) => s.networkInfo(id));
  }
  sandboxStats(id: string): Promise<SandboxStats | null> {
    return this.on(id, (s) => (s.sandboxStats ? s.sandboxStats(id) : Promise.resolve(null)));
  }

  /** Closes the connections made; one still connecting (a node that does not answer) is closed when it is done, without being waited for. */
  async close(): Promise<void> {
    this.closed = true;
    const conns = [...this.conns.values()];
    this.conns.clear();
    await Promise.all(conns.map((c) => c.ready?.close().catch(() => undefined)));
  }
}

/** Sandboxes in id order: the order of every node's pages. */
function byId(a: SandboxInfo, b: SandboxInfo): number {
  return a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
}

/** An optional method of a node's shim, or NOT_SUPPORTED when the node does not offer it. */
function offered<K extends 'screenshot' | 'sendInput' | 'openVnc'>(s: Shim, name: K): NonNullable<Shim[K]> {
  const f = s[name];
  if (typeof f !== 'function') throw new WarrenError('NOT_SUPPORTED', `node ${s.nodeId} does not offer ${name}`);
  return (f as (...args: never[]) => unknown).bind(s) as NonNullable<Shim[K]>;
}

/** A node's error as the cluster answers it: the same code, the node named in the message and details. */
function namingNode(node: string, e: WarrenError): WarrenError {
  return new WarrenError(e.code, `node ${node}: ${e.message}`, { ...(e.details ?? {}), node });
}
