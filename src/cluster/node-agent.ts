/**
 * The cluster side of a node (`warren node`): it registers the node in etcd
 * under a lease, publishes its live load and the layers it holds, runs the
 * job shares placed on it, applies the policy distributed through etcd, and
 * fences itself when etcd says its lease is gone.
 *
 * Lease handling is done here rather than with etcd3's `Lease` class: that
 * class declares a lease lost after 2 TTLs without a successful keepalive,
 * which is what a quorum loss looks like from the node, and would make the
 * node destroy sandboxes that are still fine (without quorum nothing
 * expires; the new leader renews every lease to its full TTL). Here only an
 * answer from etcd that the lease is gone (TTL <= 0, or a put refused for an
 * unknown lease) fences the node.
 *
 * A node admits only while etcd has confirmed its lease recently enough: a keepalive answered
 * with a TTL proves the lease lives at least that long after the keepalive was sent, by the
 * monotonic clock, which runs on while the process is stopped. A node woken after a SIGSTOP, or
 * cut off from etcd, finds its lease unconfirmed at once; it asks etcd and waits for the answer
 * before it admits, so it never admits a create in a lost epoch before it knows of the loss.
 *
 * Fencing: stop admitting (creates answer NODE_FENCED), stop the job shares,
 * record the loss (/warren/lost/<node>/<epoch>, so jobs and owners are told
 * even if no gateway saw the lease expire), destroy the sandboxes of the
 * lost epoch (their owners were told they are lost), then register again
 * with epoch + 1.
 */
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, renameSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import type { Etcd3 } from 'etcd3';
import { WarrenError, asWarrenError } from '../errors';
import { BUNDLED_POLICY_DIR, policyStore } from '../security/confinement';
import type { ShimNode } from '../shim/node';
import type { BackendName, ImageInfo, Principal, SandboxInfo, SandboxSpec, Shim } from '../shim/types';
import type { ClusterCredential } from './credential';
import { type StagedImage, keys, nextRevision, parseJson, readPrefix } from './etcd';
import { type NodeRecord, type Pool, imageLayers } from './placement';
import { type Amount, NodeBlocks, addAmounts } from './quota-blocks';
import { UsageTally } from '../shim/sandbox-map';

export interface NodeAgentOptions {
  etcd: Etcd3;
  credential: ClusterCredential;
  shim: ShimNode;
  /** The node's API as its operator reaches it. */
  url: string;
  /** The node's shim protocol as gateways reach it. */
  shimUrl: string;
  dataDir: string;
  pool: Pool;
  labels: Record<string, string>;
  /** Most sandboxes this node admits at once. */
  maxSandboxes: number;
  /** Lease TTL in seconds (default 10; tests use 2-3). */
  leaseTtlS?: number;
  /** Creates this node runs at once for job shares (its back-pressure; default 8). */
  createWindow?: number;
  /** The node can mount layers it lacks from the registry on demand (the lazy layer path). */
  lazyLayers?: () => boolean;
  /**
   * When a lazy node pulls an image staged in the registry: `eager` (the default) as soon as it is
   * staged, `on-demand` when the first sandbox that needs it is created here. Either way a create
   * for a staged image the node has not pulled yet pulls it first: placement counts a lazy node as
   * able to serve every staged image.
   */
  pullStaged?: 'eager' | 'on-demand';
  /** Layer digests held beyond those of the listed images (the lazy layer cache). */
  heldLayers?: () => string[];
  log?: (line: string) => void;
}

/** A job share: `count` sandboxes of one template, with the job-wide indices in `ranges` (docs/cluster.md). */
export interface JobShare {
  job: string;
  share: string;
  node: string;
  epoch: number;
  spec: SandboxSpec;
  principal: Principal;
  ranges: IndexRange[];
  count: number;
  concurrency: number;
}

export interface IndexRange {
  from: number;
  count: number;
}

export function* indicesOf(ranges: readonly IndexRange[]): Generator<number> {
  for (const r of ranges) for (let i = r.from; i < r.from + r.count; i++) yield i;
}

/** Sorted indices as ranges. */
export function toRanges(indices: readonly number[]): IndexRange[] {
  const out: IndexRange[] = [];
  for (const i of indices) {
    const last = out[out.length - 1];
    if (last && last.from + last.count === i) last.count++;
    else out.push({ from: i, count: 1 });
  }
  return out;
}

export type ShareState = 'creating' | 'done' | 'paused' | 'cancelled' | 'deleted' | 'refused';

export interface ShareProgress {
  job: string;
  share: string;
  node: string;
  epoch: number;
  assigned: number;
  created: number;
  failed: number;
  /** Sandboxes this node refused (full or fenced): the gateway places them again elsewhere. */
  refused: number;
  /** The indices refused, handed back for placement elsewhere. */
  refusedRanges?: IndexRange[];
  paused: number;
  releasedBytes: number;
  deleted: number;
  state: ShareState;
  errors: Record<string, number>;
  /** The first failures (at most 50), with their index. */
  failures: { index: number; code: string; message: string }[];
  /** Sandboxes created since the previous write of this record (watchers see every write). */
  batch: { seq: number; ids: string[] };
  at: number;
}

export type JobControlState = 'running' | 'paused' | 'cancelled' | 'deleted';

const MAX_FAILURES = 50;
/** How long a staged image whose pull failed is left alone (and listed as unloadable) before it is tried again. */
const PULL_RETRY_MS = 30_000;
/** Keepalives a stream may leave unanswered before it is replaced. */
const MAX_UNANSWERED_KEEPALIVES = 16;

