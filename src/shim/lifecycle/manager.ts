/**
 * The node's lifecycle: lifetime policies (scheduler.ts), pause/resume
 * (the backend's freeze facet), hibernate (its snapshot facet), pack_diff and
 * environments (pack.ts over its export facet), and the optional zram swap
 * device (swap.ts). ShimNode owns the sandboxes; this class changes their
 * state through the small `LifecycleHost` view of it and never touches
 * cgroups or CRIU itself.
 *
 * Every state change of one sandbox (pause, resume, hibernate, pack, stop)
 * runs under that sandbox's lock, so concurrent requests that all find it
 * paused resume it once and then proceed.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { Database } from 'better-sqlite3';
import { WarrenError } from '../../errors';
import { facet, offers, refusal } from '../backends/facets';
import type { LayerStore } from '../layers/store';
import { imageDigest } from '../layers/store';
import { mkfsErofs } from '../layers/erofs';
import { removeTree } from '../layers/sys';
import { instruments } from '../../telemetry';
import type {
  Backend,
  BackendSandbox,
  EnvironmentInfo,
  ImageInfo,
  PackRequest,
  PackResult,
  PauseResult,
  ResumeResult,
  ColdReclaimResult,
  SandboxLifecycleInfo,
  SandboxRecord,
  SandboxState,
} from '../types';
import { DEFAULT_SCRUB, EnvironmentRegistry, type EnvironmentRecord, type PackBudget, packUpper, squashLayers, validateScrubPattern, withDeadline } from './pack';
import { DEFAULT_PROFILE, profile as confinementProfile } from '../../security/confinement';
import { type DueAction, type LifecycleClock, clockFor, clockJson, extendClock } from './policy';
import { LifecycleScheduler } from './scheduler';
import { ZramSwap, setZswap } from './swap';

const MIB = 1024 * 1024;

export interface LiveSandbox {
  record: SandboxRecord;
  box: BackendSandbox | null;
  state: SandboxState;
}

/** What the lifecycle needs from the node. */
export interface LifecycleHost {
  readonly nodeId: string;
  get(id: string): LiveSandbox | undefined;
  all(): LiveSandbox[];
  /** Persist state + runtime of a sandbox. */
  saveState(live: LiveSandbox): void;
  saveLifecycle(id: string, lifecycle: Record<string, unknown>): void;
  /** Kill the processes, release everything, keep the record as `stopped`. */
  stop(id: string, reason: string): Promise<void>;
  delete(id: string): Promise<void>;
  /** The backend a sandbox runs on (its facets are what pause, hibernate and pack use). */
  backend(live: LiveSandbox): Backend;
  /** Bring a checkpointed sandbox back through its backend and watch it again (hibernate). */
  restore(live: LiveSandbox, checkpoint: { dir: string }): Promise<BackendSandbox>;
  openSessions(id: string): Promise<number>;
}

export interface LifecycleOptions {
  /** Set up a zram swap device of this size (MiB) at start, for pause to push memory into. */
  zramSwapMb?: number;
  /** Turn zswap on at start (hosts with disk swap; with zram it adds nothing). The previous setting is restored by close(). */
  zswap?: boolean;
  /** Node policy: paths/patterns every pack scrubs, on top of DEFAULT_SCRUB. */
  scrub?: string[];
  /** Squash pack layers automatically once a chain is deeper than this (default 8). */
  maxChainDepth?: number;
  /** How often activity is written to the registry at most (ms, default 1000). */
  activityFlushMs?: number;
}

interface Persisted {
  clock: LifecycleClock;
  /** `kept`: what the backend's freeze facet asked to keep until resume; pausedLimitBytes: the same, in records written before `kept` existed. */
  paused?: { at: number; limitBytes: number; kept?: Record<string, unknown>; pausedLimitBytes?: number };
  hibernated?: { at: number; dir: string };
  stopReason?: string;
  coldReclaim?: ColdReclaimResult;
}

export class LifecycleManager {
  readonly scheduler: LifecycleScheduler;
  readonly environments: EnvironmentRegistry;
  readonly swap: ZramSwap;
  private readonly state = new Map<string, Persisted>();
  private readonly locks = new Map<string, Promise<unknown>>();
  private readonly tmpDir: string;
  private zswapBefore: boolean | null = null;
  private readonly metrics = instruments();

