/**
 * The node: owns this machine's sandboxes, layers and sessions, and implements
 * the Shim contract the gateway calls.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os, { hostname } from 'node:os';
import { join, posix } from 'node:path';
import type { Readable } from 'node:stream';
import type { Database } from 'better-sqlite3';
import { WarrenError, errorFromToolOutput } from '../errors';
import { NODE_ID_RE } from '../validation';
import { OutputCapture } from './exec-output';
import { featureReport } from '../features';
import { onPolicyApplied, policyStore } from '../security/confinement';
import { native, bpfObject } from '../native';
import { inSpan, instruments } from '../telemetry';
import { ContentAccess, type Principal } from './access';
import { facet, requireOffered } from './backends/facets';
import { BackendRegistry } from './backends/registry';
import { LayerStore, type LayerAvailability, type PullMode } from './layers/store';
import type { RegistryConfig } from './layers/distribution';
import { pullImage, pushImage, stageImage, type PushResult } from './layers/remote';
import { assertTarConfined, scanTar } from './layers/tar';
import { type LifecycleHost, LifecycleManager, type LifecycleOptions, type LiveSandbox } from './lifecycle/manager';
import { SandboxMap, UsageTally } from './sandbox-map';
import { setExecSpillDir } from './exec-output';
import { SandboxRegistry } from './registry';
import { attachSession as attachHolder, listSessions as listHolderSessions, spawnHolder } from './sessions/session-manager';
// FnCall warm pools (docs/fncall.md).
import { FnCallManager } from './fncall/manager';
import { type CapacityOptions, HostCapacity } from './capacity';
import { hostTunables } from './host-tunables';
import { DEFAULT_PREPARED, type Prepared, PreparedPool, type PreparedOptions } from './prepared';
import { NetworkManager, type NetworkOptions, type SandboxNetworkRuntime } from './network/manager';
import type { FnCallConfig } from './fncall/types';
import type {
  Backend,
  BackendSandbox,
  CapturedExec,
  EnvironmentInfo,
  ExecRequest,
  ExecResult,
  ExecStream,
  FeatureReport,
  DisplayFacet,
  DirWatch,
  FileEntry,
  ImageInfo,
  ImageRemoval,
  ImportProgress,
  LiveExec,
  OpenSessionOptions,
  PackRequest,
  PackResult,
  PauseResult,
  ResumeResult,
  SandboxInfo,
  SandboxNetworkInfo,
  SandboxRecord,
  SandboxSpec,
  SandboxStats,
  SessionAttachment,
  CommandResult,
  SessionInfo,
  ImportImageRequest,
} from './types';

export interface ShimOptions {
  dataDir: string;
  db: Database;
  nodeId?: string;
  /** Build (or take from the node cache) the Debian default image when missing. */
  ensureDefaultImage?: boolean;
  onProgress?: (p: ImportProgress) => void;
  log?: (line: string) => void;
  /** Bytes of output each shell session keeps for re-attaching clients. */
  sessionBufferBytes?: number;
  /** FnCall pools; default: <dataDir>/fncall.json when present. */
  fncall?: FnCallConfig;
  /** Lifetime policies, pause/resume, pack_diff (src/shim/lifecycle, docs/lifecycle.md). */
  lifecycle?: LifecycleOptions;
  /** sandbox networking with per-service egress (bridge, netns pool, eBPF, DNS).
   *  Absent: every sandbox is loopback-only and `network` in a create request is refused. */
  network?: NetworkConfig;
  /** Reserves and caps of the host-capacity admission (capacity.ts). */
  capacity?: CapacityOptions;
  /** OCI registries (auth, TLS) by host[:port]; pulls, pushes and lazily loaded layers (docs/images.md). */
  registries?: RegistryConfig;
  /** How pulls fetch layers when a request does not say (default 'lazy' where warren-lazyfs works, else 'eager'). */
  pullMode?: PullMode;
  /** Bound of the chunk cache of lazily loaded layers, bytes (default 4 GiB). */
  lazyCacheBytes?: number;
  /** Creates made ahead of time (prepared.ts); absent or perShape 0: every create spawns. */
  prepared?: Partial<PreparedOptions>;
}

export type NetworkConfig = Partial<Omit<NetworkOptions, 'native' | 'nodeId' | 'policy' | 'log'>>;

const SESSION_BUFFER_BYTES = 1024 * 1024;

export function defaultNodeId(): string {
  const machineId = (() => {
    try {
      return readFileSync('/etc/machine-id', 'utf8').trim();
    } catch {
      return hostname();
    }
  })();
  return 'n' + createHash('sha256').update(machineId).digest('hex').slice(0, 6);
}

/** What the prepared pool makes a sandbox from: a spec of the shape and its resolved layers. */
interface PrepareRequest {
  spec: SandboxSpec;
  digests: string[];
}

/** Sandbox ids encode their node so a router can find the owner without a lookup. */
function newSandboxId(nodeId: string): string {
  return `${nodeId}-${randomBytes(8).toString('hex')}`;
}

export async function openShim(opts: ShimOptions): Promise<ShimNode> {
  const node = new ShimNode(opts);
  await node.start();
  return node;
}

export class ShimNode {
  readonly nodeId: string;
  private readonly registry: SandboxRegistry;
  readonly layers: LayerStore;
  /** FnCall warm pools (src/shim/fncall). */
  readonly functions: FnCallManager;
  /** The one check of who may use which image, environment or layer (access.ts). */
  readonly access: ContentAccess;
  /** Every backend by name (src/shim/backends/registry.ts); disabled ones answer NOT_SUPPORTED. */
  readonly backends: BackendRegistry;
  private readonly sandboxes = new SandboxMap();
  /** Creates between their createdAt and their entry in `sandboxes`. */
  private readonly creatingUsage = new UsageTally();
  private readonly sessionsDir: string;
  private readonly log: (line: string) => void;
  private readonly metrics = instruments();
  private readonly observeLive = (r: { observe(v: number): void }) => r.observe(this.sandboxes.size);
  /** Lifetime policies, pause/resume, hibernate, pack_diff (src/shim/lifecycle). */
  readonly lifecycle: LifecycleManager;
  /** null when the node runs without sandbox networking. */
  readonly network: NetworkManager | null;
  private unsubscribePolicy: (() => void) | null = null;
  /** Creates are refused with NODE_AT_CAPACITY before the host runs out of fds, pids, namespaces or memory. */
  readonly capacity: HostCapacity;
  /** Ids in order, for paginated lists (rebuilt lazily after a create or delete). */
  private sortedIds: string[] | null = null;
  /** Sandboxes made ahead of time for the shapes of recent creates (prepared.ts). */
  readonly prepared: PreparedPool<PrepareRequest>;

