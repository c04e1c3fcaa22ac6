/**
 * The microVM backend: every sandbox is its own virtual machine with its own
 * kernel, under a VMM driver (vmm.ts: QEMU's `microvm` machine, KVM where the
 * host has hardware virtualization, TCG elsewhere; or Firecracker, KVM only,
 * firecracker.ts). The image's EROFS layers are attached as read-only
 * virtio-blk disks, the writable layer is a per-sandbox ext4 disk of `diskMb`,
 * and the guest's /init composes them with overlayfs before handing over to
 * warren-agent (pid 1), which the shim talks to over virtio-serial (QEMU) or
 * guest vsock ports (Firecracker).
 *
 * Host side, per sandbox:
 *   <dataDir>/microvm/<id>/disk.img   writable disk (sparse)
 *   <dataDir>/microvm/<id>/snapshot   paused VM (memory + devices), while paused (Firecracker: and snapshot.mem)
 *   /run/warren/vm/<id>/              QEMU: {agent,qmp,sN}.sock; Firecracker: {api,v}.sock, vm.json, the console FIFO
 *   cgroup <id>                       the VMM process (guest RAM and the VMM's own overhead count there)
 */
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { chmodSync, chownSync, closeSync, copyFileSync, existsSync, linkSync, mkdirSync, openSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { rm, truncate } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { PassThrough } from 'node:stream';
import { promisify } from 'node:util';
import { WarrenError } from '../../../errors';
import { feature, microvmAccelerator, microvmVmm } from '../../../features';
import { native } from '../../../native';
import { destroyCgroup } from '../cgroup';
import { profile as policyProfile, profileForOwner } from '../../../security/confinement';
import { BoundedCollector } from '../../output';
import { parsePasswd, resolveUserWith, type SandboxUser } from '../../users';
import { checkConfined, indexTarFile } from '../../layers/tar';
import type {
  Backend,
  BackendSandbox,
  ExecRequest,
  ExecResult,
  ExecStatus,
  ExecStream,
  FacetName,
  FacetStatus,
  FileEntry,
  FilesFacet,
  FreezeFacet,
  PauseReportCore,
  ResolvedLayer,
  SandboxRecord,
  SandboxSpec,
  SandboxStats,
  SessionsFacet,
  ExportFacet,
} from '../../types';
import type { NetworkManager, SandboxNetworkRuntime } from '../../network/manager';
import { AgentClient } from './agent-client';
import { AS_OVERHEAD, AgentType, MAX_AGENT_PAYLOAD, encodeAs, encodeClock, encodeExec, encodeFrame, encodeMkdirs, encodeRead, encodeWrite, cstrings } from './agent-protocol';
import { findGuestKernel, guestInitramfs, vmmExecBinary, vmshellBinary } from './guest';
import { firecracker, vsockCmdline } from './firecracker';
import { Qmp } from './qmp';
import { type Template, type TemplateShape, TemplateStore, configLine, portHandshake } from './template';
import { type VmLaunch, type VmmDriver, hostTscKhz, qemuAwaitIncoming, qemuConsoleTail, qemuMicrovm, qemuSaveVm, shellWord, spawnVmm, vmmUser, vmmUserIds } from './vmm';

const SIGPIPE = 13;
const run = promisify(execFile);
const MIB = 1024 * 1024;
const CPU_PERIOD_US = 100_000;
const DEFAULT_MAX_OUTPUT = MIB;
const SIGKILL = 9;
/** Smallest guest the Debian kernel boots in (64 MiB does not; 80 MiB does). */
export const MIN_GUEST_MB = 128;
/** QEMU's own memory on top of guest RAM (TCG translation cache, binary, heap, I/O buffers). */
const VMM_OVERHEAD_MB = 160;
/** Layers + writable disk: microvm has 24 virtio-mmio slots and the agent port takes one. */
const MAX_LAYERS = 20;
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const STREAM_BUFFER_LIMIT = 16 * MIB;
/** How long the guest agent may take to report a command started (TCG under load is slow, not this slow). */
const GUEST_START_TIMEOUT_MS = 60_000;
/** How long after a timeout's SIGKILL the guest may take to report the exit. */
const GUEST_KILL_GRACE_MS = 10_000;
/** Shell sessions a microVM can have open at once (one virtio port each). */
export const SESSION_SLOTS = 4;
/** The fd on which warren-vmshell reads its holder's MARKs and signals (after stdio and the status fd). */
const BRIDGE_CONTROL_FD = 4;

export interface MicroVMRuntime {
  [key: string]: unknown;
  vmmPid: number;
  /** Start time of the VMM process (with the pid, what tells it from a recycled pid). */
  startTime: number;
  initrd: string;
  dir: string;
  runDir: string;
  accel: 'kvm' | 'tcg';
  kernel: string;
  vcpus: number;
  guestMb: number;
  layerFiles: string[];
  /** The sandbox's pids limit, enforced by a cgroup inside the guest (the host's counts QEMU's threads). */
  pids?: number;
  /** Set while paused: the snapshot file the next resume restores. */
  snapshot?: string;
  /** The kernel command line of the template this VM was restored from (every resume passes it again). */
  cmdline?: string;
  /** Guest RAM is the named backend of a VM restored from a template (its resumes name it the same). */
  namedRam?: boolean;
  /** The sandbox's namespace, cgroup policy and tap (absent: the guest has no NIC). */
  network?: SandboxNetworkRuntime;
}

export interface MicroVMOptions {
  dataDir: string;
  /** Where sockets live (short: unix socket paths are limited to 108 bytes). */
  runRoot?: string;
  /** The VMM (default: QEMU microvm, or Firecracker with WARREN_MICROVM_VMM=firecracker). */
  driver?: VmmDriver;
  bootTimeoutMs?: number;
  log?: (line: string) => void;
  /** The node network: microVMs with `network` get a tap in a pooled namespace, enforced by the tap programs. */
  network?: NetworkManager | null;
  /** Restore new microVMs from template snapshots (template.ts) instead of booting each; default on (WARREN_MICROVM_TEMPLATES=0 turns it off). */
  templates?: boolean;
}

export class MicroVMBackend implements Backend {
  readonly name = 'microvm' as const;
  readonly driver: VmmDriver;
  private readonly dir: string;
  private readonly runRoot: string;
  /** Empty directory the jail mounts its scratch tmpfs on (outside the run root it hides). */
  private readonly stash: string;

  constructor(private readonly opts: MicroVMOptions) {
    this.driver = opts.driver ?? (microvmVmm() === 'firecracker' ? firecracker : qemuMicrovm);
    this.dir = join(opts.dataDir, 'microvm');
    this.runRoot = opts.runRoot ?? '/run/warren/vm';
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    mkdirSync(this.runRoot, { recursive: true, mode: 0o700 });
    this.stash = opts.runRoot === undefined ? '/run/warren-vm-jail' : `${this.runRoot}-jail`;
    mkdirSync(this.stash, { recursive: true, mode: 0o700 });
    if (this.driver.templates && (opts.templates ?? process.env.WARREN_MICROVM_TEMPLATES !== '0')) {
      const store = new TemplateStore(join(opts.dataDir, 'microvm-templates'), (key, shape, dir) => this.buildTemplate(key, shape, dir), opts.log);
      this.templates = store;
      this.swept = store.sweep(killAndWait, destroyCgroup).then(
        (n) => void (n > 0 && opts.log?.(`microvm: removed ${n} unfinished template builds`)),
        (err: Error) => opts.log?.(`microvm: sweeping template builds: ${err.message}`),
      );
    }
  }

  close(): void {
    this.templates?.close();
  }

  /** Template snapshots new microVMs are restored from (null: every microVM boots). */
  readonly templates: TemplateStore | null = null;
  private swept: Promise<void> = Promise.resolve();

  /** The template for a sandbox, or null when templates are off (it boots). */
  private async templateFor(shape: TemplateShape): Promise<Template | null> {
    if (this.templates === null) return null;
    await this.swept;
    return this.templates.get(shape);
  }

  /**
   * Boot a guest that stops at /init's hold point, snapshot it there and end it. It runs like a
   * sandbox's VMM (jailed, unprivileged, in a cgroup of its own with the same limits).
   */
  private async buildTemplate(key: string, shape: TemplateShape, dir: string): Promise<{ cmdline: string }> {
    const id = `tpl-${key.slice(0, 16)}-${randomBytes(3).toString('hex')}`;
    const runDir = join(this.runRoot, id);
    const user = vmmUserIds();
    const runtime: MicroVMRuntime = { vmmPid: 0, startTime: 0, dir, runDir, accel: shape.accel, kernel: shape.kernel, vcpus: shape.vcpus, guestMb: shape.guestMb, layerFiles: [...shape.layerFiles], initrd: join(dir, 'initrd.cpio') };
    const cmdline = `${this.cmdline(id, runtime, true)}`;
    let cgroup = false;
    let pid = 0;
    try {
      mkdirSync(runDir, { mode: 0o700 });
      pinFile(shape.initrd, runtime.initrd);
      if (user !== null) chownSync(dir, user.uid, user.gid);
      await makeWritableDisk(join(dir, 'disk.img'), shape.diskMb, user);
      native.cgroupCreate(id, this.limits({ memoryMb: shape.guestMb, cpu: shape.vcpus }));
      cgroup = true;
      writeFileSync(join(dir, 'vmm.json'), JSON.stringify({ pid: 0, cgroup: id }));
      pid = await this.launch(id, runtime, false, { cmdline, ram: { file: this.inJail(join(dir, 'ram')), share: true }, templateNic: shape.nic });
      writeFileSync(join(dir, 'vmm.json'), JSON.stringify({ pid, startTime: runtime.startTime, cgroup: id }));
      await portHandshake(join(runDir, 'agent.sock'), { want: 'WARREN_HOLD', timeoutMs: this.opts.bootTimeoutMs ?? 180_000, isAlive: () => processAlive(pid) });
      const q = await Qmp.connect(join(runDir, 'qmp.sock'));
      try {
        await q.execute('stop');
        await q.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }] });
        await qemuSaveVm(q, this.inJail(join(dir, 'snapshot')));
      } finally {
        q.close();
      }
      await killAndWait(pid);
      pid = 0;
      // every restore reads it, whoever the sandbox's owner: it holds only the booted kernel and /init
      for (const f of ['snapshot', 'ram', 'disk.img']) {
        chownSync(join(dir, f), 0, 0);
        chmodSync(join(dir, f), 0o644);
      }
      return { cmdline };
    } catch (err) {
      const tail = pid > 0 ? await qemuConsoleTail(join(runDir, 'qmp.sock')) : '';
      const vmmLog = readTail(join(dir, 'vmm.log'));
      if (err instanceof WarrenError && (err.code === 'TIMEOUT' || err.code === 'UNAVAILABLE')) {
        throw new WarrenError('SPAWN_ERROR', `the microVM template did not come up: ${err.message}${tail ? `; guest console: ${tail}` : ''}${vmmLog ? `; VMM: ${vmmLog}` : ''}`, { console: tail, vmm: vmmLog });
      }
      throw err;
    } finally {
      if (pid > 0) await killAndWait(pid);
      if (cgroup) await destroyCgroup(id).catch(() => undefined);
      await rm(runDir, { recursive: true, force: true }).catch(() => undefined);
      await rm(join(dir, 'vmm.json'), { force: true }).catch(() => undefined);
    }
  }

  get facets(): Record<FacetName, FacetStatus> {
    return {
      files: { offered: true, how: 'through the guest agent, resolved inside the guest root (openat2 RESOLVE_IN_ROOT)' },
      sessions: { offered: true, how: `warren-session holder running warren-vmshell, bridged to one of ${SESSION_SLOTS} ${this.driver.channel.kind === 'vsock' ? 'guest vsock' : 'virtio'} session ports` },
      freeze: { offered: true, how: 'the VM (memory and devices) is saved to disk and the VMM ends; resume restores it' },
      snapshot: { offered: false, reason: 'pause already writes the whole VM to disk and ends the VMM; hibernate is pause here' },
      export: { offered: true, how: "tar of the guest's overlay upper dir (whiteouts kept, opaque-dir xattrs not), checked and unpacked on the host" },
      network: this.networkStatus(),
    };
  }

  private networkStatus(): FacetStatus {
    const net = this.opts.network ?? null;
    if (net === null) return { offered: false, reason: 'networking is disabled on this node (sandboxes are loopback-only)' };
    const why = net.tapRefusal();
    if (why !== null) return { offered: false, reason: why };
    return { offered: true, how: "a tap in a pooled netns whose veth is on the node bridge; the tap's frames pass tcx programs reading the sandbox's egress maps (same policy, DNS responder and denials as containers)" };
  }

  /** Give back a sandbox's namespace and enforcement (idempotent). */
  async tearDownNetwork(id: string, net: SandboxNetworkRuntime | undefined): Promise<void> {
    if (net === undefined || !this.opts.network) return;
    await this.opts.network.tearDown(id, net);
  }

  async create(id: string, spec: SandboxSpec, layers: ResolvedLayer[]): Promise<MicroVMSandbox> {
    const netStatus = this.networkStatus();
    if (spec.network !== undefined && !netStatus.offered) throw new WarrenError('NOT_SUPPORTED', `the microvm backend does not offer network: ${netStatus.reason}`, { field: 'network', facet: 'network' });
    if (spec.memoryMb < MIN_GUEST_MB) throw new WarrenError('LIMIT_OUT_OF_RANGE', `microVMs need memoryMb >= ${MIN_GUEST_MB} (the guest kernel does not boot in less)`, { field: 'memoryMb', min: MIN_GUEST_MB });
    if (layers.length > MAX_LAYERS) throw new WarrenError('LIMIT_OUT_OF_RANGE', `microVMs take at most ${MAX_LAYERS} layers (got ${layers.length})`, { field: 'layers', max: MAX_LAYERS });
    const files = layers.map((l) => {
      if (l.file === undefined) throw new WarrenError('INTERNAL', `layer ${l.digest} has no image file`);
      return l.file;
    });
    const kernel = findGuestKernel();
    if (kernel === null) throw new WarrenError('NOT_SUPPORTED', `microvm: ${feature('microvm-guest').reason}`);
    const cachedInitrd = guestInitramfs(kernel);
    const diskMb = spec.diskMb ?? policyProfile(profileForOwner(spec.owner)).limits.diskMb ?? 2048;
    const dir = join(this.dir, id);
    const runDir = join(this.runRoot, id);
    // Firecracker has no emulator: where it is available the host's KVM runs the guest
    const accel = this.driver.name === 'firecracker' ? 'kvm' : microvmAccelerator().accel;
    const vcpus = Math.max(1, Math.min(Math.ceil(spec.cpu), 16));
    const template = await this.templateFor({ kernel: kernel.image, initrd: cachedInitrd, layerFiles: files, diskMb, guestMb: spec.memoryMb, vcpus, accel, nic: spec.network !== undefined, extra: `${hostTscKhz() ?? ''} ${vmmUser() ?? ''}` });
    // The sandbox keeps its own link to the initramfs it booted: a later build (another agent or
    // /init) replaces the cached one, and a paused VM must restore with the initramfs it had.
    const initrd = join(dir, 'initrd.cpio');
    const runtime: MicroVMRuntime = { vmmPid: 0, startTime: 0, dir, runDir, accel, kernel: kernel.image, vcpus, guestMb: spec.memoryMb, layerFiles: files, initrd, pids: spec.pids, ...(template ? { cmdline: template.cmdline, namedRam: true } : {}) };
    let cgroup = false;
    let pid = 0;
    try {
      mkdirSync(dir, { mode: 0o700 });
      mkdirSync(runDir, { mode: 0o700 });
      pinFile(template?.initrd ?? cachedInitrd, initrd);
      // QEMU runs as the unprivileged VMM user after start-up: the snapshot it writes goes in `dir`.
      const user = vmmUserIds();
      if (user !== null) chownSync(dir, user.uid, user.gid);
      // a restored guest has its writable disk mounted already: it gets the template's as it was at the snapshot
      if (template === null) await makeWritableDisk(join(dir, 'disk.img'), diskMb, user);
      else await copyDisk(template.disk, join(dir, 'disk.img'), user);
      native.cgroupCreate(id, this.limits(spec));
      cgroup = true;
      if (spec.network !== undefined) {
        // the tap belongs to the VMM user: the jailed QEMU opens it by name in the sandbox's namespace
        const owner = user ?? { uid: 0, gid: 0 };
        runtime.network = await this.opts.network!.setUp(id, spec.owner, cgroupDir(id), spec.network, owner);
      }
      if (template === null) pid = await this.launch(id, runtime, spec.priority === 'idle');
      else {
        const ram = await this.templates!.acquireRam(template);
        try {
          pid = await this.launch(id, runtime, spec.priority === 'idle', { incoming: { file: template.snapshot, shared: true }, ram: { file: '/proc/self/fd/3', share: false }, passFd: ram.fd });
        } finally {
          // the VMM has its own copy of the descriptor from here on
          ram.release();
        }
        const launched = pid;
        const q = await Qmp.connect(join(runDir, 'qmp.sock'), 30_000);
        try {
          // the template's RAM is mapped from its file, not in the snapshot: both ends of the migration say so
          await q.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: true }] });
          await q.execute('migrate-incoming', { uri: `exec:cat ${shellWord(template.snapshot)}` });
          await qemuAwaitIncoming(q);
          await q.execute('cont');
        } finally {
          q.close();
        }
        const tap = runtime.network?.tap;
        const line = configLine({ id, pids: spec.pids, ...(tap ? { net: { cidr: tap.cidr, gateway: tap.gateway, mac: tap.mac } } : {}) });
        await portHandshake(join(runDir, 'agent.sock'), { send: line, want: 'WARREN_GO', timeoutMs: 60_000, isAlive: () => processAlive(launched) });
      }
      const box = new MicroVMSandbox(id, spec, runtime, this);
      await box.connect(this.opts.bootTimeoutMs ?? 180_000);
      return box;
    } catch (err) {
      const tail = pid > 0 ? await this.driver.control.consoleTail(runDir) : '';
      const vmmLog = readTail(join(dir, 'vmm.log'));
      if (pid > 0) await killAndWait(pid);
      this.driver.control.forget(runDir);
      if (cgroup) await destroyCgroup(id).catch(() => undefined);
      await this.tearDownNetwork(id, runtime.network).catch(() => undefined);
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      await rm(runDir, { recursive: true, force: true }).catch(() => undefined);
      if (err instanceof WarrenError && (err.code === 'TIMEOUT' || err.code === 'UNAVAILABLE')) {
        throw new WarrenError('SPAWN_ERROR', `microVM ${id} did not come up: ${err.message}${tail ? `; guest console: ${tail}` : ''}${vmmLog ? `; VMM: ${vmmLog}` : ''}`, { console: tail, vmm: vmmLog });
      }
      throw err;
    }
  }

  private limits(spec: Pick<SandboxSpec, 'memoryMb' | 'cpu'>) {
    const bytes = (spec.memoryMb + VMM_OVERHEAD_MB) * MIB;
    return {
      cpuQuotaUs: Math.max(1000, Math.round(spec.cpu * CPU_PERIOD_US)),
      cpuPeriodUs: CPU_PERIOD_US,
      memoryBytes: bytes,
      memorySwapBytes: bytes,
      // QEMU's threads (vCPUs, I/O workers, RCU, the migration shell): not the guest's processes.
      pidsMax: 128,
    };
  }

  /**
   * The kernel command line of a boot. A template's names nothing of any one sandbox (/init
   * holds and is told those after the restore).
   */
  private cmdline(id: string, runtime: MicroVMRuntime, template = false): string {
    const khz = hostTscKhz();
    const tap = runtime.network?.tap;
    const own = template ? ['warren.hold=1'] : [`warren.id=${id}`, ...(runtime.pids !== undefined ? [`warren.pids=${runtime.pids}`] : []), ...(tap ? [`warren.net=${tap.cidr},${tap.gateway}`] : [])];
    const channel = this.driver.channel.kind === 'vsock' ? [vsockCmdline(SESSION_SLOTS)] : [];
    return ['console=ttyS0', 'panic=-1', 'quiet', 'loglevel=3', ...(khz ? [`tsc_early_khz=${khz}`] : []), `warren.layers=${runtime.layerFiles.length}`, ...channel, ...own].join(' ');
  }

  /**
   * Start the VMM (booting, or restoring a snapshot: the sandbox's own from a pause, or a
   * template's, which the jail binds read-only); returns its pid.
   */
  async launch(id: string, runtime: MicroVMRuntime, idle: boolean, o: { incoming?: { file: string; shared: boolean }; cmdline?: string; ram?: { file?: string; share?: boolean }; passFd?: number; templateNic?: boolean } = {}): Promise<number> {
    const cmdline = o.cmdline ?? runtime.cmdline ?? this.cmdline(id, runtime);
    const tap = runtime.network?.tap;
    const agentSocket = join(runtime.runDir, 'agent.sock');
    const qmpSocket = join(runtime.runDir, 'qmp.sock');
    for (const f of [agentSocket, qmpSocket, ...Array.from({ length: SESSION_SLOTS }, (_, i) => join(runtime.runDir, `s${i}.sock`))]) await rm(f, { force: true });
    const launch: VmLaunch = {
      id,
      runDir: runtime.runDir,
      accel: runtime.accel,
      kernel: runtime.kernel,
      initrd: runtime.initrd,
      cmdline,
      vcpus: runtime.vcpus,
      memoryMb: runtime.guestMb,
      // the VMM re-opens its writable disk by path after dropping to the VMM user: give it the path it can traverse
      disks: [{ id: 'rw', file: this.inJail(join(runtime.dir, 'disk.img')), readOnly: false, serial: 'rw' }, ...runtime.layerFiles.map((f, i) => ({ id: `l${i}`, file: f, readOnly: true, serial: `l${i}` }))],
      agentSocket,
      sessionSockets: Array.from({ length: SESSION_SLOTS }, (_, i) => join(runtime.runDir, `s${i}.sock`)),
      qmpSocket,
      logFile: join(runtime.dir, 'vmm.log'),
      ...(tap && runtime.network ? { net: { netnsPath: runtime.network.lease.path, tap: tap.name, mac: tap.mac } } : {}),
      jail: { runDir: runtime.runDir, dataDir: runtime.dir, runRoot: dirname(this.runRoot), dataRoot: this.opts.dataDir, files: [...runtime.layerFiles, ...(o.incoming?.shared ? [o.incoming.file] : [])], stash: this.stash, user: vmmUser() },
      ...(o.ram !== undefined ? { ram: o.ram } : runtime.namedRam ? { ram: {} } : {}),
      ...(o.passFd !== undefined ? { passFd: o.passFd } : {}),
      ...(o.templateNic ? { templateNic: true } : {}),
      // a template's snapshot is read once QMP has said its RAM is not in it (see create)
      ...(o.incoming !== undefined ? { incoming: o.incoming.shared ? 'defer' : this.inJail(o.incoming.file) } : {}),
      // a restored guest has resident only the pages its snapshot holds data for, unless huge pages round them up to 2 MiB
      ...(o.incoming !== undefined && vmmExecBinary() !== null ? { noHugePages: vmmExecBinary()! } : {}),
    };
    return launchVmm(this.driver, launch, runtime, idle);
  }

  inJail(file: string): string {
    return inJail(this.stash, file);
  }

  async adopt(record: SandboxRecord): Promise<MicroVMSandbox | null> {
    const r = record.runtime as Partial<MicroVMRuntime>;
    const gone = (why: string): null => {
      this.opts.log?.(`microvm ${record.id}: not adopted: ${why}`);
      return null;
    };
    if (typeof r.dir !== 'string' || typeof r.runDir !== 'string' || typeof r.vmmPid !== 'number') return gone('its record has no VMM');
    if (!native.cgroupExists(record.id)) return gone('its cgroup is gone');
    // its enforcement outlived the gateway (pinned); take the network's bookkeeping back first
    if (r.network !== undefined && (!this.opts.network || !this.opts.network.adopt(record.id, cgroupDir(record.id), r.network))) return gone('its network could not be taken over');
    if (typeof r.snapshot === 'string') {
      // Paused: no VMM, only its snapshot; the next resume restores it.
      if (!existsSync(r.snapshot)) return gone(`its snapshot ${r.snapshot} is missing`);
      return new MicroVMSandbox(record.id, record.spec, r as MicroVMRuntime, this, true);
    }
    if (native.processStartTime(r.vmmPid) !== r.startTime) return gone(`VMM ${r.vmmPid} is not running`);
    if (!native.cgroupProcs(record.id).includes(r.vmmPid)) return gone(`VMM ${r.vmmPid} is not in its cgroup`);
    const box = new MicroVMSandbox(record.id, record.spec, r as MicroVMRuntime, this);
    // The VM's agent port takes one connection: a handle this process still holds gives it up.
    live.get(record.id)?.detachAgent();
    try {
      await box.connect(30_000);
    } catch (err) {
      return gone(`its agent does not answer: ${(err as Error).message}`);
    }
    return box;
  }

  leftovers(known: ReadonlySet<string>, prefix: string): string[] {
    return vmLeftovers([this.dir, this.runRoot], known, prefix);
  }

  async cleanup(id: string, record?: SandboxRecord): Promise<void> {
    const r = record?.runtime as Partial<MicroVMRuntime> | undefined;
    if (native.cgroupExists(id)) await destroyCgroup(id);
    if (this.opts.network) await this.opts.network.tearDown(id, r?.network);
    await rm(join(this.dir, id), { recursive: true, force: true });
    await rm(join(this.runRoot, id), { recursive: true, force: true });
    if (r?.dir) await rm(r.dir, { recursive: true, force: true });
  }
}