  constructor(
    private readonly host: LifecycleHost,
    private readonly deps: { dataDir: string; db: Database; layers: LayerStore; log: (line: string) => void },
    private readonly opts: LifecycleOptions = {},
  ) {
    this.environments = new EnvironmentRegistry(deps.db);
    const dir = join(deps.dataDir, 'lifecycle');
    this.tmpDir = join(dir, 'tmp');
    mkdirSync(this.tmpDir, { recursive: true, mode: 0o700 });
    this.swap = new ZramSwap(dir);
    this.scheduler = new LifecycleScheduler(
      {
        state: (id) => host.get(id)?.state ?? null,
        persist: (id, clock) => this.persist(id, { clock }),
        fire: (id, action) => this.fire(id, action),
        log: deps.log,
      },
      { activityFlushMs: opts.activityFlushMs ?? 1000 },
    );
  }

  async start(): Promise<void> {
    for (const name of readdirSync(this.tmpDir)) {
      const pid = Number(/^[a-z]+-(\d+)-/.exec(name)?.[1] ?? NaN);
      if (pid === process.pid) continue;
      try {
        process.kill(pid, 0);
        continue;
      } catch {
        /* dead: remove its scratch */
      }
      try {
        removeTree(join(this.tmpDir, name));
      } catch (err) {
        this.deps.log(`lifecycle: cannot remove scratch ${name}: ${(err as Error).message}`);
      }
    }
    if (this.opts.zswap) {
      this.zswapBefore = await setZswap(true);
      this.deps.log(`lifecycle: zswap enabled (was ${this.zswapBefore ? 'on' : 'off'})`);
    }
    if (this.opts.zramSwapMb !== undefined && this.opts.zramSwapMb > 0) {
      const st = await this.swap.setup({ sizeBytes: this.opts.zramSwapMb * MIB });
      this.deps.log(`lifecycle: zram swap /dev/zram${st.device} (${this.opts.zramSwapMb} MiB, ${st.algorithm})`);
    }
  }

  close(): void {
    this.scheduler.close();
    if (this.zswapBefore === false) void setZswap(false).catch(() => undefined);
  }

  // ---------------------------------------------------------------- tracking

  /** A new sandbox: its clocks start now. Returns what to persist with the record. */
  created(record: SandboxRecord): Record<string, unknown> {
    const p: Persisted = { clock: clockFor(record.spec.lifetime, Date.now()) };
    this.state.set(record.id, p);
    record.lifecycle = p as unknown as Record<string, unknown>;
    return record.lifecycle;
  }

  /** After the insert: start watching its clocks. */
  track(id: string): void {
    const p = this.state.get(id);
    if (p) this.scheduler.track(id, p.clock);
  }

  /** A sandbox found in the registry at start (running, paused, hibernated or stopped). */
  adopted(record: SandboxRecord): void {
    const raw = record.lifecycle as Partial<Persisted> | undefined;
    const p: Persisted = raw?.clock ? (raw as Persisted) : { clock: clockFor(record.spec.lifetime, Date.parse(record.createdAt) || Date.now()) };
    this.state.set(record.id, p);
    if (record.state !== 'stopped' && record.state !== 'failed') this.scheduler.track(record.id, p.clock);
  }

  forget(id: string): void {
    this.state.delete(id);
    this.scheduler.untrack(id);
    this.locks.delete(id);
  }

  info(id: string): SandboxLifecycleInfo | undefined {
    const p = this.state.get(id);
    if (!p) return undefined;
    const info: SandboxLifecycleInfo = clockJson(this.scheduler.clock(id) ?? p.clock);
    if (p.paused) info.pausedAt = new Date(p.paused.at).toISOString();
    if (p.hibernated) info.pausedAt = new Date(p.hibernated.at).toISOString();
    if (p.stopReason) info.stopReason = p.stopReason;
    if (p.coldReclaim) info.coldReclaim = p.coldReclaim;
    return info;
  }

