/**
 * VMM drivers: how a microVM's virtual machine monitor is started, how the
 * host reaches its guest, and how the VM is saved to disk and restored. QEMU
 * (its `microvm` machine here, `q35` for full VMs in ../vm/qemu.ts) is driven
 * over QMP with virtio-serial ports; Firecracker (firecracker.ts) over its
 * HTTP API with a hybrid vsock.
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import type net from 'node:net';
import { dirname, join } from 'node:path';
import { WarrenError } from '../../../errors';
import { feature } from '../../../features';
import { unixDial } from './agent-client';
import { Qmp } from './qmp';

export interface VmDisk {
  id: string;
  file: string;
  readOnly: boolean;
  /** What the guest's /init finds the disk by (virtio-blk serial). */
  serial: string;
}

export interface VmLaunch {
  id: string;
  /** The VM's run dir: its sockets (and a driver's own files) live here. */
  runDir: string;
  accel: 'kvm' | 'tcg';
  kernel: string;
  initrd: string;
  cmdline: string;
  vcpus: number;
  memoryMb: number;
  disks: VmDisk[];
  agentSocket: string;
  /** One virtio port per shell-session slot ("warren.session.N"), served at these sockets. */
  sessionSockets: string[];
  qmpSocket: string;
  /** Restore from this snapshot file instead of booting ('defer': the caller starts the restore over QMP). */
  incoming?: string;
  /**
   * Guest RAM as a named memory backend ("mem"), for templates and what is restored from them:
   *   - `file` + `share: true`: a template's guest writes its RAM into the file, which its snapshot
   *     then leaves out (x-ignore-shared);
   *   - `file` + `share: false`: a private (copy-on-write) mapping of a template's RAM: every microVM
   *     restored from it shares the pages it has not written;
   *   - no file: anonymous RAM under the same name (the resume of a VM that began as a template's).
   * Absent: QEMU's default anonymous RAM.
   */
  ram?: { file?: string; share?: boolean };
  /** An fd the VMM inherits as its fd 3 (a template's sealed RAM: `ram.file` is then /proc/self/fd/3). */
  passFd?: number;
  /** Run the VMM without transparent huge pages (through this wrapper: warren-vmm-exec). */
  noHugePages?: string;
  logFile: string;
  /** A template for microVMs with a NIC: the same NIC device, on a backend that reaches nothing. */
  templateNic?: boolean;
  /** A NIC on the tap `tap` of the sandbox's network namespace (the VMM runs in that namespace). */
  net?: { netnsPath: string; tap: string; mac: string };
  /** Confine the VMM (see spawnVmm); absent: it runs as root in the host's namespaces. */
  jail?: VmJail;
}

/**
 * How the VMM is confined, like Firecracker's jailer: its own mount, pid,
 * network, ipc and uts namespaces (a fresh /proc: no host processes), every
 * other sandbox's run dir and data dir hidden under empty tmpfs (only its
 * own are bound back), and QEMU drops to an unprivileged user once it has
 * opened its disks (`-runas`), on top of its seccomp filter.
 */
export interface VmJail {
  /** Its own run dir and data dir (bound back over the hidden parents). */
  runDir: string;
  dataDir: string;
  /** Hidden by empty tmpfs: the node's run dir (every sandbox's sockets, session holders) and its
   *  data dir (registry, other sandboxes' disks); only its own dirs and its layer files come back. */
  runRoot: string;
  dataRoot: string;
  /** Read-only files (the layers) bound back at their own paths. */
  files: string[];
  /** Mount point outside both, with traversable parents (created by the caller): the VMM reaches its
   *  own data dir as <stash>/data once it runs unprivileged (the real parents may be root-only). */
  stash: string;
  /** Unprivileged user QEMU runs as after start-up (null: stays root). */
  user: string | null;
}

/** How the host reaches the guest agent and the shell sessions' servers. */
export type GuestChannel =
  /** One virtio-serial port each ("warren.agent", "warren.session.N"), served by the VMM at unix sockets of the run dir. */
  | { kind: 'virtio-serial' }
  /** Guest vsock ports, reached through the VMM's unix socket `v.sock` of the run dir ("CONNECT <port>"). */
  | { kind: 'vsock'; agentPort: number; firstSessionPort: number };