type KeepStream = Awaited<ReturnType<Etcd3['leaseClient']['leaseKeepAlive']>>;
export const JOB_LABEL = 'warren.job';
export const SHARE_LABEL = 'warren.share';
export const INDEX_LABEL = 'warren.index';

/** A shim that refuses creates past the node's capacity, past the account's quota block, or while fenced: the node's final admission. */
export function admissionShim(shim: Shim, admit: (spec: SandboxSpec) => Promise<(created: boolean) => void>): Shim {
  return new Proxy(shim, {
    get(target, prop, receiver) {
      if (prop === 'createSandbox') {
        return async (spec: SandboxSpec, principal?: Principal) => {
          const done = await admit(spec);
          let info: SandboxInfo;
          try {
            info = await target.createSandbox(spec, principal);
          } catch (err) {
            done(false);
            throw err;
          }
          done(true);
          return info;
        };
      }
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

class ShareRun {
  progress: ShareProgress;
  private seq = 0;
  private pendingIds: string[] = [];
  private dirty = true;
  stopped = false;
  private wake: (() => void) | null = null;
  done: Promise<void> = Promise.resolve();

  constructor(readonly share: JobShare) {
    this.progress = {
      job: share.job,
      share: share.share,
      node: share.node,
      epoch: share.epoch,
      assigned: share.count,
      created: 0,
      failed: 0,
      refused: 0,
      paused: 0,
      releasedBytes: 0,
      deleted: 0,
      state: 'creating',
      errors: {},
      failures: [],
      batch: { seq: 0, ids: [] },
      at: Date.now(),
    };
  }

  mark(): void {
    this.dirty = true;
  }

  created(id: string): void {
    this.progress.created++;
    this.pendingIds.push(id);
    this.dirty = true;
  }

  readonly failedIndices: number[] = [];

  failed(index: number, err: WarrenError): void {
    this.progress.failed++;
    this.failedIndices.push(index);
    this.progress.errors[err.code] = (this.progress.errors[err.code] ?? 0) + 1;
    if (this.progress.failures.length < MAX_FAILURES) this.progress.failures.push({ index, code: err.code, message: err.message });
    this.dirty = true;
  }

  /** The record to write, or null when nothing changed since the last one. */
  take(): ShareProgress | null {
    if (!this.dirty) return null;
    this.dirty = false;
    const ids = this.pendingIds;
    this.pendingIds = [];
    if (ids.length > 0) this.seq++;
    this.progress.batch = { seq: this.seq, ids };
    this.progress.at = Date.now();
    return { ...this.progress };
  }

  /** Give the ids of a record that failed to be written back (the next write carries them). */
  untake(rec: ShareProgress): void {
    this.pendingIds = [...rec.batch.ids, ...this.pendingIds];
    this.dirty = true;
  }

  notify(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  waitChange(): Promise<void> {
    return new Promise((r) => (this.wake = r));
  }
}

export class NodeAgent {
  private readonly etcd: Etcd3;
  private readonly log: (line: string) => void;
  private readonly ttl: number;
  private leaseId: string | null = null;
  epoch = 0;
  fenced = false;
  private closed = false;
  private heartbeat: NodeJS.Timeout | null = null;
  private keepTimer: NodeJS.Timeout | null = null;
  private keepStream: KeepStream | null = null;
  private keepOpening: Promise<KeepStream> | null = null;
  /** performance.now() until which etcd has confirmed the lease (see admit). */
  private leaseValidUntil = 0;
  /** When each keepalive on the stream was sent, oldest first: etcd answers them in order. */
  private keepSent: number[] = [];
  /** Admissions waiting for etcd to answer a keepalive. */
  private confirmWaiters: Array<() => void> = [];
  private readonly runs = new Map<string, ShareRun>();
  private readonly control = new Map<string, JobControlState>();
  private creating = 0;
  private watchers: { cancel(): Promise<void> }[] = [];
  private readonly epochFile: string;
  private registering: Promise<void> | null = null;
  private policyRev = '';
  /** Eager pulls of staged images run one at a time, in the order they were staged. */
  private pulls: Promise<void> = Promise.resolve();
  /** The staged images this node knows of, by name (their records verified). */
  private readonly staged = new Map<string, StagedImage>();
  /** The node mounts layers on demand (read once at start). */
  private lazy = false;
  /**
   * Staged images whose pull failed, until when they are not tried again. The record lists their
   * layers as unloadable meanwhile, so placement sends them elsewhere instead of here again.
   */
  private readonly failedPulls = new Map<string, { layers: string[]; until: number; error: string }>();
  /** Pulls under way, by image name: an eager pull and the creates waiting on it share one. */
  private readonly pulling = new Map<string, Promise<void>>();

  constructor(private readonly opts: NodeAgentOptions) {
    this.etcd = opts.etcd;
    this.log = opts.log ?? (() => undefined);
    this.ttl = opts.leaseTtlS ?? 10;
    this.epochFile = join(opts.dataDir, 'cluster-epoch');
  }

  get nodeId(): string {
    return this.opts.shim.nodeId;
  }

  /**
   * Whether etcd's last word on the lease still holds, with a margin for the clocks' rates
   * (a tenth of the TTL, at most a second).
   */
  private leaseConfirmed(): boolean {
    return performance.now() < this.leaseValidUntil - Math.min(1000, this.ttl * 100);
  }

  /**
   * Resolves once the lease is confirmed, the node is fenced, or a TTL has passed without an
   * answer from etcd (then admit refuses). A keepalive goes out at once: a node that was stopped
   * learns now whether its lease survived, not at its next keepalive.
   */
  private async confirmLease(): Promise<void> {
    const deadline = performance.now() + this.ttl * 1000;
    while (!this.fenced && this.leaseId !== null && !this.closed && !this.leaseConfirmed()) {
      const left = deadline - performance.now();
      if (left <= 0) return;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, left);
        timer.unref();
        function done(): void {
          clearTimeout(timer);
          resolve();
        }
        this.confirmWaiters.push(done);
        // one keepalive in flight is enough: its answer wakes every waiter (an answer to one sent
        // before a stop confirms too little, and the loop asks again)
        if (this.keepSent.length === 0) void this.keepAlive();
      });
    }
  }

  private wakeConfirmWaiters(): void {
    for (const w of this.confirmWaiters.splice(0)) w();
  }

  /** The node's final admission: throws when it may not take one more sandbox. */
  admit(): void {
    if (this.fenced || this.leaseId === null) throw new WarrenError('NODE_FENCED', `node ${this.nodeId} is not registered in the cluster (it lost its lease or has not registered yet); it admits nothing until it has`);
    if (!this.leaseConfirmed()) {
      throw new WarrenError('NODE_FENCED', `node ${this.nodeId} has no recent word from etcd that its lease lives (the node was stopped, or is cut off from etcd); it admits nothing until etcd renews the lease`, { node: this.nodeId, retryAfterS: 1 });
    }
    const live = this.liveCount();
    if (live + this.creating >= this.opts.maxSandboxes) {
      throw new WarrenError('RESOURCE_EXHAUSTED', `node ${this.nodeId} is full (${live} sandboxes, ${this.creating} being created, capacity ${this.opts.maxSandboxes})`, { node: this.nodeId, retryAfterS: 1 });
    }
  }

  private live = { count: 0, at: 0 };
  /** Single creates admitted and not ended, per account (job creates are counted by their shares). */
  private readonly admitted = new UsageTally();
  /** This node's blocks of the accounts' quotas (none before start()). */
  private blocks: NodeBlocks | null = null;

  /** Live sandboxes, counted at most every 250 ms (listing them all is O(n)); creates in between are added as they finish. */
  private liveCount(fresh = false): number {
    if (fresh || Date.now() - this.live.at > 250) {
      let n = 0;
      for (const s of this.opts.shim.listSandboxes()) if (s.state !== 'stopped' && s.state !== 'failed') n++;
      this.live = { count: n, at: Date.now() };
    }
    return this.live.count;
  }

  /** A create admitted by admit() finished: count it until the next full count. */
  createdOne(): void {
    this.live.count++;
  }

  /**
   * Admit one create of the node's API: capacity, then the account's quota block on this node.
   * It is counted as being created from here until it ends, so that a record counts every create
   * admitted before it (the gateways rely on it), and against the block from before its check
   * (a block given back meanwhile keeps room for it).
   */
  async admitOne(spec: Pick<SandboxSpec, 'owner' | 'cpu' | 'memoryMb'>): Promise<(created: boolean) => void> {
    await this.confirmLease();
    this.admit();
    this.creating++;
    const used = this.held(spec.owner);
    this.admitted.add(spec.owner, spec.cpu, spec.memoryMb, 1);
    let ended = false;
    const end = (created: boolean): void => {
      if (ended) return;
      ended = true;
      this.creating--;
      this.admitted.add(spec.owner, spec.cpu, spec.memoryMb, -1);
      if (created) this.createdOne();
    };
    try {
      await this.blocks?.admit(spec.owner, used, spec);
    } catch (err) {
      end(false);
      throw err;
    }
    return end;
  }

  /**
   * What this node holds and has promised for an account: its live sandboxes, the single creates
   * admitted and not ended, and what its running job shares still have to make.
   */
  private held(owner: string): Amount {
    let u: Amount = addAmounts(this.opts.shim.sandboxUsage(owner), this.admitted.of(owner));
    for (const run of this.runs.values()) {
      const { share } = run;
      if (share.spec.owner !== owner || run.stopped) continue;
      const state = this.control.get(share.job) ?? 'running';
      if (state === 'cancelled' || state === 'deleted') continue;
      const p = run.progress;
      const left = Math.max(0, share.count - p.created - p.failed - p.refused);
      u = addAmounts(u, { sandboxes: 1, cpu: share.spec.cpu, memoryMb: share.spec.memoryMb }, left);
    }
    return u;
  }

  /**
   * Register, then start the heartbeat, the share and control watches and the
   * policy watch. A node that restarts after its lease expired (the record
   * is gone) was declared lost: it reconciles first.
   */
  async start(): Promise<void> {
    const saved = existsSync(this.epochFile) ? Number(readFileSync(this.epochFile, 'utf8').trim()) : 0;
    this.epoch = Number.isInteger(saved) && saved > 0 ? saved : 1;
    const existing = await this.etcd.get(keys.node(this.nodeId)).string();
    const rec = existing === null ? null : this.opts.credential.verify(parseJson<NodeRecord & { sig: string }>(existing));
    // The blocks before anything is admitted: unused reserved room goes back within half a second
    // to a second (a gateway that finds the quota full while some block is unused waits for it; a
    // burst of creates and deletes re-grows by chunks).
    this.blocks = new NodeBlocks(this.etcd, this.opts.credential, this.nodeId, (owner) => this.held(owner), (line) => this.log(line), 500);
    this.blocks.holdGiveBack = true; // until the job shares, part of the need, are loaded
    await this.blocks.start();
    if (saved > 0 && (rec === null || rec.epoch !== this.epoch)) {
      // Our lease expired while we were down: gateways reported our sandboxes lost.
      this.log(`cluster: node ${this.nodeId} epoch ${this.epoch} expired while the node was down; reconciling`);
      await this.reconcileLost();
      await this.blocks.giveBackAll();
      this.epoch++;
    }
    this.saveEpoch();
    await this.register();
    this.heartbeat = setInterval(() => void this.beat(), 1000);
    this.heartbeat.unref();
    await this.watchShares();
    this.blocks.holdGiveBack = false;
    await this.watchPolicy();
    this.lazy = this.opts.lazyLayers?.() ?? false;
    if (this.lazy) await this.watchStaged();
  }

  private saveEpoch(): void {
    const tmp = `${this.epochFile}.tmp`;
    writeFileSync(tmp, `${this.epoch}\n`, { mode: 0o600 });
    renameSync(tmp, this.epochFile);
  }

  private backendsCache: { at: number; names: BackendName[] } | null = null;

  record(): NodeRecord {
    const shim = this.opts.shim;
    // `at` is read before the usage, which counts the creates in progress from their createdAt:
    // a sandbox whose createdAt is before `at` is counted (the gateways rely on it)
    const at = Date.now();
    const creating = this.creating;
    const accounts: Record<string, number> = {};
    const resources: Record<string, { cpu: number; memoryMb: number }> = {};
    for (const [owner, u] of shim.usageByOwner()) {
      accounts[owner] = u.sandboxes;
      resources[owner] = { cpu: u.cpu, memoryMb: u.memoryMb };
    }
    const live = this.liveCount(true);
    const images = shim.listImages().map((i) => ({ name: i.name, digest: i.digest, kind: i.kind, layers: i.layers }));
    const layers = new Set<string>();
    for (const i of images) for (const l of imageLayers(i)) layers.add(l);
    for (const l of this.opts.heldLayers?.() ?? []) layers.add(l);
    // the backend probes read /proc and /sys: once every 30 s is enough for placement
    if (this.backendsCache === null || Date.now() - this.backendsCache.at > 30_000) {
      const b = shim.features().backends;
      this.backendsCache = { at: Date.now(), names: (Object.keys(b) as BackendName[]).filter((n) => b[n]?.available) };
    }
    const meminfo = (() => {
      try {
        const m = /MemAvailable:\s+(\d+)/.exec(readFileSync('/proc/meminfo', 'utf8'));
        return m ? Math.floor(Number(m[1]) / 1024) : 0;
      } catch {
        return 0;
      }
    })();
    const now = Date.now();
    const unloadable: string[] = [];
    for (const [image, f] of this.failedPulls) {
      if (f.until <= now) this.failedPulls.delete(image);
      else unloadable.push(...f.layers);
    }
    return {
      id: this.nodeId,
      url: this.opts.url,
      shim: this.opts.shimUrl,
      pool: this.opts.pool,
      labels: this.opts.labels,
      epoch: this.epoch,
      capacity: { sandboxes: this.opts.maxSandboxes, cpus: os.availableParallelism?.() ?? os.cpus().length, memoryMb: Math.floor(os.totalmem() / 1048576) },
      used: { sandboxes: live, creating, memoryAvailableMb: meminfo, load1: os.loadavg()[0] ?? 0 },
      backends: this.backendsCache.names,
      images,
      layers: [...layers],
      lazy: this.lazy,
      ...(unloadable.length > 0 ? { unloadable } : {}),
      accounts,
      resources,
      fenced: this.fenced,
      at,
    };
  }

  private async putRecord(): Promise<void> {
    if (this.leaseId === null) return;
    await this.etcd.put(keys.node(this.nodeId)).value(JSON.stringify(this.opts.credential.sign(this.record()))).lease(this.leaseId).exec();
  }

  private register(): Promise<void> {
    this.registering ??= (async () => {
      let delay = 200;
      while (!this.closed) {
        try {
          const asked = performance.now();
          const grant = await this.etcd.leaseClient.leaseGrant({ TTL: this.ttl });
          this.leaseId = grant.ID;
          this.leaseValidUntil = asked + (Number(grant.TTL) || this.ttl) * 1000;
          this.fenced = false;
          await this.putRecord();
          this.startKeepAlive();
          this.log(`cluster: node ${this.nodeId} registered (epoch ${this.epoch}, lease ttl ${this.ttl}s)`);
          return;
        } catch (err) {
          this.leaseId = null;
          this.log(`cluster: registration failed, retrying: ${(err as Error).message}`);
          await new Promise((r) => setTimeout(r, delay));
          delay = Math.min(delay * 2, 2000);
        }
      }
    })().finally(() => {
      this.registering = null;
    });
    return this.registering;
  }

  private startKeepAlive(): void {
    if (this.keepTimer) clearInterval(this.keepTimer);
    this.keepTimer = setInterval(() => void this.keepAlive(), Math.max(300, (this.ttl * 1000) / 3));
    this.keepTimer.unref();
  }

  private async keepAlive(): Promise<void> {
    const id = this.leaseId;
    if (id === null || this.closed) return;
    try {
      // A stream without answers (no quorum) is replaced before its list of sent times grows long;
      // the old stream's late answers are ignored, so an answer is never taken for a later keepalive.
      if (this.keepStream !== null && this.keepSent.length >= MAX_UNANSWERED_KEEPALIVES) {
        this.keepStream.end();
        this.keepStream = null;
        this.keepSent = [];
      }
      const s = this.keepStream ?? (await (this.keepOpening ??= this.openKeepStream().finally(() => (this.keepOpening = null))));
      if (id !== this.leaseId || this.closed || s !== this.keepStream) return;
      this.keepSent.push(performance.now());
      s.write({ ID: id });
    } catch {
      // etcd unreachable or without quorum: keep going; only etcd saying the lease is gone fences
      // us (meanwhile the lease goes unconfirmed and the node admits nothing)
      this.keepStream = null;
      this.keepSent = [];
    }
  }

  private async openKeepStream(): Promise<KeepStream> {
    const s = await this.etcd.leaseClient.leaseKeepAlive();
    s.on('data', (res: { ID: string; TTL: string }) => {
      if (this.keepStream !== s) return;
      const sentAt = this.keepSent.shift();
      if (res.ID !== this.leaseId) return;
      if (Number(res.TTL) <= 0) {
        void this.onLeaseLost('etcd answered that the lease expired');
      } else if (sentAt !== undefined) {
        // the lease lives at least TTL seconds from when etcd took the keepalive, which is after it was sent
        this.leaseValidUntil = Math.max(this.leaseValidUntil, sentAt + Number(res.TTL) * 1000);
        this.wakeConfirmWaiters();
      }
    });
    const lost = (): void => {
      if (this.keepStream !== s) return;
      this.keepStream = null;
      this.keepSent = [];
    };
    s.on('error', lost);
    s.on('end', lost);
    this.keepStream = s;
    this.keepSent = [];
    return s;
  }

  private async beat(): Promise<void> {
    if (this.closed || this.fenced) return;
    try {
      await this.putRecord();
    } catch (err) {
      const msg = (err as Error).message;
      if (/requested lease not found|lease not found/i.test(msg)) await this.onLeaseLost(msg);
    }
    await this.flushProgress();
  }

  private async onLeaseLost(why: string): Promise<void> {
    if (this.fenced || this.closed) return;
    this.fenced = true;
    const lostEpoch = this.epoch;
    this.log(`cluster: node ${this.nodeId} lost its lease (${why}): fencing, reconciling epoch ${lostEpoch}`);
    this.leaseId = null;
    this.leaseValidUntil = 0;
    this.keepStream?.end();
    this.keepStream = null;
    this.keepSent = [];
    this.wakeConfirmWaiters();
    for (const run of this.runs.values()) {
      run.stopped = true;
      run.notify();
    }
    await this.reconcileLost();
    await this.blocks?.giveBackAll();
    this.epoch = lostEpoch + 1;
    this.saveEpoch();
    this.runs.clear();
    await this.register();
  }

  /** Record the loss of this epoch (if no gateway did) and destroy its sandboxes: their owners were told they are lost. */
  private async reconcileLost(): Promise<void> {
    const lostKey = keys.lost(this.nodeId, this.epoch);
    for (let delay = 200; !this.closed; delay = Math.min(delay * 2, 2000)) {
      try {
        await this.etcd
          .if(lostKey, 'Create', '==', 0)
          .then(this.etcd.put(lostKey).value(JSON.stringify({ node: this.nodeId, epoch: this.epoch, at: Date.now(), by: 'node' })))
          .commit();
        break;
      } catch (err) {
        this.log(`cluster: cannot record the loss yet: ${(err as Error).message}`);
        await new Promise((r) => setTimeout(r, delay));
      }
    }
    const doomed = this.opts.shim.listSandboxes();
    await pool(doomed, 8, (s) => this.opts.shim.deleteSandbox(s.id).catch((err: Error) => this.log(`cluster: cannot remove lost sandbox ${s.id}: ${err.message}`)));
    if (doomed.length > 0) this.log(`cluster: removed ${doomed.length} sandbox(es) of the lost epoch`);
  }

  // ------------------------------------------------------------------ jobs

  private async watchShares(): Promise<void> {
    const sharePrefix = `${keys.shares}${this.nodeId}/`;
    const controls = await readPrefix(this.etcd, keys.controls);
    for (const kv of controls.kvs) {
      const c = parseJson<{ state: JobControlState }>(kv.value);
      if (c) this.control.set(kv.key.slice(keys.controls.length), c.state);
    }
    const cw = await this.etcd.watch().prefix(keys.controls).startRevision(nextRevision(controls.revision)).create();
    cw.on('put', (kv) => {
      const c = parseJson<{ state: JobControlState }>(kv.value);
      if (c) void this.onControl(kv.key.toString('utf8').slice(keys.controls.length), c.state);
    });
    this.watchers.push(cw);
    const shares = await readPrefix(this.etcd, sharePrefix);
    for (const kv of shares.kvs) this.onShare(kv.value);
    const sw = await this.etcd.watch().prefix(sharePrefix).startRevision(nextRevision(shares.revision)).create();
    sw.on('put', (kv) => this.onShare(kv.value.toString('utf8')));
    this.watchers.push(sw);
  }

  private onShare(value: string): void {
    const share = this.opts.credential.verify(parseJson<JobShare & { sig: string }>(value));
    if (share === null || share.node !== this.nodeId) return;
    if (share.epoch !== this.epoch) return; // placed on an epoch that was lost: reported lost, never run
    const key = `${share.job}/${share.share}`;
    if (this.runs.has(key)) return;
    const run = new ShareRun(share);
    this.runs.set(key, run);
    run.done = this.runShare(run).catch((err: Error) => this.log(`cluster: share ${key} failed: ${err.message}`));
  }

  private async runShare(run: ShareRun): Promise<void> {
    const { share } = run;
    const shim = this.opts.shim;
    // A node restarted within its lease goes on where it was: indices already made are skipped.
    const existing = new Set<number>();
    for (const s of shim.listSandboxes({ labels: { [JOB_LABEL]: share.job, [SHARE_LABEL]: share.share } })) {
      existing.add(Number(s.labels[INDEX_LABEL]));
      run.created(s.id);
    }
    const todo: number[] = [];
    for (const i of indicesOf(share.ranges)) if (!existing.has(i)) todo.push(i);
    const window = Math.max(1, Math.min(share.concurrency, this.opts.createWindow ?? 8));
    let next = 0;
    let refusedAt: number | null = null;
    const worker = async () => {
      while (!run.stopped && refusedAt === null) {
        const state = this.control.get(share.job) ?? 'running';
        if (state === 'cancelled' || state === 'deleted') return;
        if (state === 'paused') {
          await run.waitChange();
          continue;
        }
        if (next >= todo.length) return;
        const index = todo[next++]!;
        const spec: SandboxSpec = { ...share.spec, labels: { ...share.spec.labels, [JOB_LABEL]: share.job, [SHARE_LABEL]: share.share, [INDEX_LABEL]: String(index) } };
        try {
          await this.confirmLease();
          this.admit();
          this.creating++;
          let info: SandboxInfo;
          try {
            // a staged image this node cannot load refuses the rest of the share, to be placed elsewhere
            await this.ensureStaged(spec).catch((err: unknown) => {
              throw new WarrenError('RESOURCE_EXHAUSTED', asWarrenError(err).message, { node: this.nodeId });
            });
            info = await shim.createSandbox(spec, share.principal);
          } finally {
            this.creating--;
          }
          this.createdOne();
          run.created(info.id);
          // a pause that arrived while this one was being created
          if (this.control.get(share.job) === 'paused') await shim.pauseSandbox(info.id).catch(() => undefined);
          if (this.control.get(share.job) === 'deleted') await shim.deleteSandbox(info.id).catch(() => undefined);
        } catch (err) {
          const e = asWarrenError(err);
          if (e.code === 'RESOURCE_EXHAUSTED' || e.code === 'NODE_FENCED') {
            refusedAt = refusedAt === null ? index : Math.min(refusedAt, index);
            next = todo.length;
            return;
          }
          run.failed(index, e);
        }
      }
    };
    await Promise.all(Array.from({ length: Math.min(window, Math.max(1, todo.length)) }, worker));
    if (run.stopped) return;
    if (refusedAt !== null) {
      // every index that was neither created nor failed (the workers stopped at the first refusal)
      const made = new Set(shim.listSandboxes({ labels: { [JOB_LABEL]: share.job, [SHARE_LABEL]: share.share } }).map((s) => Number(s.labels[INDEX_LABEL])));
      for (const f of run.failedIndices) made.add(f);
      const left = todo.filter((i) => !made.has(i));
      run.progress.refused = left.length;
      run.progress.refusedRanges = toRanges(left);
    }
    const state = this.control.get(share.job) ?? 'running';
    run.progress.state = state === 'deleted' ? 'deleted' : state === 'cancelled' ? 'cancelled' : state === 'paused' ? 'paused' : run.progress.refused > 0 ? 'refused' : 'done';
    run.mark();
    await this.flushProgress();
  }

  private async onControl(job: string, state: JobControlState): Promise<void> {
    this.control.set(job, state);
    const mine = [...this.runs.values()].filter((r) => r.share.job === job);
    for (const r of mine) r.notify();
    if (mine.length === 0) return;
    const shim = this.opts.shim;
    const labels = { [JOB_LABEL]: job };
    try {
      if (state === 'paused') {
        const results = await shim.pauseSandboxes({ labels });
        const released = results.reduce((s, r) => s + (r.releasedBytes ?? 0), 0);
        for (const r of mine) {
          r.progress.paused = results.filter((x) => x.id !== undefined).length;
          r.progress.releasedBytes = released;
          if (r.progress.state !== 'creating') r.progress.state = 'paused';
          r.mark();
          // all of it is counted on the first share's record
          r.progress.paused = r === mine[0] ? r.progress.paused : 0;
          r.progress.releasedBytes = r === mine[0] ? released : 0;
        }
      } else if (state === 'running') {
        await shim.resumeSandboxes({ labels });
        for (const r of mine) {
          r.progress.paused = 0;
          r.progress.releasedBytes = 0;
          if (r.progress.state === 'paused') r.progress.state = r.progress.refused > 0 ? 'refused' : 'done';
          r.mark();
        }
      } else if (state === 'deleted') {
        const doomed = shim.listSandboxes({ labels });
        await pool(doomed, 8, (s) => shim.deleteSandbox(s.id).catch(() => undefined));
        for (const r of mine) {
          r.progress.deleted = r === mine[0] ? doomed.length : 0;
          r.progress.state = 'deleted';
          r.mark();
        }
      } else if (state === 'cancelled') {
        for (const r of mine) {
          if (r.progress.state === 'creating') r.progress.state = 'cancelled';
          r.mark();
        }
      }
    } catch (err) {
      this.log(`cluster: job ${job}: ${state} failed: ${(err as Error).message}`);
    }
    await this.flushProgress();
  }

  private flushing: Promise<void> | null = null;

  /** Write the progress of every share that changed (one txn). */
  flushProgress(): Promise<void> {
    this.flushing ??= (async () => {
      const recs: { run: ShareRun; rec: ShareProgress }[] = [];
      for (const run of this.runs.values()) {
        const rec = run.take();
        if (rec) recs.push({ run, rec });
      }
      if (recs.length === 0) return;
      try {
        for (let i = 0; i < recs.length; i += 64) {
          const chunk = recs.slice(i, i + 64);
          await this.etcd
            .if(keys.node(this.nodeId), 'Create', '>', 0)
            .then(...chunk.map(({ rec }) => this.etcd.put(keys.jobProgress(rec.job, rec.node, rec.share)).value(JSON.stringify(rec))))
            .commit();
        }
      } catch {
        for (const { run, rec } of recs) run.untake(rec);
      }
    })().finally(() => {
      this.flushing = null;
    });
    return this.flushing;
  }

  /** Progress is written about every 250 ms while shares run. */
  private progressTimer = setInterval(() => {
    if (this.runs.size > 0 && !this.fenced) void this.flushProgress();
  }, 250).unref();

  // ------------------------------------------------------------------ policy

  /** The node's own copy of the policy directory, seeded from the bundled one. */
  static policyDir(dataDir: string): string {
    const dir = join(dataDir, 'policy');
    if (!existsSync(dir)) {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      for (const f of readdirSync(BUNDLED_POLICY_DIR)) if (f.endsWith('.yaml')) copyFileSync(join(BUNDLED_POLICY_DIR, f), join(dir, f));
    }
    return dir;
  }

  private async watchPolicy(): Promise<void> {
    const res = await readPrefix(this.etcd, keys.policy);
    const cur = res.kvs.find((kv) => kv.key === keys.policy);
    if (cur) await this.applyPolicy(cur.value);
    const w = await this.etcd.watch().key(keys.policy).startRevision(nextRevision(res.revision)).create();
    w.on('put', (kv) => void this.applyPolicy(kv.value.toString('utf8')));
    this.watchers.push(w);
  }

  /**
   * Write the distributed files into the node's policy directory and apply
   * them as a whole; when they are invalid the previous files are put back
   * and the last good policy stays in force. Without etcd the node keeps
   * whatever it last applied.
   */
  private async applyPolicy(value: string): Promise<void> {
    const bundle = this.opts.credential.verify(parseJson<{ rev: string; files: Record<string, string>; sig: string }>(value));
    if (bundle === null || bundle.rev === this.policyRev) return;
    const dir = policyStore().dir;
    const names = Object.keys(bundle.files).filter((n) => /^[a-z][a-z0-9-]*\.yaml$/.test(n));
    const previous = new Map<string, string | null>();
    for (const n of names) previous.set(n, existsSync(join(dir, n)) ? readFileSync(join(dir, n), 'utf8') : null);
    const writeAll = (files: Map<string, string | null> | Record<string, string>) => {
      for (const [n, text] of files instanceof Map ? files : Object.entries(files)) {
        if (!names.includes(n)) continue;
        if (text === null) continue;
        writeFileSync(join(dir, `.${n}.tmp`), text, { mode: 0o600 });
        renameSync(join(dir, `.${n}.tmp`), join(dir, n));
      }
    };
    let status: Record<string, unknown>;
    try {
      writeAll(bundle.files);
      const r = policyStore().apply();
      this.policyRev = bundle.rev;
      status = { rev: bundle.rev, applied: true, digests: r.digests, at: Date.now() };
      this.log(`cluster: policy ${bundle.rev} applied (${r.changes.length} change(s))`);
    } catch (err) {
      writeAll(previous);
      status = { rev: bundle.rev, applied: false, error: asWarrenError(err).message, at: Date.now() };
      this.log(`cluster: policy ${bundle.rev} rejected, the last good one stays: ${(err as Error).message}`);
    }
    await this.etcd.put(keys.policyStatus(this.nodeId)).value(JSON.stringify(status)).exec().catch(() => undefined);
  }

  // ------------------------------------------------------------------ staged images

  /**
   * A node that mounts layers on demand learns of every image staged for
   * the overflow pool. By default it pulls each as it is staged: the
   * metadata now (a few KiB per layer), the data when a sandbox reads it. It
   * then lists the image, so placement sends it the requests for it like any
   * holder. With `pullStaged: 'on-demand'` it only records the image, and
   * the first create that needs it pulls it.
   */
  private async watchStaged(): Promise<void> {
    const res = await readPrefix(this.etcd, keys.overflowImages);
    for (const kv of res.kvs) this.onStaged(kv.value);
    const w = await this.etcd.watch().prefix(keys.overflowImages).startRevision(nextRevision(res.revision)).create();
    w.on('put', (kv) => this.onStaged(kv.value.toString('utf8')));
    w.on('delete', (kv) => this.staged.delete(decodeURIComponent(kv.key.toString('utf8').slice(keys.overflowImages.length))));
    this.watchers.push(w);
  }

  private onStaged(value: string): void {
    const rec = this.opts.credential.verify(parseJson<StagedImage & { sig: string }>(value));
    if (rec === null || typeof rec.image !== 'string' || typeof rec.ref !== 'string' || !Array.isArray(rec.layers) || !rec.layers.every((d) => typeof d === 'string')) {
      this.log('cluster: a staged image record without a valid signature is ignored');
      return;
    }
    const before = this.staged.get(rec.image);
    this.staged.set(rec.image, rec);
    // staged again elsewhere (a registry that serves it, new layers): a failed pull is no reason to wait
    if (before !== undefined && (before.ref !== rec.ref || before.layers.join(',') !== rec.layers.join(',')) && this.failedPulls.delete(rec.image)) {
      void this.putRecord().catch(() => undefined);
    }
    if (this.opts.pullStaged === 'on-demand') return;
    this.pulls = this.pulls.then(() => this.pullStaged(rec).catch((err: Error) => this.log(`cluster: staged image ${rec.image} could not be pulled from ${rec.ref}: ${err.message}`)));
  }

  /** The image `ref` names on this node (one indexed lookup, not a listing: it runs before every create of a lazy node). */
  private image(ref: string): ImageInfo | undefined {
    try {
      return this.opts.shim.layers.resolveImage(ref);
    } catch {
      return undefined;
    }
  }

  /** Whether the node lists `image` with exactly the layers `rec` names. */
  private holdsStaged(rec: StagedImage): boolean {
    const held = this.image(rec.image);
    return held !== undefined && held.name === rec.image && imageLayers(held).join(',') === rec.layers.join(',');
  }

  /** Pull a staged image (metadata only), once at a time per image; rejects when the registry cannot serve it. */
  private pullStaged(rec: StagedImage): Promise<void> {
    if (this.closed || this.holdsStaged(rec)) return Promise.resolve();
    const under = this.pulling.get(rec.image);
    if (under !== undefined) return under;
    const p = (async () => {
      let img: ImageInfo;
      try {
        img = await this.opts.shim.importImage({ name: rec.image, source: { type: 'registry', ref: rec.ref, mode: 'lazy' } });
      } catch (err) {
        this.failedPulls.set(rec.image, { layers: rec.layers, until: Date.now() + PULL_RETRY_MS, error: (err as Error).message });
        await this.putRecord().catch(() => undefined);
        throw err;
      }
      this.failedPulls.delete(rec.image);
      this.log(`cluster: staged image ${rec.image} pulled from ${rec.ref} (layers on demand)`);
      if (imageLayers(img).join(',') !== rec.layers.join(',')) this.log(`cluster: staged image ${rec.image} at ${rec.ref} does not have the layers its record names`);
      await this.putRecord().catch(() => undefined);
    })().finally(() => this.pulling.delete(rec.image));
    this.pulling.set(rec.image, p);
    return p;
  }

  /**
   * Before a create: pull the staged images among its image and extra
   * layers that this node lacks. Placement sends a lazy node requests for
   * any staged image, pulled here or not; a pull that fails is UNAVAILABLE,
   * so the gateway places the create on another node.
   */
  async ensureStaged(spec: Pick<SandboxSpec, 'image' | 'workspaces' | 'toolkits'>): Promise<void> {
    if (!this.lazy) return;
    for (const ref of [spec.image, ...spec.workspaces, ...spec.toolkits]) {
      const rec = this.staged.get(ref) ?? (this.image(ref) !== undefined ? undefined : await this.stagedRecord(ref));
      if (rec === undefined || this.holdsStaged(rec)) continue;
      const cannot = (why: string) => new WarrenError('UNAVAILABLE', `node ${this.nodeId} cannot load the staged image ${rec.image} from ${rec.ref}: ${why}`, { node: this.nodeId, image: rec.image, retryAfterS: 1 });
      // a pull that failed lately is not tried again for each create (the registry is spared)
      const failed = this.failedPulls.get(rec.image);
      if (failed !== undefined && failed.until > Date.now() && failed.layers.join(',') === rec.layers.join(',')) {
        throw cannot(`${failed.error} (tried again after ${Math.ceil((failed.until - Date.now()) / 1000)} s)`);
      }
      await this.pullStaged(rec).catch((err: Error) => {
        throw cannot(err.message);
      });
    }
  }

  /**
   * The staged record of an image this node has not heard of yet: the
   * gateway that placed the create may have seen the record before this
   * node's watch did. Read once from etcd; no record is no staged image.
   */
  private async stagedRecord(name: string): Promise<StagedImage | undefined> {
    const value = await this.etcd.get(keys.overflowImage(name)).string().catch(() => null);
    if (value === null) return undefined;
    this.onStaged(value);
    return this.staged.get(name);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.heartbeat) clearInterval(this.heartbeat);
    if (this.keepTimer) clearInterval(this.keepTimer);
    clearInterval(this.progressTimer);
    for (const run of this.runs.values()) {
      run.stopped = true;
      run.notify();
    }
    await Promise.all([...this.runs.values()].map((r) => r.done));
    await this.flushProgress().catch(() => undefined);
    this.keepStream?.end();
    await this.blocks?.close();
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)));
    // The lease is left to expire: sandboxes outlive the node process, and a restart within the TTL keeps them.
  }
}

export async function pool<T>(items: readonly T[], width: number, fn: (item: T) => Promise<unknown>): Promise<void> {
  let i = 0;
  await Promise.all(
    Array.from({ length: Math.min(width, items.length) }, async () => {
      while (i < items.length) await fn(items[i++]!);
    }),
  );
}