  /** Mark why a sandbox stopped (kept with the record). */
  stopped(id: string, reason: string): void {
    const p = this.state.get(id);
    if (!p) return;
    p.stopReason = reason;
    delete p.paused;
    delete p.hibernated;
    this.scheduler.untrack(id);
    this.host.saveLifecycle(id, p as unknown as Record<string, unknown>);
  }

  private persist(id: string, patch: Partial<Persisted>): void {
    const p = this.state.get(id);
    if (!p) return;
    Object.assign(p, patch);
    this.host.saveLifecycle(id, p as unknown as Record<string, unknown>);
  }

  touch(id: string): void {
    this.scheduler.touch(id);
  }

  begin(id: string): () => void {
    return this.scheduler.begin(id);
  }

  private withLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.locks.get(id) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const settled = next.then(
      () => undefined,
      () => undefined,
    );
    this.locks.set(id, settled);
    void settled.then(() => {
      if (this.locks.get(id) === settled) this.locks.delete(id);
    });
    return next;
  }

  private live(id: string): LiveSandbox {
    const live = this.host.get(id);
    if (!live) throw new WarrenError('SANDBOX_NOT_FOUND', `no sandbox ${id}`);
    return live;
  }

  // ---------------------------------------------------------------- scheduler actions

  private async fire(id: string, action: DueAction): Promise<void> {
    const live = this.host.get(id);
    if (!live) return;
    if (action.kind === 'expire') {
      this.deps.log(`lifecycle: ${id}: ttl reached, stopping`);
      await this.host.stop(id, 'ttl');
      return;
    }
    this.deps.log(`lifecycle: ${id}: idle, ${action.action}`);
    switch (action.action) {
      case 'pause':
        await this.pause(id);
        return;
      case 'hibernate':
        if (!offers(this.host.backend(live), 'snapshot')) {
          // Hibernate where the backend can checkpoint; pause (freeze facet) everywhere else.
          if (live.state === 'running') await this.pause(id);
          return;
        }
        await this.hibernate(id);
        return;
      case 'stop':
        await this.host.stop(id, 'idle');
        return;
      case 'delete':
        await this.host.delete(id);
        return;
      case 'reclaim':
        await this.reclaimCold(id);
        return;
    }
  }

  /**
   * Give back the cold part of an idle, running sandbox's memory (its freeze facet). Done once
   * per idle period: the clock remembers it, and the next activity starts a new period. A
   * backend that cannot is logged once per period, not retried.
   */
  reclaimCold(id: string): Promise<ColdReclaimResult | null> {
    return this.withLock(id, async () => {
      const live = this.live(id);
      if (live.state !== 'running' || live.box === null) return null;
      const freeze = offers(this.host.backend(live), 'freeze') ? facet(this.host.backend(live), live.box, 'freeze') : null;
      let result: ColdReclaimResult | null = null;
      if (freeze?.reclaimCold === undefined) {
        this.deps.log(`lifecycle: ${id}: idle reclaim: the ${live.record.spec.backend} backend cannot reclaim a running sandbox's memory`);
      } else {
        const report = await freeze.reclaimCold(live.record.spec.memoryMb * MIB);
        result = { at: new Date().toISOString(), ...report };
        this.metrics.coldReclaimed.record(report.releasedBytes, { reclaim: report.reclaim });
        this.deps.log(`lifecycle: ${id}: idle reclaim: ${(report.releasedBytes / MIB).toFixed(1)} MiB of ${(report.coldBytes / MIB).toFixed(1)} MiB cold given back in ${report.durationMs.toFixed(0)} ms${report.note ? ` (${report.note})` : ''}`);
      }
      if (result !== null) this.persist(id, { coldReclaim: result });
      const clock = this.scheduler.clock(id);
      if (clock !== null) this.scheduler.update(id, { ...clock, coldReclaimedAt: Date.now() }); // persists the clock
      return result;
    });
  }

  extend(id: string, req: { seconds?: number; ttlSeconds?: number }): void {
    const live = this.live(id);
    if (!['running', 'paused', 'hibernated'].includes(live.state)) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
    const clock = this.scheduler.clock(id) ?? this.state.get(id)?.clock;
    if (!clock) throw new WarrenError('INTERNAL', `sandbox ${id} has no lifecycle clock`);
    const next = extendClock(clock, req, Date.now());
    this.state.get(id)!.clock = next;
    this.scheduler.update(id, next);
  }

  // ---------------------------------------------------------------- pause / resume

  pause(id: string): Promise<PauseResult> {
    return this.withLock(id, async () => {
      const live = this.live(id);
      if (live.state === 'paused' || live.state === 'hibernated') {
        return { id, state: live.state, changed: false, memoryBeforeBytes: 0, memoryAfterBytes: 0, releasedBytes: 0, swapBytes: null, reclaim: 'none', durationMs: 0 };
      }
      if (live.state !== 'running' || live.box === null) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
      const limitBytes = live.record.spec.memoryMb * MIB;
      const report = await facet(this.host.backend(live), live.box, 'freeze').pause(limitBytes);
      live.state = 'paused';
      this.host.saveState(live);
      const paused: Persisted['paused'] = { at: Date.now(), limitBytes };
      if (report.keep !== undefined) paused.kept = report.keep;
      this.persist(id, { paused });
      const result: PauseResult = {
        id,
        state: 'paused',
        changed: true,
        memoryBeforeBytes: report.memoryBeforeBytes,
        memoryAfterBytes: report.memoryAfterBytes,
        releasedBytes: report.releasedBytes,
        swapBytes: report.swapBytes,
        reclaim: report.reclaim,
        durationMs: report.durationMs,
      };
      if (report.note !== undefined) result.note = report.note;
      this.metrics.pauseReleased.record(report.releasedBytes, { reclaim: report.reclaim });
      if (report.writtenBytes !== undefined) result.writtenBytes = report.writtenBytes;
      return result;
    });
  }

  resume(id: string): Promise<ResumeResult> {
    return this.withLock(id, async () => {
      const live = this.live(id);
      const started = performance.now();
      if (live.state === 'running') return { id, state: live.state, changed: false, durationMs: 0 };
      if (live.state === 'hibernated') {
        await this.restore(live);
      } else if (live.state === 'paused') {
        await this.unfreeze(live);
        live.state = 'running';
        this.host.saveState(live);
      } else {
        throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
      }
      const p = this.state.get(id);
      if (p) {
        delete p.paused;
        delete p.hibernated;
        // Its idle clock starts again now.
        p.clock = { ...(this.scheduler.clock(id) ?? p.clock), lastActivityAt: Date.now() };
        this.scheduler.update(id, p.clock);
      }
      return { id, state: 'running', changed: true, durationMs: Math.round((performance.now() - started) * 1000) / 1000 };
    });
  }

  /** Resume a paused sandbox through its backend's freeze facet, with what the pause kept. */
  private async unfreeze(live: LiveSandbox): Promise<void> {
    if (live.box === null) throw new WarrenError('INTERNAL', `sandbox ${live.record.id} is paused without a backend sandbox`);
    const p = this.state.get(live.record.id)?.paused;
    const kept = p?.kept ?? (p?.pausedLimitBytes !== undefined ? { pausedLimitBytes: p.pausedLimitBytes } : undefined);
    await facet(this.host.backend(live), live.box, 'freeze').resume(p?.limitBytes ?? live.record.spec.memoryMb * MIB, kept);
  }

  /** Before any request: a paused or hibernated sandbox is resumed first, transparently. */
  async ensureAwake(id: string): Promise<void> {
    const live = this.host.get(id);
    if (live && (live.state === 'paused' || live.state === 'hibernated')) await this.resume(id);
  }

  /** Before stop/delete: thaw (and restore the limit) so that sessions can be closed and processes killed. */
  async beforeDestroy(id: string): Promise<void> {
    const live = this.host.get(id);
    if (live?.state === 'paused' && live.box !== null) await this.unfreeze(live).catch(() => undefined);
  }

  async pauseMany(ids: string[]): Promise<PauseResult[]> {
    return Promise.all(ids.map((id) => this.pause(id)));
  }

  async resumeMany(ids: string[]): Promise<ResumeResult[]> {
    return Promise.all(ids.map((id) => this.resume(id)));
  }

  // ---------------------------------------------------------------- hibernate (CRIU)

  async hibernate(id: string): Promise<PauseResult> {
    const backend = this.host.backend(this.live(id));
    if (!offers(backend, 'snapshot')) throw refusal(backend, 'snapshot');
    return this.withLock(id, async () => {
      const live = this.live(id);
      if (live.state === 'hibernated') return { id, state: live.state, changed: false, memoryBeforeBytes: 0, memoryAfterBytes: 0, releasedBytes: 0, swapBytes: null, reclaim: 'criu', durationMs: 0 };
      if (live.state === 'paused') {
        await this.unfreeze(live);
        live.state = 'running';
      }
      if (live.state !== 'running' || live.box === null) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
      if ((await this.host.openSessions(id)) > 0) {
        throw new WarrenError('SESSION_BUSY', 'hibernate needs the sandbox to have no open shell sessions (their holders live outside the checkpointed tree); close them or use pause');
      }
      const started = performance.now();
      const box = live.box;
      const before = (await box.stats()).memoryCurrentBytes;
      const { dir } = await facet(backend, box, 'snapshot').checkpoint();
      live.state = 'hibernated';
      live.box = null;
      this.host.saveState(live);
      this.persist(id, { hibernated: { at: Date.now(), dir } });
      const after = await box.stats().then((s) => s.memoryCurrentBytes, () => 0);
      this.metrics.pauseReleased.record(Math.max(0, before - after), { reclaim: 'criu' });
      return { id, state: 'hibernated', changed: true, memoryBeforeBytes: before, memoryAfterBytes: after, releasedBytes: Math.max(0, before - after), swapBytes: 0, reclaim: 'criu', durationMs: Math.round(performance.now() - started) };
    });
  }

  private async restore(live: LiveSandbox): Promise<void> {
    const p = this.state.get(live.record.id)?.hibernated;
    if (!p) throw new WarrenError('INTERNAL', `sandbox ${live.record.id} is hibernated without a checkpoint`);
    live.box = await this.host.restore(live, { dir: p.dir });
    live.state = 'running';
    this.host.saveState(live);
  }

  // ---------------------------------------------------------------- pack_diff

  async pack(id: string, req: PackRequest, owner: string): Promise<PackResult> {
    const scrubExtra = (req.scrub ?? []).map(validateScrubPattern);
    return this.withLock(id, async () => {
      const started = performance.now();
      const live = this.live(id);
      if (!['running', 'paused', 'hibernated'].includes(live.state)) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
      const layers = this.deps.layers;
      // The name must be new, or an environment of the same owner (a new version of it).
      let existing: EnvironmentRecord | null = null;
      try {
        const img = layers.resolveImage(req.name);
        existing = this.environments.get(img.name);
        if (existing === null) throw new WarrenError('ALREADY_EXISTS', `image ${JSON.stringify(img.name)} exists and is not a packed environment`, { name: img.name });
        if (existing.owner !== owner) throw new WarrenError('ALREADY_EXISTS', `environment ${JSON.stringify(img.name)} belongs to another account`, { name: img.name });
      } catch (err) {
        if (!(err instanceof WarrenError) || err.code !== 'IMAGE_NOT_FOUND') throw err;
      }
      // A hibernated sandbox's writable layer is reached through its restored sandbox.
      if (live.state === 'hibernated') await this.restore(live);
      if (live.box === null) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${live.state}`);
      const exporter = facet(this.host.backend(live), live.box, 'export');
      const runtime = live.record.runtime as { profile?: string };
      const limits = (() => {
        try {
          return confinementProfile(runtime.profile ?? DEFAULT_PROFILE).limits;
        } catch {
          return confinementProfile(DEFAULT_PROFILE).limits; // the profile left the policy meanwhile
        }
      })();
      const budget = { maxBytes: limits.packMb * 1024 * 1024, seconds: limits.packSeconds };
      const parent = this.environments.byDigest(imageDigest(live.record.layers));
      const scrub = [...new Set([...DEFAULT_SCRUB, ...(this.opts.scrub ?? []), ...scrubExtra])];
      const scratch = join(this.tmpDir, `pack-${process.pid}-${randomBytes(6).toString('hex')}`);
      mkdirSync(scratch, { mode: 0o700 });
      try {
        const packed = await packUpper({
          sandboxId: id,
          measureUpper: () => exporter.measureUpper(),
          lowerPaths: live.record.layers.map((d) => layers.mountPath(d)),
          scrub,
          compression: req.compression ?? 'lz4',
          exportUpper: (dest) => exporter.exportUpper(dest, live.state !== 'running'),
          scratch,
          budget,
          log: (l) => this.deps.log(`mkfs.erofs: ${l}`),
        });
        const source = `pack_diff:${id}`;
        const layer = await layers.importLayerFile(packed.file, source);
        let diffLayers = [layer, ...(parent?.diffLayers ?? [])];
        const baseLayers = parent ? parent.baseLayers : live.record.layers;
        let squashed = false;
        if (diffLayers.length > 1 && (req.squash === true || diffLayers.length > (this.opts.maxChainDepth ?? 8))) {
          diffLayers = [await this.squash(diffLayers, baseLayers, scratch, req, budget, started)];
          squashed = true;
        }
        const name = existing?.name ?? req.name;
        const env: EnvironmentRecord = {
          name,
          digest: imageDigest([...diffLayers, ...baseLayers]),
          owner,
          published: req.publish ?? existing?.published ?? false,
          parent: live.record.spec.image,
          sourceSandbox: id,
          diffLayers,
          baseLayers,
          scrub,
          createdAt: new Date().toISOString(),
        };
        // The environment is recorded before its image name exists, so the
        // name is never, even briefly, a node image usable by every account.
        this.environments.put(env);
        let image: ImageInfo;
        try {
          image = layers.composeImage({ name, layers: [...diffLayers, ...baseLayers], kind: 'base', source });
        } catch (err) {
          if (existing) this.environments.put(existing);
          else this.environments.remove(name);
          throw err;
        }
        this.touch(id);
        return {
          image,
          environment: envInfo(env),
          layer,
          diffBytes: packed.diffBytes,
          diffEntries: packed.diffEntries,
          scrubbed: packed.scrubbed,
          squashed,
          frozenMs: packed.frozenMs,
          durationMs: Math.round(performance.now() - started),
        };
      } finally {
        try {
          removeTree(scratch);
        } catch (err) {
          this.deps.log(`lifecycle: cannot remove ${scratch}: ${(err as Error).message}`);
        }
      }
    });
  }

  private async squash(diffLayers: string[], baseLayers: string[], scratch: string, req: PackRequest, budget: PackBudget, started: number): Promise<string> {
    const layers = this.deps.layers;
    const held = await layers.acquire([...diffLayers, ...baseLayers]);
    try {
      const diffPaths = held.slice(0, diffLayers.length).map((l) => l.path);
      const basePaths = held.slice(diffLayers.length).map((l) => l.path);
      const dir = await squashLayers(diffPaths, basePaths, scratch);
      const file = join(scratch, 'squashed.erofs');
      await withDeadline(started + budget.seconds * 1000, budget.seconds, (signal) => mkfsErofs(file, dir, { compression: req.compression ?? 'lz4', chunked: true, signal }));
      return await layers.importLayerFile(file, `squash:${diffLayers.length} layers`);
    } finally {
      layers.release([...diffLayers, ...baseLayers]);
    }
  }

  environment(ref: string): EnvironmentInfo | null {
    let name: string;
    let digest: string;
    try {
      const img = this.deps.layers.resolveImage(ref);
      name = img.name;
      digest = img.digest;
    } catch {
      return null;
    }
    const env = this.environments.get(name) ?? this.environments.byDigest(digest);
    return env === null ? null : envInfo(env);
  }

  publish(name: string, published: boolean): EnvironmentInfo {
    const env = this.environment(name);
    if (env === null) throw new WarrenError('IMAGE_NOT_FOUND', `no packed environment ${JSON.stringify(name)}`, { ref: name });
    this.environments.setPublished(env.name, published);
    return { ...env, published };
  }

  listEnvironments(): EnvironmentInfo[] {
    return this.environments.list().map(envInfo);
  }
}

function envInfo(e: EnvironmentRecord): EnvironmentInfo {
  return {
    name: e.name,
    digest: e.digest,
    owner: e.owner,
    published: e.published,
    parent: e.parent,
    sourceSandbox: e.sourceSandbox,
    diffLayers: e.diffLayers,
    baseLayers: e.baseLayers,
    createdAt: e.createdAt,
  };
}