  constructor(private readonly opts: ShimOptions) {
    this.nodeId = opts.nodeId ?? defaultNodeId();
    if (!NODE_ID_RE.test(this.nodeId)) throw new WarrenError('INVALID_ARGUMENT', `invalid node id: ${this.nodeId}`);
    this.log = opts.log ?? (() => undefined);
    this.registry = new SandboxRegistry(opts.db);
    this.layers = new LayerStore({
      dataDir: opts.dataDir,
      db: opts.db,
      log: this.log,
      ...(opts.registries ? { registries: opts.registries } : {}),
      ...(opts.pullMode ? { pullMode: opts.pullMode } : {}),
      ...(opts.lazyCacheBytes !== undefined ? { lazyCacheBytes: opts.lazyCacheBytes } : {}),
    });
    mkdirSync(join(opts.dataDir, 'sandboxes'), { recursive: true, mode: 0o700 });
    setExecSpillDir(join(opts.dataDir, 'tmp'));
    this.network = opts.network
      ? new NetworkManager({
          native,
          nodeId: this.nodeId,
          policy: () => policyStore().current,
          log: this.log,
          objectPath: opts.network.objectPath ?? bpfObject('sandbox_egress'),
          ...opts.network,
        })
      : null;
    this.backends = BackendRegistry.build({ dataDir: opts.dataDir, network: this.network, log: this.log });
    // Unix socket paths are limited to 108 bytes: keep session sockets under a short, data-dir specific run dir.
    this.sessionsDir = join('/run/warren', createHash('sha256').update(opts.dataDir).digest('hex').slice(0, 10));
    mkdirSync(this.sessionsDir, { recursive: true, mode: 0o700 });
    this.metrics.liveSandboxes.addCallback(this.observeLive);
    this.lifecycle = new LifecycleManager(this.lifecycleHost(), { dataDir: opts.dataDir, db: opts.db, layers: this.layers, log: this.log }, opts.lifecycle);
    this.access = new ContentAccess(this.layers, this.lifecycle.environments);
    // prepared sandboxes hold what live ones hold (a pidfd, namespaces, a pid 1)
    this.capacity = new HostCapacity(opts.capacity, () => this.sandboxes.size + this.prepared.size);
    this.prepared = new PreparedPool<PrepareRequest>({ ...DEFAULT_PREPARED, perShape: 0, ...opts.prepared }, {
      make: (r) => this.makePrepared(r),
      discard: async (p) => {
        await p.box.destroy();
        this.layers.release([...p.digests]);
      },
      log: this.log,
    });
    this.functions = new FnCallManager({ dataDir: opts.dataDir, nodeId: this.nodeId, layers: this.layers, log: this.log, config: opts.fncall, onProgress: opts.onProgress });
  }

  private lifecycleHost(): LifecycleHost {
    return {
      nodeId: this.nodeId,
      get: (id) => this.sandboxes.get(id),
      all: () => [...this.sandboxes.values()],
      saveState: (live) => {
        live.record.state = live.state;
        this.registry.update(live.record.id, live.state, live.record.runtime);
      },
      saveLifecycle: (id, lifecycle) => this.registry.setLifecycle(id, lifecycle),
      stop: (id, reason) => this.stopSandbox(id, reason),
      delete: (id) => this.deleteSandbox(id),
      backend: (live) => this.backendOf(live.record),
      restore: async (live, checkpoint) => {
        const backend = this.backendOf(live.record);
        if (backend.restore === undefined) throw new WarrenError('NOT_SUPPORTED', `the ${backend.name} backend cannot restore checkpoints`);
        const box = await backend.restore(live.record, checkpoint, live.record.layers.map((d) => this.layers.mountPath(d)));
        this.watchEnd(live, box);
        return box;
      },
      openSessions: async (id) => {
        const dir = this.sandboxSessionsDir(id);
        return existsSync(dir) ? (await listHolderSessions(dir)).filter((s) => s.alive).length : 0;
      },
    };
  }

  async start(): Promise<void> {
    this.layers.init();
    if (this.network) {
      const leased = this.registry
        .all()
        .filter((r) => r.state !== 'stopped' && r.state !== 'failed')
        .map((r) => r.runtime.network as SandboxNetworkRuntime | undefined)
        .filter((n): n is SandboxNetworkRuntime => n !== undefined);
      await this.network.start(leased);
    }
    // A prepared sandbox's pid 1 is confined by the policy it was made under; a new policy makes
    // new shapes (preparedShape), and the old ones are given back now rather than when they idle out.
    this.unsubscribePolicy = onPolicyApplied(() => {
      this.network?.reapply();
      void this.prepared.flush();
    });
    await this.adoptSurvivors();
    await this.lifecycle.start();
    await this.functions.start();
    if (this.opts.ensureDefaultImage && !this.layers.listImages().some((i) => i.name === 'default')) {
      await this.layers.buildDebian({ name: 'default', onProgress: this.opts.onProgress });
    }
  }

