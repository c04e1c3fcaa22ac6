/**
 * The container backend: namespaces + cgroups over an overlay of read-only
 * EROFS layers. The native helper does the kernel work; this file decides.
 */
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import { chmod, mkdir, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { Socket } from 'node:net';
import { Readable } from 'node:stream';
import { native, helperBinary } from '../../native';
import { feature } from '../../features';
import type { ExecProcess } from '../../native/types';
import { WarrenError } from '../../errors';
import type {
  CapturedExec,
  CheckpointRef,
  ExecOutcome,
  ExecRequest,
  ExecResult,
  ExecStatus,
  ExecStream,
  ExportFacet,
  FacetName,
  FacetStatus,
  FreezeFacet,
  BackendSandbox,
  HostProcessBackend,
  HostProcessSandbox,
  LiveExec,
  PauseReportCore,
  ResolvedLayer,
  SandboxRecord,
  SandboxSpec,
  SessionsFacet,
  ShellLaunch,
  SupervisedExecFacet,
  SnapshotFacet,
} from '../types';
import { RootFiles } from './container-files';
import { forgetPrefetch, pauseCgroup, reclaimColdCgroup, resumeCgroup } from '../lifecycle/memory';
import { dumpSandbox, restoreSandbox } from '../lifecycle/criu';
import { copyTree, treeBytes } from '../lifecycle/pack';
import { resolveUser, type SandboxUser } from '../users';
import { LimitedPipe, OutputCapture, captureInto } from '../exec-output';
import { capacityErrorOf } from '../capacity';
import { destroyCgroup } from './cgroup';
import { dropSupervised, followSupervised, startSupervised, sweepSupervised } from '../supervised-exec';
import type { NetworkManager, SandboxNetworkRuntime } from '../network/manager';
import { assertConfinable, confineFor, confineForSandbox, forgetSandbox, nsexecConfineArgs, profile as policyProfile, profileForOwner, registerSandbox } from '../../security/confinement';

const CPU_PERIOD_US = 100_000;
const MIB = 1024 * 1024;
const DEFAULT_MAX_OUTPUT = 1 * MIB;
const SIGKILL = 9;

export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface ContainerRuntime {
  pid: number;
  startTime: number;
  dir: string;
  [key: string]: unknown;
}

export class ContainerBackend implements HostProcessBackend {
  readonly name = 'container' as const;

  get facets(): Record<FacetName, FacetStatus> {
    const criu = feature('criu');
    return {
      files: { offered: true, how: 'host-side, resolved inside /proc/<pid 1>/root' },
      sessions: { offered: true, how: 'warren-session holder running warren-nsexec into the sandbox' },
      freeze: { offered: true, how: 'cgroup freezer, then memory reclaim into swap' },
      snapshot: criu.supported ? { offered: true, how: 'CRIU checkpoint of the process tree' } : { offered: false, reason: `CRIU: ${criu.reason ?? 'criu check failed'}` },
      export: { offered: true, how: 'copy of the overlay upper dir while frozen' },
      network: this.network !== null ? { offered: true, how: 'pooled netns + veth on the node bridge, cgroup egress programs' } : { offered: false, reason: 'networking is disabled on this node (sandboxes are loopback-only)' },
    };
  }

  /** `profile`: the confinement profile of every sandbox of this backend (default: per account, accounts.yaml). */
  constructor(
    private readonly sandboxesDir: string,
    private readonly profileName?: string,
    /** sandboxes whose spec has `network` join a pooled netns with egress enforced. */
    private readonly network: NetworkManager | null = null,
  ) {}

  /**
   * The mount namespace new sandboxes start from (native/helper/src/mnt_template.c): without it
   * each create copies every mount of the gateway's namespace, one per sandbox and per layer,
   * and at thousands of sandboxes that copy is most of a create. Made at the first create;
   * null when it cannot be (then each create copies the namespace). `WARREN_MOUNT_TEMPLATE=0` turns it off.
   */
  private template: { fd: number; keep: string[]; sysfs: boolean } | null | undefined;

  /** The node's one mask tmpfs lives on this empty directory, mounted in the template only. */
  private get maskDir(): string {
    return `${this.sandboxesDir}-mask`;
  }

  /** The node's one sandbox sysfs lives on this empty directory, mounted in the template only. */
  private get sysfsDir(): string {
    return `${this.sandboxesDir}-sysfs`;
  }

  /** The template's descriptor for a create from `layers`; undefined: this create copies the namespace. */
  private mountTemplate(layers: ResolvedLayer[]): number | undefined {
    if (this.template === undefined) {
      // made synchronously, once: creates that start together all get it
      const keep = [...new Set([this.sandboxesDir, ...layers.map((l) => dirname(l.path))])];
      this.template = null;
      if (process.env.WARREN_MOUNT_TEMPLATE !== '0') {
        try {
          mkdirSync(this.maskDir, { recursive: true, mode: 0o555 });
          mkdirSync(this.sysfsDir, { recursive: true, mode: 0o555 });
          this.template = { fd: native.mountTemplateCreate(keep, this.maskDir, this.sysfsDir), keep, sysfs: true };
        } catch {
          try {
            // a sysfs that cannot be mounted there: each sandbox mounts its own
            this.template = { fd: native.mountTemplateCreate(keep, this.maskDir), keep, sysfs: false };
          } catch {
            // an older kernel (no open_tree, or no mount roots in statx): the copy still works
          }
        }
      }
    }
    const t = this.template;
    if (t === null) return undefined;
    // a layer from somewhere the template did not keep: this create copies the namespace
    const covered = layers.every((l) => t.keep.some((k) => dirname(l.path) === k || dirname(l.path).startsWith(`${k}/`)));
    return covered ? t.fd : undefined;
  }

  close(): void {
    if (this.template) native.close(this.template.fd);
    this.template = undefined;
  }

  /** Supervised execs (supervised-exec.ts) keep their output and result here, one directory per sandbox. */
  private get supervisedDir(): string {
    return join(dirname(this.sandboxesDir), 'supervised-exec');
  }

  async create(id: string, spec: SandboxSpec, layers: ResolvedLayer[]): Promise<ContainerSandbox> {
    const dir = join(this.sandboxesDir, id);
    const upperDir = join(dir, 'upper');
    const workDir = join(dir, 'work');
    const rootfsDir = join(dir, 'rootfs');
    // confinement profile, enforcer check, disk quota of the writable layer
    const profileName = this.profileName ?? profileForOwner(spec.owner);
    assertConfinable();
    const diskMb = spec.diskMb ?? policyProfile(profileName).limits.diskMb;
    let cgroupCreated = false;
    let diskMounted = false;
    let net: SandboxNetworkRuntime | null = null;
    try {
      await mkdir(dir, { mode: 0o700 });
      if (diskMb !== null) {
        mountDisk(dir, diskMb);
        diskMounted = true;
      }
      registerSandbox(id, profileName);
      // With a quota, /dev/shm and /dev are directories on the same tmpfs as the writable layer:
      // one budget of diskMb for everything the sandbox can write, and no superblock of their
      // own (spawn.c, on superblocks).
      const shmDir = diskMb !== null ? join(dir, 'shm') : undefined;
      const devDir = diskMb !== null ? join(dir, 'dev') : undefined;
      await Promise.all([
        mkdir(upperDir, { mode: 0o755 }),
        mkdir(workDir, { mode: 0o700 }),
        mkdir(rootfsDir, { mode: 0o700 }),
        ...(shmDir !== undefined ? [mkdir(shmDir).then(() => chmod(shmDir, 0o1777))] : []),
        ...(devDir !== undefined ? [mkdir(devDir, { mode: 0o755 })] : []),
      ]);
      // /work exists in every sandbox (the writable workspace, whatever the image has)
      await mkdir(join(upperDir, 'work'), { mode: 0o755 }).catch(() => undefined);
      await native.cgroupCreateAsync(id, limitsOf(spec));
      cgroupCreated = true;
      if (spec.network !== undefined) {
        if (this.network === null) throw new WarrenError('NOT_SUPPORTED', 'networking is disabled on this node (sandboxes are loopback-only)', { field: 'network' });
        // enforcement is on the cgroup before anything runs in it
        net = await this.network.setUp(id, spec.owner, cgroupDir(id), spec.network);
        await mkdir(join(upperDir, 'etc'), { mode: 0o755 }).catch(() => undefined);
        await writeFile(join(upperDir, 'etc', 'resolv.conf'), `nameserver ${this.network.gatewayAddress}\noptions timeout:2 attempts:2\n`, { mode: 0o644 });
      }
      const template = this.mountTemplate(layers);
      const proc = await native.spawnSandboxAsync({
        id,
        hostname: id,
        lowerDirs: layers.map((l) => l.path),
        upperDir,
        workDir,
        rootfsDir,
        initPath: helperBinary('warren-init'),
        ...(net ? { network: 'netns' as const, netnsPath: net.lease.path } : { network: 'loopback' as const }),
        schedIdle: spec.priority === 'idle',
        coreSched: false,
        ...(shmDir !== undefined ? { shmDir } : {}),
        ...(devDir !== undefined ? { devDir } : {}),
        ...(template !== undefined ? { mountTemplateFd: template, maskDir: this.maskDir, ...(this.template?.sysfs ? { sysfsDir: this.sysfsDir } : {}) } : {}),
        confine: confineFor(profileName),
      });
      const runtime: ContainerRuntime = { pid: proc.pid, startTime: proc.startTime, dir, profile: profileName, diskMb, ...(net ? { network: net } : {}) };
      return new ContainerSandbox(id, spec, runtime, proc.pidfd, this.network, join(this.supervisedDir, id));
    } catch (err) {
      forgetSandbox(id);
      if (cgroupCreated) await destroyCgroup(id).catch(() => undefined);
      if (net) await this.network!.tearDown(id, net).catch(() => undefined);
      if (diskMounted) await unmountDisk(dir);
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      throw capacityErrorOf(err) ?? err;
    }
  }

  /**
   * What a sandbox is made from and a claim cannot change: its layers, the disk quota, the
   * confinement of its pid 1 (the profile's name and what it resolves to under the policy in
   * force, so a policy edit makes new shapes) and its scheduling class. Limits, user and env are
   * the claim's. Sandboxes with network are made fresh: their namespace and egress programs are
   * per request.
   */
  preparedShape(spec: SandboxSpec, digests: readonly string[]): string | null {
    if (spec.network !== undefined || spec.backend !== 'container') return null;
    const profileName = this.profileName ?? profileForOwner(spec.owner);
    const diskMb = spec.diskMb ?? policyProfile(profileName).limits.diskMb;
    return JSON.stringify(['container', digests, diskMb, profileName, spec.priority === 'idle', confineFor(profileName)]);
  }

  async claimPrepared(box: BackendSandbox, spec: SandboxSpec): Promise<void> {
    if (!(box instanceof ContainerSandbox)) throw new WarrenError('INTERNAL', `sandbox ${box.id} was not made by the container backend`);
    assertConfinable();
    box.claim(spec);
  }

  async adopt(record: SandboxRecord): Promise<ContainerSandbox | null> {
    const runtime = record.runtime as Partial<ContainerRuntime>;
    if (typeof runtime.pid !== 'number' || typeof runtime.startTime !== 'number' || typeof runtime.dir !== 'string') return null;
    if (native.processStartTime(runtime.pid) !== runtime.startTime) return null;
    if (!native.cgroupExists(record.id) || !native.cgroupProcs(record.id).includes(runtime.pid)) return null;
    const net = runtime.network as SandboxNetworkRuntime | undefined;
    if (net !== undefined && (this.network === null || !this.network.adopt(record.id, cgroupDir(record.id), net))) return null;
    const pidfd = native.pidfdOpen(runtime.pid);
    registerSandbox(record.id, typeof runtime.profile === 'string' ? runtime.profile : (this.profileName ?? profileForOwner(record.spec.owner)));
    return new ContainerSandbox(record.id, record.spec, runtime as ContainerRuntime, pidfd, this.network, join(this.supervisedDir, record.id));
  }

  /**
   * Ids of this node's sandboxes that have a directory under its sandboxes dir but are not in
   * `known`: what a node killed in the middle of a create or a delete left behind. The directory
   * is made before anything else of a sandbox and removed after everything else, so it marks
   * what this node (this data dir) made; a cgroup name alone would not, since another node on
   * the same host could use the same id prefix.
   */
  leftovers(known: ReadonlySet<string>, prefix: string): string[] {
    const ids = new Set<string>();
    for (const dir of [this.sandboxesDir, this.supervisedDir]) {
      if (!existsSync(dir)) continue;
      for (const id of readdirSync(dir)) if (id.startsWith(prefix) && !known.has(id)) ids.add(id);
    }
    return [...ids];
  }

  /**
   * Restore a CRIU checkpoint: the overlay (same lower layers + the kept upper
   * dir) is mounted on the sandbox's rootfs dir for the restore, then the new
   * pid 1 is adopted.
   */
  async restore(record: SandboxRecord, checkpoint: CheckpointRef, lowerPaths: string[]): Promise<ContainerSandbox> {
    const runtime = record.runtime as unknown as ContainerRuntime;
    const rootfs = join(runtime.dir, 'rootfs');
    // nodev like the spawn's root overlay; CRIU restores the tree's own mounts on top.
    native.mount('overlay', rootfs, 'overlay', ['nodev'], `lowerdir=${lowerPaths.join(':')},upperdir=${join(runtime.dir, 'upper')},workdir=${join(runtime.dir, 'work')}`);
    try {
      const layout = native.cgroupLayout();
      const { pid } = await restoreSandbox({ dir: checkpoint.dir, rootfs, cgroupRoot: join(layout.roots.memory ?? layout.roots.unified ?? '', record.id), logDir: runtime.dir });
      record.runtime = { ...record.runtime, pid, startTime: native.processStartTime(pid) };
    } finally {
      native.umount(rootfs, true);
    }
    const box = await this.adopt(record);
    if (box === null) throw new WarrenError('INTERNAL', `sandbox ${record.id}: restored tree could not be adopted`);
    return box;
  }

  /** Remove whatever a dead or half-created sandbox left behind. */
  async cleanup(id: string, record?: SandboxRecord): Promise<void> {
    if (native.cgroupExists(id)) await destroyCgroup(id);
    const net = record?.runtime.network as SandboxNetworkRuntime | undefined;
    if (this.network !== null) await this.network.tearDown(id, net);
    forgetSandbox(id);
    await unmountDisk(join(this.sandboxesDir, id));
    await rm(join(this.sandboxesDir, id), { recursive: true, force: true });
    await rm(join(this.supervisedDir, id), { recursive: true, force: true });
  }
}

/**
 * The writable layer (upper + work dirs), /dev and /dev/shm of a sandbox live on its own tmpfs
 * of `diskMb` (size= and an inode cap), mounted on the sandbox directory: filling it gives
 * ENOSPC inside that sandbox only, and everything the sandbox can write is one budget. Mounting
 * is ~0.1 ms. tmpfs pages are charged to the sandbox's memory cgroup, so memoryMb bounds it as
 * well (docs/security.md).
 */
function mountDisk(dir: string, diskMb: number): void {
  const inodes = Math.max(16_384, Math.min(diskMb * 256, 4_194_304));
  native.mount('tmpfs', dir, 'tmpfs', ['nosuid', 'nodev'], `size=${diskMb * 1024}k,nr_inodes=${inodes},mode=0700`);
}

async function unmountDisk(dir: string): Promise<void> {
  try {
    await native.umountAsync(dir, true);
  } catch {
    /* not mounted (no quota, or already gone) */
  }
}

/** The sandbox's group in the cgroup2 hierarchy, where the egress programs attach. */
function cgroupDir(id: string): string {
  const root = native.cgroupLayout().roots.unified;
  if (root === undefined) throw new WarrenError('NOT_SUPPORTED', 'no cgroup2 hierarchy for the egress programs', { feature: 'cgroup2-bpf-hierarchy' });
  return join(root, id);
}

function limitsOf(spec: SandboxSpec) {
  return {
    cpuQuotaUs: Math.max(1000, Math.round(spec.cpu * CPU_PERIOD_US)),
    cpuPeriodUs: CPU_PERIOD_US,
    memoryBytes: spec.memoryMb * MIB,
    memorySwapBytes: spec.memoryMb * MIB,
    pidsMax: spec.pids,
  };
}

const EAGAIN = 11;

export class ContainerSandbox implements HostProcessSandbox {
  readonly ended: Promise<void>;
  readonly files = new RootFiles(
    () => this.rootPath(),
    () => this.fileCreds(),
  );
  readonly sessions: SessionsFacet;
  readonly supervised: SupervisedExecFacet | undefined;
  readonly freeze: FreezeFacet;
  readonly snapshot: SnapshotFacet | undefined;
  readonly export: ExportFacet;
  private alive = true;
  private destroyed: Promise<void> | null = null;

  constructor(
    readonly id: string,
    private spec: SandboxSpec,
    readonly runtime: ContainerRuntime,
    pidfd: number,
    private readonly network: NetworkManager | null = null,
    private readonly supervisedDir: string | null = null,
  ) {
    // The watcher owns pid 1's pidfd (closed once pid 1 has ended): the one descriptor of the
    // gateway per sandbox (docs/density.md).
    this.ended = new Promise((resolve) => {
      native.watchExit(
        pidfd,
        () => {
          this.alive = false;
          resolve();
        },
        true,
      );
    });
    this.sessions = {
      shellCommand: async (opts) => this.shellCommand(opts),
      // The holder joins the sandbox's cgroup: deleting the sandbox kills it with everything else.
      holderStarted: (pid) => native.cgroupAttach(this.id, pid),
    };
    const runDir = (runId: string): string => {
      if (!/^[A-Za-z0-9_-]{1,64}$/.test(runId)) throw new WarrenError('INVALID_ARGUMENT', `bad supervised run id ${JSON.stringify(runId)}`);
      return join(this.supervisedDir!, runId);
    };
    this.supervised =
      this.supervisedDir === null
        ? undefined
        : {
            start: async (req, runId) => this.startSupervised(req, runDir(runId)),
            // A keyed run is never stopped by its reader: kill() does nothing.
            follow: (runId) => (existsSync(runDir(runId)) ? followSupervised(runDir(runId), () => this.oomKills(), () => undefined) : null),
            drop: async (runId) => dropSupervised(runDir(runId)),
            sweep: async (keep) => sweepSupervised(this.supervisedDir!, keep),
          };
    this.freeze = {
      reclaimCold: (limitBytes) => reclaimColdCgroup(this.id, limitBytes),
      pause: async (limitBytes): Promise<PauseReportCore> => {
        const r = await pauseCgroup(this.id, limitBytes);
        const out: PauseReportCore = { memoryBeforeBytes: r.memoryBeforeBytes, memoryAfterBytes: r.memoryAfterBytes, releasedBytes: r.releasedBytes, swapBytes: r.swapBytes, reclaim: r.reclaim, durationMs: r.durationMs };
        if (r.note !== undefined) out.note = r.note;
        return out;
      },
      resume: async (limitBytes, kept) => {
        // a sandbox paused by an earlier version holds a lowered limit until its resume
        const paused = typeof kept?.pausedLimitBytes === 'number' ? kept.pausedLimitBytes : undefined;
        await resumeCgroup(this.id, limitBytes, paused);
      },
    };
    this.snapshot = feature('criu').supported
      ? {
          checkpoint: async () => {
            const dir = join(this.runtime.dir, 'checkpoint');
            await dumpSandbox({ pid: this.runtime.pid, dir, logDir: this.runtime.dir });
            // The dump killed the tree (the watcher releases the old pid 1's pidfd as it ends);
            // the upper dir stays for the restore.
            this.alive = false;
            return { dir };
          },
        }
      : undefined;
    this.export = {
      measureUpper: async () => treeBytes(this.upperDir()),
      exportUpper: async (dest, frozen) => {
        const t0 = performance.now();
        if (!frozen) native.cgroupFreeze(this.id, true);
        try {
          await copyTree(this.upperDir(), dest);
        } finally {
          if (!frozen) native.cgroupFreeze(this.id, false);
        }
        return { frozenMs: frozen ? 0 : Math.round((performance.now() - t0) * 1000) / 1000 };
      },
    };
  }

  upperDir(): string {
    return join(this.runtime.dir, 'upper');
  }

  /**
   * A prepared sandbox becomes `spec`'s (ContainerBackend.claimPrepared): the cgroup gets its
   * limits, written the same way a create writes them, and execs its user and env. Nothing else
   * of the spec reaches the kernel after the spawn.
   */
  claim(spec: SandboxSpec): void {
    this.assertAlive();
    native.cgroupUpdate(this.id, limitsOf(spec));
    this.spec = spec;
  }

  /** The holder's child: warren-nsexec into the sandbox's namespaces and cgroup, confined like every exec. */
  private shellCommand(opts: Parameters<SessionsFacet['shellCommand']>[0]): ShellLaunch {
    this.assertAlive();
    const root = this.rootPath();
    const user = resolveUser(root, opts.user ?? this.spec.user);
    const hasBash = existsSync(`${root}/bin/bash`) || existsSync(`${root}/usr/bin/bash`);
    const shell = hasBash ? ['/bin/bash', '--noprofile', '--norc'] : ['/bin/sh'];
    if (opts.mode === 'pty') shell.push('-i');
    const env: Record<string, string> = {
      PATH: DEFAULT_PATH,
      HOME: user.home,
      USER: user.name,
      HOSTNAME: this.id,
      LANG: 'C.UTF-8',
      TERM: opts.mode === 'pty' ? 'xterm-256color' : 'dumb',
      ...this.spec.env,
      ...opts.env,
    };
    const argv = [helperBinary('warren-nsexec'), '--pid', String(this.runtime.pid), '--cgroup', this.id, '--uid', String(user.uid), '--gid', String(user.gid), '--cwd', opts.cwd ?? user.home];
    if (this.spec.priority === 'idle') argv.push('--sched-idle');
    argv.push(...nsexecConfineArgs(confineForSandbox(this.id)));
    for (const [k, v] of Object.entries(env)) argv.push('--env', `${k}=${v}`);
    argv.push('--', ...shell);
    // warren-nsexec starts the shell as its own child (CLONE_PARENT of its clone)
    return opts.mode === 'pty' ? { argv, ptmxPath: `${root}/dev/pts/ptmx`, shellDepth: 1 } : { argv, shellDepth: 1 };
  }

  get pid(): number {
    return this.runtime.pid;
  }

  rootPath(): string {
    return `/proc/${this.runtime.pid}/root`;
  }

  /** The identity the files API uses inside this sandbox: its user's, like an exec's (no supplementary groups). */
  fileCreds(): { uid: number; gid: number; groups: number[] } {
    const u = resolveUser(this.rootPath(), this.spec.user);
    return { uid: u.uid, gid: u.gid, groups: [] };
  }

  private assertAlive(): void {
    if (!this.alive || this.destroyed !== null) {
      throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is not running`);
    }
  }

  private environment(extra: Record<string, string> | undefined, user: SandboxUser): string[] {
    const env: Record<string, string> = {
      PATH: DEFAULT_PATH,
      HOME: user.home,
      USER: user.name,
      HOSTNAME: this.id,
      LANG: 'C.UTF-8',
      ...this.spec.env,
      ...extra,
    };
    return Object.entries(env).map(([k, v]) => `${k}=${v}`);
  }

  /** Start a process inside the sandbox; ENOENT on the command becomes a 127 like a shell would give. */
  private async spawn(req: Pick<ExecRequest, 'cmd' | 'env' | 'cwd' | 'user'>): Promise<ExecProcess> {
    this.assertAlive();
    const user = resolveUser(this.rootPath(), req.user ?? this.spec.user);
    const argv = typeof req.cmd === 'string' ? ['/bin/sh', '-c', req.cmd] : req.cmd;
    try {
      return await this.nativeExec(argv, req, user);
    } catch (err) {
      if (err instanceof WarrenError && err.code === 'SPAWN_ERROR' && err.errno === EAGAIN) {
        throw new WarrenError('RESOURCE_EXHAUSTED', `sandbox ${this.id} is at its pids limit (${this.spec.pids}); nothing new can start until processes exit`, { limit: 'pids' }, EAGAIN);
      }
      throw err;
    }
  }

  private nativeExec(argv: string[], req: Pick<ExecRequest, 'env' | 'cwd'>, user: SandboxUser): Promise<ExecProcess> {
    return native.execAsync({
      initPid: this.runtime.pid,
      cgroup: this.id,
      argv,
      env: this.environment(req.env, user),
      cwd: req.cwd ?? user.home,
      uid: user.uid,
      gid: user.gid,
      schedIdle: this.spec.priority === 'idle',
    });
  }

  /**
   * Start `req` with its output as Readables (see LiveExec): at most
   * maxOutputBytes per stream, read as fast as the consumer takes it; past
   * the limit the pipe is closed, which stops a writer that goes on (EPIPE /
   * SIGPIPE) instead of letting it run to completion unread.
   */
  async execLive(req: ExecRequest): Promise<LiveExec> {
    this.assertAlive();
    const started = performance.now();
    const maxOutput = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    const oomBefore = this.oomKills();
    let proc: ExecProcess;
    try {
      proc = await this.spawn(req);
    } catch (err) {
      const notFound = commandNotFound(err, req.cmd);
      if (notFound === null) throw err;
      return {
        stdout: Readable.from([]),
        stderr: Readable.from([Buffer.from(notFound)]),
        done: Promise.resolve({ exitCode: 127, signal: null, status: 'error', durationMs: performance.now() - started, truncated: false }),
        kill: () => undefined,
      };
    }
    const stdout = new LimitedPipe(proc.stdout!, maxOutput);
    const stderr = new LimitedPipe(proc.stderr!, maxOutput);
    writeStdin(proc.stdin!, req.stdin);

    let timedOut = false;
    const exited = new Promise<{ exitCode: number | null; signal: number | null }>((resolve) => native.watchExit(proc.pidfd, resolve));
    const timer =
      req.timeoutMs !== undefined
        ? setTimeout(() => {
            timedOut = true;
            killGroup(proc);
          }, req.timeoutMs)
        : null;
    const ended = (p: LimitedPipe) => new Promise<void>((r) => {
      if (p.destroyed || p.readableEnded) return r();
      p.once('end', r);
      p.once('close', r);
    });
    const done = (async (): Promise<ExecOutcome> => {
      const status = await exited;
      if (timer) clearTimeout(timer);
      native.close(proc.pidfd);
      // Output pipes may be held open by background children: once silent, they are given up.
      stdout.processExited();
      stderr.processExited();
      await Promise.all([ended(stdout), ended(stderr)]);
      let execStatus: ExecStatus = status.exitCode === 0 ? 'ok' : 'error';
      if (timedOut) execStatus = 'timeout';
      else if (status.signal !== null) {
        execStatus = status.signal === SIGKILL && this.oomKills() > oomBefore ? 'oom' : 'killed';
      }
      return {
        exitCode: status.exitCode,
        signal: status.signal,
        status: execStatus,
        durationMs: Math.round((performance.now() - started) * 1000) / 1000,
        truncated: stdout.truncated || stderr.truncated,
      };
    })();
    return { stdout, stderr, done, kill: () => killGroup(proc) };
  }

  /**
   * Start `req` under warren-nsexec --supervise (supervised-exec.ts): the same
   * namespaces, cgroup, user and confinement as execLive, but the output goes
   * to files in `dir` and the supervisor, not this process, waits for it.
   */
  private async startSupervised(req: ExecRequest, dir: string): Promise<LiveExec | null> {
    this.assertAlive();
    const user = resolveUser(this.rootPath(), req.user ?? this.spec.user);
    const argv = typeof req.cmd === 'string' ? ['/bin/sh', '-c', req.cmd] : req.cmd;
    const nsexec = [helperBinary('warren-nsexec'), '--pid', String(this.runtime.pid), '--cgroup', this.id, '--uid', String(user.uid), '--gid', String(user.gid), '--cwd', req.cwd ?? user.home];
    if (this.spec.priority === 'idle') nsexec.push('--sched-idle');
    nsexec.push(...nsexecConfineArgs(confineForSandbox(this.id)));
    for (const kv of this.environment(req.env, user)) nsexec.push('--env', kv);
    const started = performance.now();
    let pid: number;
    try {
      pid = await startSupervised(dir, { nsexec, argv, stdin: req.stdin, maxOutputBytes: req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT, timeoutMs: req.timeoutMs, oomBefore: this.oomKills() });
    } catch (err) {
      await dropSupervised(dir);
      if (err instanceof WarrenError && err.code === 'SPAWN_ERROR' && err.errno === EAGAIN) {
        throw new WarrenError('RESOURCE_EXHAUSTED', `sandbox ${this.id} is at its pids limit (${this.spec.pids}); nothing new can start until processes exit`, { limit: 'pids' }, EAGAIN);
      }
      const notFound = commandNotFound(err, req.cmd);
      if (notFound === null) throw err;
      return {
        stdout: Readable.from([]),
        stderr: Readable.from([Buffer.from(notFound)]),
        done: Promise.resolve({ exitCode: 127, signal: null, status: 'error', durationMs: performance.now() - started, truncated: false }),
        kill: () => undefined,
      };
    }
    // In the sandbox's cgroup: deleting the sandbox kills the supervisor with everything else.
    try {
      native.cgroupAttach(this.id, pid);
    } catch {
      /* the sandbox is being deleted: the supervisor goes with its command */
    }
    return null;
  }

  /** Run `req` to its end with the output kept in bounded memory (spilled to a file past CAPTURE_MEMORY_BYTES). */
  async execCaptured(req: ExecRequest): Promise<CapturedExec> {
    const live = await this.execLive(req);
    const limit = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    const out = new OutputCapture(limit);
    const err = new OutputCapture(limit);
    try {
      const [, , outcome] = await Promise.all([captureInto(live.stdout, out), captureInto(live.stderr, err), live.done]);
      return {
        ...outcome,
        truncated: outcome.truncated || out.truncated || err.truncated,
        stdout: out,
        stderr: err,
        release: () => {
          out.release();
          err.release();
        },
      };
    } catch (e) {
      out.release();
      err.release();
      throw e;
    }
  }

  async exec(req: ExecRequest): Promise<ExecResult> {
    const c = await this.execCaptured(req);
    try {
      const { stdout, stderr, release: _release, ...outcome } = c;
      return { ...outcome, stdout: stdout.bytes().toString('utf8'), stderr: stderr.bytes().toString('utf8') };
    } finally {
      c.release();
    }
  }

  /** OOM kills of the sandbox so far; 0 once its cgroup is gone (a delete raced the exec). */
  private oomKills(): number {
    try {
      return native.cgroupOomKills(this.id);
    } catch {
      return 0;
    }
  }

  async execStream(req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    const proc = await this.spawn(req);
    const stdin = new Socket({ fd: proc.stdin!, readable: false, writable: true });
    const stdout = new Socket({ fd: proc.stdout!, readable: true, writable: false });
    const stderr = new Socket({ fd: proc.stderr!, readable: true, writable: false });
    const exited = new Promise<{ exitCode: number | null; signal: number | null }>((resolve) =>
      native.watchExit(proc.pidfd, (s) => {
        native.close(proc.pidfd);
        resolve(s);
      }),
    );
    const timer = req.timeoutMs !== undefined ? setTimeout(() => killGroup(proc), req.timeoutMs) : null;
    void exited.then(() => timer && clearTimeout(timer));
    return {
      pid: proc.pid,
      stdin,
      stdout,
      stderr,
      exited,
      kill: (signal = SIGKILL) => {
        try {
          process.kill(-proc.pid, signal);
        } catch {
          /* already gone */
        }
      },
    };
  }

  async stats() {
    const s = native.cgroupStats(this.id);
    return {
      memoryCurrentBytes: s.memoryCurrentBytes,
      memoryPeakBytes: s.memoryPeakBytes,
      oomKills: s.oomKills,
      cpuUsageUs: s.cpuUsageUs,
      pidsCurrent: s.pidsCurrent,
    };
  }

  destroy(): Promise<void> {
    if (this.destroyed === null) this.destroyed = this.doDestroy();
    return this.destroyed;
  }

  private async doDestroy(): Promise<void> {
    await destroyCgroup(this.id);
    forgetSandbox(this.id);
    forgetPrefetch(this.id);
    if (this.runtime.network !== undefined && this.network !== null) await this.network.tearDown(this.id, this.runtime.network as SandboxNetworkRuntime);
    // pid 1 is gone once its cgroup is empty; the watcher releases its pidfd as it observes the exit.
    await Promise.race([this.ended, new Promise((r) => setTimeout(r, 2000))]);
    if (this.runtime.diskMb !== undefined && this.runtime.diskMb !== null) await unmountDisk(this.runtime.dir);
    await rm(this.runtime.dir, { recursive: true, force: true });
    if (this.supervisedDir !== null) await rm(this.supervisedDir, { recursive: true, force: true });
  }
}

function killGroup(proc: ExecProcess): void {
  try {
    process.kill(-proc.pid, SIGKILL);
  } catch {
    try {
      native.pidfdSendSignal(proc.pidfd, SIGKILL);
    } catch {
      /* already gone */
    }
  }
}

function commandNotFound(err: unknown, cmd: string | string[]): string | null {
  if (!(err instanceof WarrenError) || err.code !== 'SPAWN_ERROR' || err.errno !== 2) return null;
  if (/cwd|chdir/i.test(err.message)) {
    throw new WarrenError('FILE_NOT_FOUND', `working directory does not exist in the sandbox: ${err.message}`);
  }
  const name = Array.isArray(cmd) ? cmd[0] : '/bin/sh';
  return `warren: ${name}: command not found\n`;
}

function writeStdin(fd: number, data: Buffer | string | undefined): void {
  const sock = new Socket({ fd, readable: false, writable: true });
  sock.on('error', () => undefined);
  if (data !== undefined && data.length > 0) sock.end(data);
  else sock.end();
}
