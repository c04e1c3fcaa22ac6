/**
 * The vm backend: a whole OS with a screen, for GUI and computer-use agents.
 * Every sandbox is a QEMU q35 machine (KVM where the host can run it, TCG
 * elsewhere; features.ts decides and /v1/features reports it) booting the
 * desktop image (vm/image.ts: Debian, Xorg, twm, xterm) through its own
 * qcow2 overlay of `diskMb` over the read-only base, with vCPUs and memory
 * from the request. The guest agent, the jailed VMM (its own namespaces,
 * QEMU's seccomp filter, the warren-vmm user, the sandbox's cgroup), exec,
 * files, shell sessions and pause-as-snapshot are the microVM backend's
 * (microvm/backend.ts), reused as they are. On top: the display facet
 * (vm/display.ts): screenshots, keyboard and pointer input, and VNC.
 *
 * Host side, per sandbox:
 *   <dataDir>/vm/<id>/disk.img    the qcow2 overlay (backing file: the base image)
 *   <dataDir>/vm/<id>/snapshot    paused VM (memory and devices), while paused
 *   /run/warren/fullvm/<id>/{agent,qmp,display,vnc,sN}.sock
 *   cgroup <id>                   the VMM
 */
import { execFile } from 'node:child_process';
import { chownSync, existsSync, mkdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { WarrenError } from '../../errors';
import { vmAccelerator } from '../../features';
import { native } from '../../native';
import { profile as policyProfile, profileForOwner } from '../../security/confinement';
import type { Backend, BackendSandbox, ExecRequest, FacetName, FacetStatus, ResolvedLayer, SandboxRecord, SandboxSpec } from '../types';
import { MicroVMSandbox, SESSION_SLOTS, type MicroVMRuntime, inJail, killAndWait, launchVmm, readTail, vmLeftovers, vmmUser, vmmUserIds } from './microvm/backend';
import { destroyCgroup } from './cgroup';
import { Qmp } from './microvm/qmp';
import { hostTscKhz } from './microvm/vmm';
import { VmDisplay } from './vm/display';
import { type DesktopImage, desktopImage } from './vm/image';
import { type Q35Launch, qemuQ35 } from './vm/qemu';

const run = promisify(execFile);
const MIB = 1024 * 1024;
const CPU_PERIOD_US = 100_000;
/** Xorg, twm and a terminal on top of the kernel. */
export const MIN_VM_MB = 256;
/** QEMU's own memory on top of guest RAM: TCG translation cache (64 MiB), video memory (16 MiB), binary, heap, I/O. */
const VMM_OVERHEAD_MB = 256;
export const DEFAULT_SCREEN = { width: 1024, height: 768 };

export interface VmRuntime extends MicroVMRuntime {
  base: string;
  screen: { width: number; height: number };
}

export interface VmBackendOptions {
  dataDir: string;
  runRoot?: string;
  bootTimeoutMs?: number;
  screen?: { width: number; height: number };
  log?: (line: string) => void;
}

export class VmBackend implements Backend {
  readonly name = 'vm' as const;
  readonly driver = qemuQ35;
  private readonly dir: string;
  private readonly runRoot: string;
  private readonly stash: string;
  private readonly screen: { width: number; height: number };
  private readonly live = new Map<string, VmSandbox>();

  constructor(private readonly opts: VmBackendOptions) {
    this.dir = join(opts.dataDir, 'vm');
    this.runRoot = opts.runRoot ?? '/run/warren/fullvm';
    this.screen = opts.screen ?? DEFAULT_SCREEN;
    if (this.screen.width < 320 || this.screen.height < 200 || this.screen.width > 3840 || this.screen.height > 2160) throw new WarrenError('INVALID_ARGUMENT', 'vm screens are 320x200 to 3840x2160');
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    mkdirSync(this.runRoot, { recursive: true, mode: 0o700 });
    this.stash = opts.runRoot === undefined ? '/run/warren-fullvm-jail' : `${this.runRoot}-jail`;
    mkdirSync(this.stash, { recursive: true, mode: 0o700 });
  }

  get facets(): Record<FacetName, FacetStatus> {
    return {
      files: { offered: true, how: 'through the guest agent, resolved inside the guest root (openat2 RESOLVE_IN_ROOT)' },
      sessions: { offered: true, how: `warren-session holder running warren-vmshell, bridged to one of ${SESSION_SLOTS} virtio session ports` },
      freeze: { offered: true, how: 'the VM (memory, devices, screen) is saved to disk and the VMM ends; resume restores it' },
      snapshot: { offered: false, reason: 'pause already writes the whole VM to disk and ends the VMM; hibernate is pause here' },
      export: { offered: false, reason: "a vm's disk is a qcow2 overlay of a whole OS image, not an overlay upper dir that pack could publish as a layer" },
      network: { offered: false, reason: 'vm networking (tap on the node bridge with host-side egress policy) is not implemented yet' },
    };
  }

  /** The image this node boots (built on first use). */
  image(): Promise<DesktopImage> {
    return desktopImage(this.opts.log);
  }

  /**
   * Boots the desktop image. The sandbox's `image` and layers are the
   * layer-based backends' root filesystems; a vm's root is its disk image, so
   * they are not attached.
   */
  async create(id: string, spec: SandboxSpec, _layers: ResolvedLayer[]): Promise<BackendSandbox> {
    if (spec.network !== undefined) throw new WarrenError('NOT_SUPPORTED', `the vm backend does not offer network: ${(this.facets.network as { reason: string }).reason}`, { field: 'network', facet: 'network' });
    if (spec.memoryMb < MIN_VM_MB) throw new WarrenError('LIMIT_OUT_OF_RANGE', `vms need memoryMb >= ${MIN_VM_MB} (a desktop does not run in less)`, { field: 'memoryMb', min: MIN_VM_MB });
    const image = await this.image();
    const diskMb = spec.diskMb ?? policyProfile(profileForOwner(spec.owner)).limits.diskMb ?? 2048;
    if (diskMb < image.baseMb) throw new WarrenError('LIMIT_OUT_OF_RANGE', `vms need diskMb >= ${image.baseMb} (the size of the desktop image)`, { field: 'diskMb', min: image.baseMb });
    const dir = join(this.dir, id);
    const runDir = join(this.runRoot, id);
    const accel = vmAccelerator().accel;
    const vcpus = Math.max(1, Math.min(Math.ceil(spec.cpu), 16));
    const runtime: VmRuntime = { vmmPid: 0, startTime: 0, dir, runDir, accel, kernel: image.kernel, initrd: image.initrd, vcpus, guestMb: spec.memoryMb, layerFiles: [], base: image.base, screen: { ...this.screen } };
    let cgroup = false;
    let pid = 0;
    let bootConsole: ConsoleWatch | null = null;
    try {
      mkdirSync(dir, { mode: 0o700 });
      mkdirSync(runDir, { mode: 0o700 });
      const user = vmmUserIds();
      if (user !== null) chownSync(dir, user.uid, user.gid);
      const disk = join(dir, 'disk.img');
      // Copy-on-write over the shared base; the guest grows its filesystem to the overlay's size at boot.
      await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', image.base, disk, `${diskMb}M`], { timeout: 60_000 });
      if (user !== null) chownSync(disk, user.uid, user.gid);
      native.cgroupCreate(id, this.limits(spec));
      cgroup = true;
      pid = await this.launch(id, runtime, spec.priority === 'idle');
      bootConsole = new ConsoleWatch(join(runDir, 'display.sock'));
      const inner = new MicroVMSandbox(id, spec, runtime, this);
      const box = new VmSandbox(inner, runtime, this);
      // TCG runs the whole desktop boot (kernel, X) in software: on a loaded host that is minutes
      const deadline = Date.now() + (this.opts.bootTimeoutMs ?? (accel === 'tcg' ? 600_000 : 180_000));
      await inner.connect(Math.max(1000, deadline - Date.now()));
      await box.desktopReady(deadline);
      await bootConsole.stop();
      this.live.set(id, box);
      return box;
    } catch (err) {
      const early = (await bootConsole?.stop()) ?? '';
      const tail = lastLines(early + (pid > 0 ? await qemuQ35.control.consoleTail(runDir) : ''));
      const vmmLog = readTail(join(dir, 'vmm.log'));
      if (pid > 0) await killAndWait(pid);
      if (cgroup) await destroyCgroup(id).catch(() => undefined);
      await rm(dir, { recursive: true, force: true }).catch(() => undefined);
      await rm(runDir, { recursive: true, force: true }).catch(() => undefined);
      if (err instanceof WarrenError && (err.code === 'TIMEOUT' || err.code === 'UNAVAILABLE')) {
        throw new WarrenError('TIMEOUT', `vm ${id} did not come up: ${err.message}${tail ? `; guest console: ${tail}` : ''}${vmmLog ? `; VMM: ${vmmLog}` : ''}`, { console: tail, vmm: vmmLog });
      }
      throw err;
    }
  }

  private limits(spec: SandboxSpec) {
    const bytes = (spec.memoryMb + VMM_OVERHEAD_MB) * MIB;
    return { cpuQuotaUs: Math.max(1000, Math.round(spec.cpu * CPU_PERIOD_US)), cpuPeriodUs: CPU_PERIOD_US, memoryBytes: bytes, memorySwapBytes: bytes, pidsMax: 128 };
  }

  /** Start the VMM (booting, or restoring the sandbox's own snapshot from a pause); returns its pid. */
  async launch(id: string, r: MicroVMRuntime, idle: boolean, o: { incoming?: { file: string; shared: boolean } } = {}): Promise<number> {
    if (o.incoming?.shared) throw new WarrenError('INTERNAL', 'the vm backend restores only its own snapshots');
    const incoming = o.incoming?.file;
    const runtime = r as VmRuntime;
    const khz = hostTscKhz();
    // no_timer_check: a TCG guest starved by a loaded host fails the kernel's IO-APIC timer check and panics
    const cmdline = ['console=ttyS0', 'panic=-1', 'quiet', 'loglevel=3', 'no_timer_check', ...(khz ? [`tsc_early_khz=${khz}`] : []), `warren.id=${id}`].join(' ');
    const sock = (n: string) => join(runtime.runDir, n);
    const sessionSockets = Array.from({ length: SESSION_SLOTS }, (_, i) => sock(`s${i}.sock`));
    for (const f of ['agent.sock', 'qmp.sock', 'display.sock', 'vnc.sock'].map(sock).concat(sessionSockets)) await rm(f, { force: true });
    const launch: Q35Launch = {
      id,
      runDir: runtime.runDir,
      accel: runtime.accel,
      kernel: runtime.kernel,
      initrd: runtime.initrd,
      cmdline,
      vcpus: runtime.vcpus,
      memoryMb: runtime.guestMb,
      disks: [],
      overlay: this.inJail(join(runtime.dir, 'disk.img')),
      screen: runtime.screen,
      agentSocket: sock('agent.sock'),
      sessionSockets,
      qmpSocket: sock('qmp.sock'),
      displayQmpSocket: sock('display.sock'),
      vncSocket: sock('vnc.sock'),
      logFile: join(runtime.dir, 'vmm.log'),
      jail: { runDir: runtime.runDir, dataDir: runtime.dir, runRoot: dirname(this.runRoot), dataRoot: this.opts.dataDir, files: [runtime.base, runtime.kernel, runtime.initrd], stash: this.stash, user: vmmUser() },
      ...(incoming !== undefined ? { incoming: this.inJail(incoming) } : {}),
    };
    return launchVmm(qemuQ35, launch, runtime, idle);
  }

  /** vms have no network (see facets): nothing to tear down. */
  async tearDownNetwork(): Promise<void> {}

  inJail(file: string): string {
    return inJail(this.stash, file);
  }

  async adopt(record: SandboxRecord): Promise<BackendSandbox | null> {
    const r = record.runtime as Partial<VmRuntime>;
    if (typeof r.dir !== 'string' || typeof r.runDir !== 'string' || typeof r.vmmPid !== 'number' || typeof r.base !== 'string' || !existsSync(r.base)) return null;
    if (!native.cgroupExists(record.id)) return null;
    if (typeof r.snapshot === 'string') {
      if (!existsSync(r.snapshot)) return null;
      const box = new VmSandbox(new MicroVMSandbox(record.id, record.spec, r as VmRuntime, this, true), r as VmRuntime, this);
      this.live.set(record.id, box);
      return box;
    }
    if (native.processStartTime(r.vmmPid) !== r.startTime || !native.cgroupProcs(record.id).includes(r.vmmPid)) return null;
    // The VM's agent port and display monitor take one connection each: a handle this process still holds gives them up.
    this.live.get(record.id)?.detach();
    const inner = new MicroVMSandbox(record.id, record.spec, r as VmRuntime, this);
    try {
      await inner.connect(10_000);
    } catch {
      return null;
    }
    const box = new VmSandbox(inner, r as VmRuntime, this);
    this.live.set(record.id, box);
    return box;
  }

  forget(id: string, box: VmSandbox): void {
    if (this.live.get(id) === box) this.live.delete(id);
  }

  leftovers(known: ReadonlySet<string>, prefix: string): string[] {
    return vmLeftovers([this.dir, this.runRoot], known, prefix);
  }

  async cleanup(id: string, record?: SandboxRecord): Promise<void> {
    const r = record?.runtime as Partial<VmRuntime> | undefined;
    if (native.cgroupExists(id)) await destroyCgroup(id);
    await rm(join(this.dir, id), { recursive: true, force: true });
    await rm(join(this.runRoot, id), { recursive: true, force: true });
    if (r?.dir) await rm(r.dir, { recursive: true, force: true });
  }
}

/** The last lines of a console, printable only. */
function lastLines(text: string): string {
  return text.replace(/[^\x20-\x7e\n]/g, '').trim().split('\n').slice(-8).join(' | ').slice(-1500);
}

/**
 * Reads the guest console while a vm boots, over the display monitor: a guest
 * that fails early powers off, and the console ring dies with its VMM, so
 * what it said is kept here (bounded) for the error.
 */
class ConsoleWatch {
  private text = '';
  private stopped = false;
  private connected = false;
  private readonly done: Promise<void>;

  constructor(socket: string) {
    this.done = this.run(socket);
  }

  private async run(socket: string): Promise<void> {
    let q: Qmp;
    try {
      q = await Qmp.connect(socket, 30_000);
    } catch {
      return;
    }
    this.connected = true;
    try {
      while (!this.stopped) {
        const chunk = String(await q.execute('ringbuf-read', { device: 'con', size: 65536, format: 'utf8' }, 5000));
        this.text = (this.text + chunk).slice(-16384);
        await new Promise((r) => setTimeout(r, 250));
      }
    } catch {
      /* the VMM went away: what was read is kept */
    } finally {
      q.close();
    }
  }

  /** Stop reading (the monitor is free again); returns what the guest printed. */
  async stop(): Promise<string> {
    this.stopped = true;
    // still connecting (the VMM may be gone already): that attempt closes itself
    if (this.connected) await this.done;
    return this.text;
  }
}

/**
 * A vm sandbox: the microVM sandbox's exec, files, sessions and pause, plus
 * the display. No export facet (see VmBackend.facets).
 */
export class VmSandbox implements BackendSandbox {
  readonly display: VmDisplay;
  readonly files: NonNullable<BackendSandbox['files']>;
  readonly sessions: NonNullable<BackendSandbox['sessions']>;
  readonly freeze: NonNullable<BackendSandbox['freeze']>;
  private paused: boolean;

  constructor(
    private readonly inner: MicroVMSandbox,
    readonly runtime: VmRuntime,
    private readonly backend: VmBackend,
  ) {
    this.paused = typeof runtime.snapshot === 'string';
    this.files = inner.files;
    this.sessions = inner.sessions;
    this.display = new VmDisplay({
      width: runtime.screen.width,
      height: runtime.screen.height,
      runDir: runtime.runDir,
      dataDir: runtime.dir,
      inJail: (f) => backend.inJail(f),
      check: () => {
        if (this.paused) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is paused`);
        if (inner.pid === undefined) throw new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${this.id} is not running`);
      },
    });
    this.freeze = {
      pause: async (limit) => {
        this.display.close();
        const report = await inner.freeze.pause(limit);
        this.paused = true;
        return report;
      },
      resume: async (limit, kept) => {
        await inner.freeze.resume(limit, kept);
        this.paused = false;
      },
    };
  }

  get id(): string {
    return this.inner.id;
  }

  get pid(): number | undefined {
    return this.inner.pid;
  }

  get ended(): Promise<void> {
    return this.inner.ended;
  }

  exec(req: ExecRequest) {
    return this.inner.exec(req);
  }

  execStream(req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>) {
    return this.inner.execStream(req);
  }

  stats() {
    return this.inner.stats();
  }

  /** Wait until the desktop shows its terminal (the guest's desktop script marks it, X maps it). */
  async desktopReady(deadline: number): Promise<void> {
    for (;;) {
      const kind = await this.files.kind('/run/warren/desktop-ready').catch((err: unknown) => {
        if (err instanceof WarrenError && err.code === 'FILE_NOT_FOUND') return null;
        throw err;
      });
      // the terminal exists once the file is there; it is on the screen once X says it is viewable
      if (kind === 'file' && (await this.exec({ cmd: 'DISPLAY=:0 xwininfo -name terminal', timeoutMs: 30_000 })).stdout.includes('IsViewable')) return;
      if (Date.now() > deadline) throw new WarrenError('TIMEOUT', 'the desktop did not come up (its terminal is not on the screen)');
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** Give up the connections (another handle adopted this VM). */
  detach(): void {
    this.display.close();
    this.inner.detachAgent();
  }

  async destroy(): Promise<void> {
    this.display.close();
    this.backend.forget(this.id, this);
    await this.inner.destroy();
  }
}