/** The sandbox's group in the cgroup2 hierarchy (the VMM is in it), where the egress programs attach. */
function cgroupDir(id: string): string {
  const root = native.cgroupLayout().roots.unified;
  if (root === undefined) throw new WarrenError('NOT_SUPPORTED', 'no cgroup2 hierarchy for the egress programs', { feature: 'cgroup2-bpf-hierarchy' });
  return join(root, id);
}

export { vmmUser, vmmUserIds };

/**
 * Start the VMM of `launch`: its output appended to the launch's log, the process counted in
 * the sandbox's cgroup (and SCHED_IDLE for an idle sandbox) before anything waits on it. A VMM
 * that cannot be counted is killed, not left running outside its limits. Its pid and start
 * time go into `runtime` (re-adoption tells a live VMM from a reused pid by them).
 */
export async function launchVmm(driver: VmmDriver, launch: VmLaunch, runtime: { vmmPid: number; startTime: number }, idle: boolean): Promise<number> {
  await driver.prepare?.(launch);
  const log = openSync(launch.logFile, 'a', 0o600);
  let proc;
  try {
    proc = spawnVmm(driver, launch, log);
  } finally {
    closeSync(log);
  }
  try {
    native.cgroupAttach(launch.id, proc.pid);
    if (idle) native.setSchedIdle(proc.pid);
  } catch (err) {
    await killAndWait(proc.pid);
    throw err;
  }
  runtime.vmmPid = proc.pid;
  runtime.startTime = native.processStartTime(proc.pid);
  proc.release();
  return proc.pid;
}