  /** After a gateway crash: running sandboxes are re-adopted, dead ones are cleaned up and reported stopped. */
  private async adoptSurvivors(): Promise<void> {
    for (const record of this.registry.all()) {
      if (record.state === 'creating') {
        // the client never got an answer for it: nothing of it is kept
        this.log(`sandbox ${record.id}: its create was interrupted; removing what it made`);
        if (this.backends.has(record.spec.backend)) await this.backendOf(record).cleanup(record.id, record);
        this.registry.remove(record.id);
        continue;
      }
      if (record.state === 'stopped' || record.state === 'failed') {
        this.sandboxes.set(record.id, { record, box: null, state: record.state });
        this.lifecycle.adopted(record);
        continue;
      }
      if (record.state === 'hibernated') {
        // Its processes are in a CRIU checkpoint; the next request restores them.
        await this.layers.acquire(record.layers);
        this.sandboxes.set(record.id, { record, box: null, state: 'hibernated' });
        this.lifecycle.adopted(record);
        continue;
      }
      const backend = this.backends.has(record.spec.backend) ? this.backendOf(record) : null;
      const box = backend === null ? null : await backend.adopt(record);
      if (box === null) {
        this.log(`sandbox ${record.id}: gone while the gateway was down${backend === null ? ` (backend ${record.spec.backend} is not available here)` : ''}; cleaning up`);
        if (backend !== null) await backend.cleanup(record.id, record);
        this.registry.update(record.id, 'stopped', record.runtime);
        this.sandboxes.set(record.id, { record: { ...record, state: 'stopped' }, box: null, state: 'stopped' });
        this.lifecycle.adopted({ ...record, state: 'stopped' });
        this.lifecycle.stopped(record.id, 'exited');
        continue;
      }
      await this.layers.acquire(record.layers);
      // A paused sandbox stays paused (frozen, memory in swap) until a request resumes it.
      const live: LiveSandbox = { record, box, state: record.state === 'paused' ? 'paused' : 'running' };
      this.sandboxes.set(record.id, live);
      this.lifecycle.adopted(record);
      this.watchEnd(live, box);
      this.log(`sandbox ${record.id}: re-adopted (${record.spec.backend}, pid ${box.pid ?? '-'})`);
    }
    // A sandbox of this node's that has no record (a crash between making a resource and
    // recording it) is removed with its cgroups, mounts and links, so no kill -9 leaks them.
    const known = new Set(this.sandboxes.keys());
    const prefix = `${this.nodeId}-`;
    for (const backend of this.backends.all()) {
      for (const id of backend.leftovers?.(known, prefix) ?? []) {
        this.log(`sandbox ${id}: left on the host without a record; removing it (${backend.name})`);
        await backend.cleanup(id).catch((err: Error) => this.log(`sandbox ${id}: cleanup failed: ${err.message}`));
      }
    }
  }

  /** The backend a sandbox record runs on (NOT_SUPPORTED when it is disabled on this node). */
  private backendOf(record: SandboxRecord): Backend {
    return this.backends.get(record.spec.backend);
  }

  private watchEnd(live: LiveSandbox, box: BackendSandbox): void {
    void box.ended.then(async () => {
      if (live.state === 'deleting' || live.state === 'stopped' || live.state === 'hibernated' || live.box !== box || !this.sandboxes.has(live.record.id)) return;
      this.log(`sandbox ${live.record.id}: pid 1 ended unexpectedly`);
      live.state = 'stopped';
      this.lifecycle.stopped(live.record.id, 'exited');
      this.registry.update(live.record.id, 'stopped', live.record.runtime);
      await this.closeSessions(live.record.id).catch(() => undefined);
      await box.destroy().catch(() => undefined);
      this.layers.release(live.record.layers);
    });
  }

  features(): FeatureReport {
    return {
      ...featureReport(this.nodeId),
      backends: this.backends.status(),
      capacity: { ...this.capacity.report(), tunables: hostTunables(), prepared: { ...this.prepared.options, enabled: this.prepared.enabled, ready: this.prepared.size } },
      host: { cpus: os.availableParallelism?.() ?? os.cpus().length, memoryMb: Math.floor(os.totalmem() / (1024 * 1024)) },
    };
  }

  private info(live: LiveSandbox): SandboxInfo {
    const { record } = live;
    const info: SandboxInfo = {
      id: record.id,
      backend: record.spec.backend,
      image: record.spec.image,
      layers: record.layers,
      state: live.state,
      node: this.nodeId,
      createdAt: record.createdAt,
      owner: record.spec.owner,
      limits: { cpu: record.spec.cpu, memoryMb: record.spec.memoryMb, pids: record.spec.pids, diskMb: record.spec.diskMb },
      priority: record.spec.priority,
      labels: record.spec.labels,
    };
    if (live.box && live.box.pid !== undefined) info.pid = live.box.pid;
    const lifecycle = this.lifecycle.info(record.id);
    if (lifecycle) info.lifecycle = lifecycle;
    const net = record.runtime.network as SandboxNetworkRuntime | undefined;
    if (net && live.box) info.network = { services: { ...net.services }, address: net.lease.address };
    return info;
  }

  private live(id: string): LiveSandbox {
    const live = this.sandboxes.get(id);
    if (live === undefined) throw new WarrenError('SANDBOX_NOT_FOUND', `no sandbox ${id}`);
    return live;
  }

  /** For requests: resume a paused or hibernated sandbox first (transparently), note the activity, and return it. */
  private async awake(id: string): Promise<BackendSandbox> {
    await this.lifecycle.ensureAwake(id);
    this.lifecycle.touch(id);
    return this.running(id);
  }

  private running(id: string): BackendSandbox {
    const live = this.live(id);
    if (live.state !== 'running' || live.box === null) {
      throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
    }
    return live.box;
  }

