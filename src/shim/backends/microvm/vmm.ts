/**
 * VMM drivers: how a microVM's virtual machine monitor is started. QEMU's
 * `microvm` machine is the one driven here; Firecracker sits behind the same
 * interface, detected and refused with its reason (features.ts `firecracker`).
 */
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { WarrenError } from '../../../errors';
import { feature } from '../../../features';

export interface VmDisk {
  id: string;
  file: string;
  readOnly: boolean;
  /** What the guest's /init finds the disk by (virtio-blk serial). */
  serial: string;
}

export interface VmLaunch {
  id: string;
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
  /** Restore from this snapshot file instead of booting. */
  incoming?: string;
  logFile: string;
}

export interface VmmDriver {
  readonly name: 'qemu-microvm' | 'firecracker';
  status(): { available: boolean; reason?: string };
  command(l: VmLaunch): { bin: string; args: string[] };
}

/** QEMU option values are comma-separated: a comma in a path would be parsed as an option. */
function optPath(p: string): string {
  if (/[,\n]/.test(p)) throw new WarrenError('INVALID_ARGUMENT', `path ${JSON.stringify(p)} contains a comma or newline (not passable to QEMU)`);
  return p;
}

export const qemuMicrovm: VmmDriver = {
  name: 'qemu-microvm',
  status: () => (feature('qemu').supported ? { available: true } : { available: false, reason: feature('qemu').reason ?? 'no qemu' }),
  command(l) {
    const args = [
      '-name', `warren-${l.id}`,
      // ACPI stays on: this kernel has no VIRTIO_MMIO_CMDLINE_DEVICES, so ACPI is how it finds the virtio-mmio devices.
      '-M', 'microvm',
      '-accel', l.accel === 'kvm' ? 'kvm' : 'tcg,tb-size=32',
      ...(l.accel === 'kvm' ? ['-cpu', 'host'] : []),
      '-m', `${l.memoryMb}M`,
      '-smp', String(l.vcpus),
      '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot',
      // QEMU's own seccomp filter: no obsolete syscalls, no privilege changes, no resource-control
      // syscalls; spawning stays allowed because pause saves the VM through `exec:cat`.
      '-sandbox', 'on,obsolete=deny,elevateprivileges=deny,spawn=allow,resourcecontrol=deny',
      '-kernel', optPath(l.kernel),
      '-initrd', optPath(l.initrd),
      '-append', l.cmdline,
      // The console is a bounded ring inside QEMU (read over QMP when a boot fails): a guest writing to it forever costs 64 KiB.
      '-chardev', 'ringbuf,id=con,size=65536',
      '-serial', 'chardev:con',
    ];
    for (const d of l.disks) {
      args.push('-drive', `id=${d.id},file=${optPath(d.file)},format=raw,if=none${d.readOnly ? ',readonly=on' : ',discard=unmap'}`);
      args.push('-device', `virtio-blk-device,drive=${d.id},serial=${d.serial}`);
    }
    args.push(
      '-device', 'virtio-serial-device,id=vser0',
      '-chardev', `socket,id=agent,path=${optPath(l.agentSocket)},server=on,wait=off`,
      '-device', 'virtserialport,bus=vser0.0,chardev=agent,name=warren.agent',
      ...l.sessionSockets.flatMap((sock, i) => ['-chardev', `socket,id=s${i},path=${optPath(sock)},server=on,wait=off`, '-device', `virtserialport,bus=vser0.0,chardev=s${i},name=warren.session.${i}`]),
      '-qmp', `unix:${optPath(l.qmpSocket)},server=on,wait=off`,
    );
    if (l.incoming !== undefined) args.push('-incoming', `exec:cat ${shellWord(l.incoming)}`);
    return { bin: 'qemu-system-x86_64', args };
  },
};

export const firecracker: VmmDriver = {
  name: 'firecracker',
  status: () => {
    const f = feature('firecracker');
    return f.supported ? { available: true } : { available: false, reason: f.reason ?? 'unavailable' };
  },
  command() {
    throw new WarrenError('NOT_SUPPORTED', `firecracker: ${feature('firecracker').reason}`);
  },
};

function shellWord(p: string): string {
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
  const { bin, args } = driver.command(l);
  const child = spawn('/bin/sh', ['-c', 'read -r _ || exit 1; exec "$@"', 'warren-vmm', bin, ...args], {
    detached: true,
    stdio: ['pipe', 'ignore', logFd],
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

/** The host TSC frequency, for the guest's tsc_early_khz (TCG guests otherwise sometimes hang calibrating against a PIT they do not have). */
export function hostTscKhz(): number | null {
  try {
    const mhz = /^cpu MHz\s*:\s*([\d.]+)/m.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1];
    return mhz === undefined ? null : Math.round(Number(mhz) * 1000);
  } catch {
    return null;
  }
}