/** What a sandbox asks of its running VMM: everything that differs between VMMs once one runs. */
export interface VmmControl {
  /**
   * Stop the guest and write it (memory and devices) to `file`: `host` as this process names it,
   * `vmm` as the (jailed) VMM does. `namedRam`: the VM was restored from a template, whose RAM its
   * own snapshot must now hold. Returns the host paths written. On failure the guest runs on.
   */
  save(runDir: string, file: { host: string; vmm: string }, o: { namedRam: boolean }): Promise<string[]>;
  /** A VMM launched with `incoming` (the VM's own snapshot, `vmmFile`): wait until it is loaded and let the guest run. */
  resumeIncoming(runDir: string, vmmFile: string): Promise<void>;
  /** The last lines of the guest console, printable only ('' when there is nothing to read). */
  consoleTail(runDir: string): Promise<string>;
  /** One connection to the guest agent (the caller retries until the agent answers). */
  dialAgent(runDir: string): Promise<net.Socket>;
  /** The VMM of `runDir` ended or is being ended: let go of what this process holds for it. */
  forget(runDir: string): void;
}

export interface VmmDriver {
  readonly name: 'qemu-microvm' | 'qemu-q35' | 'firecracker';
  status(): { available: boolean; reason?: string };
  command(l: VmLaunch): { bin: string; args: string[] };
  /** Runs before the VMM starts (Firecracker: its configuration file and console). */
  prepare?(l: VmLaunch): Promise<void>;
  /** Whether the VMM can restore templates (QEMU's migration with shared RAM, see template.ts). */
  readonly templates: boolean;
  readonly channel: GuestChannel;
  readonly control: VmmControl;
}

/** The NIC MAC a template boots with; a microVM restored from it sets its own before the NIC comes up. */
export const TEMPLATE_MAC = '02:00:00:00:00:01';

/** QEMU option values are comma-separated: a comma in a path would be parsed as an option. */
export function optPath(p: string): string {
  if (/[,\n]/.test(p)) throw new WarrenError('INVALID_ARGUMENT', `path ${JSON.stringify(p)} contains a comma or newline (not passable to QEMU)`);
  return p;
}

/**
 * What every QEMU that Warren starts gets, whatever its machine: a name, the accelerator (a
 * TCG translation cache of `tbSizeMb`), memory and vCPUs, nothing by default, QEMU's seccomp
 * filter, the direct kernel boot, and a bounded console.
 */
export function qemuBaseArgs(l: VmLaunch, machine: 'microvm' | 'q35', tbSizeMb: number): string[] {
  return [
    '-name', `warren-${l.id}`,
    '-M', machine,
    '-accel', l.accel === 'kvm' ? 'kvm' : `tcg,tb-size=${tbSizeMb}`,
    ...(l.accel === 'kvm' ? ['-cpu', 'host'] : []),
    '-m', `${l.memoryMb}M`,
    ...(l.ram === undefined
      ? []
      : [
          '-object',
          l.ram.file === undefined ? `memory-backend-ram,id=mem,size=${l.memoryMb}M` : `memory-backend-file,id=mem,size=${l.memoryMb}M,mem-path=${optPath(l.ram.file)},share=${l.ram.share ? 'on' : 'off'}`,
          '-machine',
          'memory-backend=mem',
        ]),
    '-smp', String(l.vcpus),
    '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot',
    // QEMU's own seccomp filter: no obsolete syscalls, no resource-control syscalls; spawning stays
    // allowed because pause saves the VM through `exec:cat`. QEMU 7.2 installs the filter before
    // `-runas` drops to the VMM user, so set*id stays allowed when it drops (once unprivileged it
    // cannot gain anything back); without the drop they are denied.
    '-sandbox', `on,obsolete=deny,elevateprivileges=${l.jail?.user ? 'allow' : 'deny'},spawn=allow,resourcecontrol=deny`,
    '-kernel', optPath(l.kernel),
    '-initrd', optPath(l.initrd),
    '-append', l.cmdline,
    // The console is a bounded ring inside QEMU (read over QMP when a boot fails): a guest writing to it forever costs 64 KiB.
    '-chardev', 'ringbuf,id=con,size=65536',
    '-serial', 'chardev:con',
  ];
}