  async createSandbox(spec: SandboxSpec, principal: Principal = { account: spec.owner, unpublished: 'all' }): Promise<SandboxInfo> {
    const backend = this.backends.get(spec.backend);
    const started = performance.now();
    try {
      this.capacity.admit();
    } catch (err) {
      if (!(err instanceof WarrenError && err.code === 'NODE_AT_CAPACITY') || !this.prepared.holding) throw err;
      // Prepared sandboxes never cost a create its place: those held and those being made or given
      // back are gone before the node looks again.
      await this.prepared.flush();
      this.capacity.admit();
    }
    // the request's services, or the account's default; none at all = loopback only
    const services = this.network ? this.network.resolve(spec.network, spec.owner) : spec.network === undefined ? null : (() => {
      throw new WarrenError('NOT_SUPPORTED', 'networking is disabled on this node (sandboxes are loopback-only)', { field: 'network' });
    })();
    spec = { ...spec };
    if (services !== null && spec.network === undefined && !backend.facets.network.offered) {
      // The account's default services do not apply to a backend without network: it runs loopback-only.
      delete spec.network;
    } else if (services === null) delete spec.network;
    else {
      requireOffered(backend, 'network');
      spec.network = services;
    }
    return inSpan('warren.sandbox.create', { 'warren.image': spec.image }, async (span) => {
      // Resolve everything before touching the kernel: unknown images or layers create nothing.
      // and every reference goes through the one authorisation check.
      // A vm's root is its disk image (the desktop), not layers: only that image and no extra layers.
      if (spec.backend === 'vm') {
        if (spec.image !== 'default' && spec.image !== 'desktop') throw new WarrenError('INVALID_ARGUMENT', `the vm backend boots its desktop image: image must be "desktop" (got ${JSON.stringify(spec.image)})`, { field: 'image' });
        if (spec.toolkits.length > 0 || spec.workspaces.length > 0) throw new WarrenError('NOT_SUPPORTED', 'the vm backend takes no workspaces or toolkits (its root is a disk image, not layers)', { field: 'workspaces' });
        spec.image = 'desktop';
      }
      const image = spec.backend === 'vm' ? { digests: [] as string[] } : this.access.resolve(principal, spec.image, 'image');
      const extra = [
        ...spec.toolkits.map((ref) => this.access.resolve(principal, ref, 'toolkit').digests[0]!),
        ...spec.workspaces.map((ref) => this.access.resolve(principal, ref, 'workspace').digests[0]!),
      ];
      const digests = [...extra, ...image.digests];
      const prepared = await this.claimPrepared(backend, spec, digests);
      const id = prepared?.id ?? newSandboxId(this.nodeId);
      span.setAttribute('warren.sandbox.id', id);
      span.setAttribute('warren.sandbox.prepared', prepared !== undefined);
      // a prepared sandbox already holds its layers
      const layers = prepared !== undefined ? null : await inSpan('warren.sandbox.create.layers', { 'warren.layers': digests.length }, () => this.layers.acquire(digests));
      const record: SandboxRecord = { id, spec, layers: digests, state: 'creating', createdAt: new Date().toISOString(), runtime: {} };
      let box: BackendSandbox;
      if (prepared !== undefined) {
        // Everything exists already: the record is written once, running.
        box = prepared.box;
        record.state = 'running';
        record.runtime = box.runtime;
        try {
          this.lifecycle.created(record);
          this.registry.insert(record);
        } catch (err) {
          this.lifecycle.forget(id);
          void this.prepared.giveBack(prepared);
          throw err;
        }
      } else {
        this.lifecycle.created(record);
        // Written before anything exists in the kernel: a node killed in the middle of this create
        // finds the record when it starts again and removes what was made (adoptSurvivors).
        this.registry.insert(record);
        // Counted from the tick of its createdAt until the tick it enters `sandboxes`: a usage read
        // never misses a create that began before it (see usageByOwner).
        this.creatingUsage.add(spec.owner, spec.cpu, spec.memoryMb, 1);
        try {
          box = await inSpan('warren.sandbox.create.spawn', { 'warren.backend': backend.name }, () => backend.create(id, spec, layers!));
        } catch (err) {
          this.creatingUsage.add(spec.owner, spec.cpu, spec.memoryMb, -1);
          this.layers.release(digests);
          this.registry.remove(id);
          this.lifecycle.forget(id);
          throw err;
        }
        this.creatingUsage.add(spec.owner, spec.cpu, spec.memoryMb, -1);
        record.state = 'running';
        record.runtime = box.runtime;
        this.registry.update(id, 'running', box.runtime);
      }
      const live: LiveSandbox = { record, box, state: 'running' };
      this.sandboxes.set(id, live);
      this.sortedIds = null;
      this.lifecycle.track(id);
      this.watchEnd(live, box);
      if (box.pid !== undefined) span.setAttribute('warren.sandbox.pid', box.pid);
      this.metrics.createLatency.record(performance.now() - started, { backend: spec.backend });
      return this.info(live);
    });
  }

  /**
   * A prepared sandbox of this create's shape made into this create's sandbox, or undefined
   * (none ready, the backend prepares none, or the claim failed: then it is given back and the
   * create spawns). Every create of a shape also asks the pool to have some ready next time.
   */
  private async claimPrepared(backend: Backend, spec: SandboxSpec, digests: string[]): Promise<Prepared | undefined> {
    if (!this.prepared.enabled || backend.preparedShape === undefined || backend.claimPrepared === undefined) return undefined;
    const shape = backend.preparedShape(spec, digests);
    if (shape === null) return undefined;
    const p = this.prepared.take(shape, { spec, digests });
    if (p === undefined) return undefined;
    try {
      await backend.claimPrepared(p.box, spec);
      return p;
    } catch (err) {
      this.log(`prepared sandbox ${p.id}: claim failed (${(err as Error).message}); creating afresh`);
      void this.prepared.giveBack(p);
      return undefined;
    }
  }


  /** One sandbox of a shape, made ahead of time: everything a create does but the record. */
  private async makePrepared(r: PrepareRequest): Promise<Prepared> {
    this.capacity.admit();
    const backend = this.backends.get(r.spec.backend);
    const id = newSandboxId(this.nodeId);
    const layers = await this.layers.acquire(r.digests);
    try {
      const box = await backend.create(id, r.spec, layers);
      return { id, box, digests: r.digests };
    } catch (err) {
      this.layers.release(r.digests);
      throw err;
    }
  }

  /**
   * Resource use of a live sandbox from its cgroup. Reading counters is not a
   * request to the sandbox: it neither resumes a paused one nor resets its idle clock.
   */
  async sandboxStats(id: string): Promise<SandboxStats | null> {
    const live = this.live(id);
    if (live.box === null || !['running', 'paused'].includes(live.state)) return null;
    return live.box.stats();
  }

  getSandbox(id: string): SandboxInfo {
    return this.info(this.live(id));
  }

  listSandboxes(filter: { owner?: string; labels?: Record<string, string> } = {}): SandboxInfo[] {
    const out: SandboxInfo[] = [];
    for (const live of this.sandboxes.values()) {
      if (matches(live, filter)) out.push(this.info(live));
    }
    return out;
  }