/** `to` becomes a hard link to `from` (a copy across filesystems): it stays when `from` is replaced or removed. */
function pinFile(from: string, to: string): void {
  try {
    linkSync(from, to);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EXDEV') throw err;
    copyFileSync(from, to);
  }
}

/** A sparse disk of `mb` with an empty ext4 made here (never mounted on the host: the guest owns what goes in it). */
async function makeWritableDisk(disk: string, mb: number, user: { uid: number; gid: number } | null): Promise<void> {
  closeSync(openSync(disk, 'wx', 0o600));
  await truncate(disk, mb * MIB);
  await run('mkfs.ext4', ['-q', '-F', '-m', '0', '-E', 'lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0', disk], { timeout: 60_000 });
  if (user !== null) chownSync(disk, user.uid, user.gid);
}

/** A sparse copy of a template's writable disk (only its allocated blocks are read and written). */
async function copyDisk(from: string, to: string, user: { uid: number; gid: number } | null): Promise<void> {
  await run('cp', ['--sparse=always', '--no-preserve=all', from, to], { timeout: 60_000 });
  chmodSync(to, 0o600);
  if (user !== null) chownSync(to, user.uid, user.gid);
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return readState(pid) !== 'Z';
  } catch {
    return false;
  }
}

/** A file of a sandbox's data dir as the (jailed, unprivileged) VMM sees it: through the stash. */
export function inJail(stash: string, file: string): string {
  return vmmUser() === null ? file : join(stash, 'data', basename(file));
}