/** The guest agent's and the sessions' virtio-serial ports on `serialDevice`, and QMP. */
export function qemuChannelArgs(l: VmLaunch, serialDevice: 'virtio-serial-device' | 'virtio-serial-pci'): string[] {
  return [
    '-device', `${serialDevice},id=vser0`,
    '-chardev', `socket,id=agent,path=${optPath(l.agentSocket)},server=on,wait=off`,
    '-device', 'virtserialport,bus=vser0.0,chardev=agent,name=warren.agent',
    ...l.sessionSockets.flatMap((sock, i) => ['-chardev', `socket,id=s${i},path=${optPath(sock)},server=on,wait=off`, '-device', `virtserialport,bus=vser0.0,chardev=s${i},name=warren.session.${i}`]),
    '-qmp', `unix:${optPath(l.qmpSocket)},server=on,wait=off`,
  ];
}

/** Last: the snapshot to restore from, and the drop to the VMM user. */
export function qemuFinalArgs(l: VmLaunch): string[] {
  const incoming = l.incoming === undefined ? [] : ['-incoming', l.incoming === 'defer' ? 'defer' : `exec:cat ${shellWord(l.incoming)}`];
  return [...incoming, ...(l.jail?.user ? ['-runas', l.jail.user] : [])];
}

/** Save the stopped VM through QEMU's `exec:` migration into `file` (a path the VMM can write). */
export async function qemuSaveVm(q: Qmp, file: string): Promise<void> {
  await q.execute('migrate', { uri: `exec:cat > ${shellWord(file)}` });
  const deadline = Date.now() + 300_000;
  for (;;) {
    const st = (await q.execute('query-migrate')) as { status?: string; 'error-desc'?: string };
    if (st.status === 'completed') return;
    if (st.status === 'failed' || st.status === 'cancelled') throw new WarrenError('INTERNAL', `saving the VM failed: ${String(st['error-desc'] ?? st.status).slice(0, 300)}`);
    if (Date.now() > deadline) throw new WarrenError('TIMEOUT', 'saving the VM took longer than 300 s');
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Wait until a VMM started with `-incoming` has loaded its snapshot (it is then paused). */
export async function qemuAwaitIncoming(q: Qmp): Promise<void> {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const st = (await q.execute('query-status')) as { status?: string };
    if (st.status === 'paused' || st.status === 'postmigrate' || st.status === 'prelaunch') {
      const mig = (await q.execute('query-migrate')) as { status?: string; 'error-desc'?: string };
      if (mig.status === 'completed' || mig.status === undefined) return;
      if (mig.status === 'failed') throw new WarrenError('INTERNAL', `restoring the VM failed: ${String(mig['error-desc'] ?? 'failed').slice(0, 300)}`);
    }
    if (st.status === 'running') return;
    if (Date.now() > deadline) throw new WarrenError('TIMEOUT', 'restoring the VM took longer than 120 s');
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** The last lines of the guest console (QEMU's ring buffer, read over QMP at `qmpSocket`). */
export async function qemuConsoleTail(qmpSocket: string): Promise<string> {
  try {
    const q = await Qmp.connect(qmpSocket, 2000);
    try {
      const text = String(await q.execute('ringbuf-read', { device: 'con', size: 65536, format: 'utf8' }, 2000));
      return text.replace(/[^\x20-\x7e\n]/g, '').trim().split('\n').slice(-8).join(' | ').slice(-1500);
    } finally {
      q.close();
    }
  } catch {
    return '';
  }
}

/** QEMU, driven over QMP at `<runDir>/qmp.sock`, its guest reached over virtio-serial ports. */
export const qemuControl: VmmControl = {
  async save(runDir, file, o) {
    const q = await Qmp.connect(join(runDir, 'qmp.sock'));
    try {
      await q.execute('stop');
      try {
        // a VM restored from a template was told its RAM is someone else's; its own snapshot holds all of it
        if (o.namedRam) await q.execute('migrate-set-capabilities', { capabilities: [{ capability: 'x-ignore-shared', state: false }] });
        await qemuSaveVm(q, file.vmm);
      } catch (err) {
        await q.execute('cont').catch(() => undefined);
        throw err;
      }
    } finally {
      q.close();
    }
    return [file.host];
  },
  async resumeIncoming(runDir) {
    const q = await Qmp.connect(join(runDir, 'qmp.sock'), 30_000);
    try {
      await qemuAwaitIncoming(q);
      await q.execute('cont');
    } finally {
      q.close();
    }
  },
  consoleTail: (runDir) => qemuConsoleTail(join(runDir, 'qmp.sock')),
  dialAgent: (runDir) => unixDial(join(runDir, 'agent.sock')),
  forget: () => undefined,
};

export const qemuMicrovm: VmmDriver = {
  name: 'qemu-microvm',
  templates: true,
  channel: { kind: 'virtio-serial' },
  control: qemuControl,
  status: () => (feature('qemu').supported ? { available: true } : { available: false, reason: feature('qemu').reason ?? 'no qemu' }),
  command(l) {
    // ACPI stays on: this kernel has no VIRTIO_MMIO_CMDLINE_DEVICES, so ACPI is how it finds the virtio-mmio devices.
    // A 16 MiB translation cache: every idle TCG guest keeps it resident (a restored one fills it within
    // seconds), and 32 MiB made it a third of an idle restored guest's host memory.
    const args = qemuBaseArgs(l, 'microvm', 16);
    for (const d of l.disks) {
      // No image locking: QEMU re-opens images by path to change lock modes (at the end of a migration),
      // which the unprivileged, jailed VMM cannot do for the root-only layer store. Each VM has its own
      // writable disk and the layers are read-only, so there is nothing for the locks to protect.
      args.push('-drive', `id=${d.id},file=${optPath(d.file)},format=raw,if=none,file.locking=off${d.readOnly ? ',readonly=on' : ',discard=unmap'}`);
      args.push('-device', `virtio-blk-device,drive=${d.id},serial=${d.serial}`);
    }
    args.push(...qemuChannelArgs(l, 'virtio-serial-device'));
    if (l.net !== undefined) {
      if (!/^[a-z0-9]{1,15}$/.test(l.net.tap) || !/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/.test(l.net.mac)) throw new WarrenError('INVALID_ARGUMENT', `bad tap ${JSON.stringify(l.net)}`);
      // userspace virtio-net: vhost-net is not needed (and absent on some hosts, where vhost=on aborts QEMU)
      args.push('-netdev', `tap,id=n0,ifname=${l.net.tap},script=no,downscript=no,vhost=off`, '-device', `virtio-net-device,netdev=n0,mac=${l.net.mac}`);
    } else if (l.templateNic) {
      // the same device as a sandbox's NIC, on a backend that reaches nothing: a restore attaches the sandbox's tap
      args.push('-netdev', 'hubport,id=n0,hubid=0', '-device', `virtio-net-device,netdev=n0,mac=${TEMPLATE_MAC}`);
    }
    args.push(...qemuFinalArgs(l));
    return { bin: 'qemu-system-x86_64', args };
  },
};

/** Runs inside the new namespaces, before the VMM: hide everything but this VM's own dirs. */
function jailScript(j: VmJail): string {
  for (const p of [j.runDir, j.dataDir, j.runRoot, j.dataRoot, j.stash, ...j.files]) shellWord(p);
  return [
    'set -e',
    'mount --make-rprivate /',
    // the stash stays: its path (under /run, traversable) is how the unprivileged VMM reaches its own dir
    `mount -t tmpfs -o mode=0755 warren-jail ${j.stash}`,
    `mkdir ${j.stash}/run ${j.stash}/data`,
    `mount --bind ${j.runDir} ${j.stash}/run`,
    `mount --bind ${j.dataDir} ${j.stash}/data`,
    ...j.files.flatMap((f, i) => [`touch ${j.stash}/f${i}`, `mount --bind ${f} ${j.stash}/f${i}`]),
    `mount -t tmpfs -o mode=0755 warren-jail ${j.runRoot}`,
    `mkdir -p ${j.runDir} && mount --bind ${j.stash}/run ${j.runDir}`,
    `mount -t tmpfs -o mode=0755 warren-jail ${j.dataRoot}`,
    `mkdir -p ${j.dataDir} && mount --bind ${j.stash}/data ${j.dataDir}`,
    ...j.files.flatMap((f, i) => [`mkdir -p ${dirname(f)} && touch ${f} && mount --bind ${j.stash}/f${i} ${f}`]),
    'exec "$@"',
  ].join('\n');
}

export function shellWord(p: string): string {
  if (!/^[A-Za-z0-9_./-]+$/.test(p)) throw new WarrenError('INVALID_ARGUMENT', `snapshot path ${JSON.stringify(p)} has characters a shell would interpret`);
  return p;
}

export interface VmmProcess {
  pid: number;
  /** Let the VMM run (it waits until it is in its cgroup and has its scheduling policy). */
  release(): void;
}

/**
 * Start the VMM held at a gate: a shell that waits for one line on its stdin
 * and then execs the VMM. In between, the caller moves it into the sandbox's
 * cgroup and sets its scheduling policy, so every byte and thread the VMM ever
 * has is counted there.
 */
export function spawnVmm(driver: VmmDriver, l: VmLaunch, logFd: number): VmmProcess {
  const cmd = driver.command(l);
  const { bin, args } = l.noHugePages === undefined ? cmd : { bin: l.noHugePages, args: ['--', cmd.bin, ...cmd.args] };
  // With a NIC the VMM lives in the sandbox's network namespace (where its tap is; its own sockets there
  // would meet the sandbox's cgroup programs), else in a namespace of its own with nothing in it.
  const netns = l.net !== undefined ? ['nsenter', `--net=${shellWord(l.net.netnsPath)}`] : [];
  const argv = l.jail
    ? [...netns, 'unshare', '--mount', '--ipc', '--uts', ...(l.net === undefined ? ['--net'] : []), '--pid', '--fork', '--kill-child', '--mount-proc', '/bin/sh', '-c', jailScript(l.jail), 'warren-jail', bin, ...args]
    : [...netns, bin, ...args];
  const child = spawn('/bin/sh', ['-c', 'read -r _ || exit 1; exec "$@"', 'warren-vmm', ...argv], {
    detached: true,
    stdio: l.passFd === undefined ? ['pipe', 'ignore', logFd] : ['pipe', 'ignore', logFd, l.passFd],
  });
  if (child.pid === undefined) throw new WarrenError('SPAWN_ERROR', `cannot start ${bin}`);
  child.unref();
  child.on('error', () => undefined);
  child.stdin!.on('error', () => undefined);
  return {
    pid: child.pid,
    release: () => {
      child.stdin!.end('go\n');
    },
  };
}

/** The unprivileged user jailed VMMs run as (scripts/setup.sh creates it); null when absent. */
export function vmmUser(): string | null {
  return vmmUserIds() === null ? null : VMM_USER;
}

const VMM_USER = 'warren-vmm';
let vmmIds: { uid: number; gid: number } | null | undefined;
export function vmmUserIds(): { uid: number; gid: number } | null {
  if (vmmIds !== undefined) return vmmIds;
  try {
    const line = readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith(`${VMM_USER}:`));
    const f = line?.split(':');
    vmmIds = f && f.length >= 4 ? { uid: Number(f[2]), gid: Number(f[3]) } : null;
  } catch {
    vmmIds = null;
  }
  return vmmIds;
}

/** The host TSC frequency, for the guest's tsc_early_khz (TCG guests otherwise sometimes hang calibrating against a PIT they do not have). */
export function hostTscKhz(): number | null {
  try {
    const mhz = /^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1];
    return mhz === undefined ? null : Math.round(Number(mhz) * 1000);
  } catch {
    return null;
  }
}