  /**
   * One page of the sandboxes matching `filter`, in id order, starting after the id `after`
   * (which need not exist any more). `next` is the cursor of the following page, absent on the
   * last. Only the page is turned into SandboxInfo, so a page costs the same at 10,000 sandboxes
   * as at 10 (plus one sort after each change of the set).
   */
  listSandboxesPage(filter: { owner?: string; labels?: Record<string, string> }, page: { limit: number; after?: string }): { sandboxes: SandboxInfo[]; next?: string } {
    if (this.sortedIds === null) this.sortedIds = [...this.sandboxes.keys()].sort();
    const ids = this.sortedIds;
    let lo = 0;
    if (page.after !== undefined) {
      // first id > after (binary search)
      let hi = ids.length;
      while (lo < hi) {
        const mid = (lo + hi) >> 1;
        if (ids[mid]! <= page.after) lo = mid + 1;
        else hi = mid;
      }
    }
    const out: SandboxInfo[] = [];
    let i = lo;
    for (; i < ids.length && out.length < page.limit; i++) {
      const live = this.sandboxes.get(ids[i]!);
      if (live !== undefined && matches(live, filter)) out.push(this.info(live));
    }
    let more = false;
    for (let j = i; j < ids.length; j++) {
      const live = this.sandboxes.get(ids[j]!);
      if (live !== undefined && matches(live, filter)) {
        more = true;
        break;
      }
    }
    return more && out.length > 0 ? { sandboxes: out, next: out[out.length - 1]!.id } : { sandboxes: out };
  }

  /**
   * Per owner, what its sandboxes hold (not stopped or failed), including the creates that have
   * their createdAt but are not live yet: a reader that notes the time first and then calls this
   * counts every sandbox created before that time (the cluster's node records rely on it).
   */
  usageByOwner(): Map<string, { sandboxes: number; cpu: number; memoryMb: number }> {
    const out = new Map<string, { sandboxes: number; cpu: number; memoryMb: number }>();
    for (const tally of [this.sandboxes.owners(), this.creatingUsage.entries()]) {
      for (const [owner, u] of tally) {
        const o = out.get(owner);
        if (o === undefined) out.set(owner, { ...u });
        else {
          o.sandboxes += u.sandboxes;
          o.cpu += u.cpu;
          o.memoryMb += u.memoryMb;
        }
      }
    }
    return out;
  }

  /** What an account's live sandboxes hold (for quotas), without building their SandboxInfo. */
  sandboxUsage(owner: string): { sandboxes: number; cpu: number; memoryMb: number } {
    return this.sandboxes.usageOf(owner);
  }