export async function killAndWait(pid: number): Promise<void> {
  const pids = [...descendants(pid), pid];
  for (const p of pids) {
    try {
      process.kill(p, SIGKILL);
    } catch {
      /* gone */
    }
  }
  const deadline = Date.now() + 5000;
  const alive = (p: number) => {
    try {
      process.kill(p, 0);
    } catch {
      return false;
    }
    return readState(p) !== 'Z' && readState(p) !== null;
  };
  while (Date.now() < deadline && pids.some(alive)) await new Promise((r) => setTimeout(r, 10));
}

function descendants(pid: number, depth = 0): number[] {
  if (depth > 8) return [];
  try {
    const kids = (require('node:fs').readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8') as string).trim().split(/\s+/).filter(Boolean).map(Number);
    return kids.flatMap((k) => [...descendants(k, depth + 1), k]);
  } catch {
    return [];
  }
}

/** Resident bytes of a process and its descendants. */
export function treeRss(pid: number): number {
  const fs = require('node:fs') as typeof import('node:fs');
  let total = 0;
  const visit = (p: number, depth: number): void => {
    if (depth > 8) return;
    try {
      total += Number(/^VmRSS:\s+(\d+) kB/m.exec(fs.readFileSync(`/proc/${p}/status`, 'utf8'))?.[1] ?? 0) * 1024;
      for (const c of fs.readFileSync(`/proc/${p}/task/${p}/children`, 'utf8').trim().split(/\s+/).filter(Boolean)) visit(Number(c), depth + 1);
    } catch {
      /* gone */
    }
  };
  visit(pid, 0);
  return total;
}

export function readState(pid: number): string | null {
  try {
    const s = require('node:fs').readFileSync(`/proc/${pid}/stat`, 'utf8') as string;
    return s.slice(s.lastIndexOf(')') + 2, s.lastIndexOf(')') + 3);
  } catch {
    return null;
  }
}

/** Sandbox ids with a data or run directory of a VM backend but no record (`known`): a create cut short. */
export function vmLeftovers(dirs: readonly string[], known: ReadonlySet<string>, prefix: string): string[] {
  const found = new Set<string>();
  for (const dir of dirs) {
    try {
      // a sandbox id is the prefix and 16 hex digits: a template build's dir (tpl-<key>-<rand>) is never one, whatever the node is called
      for (const d of readdirSync(dir)) if (d.startsWith(prefix) && /^[0-9a-f]{16}$/.test(d.slice(prefix.length))) found.add(d);
    } catch {
      /* not there yet */
    }
  }
  return [...found].filter((id) => !known.has(id));
}

/** The last bytes of a host-written log (QEMU's stderr), printable only. */
export function readTail(path: string): string {
  try {
    const text = require('node:fs').readFileSync(path, 'utf8') as string;
    return text.slice(-1000).replace(/[^\x20-\x7e\n]/g, '').trim().split('\n').slice(-5).join(' | ');
  } catch {
    return '';
  }
}

/** What a sandbox asks of its backend: start its VMM again (resume), and paths as the jailed VMM sees them. */
export type VmHost = Pick<MicroVMBackend, 'launch' | 'inJail' | 'tearDownNetwork' | 'driver'>;

/** Sandboxes this process holds a connection for, by id (see adopt). */
const live = new Map<string, MicroVMSandbox>();

export class MicroVMSandbox implements BackendSandbox {
  readonly ended: Promise<void>;
  private endedResolve!: () => void;
  private agent: AgentClient | null = null;
  private destroyed: Promise<void> | null = null;
  private alive = true;
  /** True while the VM is saved to disk and no VMM runs. */
  private suspended: boolean;
  private watchedPid = 0;
  readonly files: FilesFacet;
  /** Files as guest root: what the host itself reads (the user database). */
  private readonly rootFiles: AgentFiles;
  readonly freeze: FreezeFacet;
  readonly sessions: SessionsFacet;
  readonly export: ExportFacet;

  constructor(
    readonly id: string,
    private readonly spec: SandboxSpec,
    readonly runtime: MicroVMRuntime,
    private readonly backend: VmHost,
    suspended = false,
  ) {
    this.suspended = suspended;
    this.ended = new Promise((r) => (this.endedResolve = r));
    if (!suspended) this.watch(runtime.vmmPid);
    this.rootFiles = new AgentFiles(() => this.client(), null);
    // the files API does what an exec as the sandbox's user could (like a container's), no more
    this.files = new AgentFiles(() => this.client(), async () => {
      const u = await this.user(undefined);
      return { uid: u.uid, gid: u.gid };
    });
    this.freeze = {
      pause: () => this.suspend(),
      resume: () => this.restore(),
    };
    this.sessions = {
      shellCommand: async (o) => {
        this.client();
        const user = await this.user(o.user);
        const hasBash = await this.files.kind('/bin/bash').then((k) => k === 'file', () => false);
        const shell = hasBash ? ['/bin/bash', '--noprofile', '--norc'] : ['/bin/sh'];
        if (o.mode === 'pty') shell.push('-i');
        const env: Record<string, string> = { PATH: DEFAULT_PATH, HOME: user.home, USER: user.name, HOSTNAME: this.id, LANG: 'C.UTF-8', TERM: o.mode === 'pty' ? 'xterm-256color' : 'dumb', ...this.spec.env, ...o.env };
        const channel = this.backend.driver.channel;
        const argv = [vmshellBinary(), '--dir', this.runtime.runDir, '--slots', String(SESSION_SLOTS), ...(channel.kind === 'vsock' ? ['--vsock', String(channel.firstSessionPort)] : []), '--mode', o.mode, '--cwd', o.cwd ?? user.home, '--uid', String(user.uid), '--gid', String(user.gid), '--control-fd', String(BRIDGE_CONTROL_FD)];
        for (const [k, v] of Object.entries(env)) argv.push('--env', `${k}=${v}`);
        argv.push('--', ...shell);
        // the holder cannot see the guest's processes: the bridge passes its MARKs and signals on
        return { argv, controlFd: BRIDGE_CONTROL_FD };
      },
      // Holders and their bridges are counted with (and killed with) the VMM.
      // (see exportUpper below for the export facet)
      holderStarted: (pid) => native.cgroupAttach(this.id, pid),
    };
    this.export = {
      // The guest's upper dir cannot be measured from the host: its disk bounds it (apparent size; allocated blocks of the image).
      measureUpper: async () => {
        const st = statSync(join(this.runtime.dir, 'disk.img'));
        return { bytes: st.blocks * 512, allocated: st.blocks * 512 };
      },
      exportUpper: (dest) => this.exportUpper(dest),
    };
  }

  /**
   * pack: the guest streams its upper dir as a tar (bounded by the disk size),
   * the host checks every entry (no escapes; only files, dirs, links and 0/0
   * whiteouts) and unpacks it into `dest`. The guest keeps running meanwhile.
   */
  private async exportUpper(dest: string): Promise<{ frozenMs: number }> {
    const client = this.client();
    const tarFile = `${dest}.tar`;
    const limit = (this.spec.diskMb ?? 2048) * MIB + 64 * MIB;
    const out = openSync(tarFile, 'wx', 0o600);
    try {
      await new Promise<void>((resolve, reject) => {
        let size = 0;
        let failed: Error | null = null;
        let eof = false;
        let exit: { code: number | null; sig: number | null } | null = null;
        const done = () => {
          if (!eof || exit === null) return;
          client.releaseChannel(chan);
          clearTimeout(timer);
          if (failed) reject(failed);
          else if (exit.code !== 0) reject(new WarrenError('INTERNAL', `exporting the writable layer failed in the guest (exit ${exit.code ?? `signal ${exit.sig}`})`));
          else resolve();
        };
        const chan = client.open({
          frame: (f) => {
            if (f.type === AgentType.ERR) {
              client.releaseChannel(chan);
              clearTimeout(timer);
              return reject(new WarrenError('INTERNAL', 'the guest could not start the export'));
            }
            if (f.type === AgentType.OUT && f.payload.length >= 1 && f.payload[0] === 1) {
              if (f.payload.length === 1) {
                eof = true;
                return done();
              }
              size += f.payload.length - 1;
              if (size > limit) {
                failed ??= new WarrenError('PAYLOAD_TOO_LARGE', `the guest's export is larger than its disk (${limit} bytes)`);
                client.send(encodeFrame(AgentType.KILL, chan, Buffer.from([SIGKILL])));
                return;
              }
              if (failed === null) require('node:fs').writeSync(out, f.payload, 1);
            } else if (f.type === AgentType.EXIT && f.payload.length === 8) {
              exit = { code: f.payload.readUInt32LE(4) ? null : f.payload.readUInt32LE(0), sig: f.payload.readUInt32LE(4) || null };
              if (!eof) setTimeout(() => ((eof = true), done()), 200);
              done();
            }
          },
          fail: (err) => {
            clearTimeout(timer);
            reject(err);
          },
        });
        const timer = setTimeout(() => {
          client.releaseChannel(chan);
          reject(new WarrenError('TIMEOUT', 'exporting the writable layer took longer than 600 s'));
        }, 600_000);
        client.send(encodeFrame(AgentType.EXPORT, chan));
      });
    } finally {
      closeSync(out);
    }
    try {
      const entries = indexTarFile(tarFile);
      // a root filesystem: symlinks are data (relative to the sandbox root), entries below them are refused
      checkConfined(entries, 'in-root');
      // ... and the host's tar would follow a link the archive made: nothing may lie below one
      const norm = (p: string) => p.replace(/^(\.\/)+/, '').replace(/\/+$/, '');
      const links = new Set(entries.filter((e) => e.type === 'symlink').map((e) => norm(e.path)));
      for (const e of entries) {
        const parts = norm(e.path).split('/');
        for (let i = 1; i < parts.length; i++) {
          if (links.has(parts.slice(0, i).join('/'))) throw new WarrenError('INVALID_ARCHIVE', `the guest's writable layer has an entry below a symbolic link: ${JSON.stringify(e.path.slice(0, 200))}`);
        }
      }
      for (const e of entries) {
        const ok = e.type === 'file' || e.type === 'dir' || e.type === 'symlink' || e.type === 'hardlink' || (e.type === 'char' && e.devmajor === 0 && e.devminor === 0);
        if (!ok) throw new WarrenError('INVALID_ARCHIVE', `the guest's writable layer has an entry the host will not unpack: ${JSON.stringify(e.path.slice(0, 200))} (${e.type})`);
      }
      mkdirSync(dest, { mode: 0o755 });
      await run('tar', ['-x', '-p', '--same-owner', '--numeric-owner', '--no-overwrite-dir', '-f', tarFile, '-C', dest], { timeout: 600_000, maxBuffer: 1 << 20 });
    } finally {
      await rm(tarFile, { force: true });
    }
    return { frozenMs: 0 };
  }

  get pid(): number | undefined {
    return this.suspended ? undefined : this.runtime.vmmPid;
  }

  /** Guest kernel release (from the agent's HELLO). */
  get guestRelease(): string {
    return this.agent?.release ?? '';
  }

  private watch(pid: number): void {
    this.watchedPid = pid;
    let fd: number;
    try {
      fd = native.pidfdOpen(pid);
    } catch {
      this.alive = false;
      this.endedResolve();
      return;
    }
    native.watchExit(fd, () => {
      native.close(fd);
      // A VMM that ends because we paused (or destroyed) the VM is not the sandbox ending.
      if (this.watchedPid !== pid || this.suspended) return;
      this.alive = false;
      this.agent?.close();
      this.endedResolve();
    });
  }

  async connect(timeoutMs: number): Promise<void> {
    const pid = this.runtime.vmmPid;
    const alive = () => {
      try {
        process.kill(pid, 0);
        return readState(pid) !== 'Z';
      } catch {
        return false;
      }
    };
    const client = await AgentClient.connect(() => this.backend.driver.control.dialAgent(this.runtime.runDir), timeoutMs, alive);
    this.agent = client;
    live.set(this.id, this);
    client.onEnd(() => {
      if (this.agent === client) this.agent = null;
    });
  }

  /**
   * The guest's clock to the host's: a restored guest's stood still from its snapshot on. Not
   * waited for (the agent handles frames in order, so every later request sees the new time),
   * which also keeps a VM whose older agent lacks the frame resumable.
   */
  private setClock(): void {
    const client = this.client();
    const chan = client.open({ frame: () => undefined, fail: () => undefined });
    client.send(encodeClock(chan, BigInt(Date.now()) * 1_000_000n));
    client.releaseChannel(chan);
  }

  /** Give the agent connection up (another handle adopted this VM). */
  detachAgent(): void {
    this.agent?.close();
    this.agent = null;
  }

  private client(): AgentClient {
    if (!this.alive || this.destroyed !== null) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is not running`);
    if (this.suspended) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is paused`);
    if (this.agent === null || this.agent.isClosed) throw new WarrenError('UNAVAILABLE', `the guest agent of ${this.id} is not connected`);
    return this.agent;
  }

  private async user(name: string | undefined): Promise<SandboxUser> {
    const want = name ?? this.spec.user;
    if (want === undefined || want === '' || want === 'root' || want === '0') return { name: 'root', uid: 0, gid: 0, home: '/root' };
    let text = '';
    try {
      text = (await this.rootFiles.readFile('/etc/passwd', MIB)).toString('utf8');
    } catch (err) {
      if (!(err instanceof WarrenError && err.code === 'FILE_NOT_FOUND')) throw err;
    }
    return resolveUserWith(want, () => parsePasswd(text));
  }

  private environment(extra: Record<string, string> | undefined, user: SandboxUser): string[] {
    const env: Record<string, string> = { PATH: DEFAULT_PATH, HOME: user.home, USER: user.name, HOSTNAME: this.id, LANG: 'C.UTF-8', ...this.spec.env, ...extra };
    return Object.entries(env).map(([k, v]) => `${k}=${v}`);
  }

  /** Start a process in the guest; events arrive on the returned handle. */
  private async start(req: Pick<ExecRequest, 'cmd' | 'env' | 'cwd' | 'user'>, sink: ProcSink): Promise<GuestProc> {
    const client = this.client();
    const user = await this.user(req.user);
    const argv = typeof req.cmd === 'string' ? ['/bin/sh', '-c', req.cmd] : req.cmd;
    if (!Array.isArray(argv) || argv.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'cmd must be a string or a non-empty array');
    const frame = (chan: number) => encodeExec(chan, { argv, env: this.environment(req.env, user), cwd: req.cwd ?? user.home, uid: user.uid, gid: user.gid });
    return new Promise((resolve, reject) => {
      let started = false;
      // A guest too busy to answer (a fork bomb under TCG) must not hold the caller forever.
      const startTimer = setTimeout(() => {
        if (started) return;
        started = true;
        client.releaseChannel(proc.chan);
        reject(new WarrenError('TIMEOUT', `sandbox ${this.id}: the guest agent did not start the command within ${GUEST_START_TIMEOUT_MS} ms`));
      }, GUEST_START_TIMEOUT_MS);
      const proc: GuestProc = {
        chan: 0,
        stdin: (data) => {
          for (let i = 0; i < data.length; i += MAX_AGENT_PAYLOAD) client.send(encodeFrame(AgentType.STDIN, proc.chan, data.subarray(i, i + MAX_AGENT_PAYLOAD)));
        },
        stdinEnd: () => {
          if (!client.isClosed) client.send(encodeFrame(AgentType.STDIN_EOF, proc.chan));
        },
        kill: (sig) => {
          if (!client.isClosed) client.send(encodeFrame(AgentType.KILL, proc.chan, Buffer.from([sig & 0xff])));
        },
        done: () => client.releaseChannel(proc.chan),
      };
      proc.chan = client.open({
        frame: (f) => {
          if (!started) {
            if (f.type === AgentType.STARTED && f.payload.length === 4) {
              started = true;
              clearTimeout(startTimer);
              resolve(proc);
            } else if (f.type === AgentType.ERR) {
              started = true;
              clearTimeout(startTimer);
              client.releaseChannel(proc.chan);
              const errno = f.payload.length >= 4 ? f.payload.readUInt32LE(0) : 0;
              const what = f.payload.subarray(4, 40).toString('latin1');
              if (errno === 2 && what.startsWith('chdir')) reject(new WarrenError('FILE_NOT_FOUND', `working directory does not exist in the sandbox: ${req.cwd ?? user.home}`));
              else if (errno === 2 || errno === 13) reject(new GuestNotFound(Array.isArray(req.cmd) ? req.cmd[0]! : '/bin/sh'));
              else if (errno === 11) reject(new WarrenError('RESOURCE_EXHAUSTED', `sandbox ${this.id} cannot start more processes`, { limit: 'pids' }, 11));
              else reject(new WarrenError('SPAWN_ERROR', `guest could not start the command (errno ${errno})`, { errno }, errno));
            }
            return;
          }
          if (f.type === AgentType.OUT && f.payload.length >= 1) {
            const stream = f.payload[0];
            if (stream === 1 || stream === 2) sink.out(stream, f.payload.subarray(1));
          } else if (f.type === AgentType.EXIT && f.payload.length === 8) {
            const code = f.payload.readUInt32LE(0);
            const sig = f.payload.readUInt32LE(4);
            sink.exit(sig ? null : code & 0xff, sig ? sig & 0x7f : null);
          }
        },
        fail: (err) => {
          if (!started) {
            clearTimeout(startTimer);
            reject(err);
          } else sink.broken(err);
        },
      });
      try {
        client.send(frame(proc.chan));
      } catch (err) {
        clearTimeout(startTimer);
        client.releaseChannel(proc.chan);
        reject(err);
      }
    });
  }

  async exec(req: ExecRequest): Promise<ExecResult> {
    const started = performance.now();
    const maxOutput = req.maxOutputBytes ?? DEFAULT_MAX_OUTPUT;
    const stdout = new BoundedCollector(maxOutput);
    const stderr = new BoundedCollector(maxOutput);
    let eof = 0;
    let onEof: (() => void) | null = null;
    let status: { exitCode: number | null; signal: number | null } | null = null;
    let onExit: ((s: { exitCode: number | null; signal: number | null }) => void) | null = null;
    let broken: Error | null = null;
    const sink: ProcSink = {
      out: (stream, data) => {
        if (data.length === 0) {
          eof++;
          if (eof === 2) onEof?.();
          return;
        }
        const c = stream === 1 ? stdout : stderr;
        c.push(data);
        if (c.truncated) overLimit();
      },
      exit: (exitCode, signal) => {
        status = { exitCode, signal };
        onExit?.(status);
      },
      broken: (err) => {
        broken = err;
        onExit?.({ exitCode: null, signal: SIGKILL });
      },
    };
    // At the output limit the command is stopped as a closed pipe would stop it (SIGPIPE),
    // instead of running on with its output thrown away.
    let started_: GuestProc | null = null;
    let limitHit = false;
    function overLimit(): void {
      if (limitHit) return;
      limitHit = true;
      started_?.kill(SIGPIPE);
    }
    let proc: GuestProc;
    try {
      proc = await this.start(req, sink);
    } catch (err) {
      if (err instanceof GuestNotFound) return { exitCode: 127, signal: null, stdout: '', stderr: `warren: ${err.name_}: command not found\n`, status: 'error', durationMs: performance.now() - started, truncated: false };
      throw err;
    }
    started_ = proc;
    if (limitHit) proc.kill(SIGPIPE);
    if (req.stdin !== undefined && req.stdin.length > 0) proc.stdin(typeof req.stdin === 'string' ? Buffer.from(req.stdin) : req.stdin);
    proc.stdinEnd();
    let timedOut = false;
    let grace: NodeJS.Timeout | null = null;
    const timer =
      req.timeoutMs !== undefined
        ? setTimeout(() => {
            timedOut = true;
            proc.kill(SIGKILL);
            // The kill is carried out by the guest; one that does not report the exit in the grace
            // period is past answering, and the caller gets the timeout without the exit status.
            grace = setTimeout(() => onExit?.({ exitCode: null, signal: null }), GUEST_KILL_GRACE_MS);
          }, req.timeoutMs)
        : null;
    const st = await new Promise<{ exitCode: number | null; signal: number | null }>((resolve) => {
      if (status) resolve(status);
      else onExit = resolve;
    });
    if (timer) clearTimeout(timer);
    if (grace) clearTimeout(grace);
    // Output may still be in flight behind the exit, or held open by background children: wait a little.
    if (eof < 2) await new Promise<void>((r) => ((onEof = r), setTimeout(r, 50)));
    proc.done();
    stdout.stop();
    stderr.stop();
    if (broken) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${this.id}: the guest went away during the command (${(broken as Error).message})`);
    let execStatus: ExecStatus = st.exitCode === 0 ? 'ok' : 'error';
    if (timedOut) execStatus = 'timeout';
    else if (st.signal !== null) execStatus = st.signal === SIGKILL && (await this.guestOomKills()) > 0 ? 'oom' : 'killed';
    return { exitCode: st.exitCode, signal: st.signal, stdout: stdout.text(), stderr: stderr.text(), status: execStatus, durationMs: Math.round((performance.now() - started) * 1000) / 1000, truncated: stdout.truncated || stderr.truncated };
  }

  /** OOM kills inside the guest so far (its /proc/vmstat). */
  private async guestOomKills(): Promise<number> {
    try {
      const text = (await this.files.readFile('/proc/vmstat', 64 * 1024)).toString();
      return Number(/^oom_kill (\d+)$/m.exec(text)?.[1] ?? 0);
    } catch {
      return 0;
    }
  }

  async execStream(req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream> {
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const stdin = new PassThrough();
    let resolveExit!: (s: { exitCode: number | null; signal: number | null }) => void;
    const exited = new Promise<{ exitCode: number | null; signal: number | null }>((r) => (resolveExit = r));
    let proc: GuestProc | null = null;
    const sink: ProcSink = {
      out: (stream, data) => {
        const s = stream === 1 ? stdout : stderr;
        if (data.length === 0) return void s.end();
        // A consumer that does not read cannot make the shim buffer a guest's output without bound.
        if (s.readableLength > STREAM_BUFFER_LIMIT) {
          proc?.kill(SIGKILL);
          s.destroy(new WarrenError('RESOURCE_EXHAUSTED', 'stream output not consumed; the command was killed'));
          return;
        }
        if (!s.destroyed) s.write(Buffer.from(data));
      },
      exit: (exitCode, signal) => {
        setTimeout(() => {
          stdout.end();
          stderr.end();
          proc?.done();
        }, 50);
        resolveExit({ exitCode, signal });
      },
      broken: () => {
        stdout.end();
        stderr.end();
        resolveExit({ exitCode: null, signal: SIGKILL });
      },
    };
    proc = await this.start(req, sink);
    const p = proc;
    stdin.on('data', (c: Buffer) => p.stdin(c));
    stdin.on('end', () => p.stdinEnd());
    const timer = req.timeoutMs !== undefined ? setTimeout(() => p.kill(SIGKILL), req.timeoutMs) : null;
    void exited.then(() => timer && clearTimeout(timer));
    return { pid: 0, stdin, stdout, stderr, exited, kill: (signal = SIGKILL) => p.kill(signal) };
  }

  async stats(): Promise<SandboxStats> {
    const s = native.cgroupStats(this.id);
    return { memoryCurrentBytes: s.memoryCurrentBytes, memoryPeakBytes: s.memoryPeakBytes, oomKills: s.oomKills, cpuUsageUs: s.cpuUsageUs, pidsCurrent: s.pidsCurrent };
  }

  // ---------------------------------------------------------------- pause = snapshot to disk + end the VMM

  private async suspend(): Promise<PauseReportCore> {
    this.client();
    const started = performance.now();
    const before = native.cgroupStats(this.id).memoryCurrentBytes;
    const file = join(this.runtime.dir, 'snapshot');
    const files = await this.backend.driver.control.save(this.runtime.runDir, { host: file, vmm: this.backend.inJail(file) }, { namedRam: this.runtime.namedRam === true });
    this.suspended = true;
    this.agent?.close();
    this.agent = null;
    // What ending the VMM gives back: the resident memory of its processes (guest RAM, TCG cache, QEMU).
    const vmmRss = treeRss(this.runtime.vmmPid);
    await killAndWait(this.runtime.vmmPid);
    this.backend.driver.control.forget(this.runtime.runDir);
    // The snapshot's page cache was charged to the sandbox's cgroup (the VMM wrote it): flush it to disk and drop it.
    for (const f of [...files, join(this.runtime.dir, 'disk.img')]) {
      await run('dd', ['if=/dev/null', `of=${f}`, 'oflag=nocache', 'conv=notrunc,fdatasync', 'count=0'], { timeout: 120_000 }).catch(() => undefined);
    }
    this.runtime.snapshot = file;
    const after = native.cgroupStats(this.id).memoryCurrentBytes;
    const written = files.reduce((sum, f) => sum + statSync(f).size, 0);
    return {
      memoryBeforeBytes: before,
      memoryAfterBytes: after,
      releasedBytes: Math.max(vmmRss, before - after),
      swapBytes: null,
      reclaim: 'snapshot',
      writtenBytes: written,
      durationMs: Math.round(performance.now() - started),
      keep: { snapshot: file },
    };
  }

  private async restore(): Promise<void> {
    if (!this.suspended) return;
    const file = this.runtime.snapshot;
    if (file === undefined || !existsSync(file)) throw new WarrenError('INTERNAL', `sandbox ${this.id} is paused without a snapshot`);
    const pid = await this.backend.launch(this.id, this.runtime, this.spec.priority === 'idle', { incoming: { file, shared: false } });
    try {
      await this.backend.driver.control.resumeIncoming(this.runtime.runDir, this.backend.inJail(file));
      this.suspended = false;
      this.watch(pid);
      await this.connect(30_000);
      this.setClock();
    } catch (err) {
      this.suspended = true;
      await killAndWait(pid);
      this.backend.driver.control.forget(this.runtime.runDir);
      throw err;
    }
    delete this.runtime.snapshot;
    // a driver may have written more than the one file (Firecracker: the guest memory beside its state)
    await rm(file, { force: true });
    await rm(`${file}.mem`, { force: true });
  }

  destroy(): Promise<void> {
    if (this.destroyed === null) this.destroyed = this.doDestroy();
    return this.destroyed;
  }

  private async doDestroy(): Promise<void> {
    this.alive = false;
    if (live.get(this.id) === this) live.delete(this.id);
    this.agent?.close();
    this.watchedPid = 0;
    if (!this.suspended) await killAndWait(this.runtime.vmmPid);
    this.backend.driver.control.forget(this.runtime.runDir);
    await destroyCgroup(this.id).catch((err) => {
      if (native.cgroupExists(this.id)) throw err;
    });
    await this.backend.tearDownNetwork(this.id, this.runtime.network);
    await rm(this.runtime.dir, { recursive: true, force: true });
    await rm(this.runtime.runDir, { recursive: true, force: true });
    this.endedResolve();
  }
}

class GuestNotFound extends Error {
  constructor(readonly name_: string) {
    super(`${name_}: not found`);
  }
}

interface ProcSink {
  out(stream: 1 | 2, data: Buffer): void;
  exit(exitCode: number | null, signal: number | null): void;
  broken(err: Error): void;
}

interface GuestProc {
  chan: number;
  stdin(data: Buffer): void;
  stdinEnd(): void;
  kill(signal: number): void;
  done(): void;
}

/** The files facet over the agent: paths are resolved by the guest inside its root; what comes back is bounded. */
class AgentFiles implements FilesFacet {
  /** `creds`: the identity requests run with in the guest (null: guest root). */
  constructor(
    private readonly client: () => AgentClient,
    private readonly creds: (() => Promise<{ uid: number; gid: number }>) | null,
  ) {}

  /** The request built by `make`, wrapped to run as the sandbox's user when there is one. */
  private async frame(make: (chan: number) => Buffer): Promise<(chan: number) => Buffer> {
    if (this.creds === null) return make;
    const { uid, gid } = await this.creds();
    if (uid === 0 && gid === 0) return make;
    return (c) => encodeAs(c, uid, gid, make(c));
  }

  async readFile(path: string, maxBytes: number): Promise<Buffer> {
    checkPath(path);
    const { data } = await this.client().request(await this.frame((c) => encodeRead(c, path, maxBytes)), `read ${path}`, { timeoutMs: 60_000, maxData: maxBytes });
    return data;
  }

  async writeFile(path: string, data: Buffer, mode: number): Promise<void> {
    checkPath(path);
    const client = this.client();
    const chunk = MAX_AGENT_PAYLOAD - AS_OVERHEAD - 8 - Buffer.byteLength(path) - 1;
    let off = 0;
    do {
      const part = data.subarray(off, off + chunk);
      const first = off === 0;
      await client.request(await this.frame((c) => encodeWrite(c, path, mode, first, part)), `write ${path}`, { timeoutMs: 60_000 });
      off += part.length;
    } while (off < data.length);
  }

  async listDir(path: string): Promise<FileEntry[]> {
    checkPath(path);
    const { ok } = await this.client().request(await this.frame((c) => encodeFrame(AgentType.LIST, c, cstrings([path]))), `list ${path}`, { timeoutMs: 60_000 });
    const out: FileEntry[] = [];
    for (const line of ok.toString('utf8').split('\n')) {
      const m = /^([fdlo])\t([0-7]{1,5})\t(\d{1,20})\t(-?\d{1,20})\t([^\n/]{1,255})$/.exec(line);
      if (!m) continue;
      const type = ({ f: 'file', d: 'dir', l: 'symlink', o: 'other' } as const)[m[1] as 'f' | 'd' | 'l' | 'o'];
      out.push({ name: m[5]!, type, size: Number(m[3]), mode: parseInt(m[2]!, 8), mtime: new Date(Number(m[4]) * 1000).toISOString() });
    }
    return out;
  }

  async mkdirs(path: string, mode: number): Promise<void> {
    checkPath(path);
    await this.client().request(await this.frame((c) => encodeMkdirs(c, path, mode)), `mkdir ${path}`, { timeoutMs: 60_000 });
  }

  async kind(path: string): Promise<'file' | 'dir' | 'other'> {
    checkPath(path);
    const { ok } = await this.client().request(await this.frame((c) => encodeFrame(AgentType.KIND, c, cstrings([path]))), `stat ${path}`, { timeoutMs: 60_000 });
    const k = ok.toString('latin1');
    return k === 'd' ? 'dir' : k === 'f' ? 'file' : 'other';
  }
}

function checkPath(path: string): void {
  if (typeof path !== 'string' || path.length === 0 || Buffer.byteLength(path) > 4000 || path.includes('\0')) throw new WarrenError('INVALID_ARGUMENT', 'paths are non-empty strings of at most 4000 bytes without NUL');
}