  async deleteSandbox(id: string): Promise<void> {
    const live = this.live(id);
    if (live.state === 'deleting') throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is already being deleted`);
    const previous = live.state;
    // Thaw a paused sandbox first: its session holders must answer, its processes die.
    await this.lifecycle.beforeDestroy(id);
    live.state = 'deleting';
    await inSpan('warren.sandbox.delete', { 'warren.sandbox.id': id }, async () => {
      await this.closeSessions(id);
      if (live.box) {
        await live.box.destroy();
      } else {
        await this.backendOf(live.record).cleanup(id, live.record);
      }
      if (previous === 'running' || previous === 'paused' || previous === 'hibernated') this.layers.release(live.record.layers);
      this.registry.remove(id);
      this.sandboxes.delete(id);
      this.sortedIds = null;
      this.lifecycle.forget(id);
    });
  }

  /** Kill a sandbox's processes and release everything, keeping its record as `stopped` (ttl, onIdle "stop"). */
  async stopSandbox(id: string, reason: string): Promise<void> {
    const live = this.live(id);
    if (live.state !== 'running' && live.state !== 'paused' && live.state !== 'hibernated') return;
    const previous = live.state;
    await this.lifecycle.beforeDestroy(id);
    live.state = 'stopped';
    this.lifecycle.stopped(id, reason);
    this.registry.update(id, 'stopped', live.record.runtime);
    await this.closeSessions(id).catch(() => undefined);
    if (live.box) await live.box.destroy();
    else await this.backendOf(live.record).cleanup(id, live.record);
    live.box = null;
    if (previous === 'running' || previous === 'paused' || previous === 'hibernated') this.layers.release(live.record.layers);
  }

  async exec(id: string, req: ExecRequest): Promise<ExecResult> {
    const box = await this.awake(id);
    const end = this.lifecycle.begin(id);
    try {
      return await inSpan('warren.sandbox.exec', { 'warren.sandbox.id': id }, async (span) => {
        const result = await box.exec(req);
        span.setAttribute('warren.exec.status', result.status);
        this.metrics.execLatency.record(result.durationMs, { status: result.status });
        return result;
      });
    } finally {
      end();
    }
  }

  async execCaptured(id: string, req: ExecRequest): Promise<CapturedExec> {
    const box = await this.awake(id);
    const end = this.lifecycle.begin(id);
    try {
      return await inSpan('warren.sandbox.exec', { 'warren.sandbox.id': id }, async (span) => {
        const result = box.execCaptured ? await box.execCaptured(req) : capturedOf(await box.exec(req));
        span.setAttribute('warren.exec.status', result.status);
        this.metrics.execLatency.record(result.durationMs, { status: result.status });
        return result;
      });
    } finally {
      end();
    }
  }

  async execLive(id: string, req: ExecRequest): Promise<LiveExec> {
    const box = await this.awake(id);
    const end = this.lifecycle.begin(id);
    try {
      if (!box.execLive) throw new WarrenError('NOT_SUPPORTED', `streamed exec output is not available for ${this.live(id).record.spec.backend} sandboxes; ask for the whole answer`, { backend: this.live(id).record.spec.backend });
      const live = await box.execLive(req);
      void live.done.then((r) => this.metrics.execLatency.record(r.durationMs, { status: r.status }), () => undefined).finally(end);
      return live;
    } catch (err) {
      end();
      throw err;
    }
  }

  /** Why sandbox `id` cannot run supervised execs (null: it can). */
  supervisedReason(id: string): string | null {
    const live = this.live(id);
    if (live.box !== null && live.box.supervised !== undefined) return null;
    if (live.box === null && this.backendOf(live.record).name === 'container') return null;
    return `the ${live.record.spec.backend} backend runs execs through the gateway process only (the guest agent's exec output and exit status come over the gateway process's own virtio-serial connection), so an exec cannot outlive a gateway restart there`;
  }

  /** Start `req` under a supervisor of its own (run `runId`, see supervised-exec.ts) and follow it. */
  async execSupervised(id: string, req: ExecRequest, runId: string): Promise<LiveExec> {
    const box = await this.awake(id);
    if (box.supervised === undefined) throw new WarrenError('NOT_SUPPORTED', this.supervisedReason(id) ?? 'supervised execs are not available', { backend: this.live(id).record.spec.backend });
    const end = this.lifecycle.begin(id);
    try {
      const ended = await box.supervised.start(req, runId);
      const live = ended ?? box.supervised.follow(runId);
      if (live === null) throw new WarrenError('INTERNAL', `supervised exec ${runId} left no files`);
      void live.done.then((r) => this.metrics.execLatency.record(r.durationMs, { status: r.status }), () => undefined).finally(end);
      return live;
    } catch (err) {
      end();
      throw err;
    }
  }

  /** Follow supervised run `runId` of sandbox `id` (started by this gateway process or an earlier one); null when it has no files. */
  followSupervised(id: string, runId: string): LiveExec | null {
    const live = this.sandboxes.get(id);
    const box = live?.box ?? null;
    if (box === null || box.supervised === undefined) return null;
    const run = box.supervised.follow(runId);
    if (run === null) return null;
    const end = this.lifecycle.begin(id);
    void run.done.catch(() => undefined).finally(end);
    return run;
  }

  async dropSupervised(id: string, runId: string): Promise<void> {
    await this.sandboxes.get(id)?.box?.supervised?.drop(runId);
  }

  async sweepSupervised(id: string, keep: ReadonlySet<string>): Promise<number> {
    return (await this.sandboxes.get(id)?.box?.supervised?.sweep(keep)) ?? 0;
  }

  async execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    const box = await this.awake(id);
    const end = this.lifecycle.begin(id);
    try {
      const stream = await box.execStream(req);
      void stream.exited.finally(end);
      return stream;
    } catch (err) {
      end();
      throw err;
    }
  }

  // ---- files: the backend's files facet (confined to the sandbox's root; for containers with the
  // sandbox user's uid/gid: the API can read and write what an exec as that user could, no more) ----

  private async filesOf(id: string) {
    const box = await this.awake(id);
    return facet(this.backendOf(this.live(id).record), box, 'files');
  }

  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    return (await this.filesOf(id)).readFile(path, maxBytes);
  }

  async writeFile(id: string, path: string, data: Buffer, mode = 0o644): Promise<void> {
    return (await this.filesOf(id)).writeFile(path, data, mode);
  }

  async listDir(id: string, path: string): Promise<FileEntry[]> {
    return (await this.filesOf(id)).listDir(path);
  }

  async watchDir(id: string, path: string, opts: { recursive: boolean }): Promise<DirWatch> {
    const files = await this.filesOf(id);
    if (files.watch === undefined) {
      const backend = this.live(id).record.spec.backend;
      throw new WarrenError('NOT_SUPPORTED', `the ${backend} backend cannot watch directories`, { backend, facet: 'files' });
    }
    return files.watch(path, opts.recursive);
  }

  /** The display of a sandbox that has a screen (vm backend); NOT_SUPPORTED otherwise. */
  private async displayOf(id: string): Promise<DisplayFacet> {
    const box = await this.awake(id);
    if (box.display === undefined) {
      const backend = this.live(id).record.spec.backend;
      throw new WarrenError('NOT_SUPPORTED', `sandbox ${id} has no screen: the ${backend} backend offers computer use only for backend "vm"`, { backend, facet: 'display' });
    }
    return box.display;
  }

  async screenshot(id: string, opts: { width?: number } = {}): Promise<{ png: Buffer; width: number; height: number }> {
    return (await this.displayOf(id)).screenshot(opts);
  }

  async sendInput(id: string, actions: unknown): Promise<{ actions: number; events: number }> {
    return (await this.displayOf(id)).input(actions);
  }

  async openVnc(id: string): Promise<import('node:net').Socket> {
    return (await this.displayOf(id)).openVnc();
  }

  async uploadTar(id: string, dir: string, tar: Buffer): Promise<{ entries: number }> {
    const files = await this.filesOf(id);
    const box = this.running(id);
    assertTarConfined(tar);
    const entries = scanTar(tar).length;
    await files.mkdirs(dir, 0o755);
    // Extraction runs inside the sandbox: its own root bounds what tar can touch.
    const proc = await box.execStream({ cmd: ['tar', '-x', '-f', '-', '-C', dir], timeoutMs: 300_000 });
    const stderr: Buffer[] = [];
    proc.stderr.on('data', (c: Buffer) => stderr.push(c));
    proc.stdout.resume();
    proc.stdin.on('error', () => undefined);
    proc.stdin.end(tar);
    const status = await proc.exited;
    if (status.exitCode !== 0) {
      const text = Buffer.concat(stderr).toString('utf8');
      throw errorFromToolOutput(text, 'tar extraction') ?? new WarrenError('INVALID_ARCHIVE', `tar extraction failed in the sandbox: ${text.trim().slice(0, 500)}`);
    }
    return { entries };
  }

  async downloadTar(id: string, path: string): Promise<Readable> {
    const files = await this.filesOf(id);
    const box = this.running(id);
    // Fail early with a proper 404 (or PATH_ESCAPE) instead of an empty archive.
    await files.kind(path);
    const proc = await box.execStream({ cmd: ['tar', '-c', '-f', '-', '-C', posix.dirname(path), posix.basename(path) || '.'], timeoutMs: 300_000 });
    proc.stdin.end();
    proc.stderr.resume();
    return proc.stdout;
  }

  // ---- shell sessions: each lives in a warren-session holder outside the gateway ----

  private sandboxSessionsDir(id: string): string {
    return join(this.sessionsDir, id);
  }

  async openSession(id: string, opts: OpenSessionOptions): Promise<SessionAttachment> {
    const box = await this.awake(id);
    const sessions = facet(this.backendOf(this.live(id).record), box, 'sessions');
    const sessionId = `s-${randomBytes(10).toString('hex')}`;
    const launch = await sessions.shellCommand({ mode: opts.mode, user: opts.user, cwd: opts.cwd, env: opts.env ?? {}, sessionId });
    const dir = this.sandboxSessionsDir(id);
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const socketPath = join(dir, `${sessionId}.sock`);
    const holder = await spawnHolder({
      socketPath,
      ...launch,
      mode: opts.mode,
      bufferBytes: this.opts.sessionBufferBytes ?? SESSION_BUFFER_BYTES,
      cols: opts.cols,
      rows: opts.rows,
      info: { sandboxId: id, sessionId },
    });
    try {
      sessions.holderStarted(holder.pid);
    } catch (err) {
      this.log(`session ${sessionId}: could not count holder ${holder.pid} with the sandbox: ${(err as Error).message}`);
    }
    return this.tracked(id, await attachHolder(socketPath, 0));
  }

  /**
   * A session attachment that counts as activity and resumes a paused
   * sandbox before its input reaches the (then frozen) holder.
   */
  private tracked(id: string, att: SessionAttachment): SessionAttachment {
    // Everything that sends frames to the holder goes through one chain, so a client's
    // messages reach it in the order they were sent: a signal sent before a run must not
    // arrive after the run's MARK (it would then spare what it was meant to kill and could
    // hit the new command instead). Each step first resumes a paused sandbox, whose holder
    // is frozen with it.
    let chain: Promise<void> = Promise.resolve();
    const inOrder = (fn: (wakeError: unknown) => void): void => {
      this.lifecycle.touch(id);
      chain = chain
        .then(() => this.lifecycle.ensureAwake(id))
        .then(() => null, (err: unknown) => err)
        .then((wakeError) => {
          try {
            fn(wakeError);
          } catch {
            // a write or signal to an attachment that has ended: the client learns from the end itself
          }
        });
    };
    const send = (fn: () => void): void => inOrder(() => fn());
    return {
      get info() {
        return att.info;
      },
      onOutput: (l) => att.onOutput(l),
      onCommandDone: (l) => att.onCommandDone(l),
      onExit: (l) => att.onExit(l),
      run: (commandId, command, timeoutMs, resume) =>
        new Promise<CommandResult>((resolve, reject) => {
          inOrder((wakeError) => {
            if (wakeError !== null) return reject(wakeError);
            const end = this.lifecycle.begin(id);
            // att.run sends its frames before it returns: the next step cannot overtake them
            let running: Promise<CommandResult>;
            try {
              running = att.run(commandId, command, timeoutMs, resume);
            } catch (err) {
              end();
              return reject(err);
            }
            running.then(resolve, reject).finally(end);
          });
        }),
      write: (data) => send(() => att.write(data)),
      resize: (cols, rows) => send(() => att.resize(cols, rows)),
      signal: (signal) => send(() => att.signal(signal)),
      // after what was sent before it: input handed over before a detach still reaches the holder
      detach: () => {
        chain = chain.then(() => att.detach());
      },
      onLost: (l) => att.onLost?.(l),
      onDisconnect: (l) => att.onDisconnect?.(l),
      pauseOutput: () => att.pauseOutput?.(),
      resumeOutput: () => att.resumeOutput?.(),
      recentStatus: async (commandId, after) => (att.recentStatus ? att.recentStatus(commandId, after) : null),
      abortCommand: () => send(() => att.abortCommand?.()),
      close: () =>
        new Promise<void>((resolve, reject) => {
          inOrder((wakeError) => {
            if (wakeError !== null) return reject(wakeError);
            try {
              att.close().then(resolve, reject);
            } catch (err) {
              reject(err);
            }
          });
        }),
    };
  }

  async attachSession(id: string, sessionId: string, fromOffset: number): Promise<SessionAttachment> {
    await this.awake(id);
    if (!/^s-[a-z0-9]{1,64}$/.test(sessionId)) throw new WarrenError('INVALID_ID', `invalid session id: ${sessionId}`);
    const socketPath = join(this.sandboxSessionsDir(id), `${sessionId}.sock`);
    if (!existsSync(socketPath)) throw new WarrenError('SESSION_NOT_FOUND', `no session ${sessionId} in sandbox ${id}`);
    return this.tracked(id, await attachHolder(socketPath, fromOffset));
  }

  async listSessions(id: string): Promise<SessionInfo[]> {
    // Session holders of a paused sandbox are frozen with it: asking them resumes it.
    if (this.live(id).state === 'paused' || this.live(id).state === 'hibernated') await this.awake(id);
    const dir = this.sandboxSessionsDir(id);
    return existsSync(dir) ? listHolderSessions(dir) : [];
  }

  private async closeSessions(id: string): Promise<void> {
    const dir = this.sandboxSessionsDir(id);
    if (!existsSync(dir)) return;
    for (const info of await listHolderSessions(dir)) {
      try {
        const att = await attachHolder(join(dir, `${info.id}.sock`), info.outputOffset);
        await att.close();
      } catch {
        /* the cgroup kill takes care of holders we cannot reach */
      }
    }
    await rm(dir, { recursive: true, force: true });
  }

  // ---- lifecycle: pause/resume, hibernate, extend, pack_diff (src/shim/lifecycle) ----

  pauseSandbox(id: string): Promise<PauseResult> {
    return this.lifecycle.pause(id);
  }

  resumeSandbox(id: string): Promise<ResumeResult> {
    return this.lifecycle.resume(id);
  }

  private matching(filter: { labels: Record<string, string>; owner?: string }, states: string[]): string[] {
    if (Object.keys(filter.labels).length === 0) throw new WarrenError('INVALID_ARGUMENT', 'a label selector is required (label=key=value)');
    return this.listSandboxes(filter)
      .filter((s) => states.includes(s.state))
      .map((s) => s.id);
  }

  pauseSandboxes(filter: { labels: Record<string, string>; owner?: string }): Promise<PauseResult[]> {
    return this.lifecycle.pauseMany(this.matching(filter, ['running', 'paused']));
  }

  resumeSandboxes(filter: { labels: Record<string, string>; owner?: string }): Promise<ResumeResult[]> {
    return this.lifecycle.resumeMany(this.matching(filter, ['running', 'paused', 'hibernated']));
  }

  async hibernateSandbox(id: string): Promise<PauseResult> {
    this.live(id);
    return this.lifecycle.hibernate(id);
  }

  extendSandbox(id: string, req: { seconds?: number; ttlSeconds?: number }): SandboxInfo {
    this.lifecycle.extend(id, req);
    return this.info(this.live(id));
  }

  async packSandbox(id: string, req: PackRequest, owner: string): Promise<PackResult> {
    this.live(id);
    return this.lifecycle.pack(id, req, owner);
  }

  environment(ref: string, principal?: Principal): EnvironmentInfo | null {
    const env = this.lifecycle.environment(ref);
    return env === null || principal === undefined || this.access.environmentVisible(principal, env) ? env : null;
  }

  listEnvironments(principal?: Principal): EnvironmentInfo[] {
    const all = this.lifecycle.listEnvironments();
    return principal === undefined ? all : this.access.environments(principal, all);
  }

  authorizeContent(principal: Principal, refs: { image?: string; workspaces?: readonly string[]; toolkits?: readonly string[]; backend?: string }): void {
    // a vm boots the node's desktop image, which is not in the layer store (createSandbox checks the name)
    if (refs.backend === 'vm') {
      const { image: _image, ...rest } = refs;
      this.access.check(principal, rest);
      return;
    }
    this.access.check(principal, refs);
  }

  publishEnvironment(name: string, published: boolean): EnvironmentInfo {
    return this.lifecycle.publish(name, published);
  }

  // ---- images ----

  listImages(principal?: Principal): ImageInfo[] {
    const all = this.layers.listImages();
    return principal === undefined ? all : this.access.images(principal, all);
  }

  async importImage(req: ImportImageRequest, onProgress?: (p: ImportProgress) => void): Promise<ImageInfo> {
    const { source } = req;
    switch (source.type) {
      case 'directory':
        return this.layers.importDirectory(source.path, { name: req.name, kind: req.kind ?? 'base', onProgress });
      case 'oci-archive':
        return this.layers.importOciArchive(source.path, { name: req.name, kind: req.kind ?? 'base', onProgress });
      case 'debootstrap':
        return this.layers.buildDebian({ name: req.name, suite: source.suite, include: source.include, onProgress });
      case 'registry':
        return (await pullImage(this.layers, source.ref, { name: req.name, ...(source.mode ? { mode: source.mode } : {}), ...(onProgress ? { onProgress } : {}) })).image;
    }
  }

  /** Push an image to a registry reference (host[:port]/repo[:tag]) as a Warren image artifact. */
  pushImage(req: { image: string; ref: string }, onProgress?: (p: ImportProgress) => void): Promise<PushResult> {
    return pushImage(this.layers, req.image, req.ref, onProgress ? { onProgress } : {});
  }

  /** Stage an image into an overflow pool's registry repository (host[:port]/repo). */
  stageImage(req: { image: string; repository: string }, onProgress?: (p: ImportProgress) => void): Promise<PushResult> {
    return stageImage(this.layers, req.image, req.repository, onProgress ? { onProgress } : {});
  }

  /** Remove an image; its layers no other image uses go with it (IMAGE_IN_USE while a sandbox holds one). */
  async removeImage(name: string): Promise<ImageRemoval> {
    // prepared sandboxes hold layers, and an image in use cannot be removed
    await this.prepared.flush();
    return this.layers.removeImage(name);
  }

  /** Which layers this node holds ('local'), can mount from a registry ('lazy'), or lacks ('absent'). */
  layerStates(digests?: string[]): Array<{ digest: string; state: LayerAvailability; mounted: boolean }> {
    return digests === undefined ? this.layers.allLayerStates() : this.layers.layerStates(digests);
  }

  async updateNetwork(id: string, change: Record<string, boolean>): Promise<SandboxNetworkInfo> {
    const live = this.live(id);
    if (this.network === null || !this.network.has(id)) {
      throw new WarrenError('NOT_SUPPORTED', `sandbox ${id} has no network (created without \`network\`, or the node runs without networking); create it with "network": {} to change services later`);
    }
    const services = await this.network.update(id, change);
    const net = live.record.runtime.network as SandboxNetworkRuntime | undefined;
    if (net) {
      net.services = services;
      live.record.spec = { ...live.record.spec, network: services };
      this.registry.update(id, live.state, live.record.runtime);
    }
    this.lifecycle.touch(id);
    return this.network.info(id);
  }

  networkInfo(id: string): SandboxNetworkInfo {
    this.live(id);
    if (this.network === null || !this.network.has(id)) throw new WarrenError('NOT_SUPPORTED', `sandbox ${id} has no network`);
    return this.network.info(id);
  }

  async close(): Promise<void> {
    this.unsubscribePolicy?.();
    // prepared sandboxes have no record: they go with the node that made them
    await this.prepared.close();
    await this.network?.close();
    this.metrics.liveSandboxes.removeCallback(this.observeLive);
    // Sandboxes and sessions keep running: a restarted gateway re-adopts them.
    this.lifecycle.close();
    for (const b of this.backends.all()) b.close?.();
    await this.functions.close();
    this.layers.close();
    // Layers nobody holds are unmounted (lazily loaded ones also lose their file server): a
    // stopped node leaves behind only what its running sandboxes use, for the next gateway to
    // adopt. The others are mounted again on their next use.
    await this.layers.closeLazy().catch((err) => this.log(`layers: ${(err as Error).message}`));
    try {
      this.layers.unmountUnused();
    } catch (err) {
      this.log(`layers: unmounting unused layers: ${(err as Error).message}`);
    }
  }
}

function matches(live: LiveSandbox, filter: { owner?: string; labels?: Record<string, string> }): boolean {
  if (filter.owner !== undefined && live.record.spec.owner !== filter.owner) return false;
  if (filter.labels && !Object.entries(filter.labels).every(([k, v]) => live.record.spec.labels[k] === v)) return false;
  return true;
}

/** The answer of a backend whose exec already returns bounded output, held like a captured one. */
function capturedOf(r: ExecResult): CapturedExec {
  const hold = (text: string, truncated: boolean) => {
    const c = new OutputCapture(Number.MAX_SAFE_INTEGER);
    c.push(Buffer.from(text));
    if (truncated) c.markTruncated();
    return c;
  };
  const { stdout, stderr, ...outcome } = r;
  const out = hold(stdout, r.truncated);
  const err = hold(stderr, false);
  return { ...outcome, stdout: out, stderr: err, release: () => (out.release(), err.release()) };
}
