/**
 * The one feature-detection module. Each feature is probed once (by trying the
 * operation or reading what the kernel exposes), cached, and reported with the
 * reason it is missing and what Warren does about it. Nothing else in Warren
 * guesses what the kernel can do.
 */
import { existsSync, readFileSync, readdirSync, statfsSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import os from 'node:os';
import { join } from 'node:path';
import { BACKEND_NAMES, type BackendName, type FeatureReport } from './shim/types';
import { notSupported } from './errors';

export type FeatureName =
  | 'native-helper'
  | 'cgroup-v1'
  | 'cgroup-v2'
  | 'cgroup2-bpf-hierarchy'
  | 'cgroup-freezer'
  | 'overlayfs'
  | 'erofs'
  | 'erofs-file-backed'
  | 'namespaces'
  | 'pidfd'
  | 'openat2'
  | 'sched-idle'
  | 'core-scheduling'
  | 'seccomp'
  | 'landlock'
  | 'apparmor'
  | 'bpf-lsm'
  | 'memory-reclaim'
  | 'zram'
  | 'criu'
  | 'kvm'
  | 'kvm-hardware'
  | 'qemu'
  | 'microvm-guest'
  | 'firecracker'
  | 'runc'
  | 'debootstrap'
  | 'mkfs-erofs'
  | 'lazy-layers'
  | 'egress-bpf'
  | 'sandbox-network';

export interface FeatureStatus {
  supported: boolean;
  reason?: string;
  /** What Warren does about it when it is missing (or how it uses it). */
  action?: string;
}

const CGROUP2_SUPER_MAGIC = 0x63677270;

const cache = new Map<FeatureName, FeatureStatus>();

function yes(action?: string): FeatureStatus {
  return action === undefined ? { supported: true } : { supported: true, action };
}

function no(reason: string, action: string): FeatureStatus {
  return { supported: false, reason, action };
}

function readText(path: string): string | null {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return null;
  }
}

function hasBinary(name: string): string | null {
  for (const dir of (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').concat(['/usr/sbin', '/sbin'])) {
    const p = `${dir}/${name}`;
    if (existsSync(p)) return p;
  }
  return null;
}

function kernelAtLeast(major: number, minor: number): boolean {
  const m = /^(\d+)\.(\d+)/.exec(os.release());
  if (!m) return false;
  const [maj, min] = [Number(m[1]), Number(m[2])];
  return maj > major || (maj === major && min >= minor);
}

export function cgroupVersion(): 1 | 2 {
  try {
    return statfsSync('/sys/fs/cgroup').type === CGROUP2_SUPER_MAGIC ? 2 : 1;
  } catch {
    return 1;
  }
}

function activeLsms(): string[] {
  const text = readText('/sys/kernel/security/lsm');
  if (text !== null) return text.trim().split(',');
  // securityfs is not mounted everywhere; the kernel command line or config is the fallback.
  const cmdline = readText('/proc/cmdline') ?? '';
  const m = /\blsm=([^\s]+)/.exec(cmdline);
  return m ? m[1]!.split(',') : [];
}

function loadNative(): { coreSchedSupported(): boolean; landlockAbi(): number; seccompSupported(): boolean; bpfLsmProbe(): number } | null {
  try {
    // eslint-disable-next-line @typescript-eslint/no-var-requires
    return (require('./native') as typeof import('./native')).native;
  } catch {
    return null;
  }
}

const probes: Record<FeatureName, () => FeatureStatus> = {
  'native-helper': () => {
    try {
      const n = require('./native') as typeof import('./native');
      void n.native.version;
      return yes();
    } catch (err) {
      return no((err as Error).message, 'container sandboxes are unavailable until `npm run build:native` succeeds');
    }
  },
  'cgroup-v1': () =>
    cgroupVersion() === 1 && existsSync('/sys/fs/cgroup/memory/memory.limit_in_bytes')
      ? yes('cpu, memory, pids and freezer through the v1 hierarchies')
      : no('no v1 memory hierarchy mounted', 'cgroup v2 is used'),
  'cgroup-v2': () =>
    cgroupVersion() === 2
      ? yes('cpu.max, memory.max, pids.max, cgroup.freeze, cgroup.kill')
      : no('/sys/fs/cgroup is not a cgroup2 filesystem (hybrid or v1 host)', 'limits use cgroup v1; BPF programs attach to the cgroup2 hierarchy at /sys/fs/cgroup/unified'),
  'cgroup2-bpf-hierarchy': () => {
    if (cgroupVersion() === 2) return yes('/sys/fs/cgroup');
    try {
      if (statfsSync('/sys/fs/cgroup/unified').type === CGROUP2_SUPER_MAGIC) return yes('/sys/fs/cgroup/unified');
    } catch {
      /* fallthrough */
    }
    return no('no cgroup2 hierarchy mounted', 'eBPF cgroup programs cannot be attached; network egress stays loopback-only');
  },
  'cgroup-freezer': () =>
    cgroupVersion() === 2 || existsSync('/sys/fs/cgroup/freezer')
      ? yes()
      : no('no freezer controller', 'pause is refused with NOT_SUPPORTED'),
  overlayfs: () =>
    (readText('/proc/filesystems') ?? '').includes('\toverlay\n')
      ? yes()
      : no('overlay not in /proc/filesystems', 'container sandboxes are unavailable'),
  erofs: () =>
    (readText('/proc/filesystems') ?? '').includes('\terofs\n') || existsSync('/sys/fs/erofs')
      ? yes()
      : no('erofs not in /proc/filesystems', 'layers cannot be mounted; container sandboxes are unavailable'),
  'erofs-file-backed': () =>
    kernelAtLeast(6, 12)
      ? yes('layer images are mounted directly from their files, no loop devices')
      : no('kernel older than 6.12', 'layers are mounted through loop devices by mount(8)'),
  namespaces: () => {
    const have = existsSync('/proc/self/ns') ? readdirSync('/proc/self/ns') : [];
    const need = ['mnt', 'pid', 'uts', 'ipc', 'net', 'cgroup'];
    const missing = need.filter((n) => !have.includes(n));
    return missing.length === 0 ? yes() : no(`missing namespaces: ${missing.join(', ')}`, 'container sandboxes are unavailable');
  },
  pidfd: () => (kernelAtLeast(5, 3) ? yes() : no('kernel older than 5.3', 'container sandboxes are unavailable')),
  openat2: () => (kernelAtLeast(5, 6) ? yes() : no('kernel older than 5.6', 'file access uses a component-by-component O_NOFOLLOW walk')),
  'sched-idle': () => yes('priority "idle" sandboxes run under SCHED_IDLE'),
  'core-scheduling': () => {
    const n = loadNative();
    if (n === null) return no('native helper not loaded', 'no core-scheduling cookies');
    return n.coreSchedSupported()
      ? yes('each sandbox gets its own core-scheduling cookie when asked')
      : no('prctl(PR_SCHED_CORE) is refused by this kernel (EINVAL: built without CONFIG_SCHED_CORE)', 'SCHED_IDLE only; SMT siblings are shared between sandboxes');
  },
  // probed by trying (through the native helper), not by reading securityfs (often not mounted).
  seccomp: () => {
    const n = loadNative();
    if (n !== null) {
      return n.seccompSupported()
        ? yes('default filter (denylist, EPERM) on every sandbox process; see policies/seccomp.yaml')
        : no('seccomp(SECCOMP_GET_ACTION_AVAIL) failed: kernel without CONFIG_SECCOMP_FILTER', 'sandboxes are refused unless the policy allows unconfined ones');
    }
    return /Seccomp:\s*\d/.test(readText('/proc/self/status') ?? '') ? yes() : no('kernel without CONFIG_SECCOMP', 'sandboxes rely on capabilities and namespaces only');
  },
  landlock: () => {
    const n = loadNative();
    if (n === null) return no('native helper not loaded', 'cannot probe landlock_create_ruleset');
    const abi = n.landlockAbi();
    if (abi >= 1) return yes(`ABI ${abi}: filesystem rules${abi >= 6 ? ', signal and abstract-unix scoping' : ''} on every sandbox process (policies/profiles.yaml)`);
    const why = abi === -38 ? 'ENOSYS: kernel built without CONFIG_SECURITY_LANDLOCK' : abi === -95 ? 'EOPNOTSUPP: landlock is not an active LSM (lsm= boot parameter)' : `landlock_create_ruleset failed (errno ${-abi})`;
    return no(why, 'AppArmor is needed as the enforcer');
  },
  apparmor: () =>
    existsSync('/sys/module/apparmor/parameters/enabled') && (readText('/sys/module/apparmor/parameters/enabled') ?? '').startsWith('Y')
      ? yes('profiles in apparmor/ are loaded (apparmor_parser -r) and applied on exec')
      : no('AppArmor is not built into this kernel', 'profiles are compiled (apparmor_parser -Q -K) in CI but not loaded; Landlock enforces their intent'),
  'bpf-lsm': () => {
    const n = loadNative();
    const listed = activeLsms().includes('bpf');
    if (n === null) return listed ? yes('listed as an active LSM') : no('bpf is not an active LSM', 'not used');
    const r = n.bpfLsmProbe();
    if (r === 0) return yes('BPF-LSM programs can be loaded; Warren ships none (Landlock + seccomp cover the policy)');
    const name = r === -1 ? 'EPERM' : `errno ${-r}`;
    return no(`BPF_PROG_LOAD of an LSM program is refused here (${name}${listed ? ', although bpf is an active LSM' : ''})`, 'not used; Landlock + seccomp enforce the policy');
  },
  'memory-reclaim': () =>
    cgroupVersion() === 2 ? yes('memory.reclaim') : no('cgroup v1 has no memory.reclaim', 'pause lowers memory.limit_in_bytes to push pages to swap'),
  zram: () => (existsSync('/sys/class/zram-control') || existsSync('/sys/block/zram0') ? yes() : no('zram module not loaded', 'pause frees memory only where swap exists')),
  criu: () => {
    const bin = hasBinary('criu');
    if (bin === null) return no('criu is not installed', 'hibernate is refused with NOT_SUPPORTED');
    try {
      execFileSync(bin, ['check'], { stdio: 'pipe', timeout: 10_000 });
      return yes();
    } catch (err) {
      // criu prints generic "exited, status=1" lines first; the cause is the first line naming a subsystem.
      const lines = String((err as { stderr?: Buffer }).stderr ?? '').split('\n').map((l) => l.trim()).filter(Boolean);
      const out = lines.find((l) => !/exited, status=/.test(l)) ?? lines[0] ?? 'criu check failed';
      return no(out.trim(), 'hibernate is refused with NOT_SUPPORTED; pause (freeze + reclaim) still works');
    }
  },
  kvm: () => (existsSync('/dev/kvm') ? yes() : no('/dev/kvm is absent', 'microVMs run under QEMU TCG (slow)')),
  // /dev/kvm alone is not enough: a host that is itself a PVM guest has KVM without VT-x/AMD-V,
  // which runs only PVM-enabled guest kernels and emulates any other (~50x slower than TCG).
  'kvm-hardware': () => {
    if (!existsSync('/dev/kvm')) return no('/dev/kvm is absent', 'microVMs run under QEMU TCG');
    const flags = /^flags\s*:(.*)$/m.exec(readText('/proc/cpuinfo') ?? '')?.[1] ?? '';
    const hw = /\b(vmx|svm)\b/.test(flags);
    const vendor = existsSync('/sys/module/kvm_intel') || existsSync('/sys/module/kvm_amd');
    if (hw && vendor) return yes('microVMs run under KVM');
    const pvm = existsSync('/sys/module/kvm_pvm') ? ' (KVM here is PVM)' : '';
    return no(`/dev/kvm has no VT-x/AMD-V behind it${pvm}: only PVM-enabled guest kernels run at speed, a stock kernel is emulated`, 'microVMs run under QEMU TCG');
  },
  'microvm-guest': () => {
    const { findGuestKernel, agentBinary } = require('./shim/backends/microvm/guest') as typeof import('./shim/backends/microvm/guest');
    const k = findGuestKernel();
    if (k === null) return no('no guest kernel (/boot/vmlinuz-*-cloud-amd64 with its modules; scripts/setup.sh installs linux-image-cloud-amd64)', 'the microvm backend is unavailable');
    if (!existsSync(agentBinary())) return no(`the guest agent is not built (${agentBinary()})`, 'the microvm backend is unavailable');
    if (!hasBinary('modprobe') || !hasBinary('cpio') || !hasBinary('mkfs.ext4')) return no('modprobe, cpio or mkfs.ext4 missing (kmod, cpio, e2fsprogs)', 'the microvm backend is unavailable');
    return yes(`kernel ${k.release}`);
  },
  // Firecracker runs guests only under KVM (it has no emulator), and describes its virtio-mmio
  // devices to the guest with ACPI only from 1.8 on: the cloud kernel cannot find them otherwise.
  firecracker: () => {
    const bin = hasBinary('firecracker');
    if (bin === null) return no('firecracker is not installed (Debian 12 has no package; put the release binary on PATH)', 'microVMs use QEMU microvm');
    let version = '';
    try {
      version = execFileSync(bin, ['--version'], { encoding: 'utf8', timeout: 5000, stdio: ['ignore', 'pipe', 'ignore'] });
    } catch (err) {
      return no(`firecracker --version failed: ${(err as Error).message.split('\n')[0]}`, 'microVMs use QEMU microvm');
    }
    const m = /v?(\d+)\.(\d+)\.(\d+)/.exec(version);
    if (m === null) return no(`firecracker --version printed no version (${JSON.stringify(version.slice(0, 80))})`, 'microVMs use QEMU microvm');
    if (Number(m[1]) < 1 || (Number(m[1]) === 1 && Number(m[2]) < 8)) return no(`firecracker ${m[0]} is older than 1.8 (no ACPI: the guest kernel would not find its disks)`, 'microVMs use QEMU microvm');
    const kvm = feature('kvm-hardware');
    if (!kvm.supported) return no(`firecracker ${m[0]} is installed, but it needs KVM that runs the guest: ${kvm.reason}`, 'microVMs use QEMU microvm');
    if (!hasBinary('setpriv') || !hasBinary('mkfifo')) return no('setpriv or mkfifo missing (util-linux, coreutils)', 'microVMs use QEMU microvm');
    return yes(`firecracker ${m[0]} (WARREN_MICROVM_VMM=firecracker uses it)`);
  },
  qemu: () => (hasBinary('qemu-system-x86_64') ? yes() : no('qemu-system-x86 is not installed', 'microvm and vm backends are unavailable')),
  runc: () => (hasBinary('runc') ? yes('baseline in benchmarks') : no('runc is not installed', 'benchmarks skip the runc baseline')),
  debootstrap: () => (hasBinary('debootstrap') ? yes() : no('debootstrap is not installed', 'the default Debian image cannot be built')),
  'mkfs-erofs': () => (hasBinary('mkfs.erofs') ? yes() : no('erofs-utils is not installed', 'images cannot be imported')),
  // layers mounted from a registry without their blob: warren-lazyfs (FUSE) under a file-backed EROFS mount
  'lazy-layers': () => {
    const pulls = 'pulls from registries download whole layers (eager)';
    if (!feature('erofs-file-backed').supported) return no('file-backed EROFS mounts are unsupported', pulls);
    const { lazyfsBinary } = require('./shim/layers/lazy') as typeof import('./shim/layers/lazy');
    if (!lazyfsBinary()) return no('warren-lazyfs is not built (libfuse3-dev, libcurl4-openssl-dev and libssl-dev are needed)', pulls);
    if (!existsSync('/dev/fuse')) return no('/dev/fuse is missing', pulls);
    if (!/\bfuse\b/.test(readText('/proc/filesystems') ?? '')) return no('the kernel has no FUSE file system', pulls);
    return yes('pulls are lazy by default: layer bytes are fetched from the registry when read');
  },
  // per-service egress needs the cgroup programs (cgroup2 + BPF) and the node network tools
  'egress-bpf': () => {
    if (!feature('cgroup2-bpf-hierarchy').supported) return no('no cgroup2 hierarchy to attach the programs to', 'sandboxes are loopback-only');
    if (!existsSync(join(__dirname, '..', '..', 'bpf', 'out', 'sandbox_egress.bpf.o')) && !existsSync(join(__dirname, '..', 'bpf', 'out', 'sandbox_egress.bpf.o'))) {
      return no('bpf/out/sandbox_egress.bpf.o is not built (npm run build:bpf)', 'sandboxes are loopback-only');
    }
    if (!existsSync('/sys/fs/bpf')) return no('no /sys/fs/bpf to pin programs and maps', 'sandboxes are loopback-only');
    // the kernel's verifier is the real test: load the programs once into a scratch pin directory
    try {
      const { probeEgressPrograms } = require('./shim/network/egress') as typeof import('./shim/network/egress');
      probeEgressPrograms();
    } catch (err) {
      return no(`the egress programs do not load here: ${(err as Error).message}`, 'sandboxes are loopback-only');
    }
    return yes('connect4/6, sendmsg4/6 and cgroup_skb egress programs per sandbox cgroup; pinned under /sys/fs/bpf/warren');
  },
  'sandbox-network': () => {
    const missing = ['ip', 'nft'].filter((b) => !hasBinary(b));
    if (missing.length) return no(`${missing.join(' and ')} not installed (iproute2, nftables)`, 'sandboxes are loopback-only');
    if (!existsSync('/proc/sys/net/ipv4/ip_forward')) return no('no IPv4 forwarding in this kernel', 'sandboxes are loopback-only');
    return yes('netns + veth on a host bridge, NAT through nftables, per-node DNS responder');
  },
};

/** Features the operator masks (WARREN_FEATURES_DISABLE=landlock,apparmor): treated as missing (fallback testing, incident response). */
function disabledByOperator(name: FeatureName): boolean {
  return (process.env.WARREN_FEATURES_DISABLE ?? '').split(',').map((s) => s.trim()).includes(name);
}

export function feature(name: FeatureName): FeatureStatus {
  let status = cache.get(name);
  if (status === undefined && disabledByOperator(name)) {
    status = no('disabled by WARREN_FEATURES_DISABLE', 'treated as missing');
    cache.set(name, status);
  }
  if (status === undefined) {
    try {
      status = probes[name]();
    } catch (err) {
      status = no(`probe failed: ${(err as Error).message}`, 'treated as unsupported');
    }
    cache.set(name, status);
  }
  return status;
}

export function has(name: FeatureName): boolean {
  return feature(name).supported;
}

/** Throw NOT_SUPPORTED with the probe's reason when `name` is missing. */
export function requireFeature(name: FeatureName): void {
  const status = feature(name);
  if (!status.supported) throw notSupported(name, status.reason ?? 'unknown');
}

/** For tests: the reason to skip, or null when the feature is there. */
export function skipReason(...names: FeatureName[]): string | null {
  for (const n of names) {
    const s = feature(n);
    if (!s.supported) return `requires ${n}: ${s.reason}`;
  }
  if (typeof process.getuid === 'function' && process.getuid() !== 0) return 'requires root';
  return null;
}

export function containerBackendStatus(): { available: boolean; reason?: string } {
  for (const n of ['native-helper', 'overlayfs', 'erofs', 'namespaces', 'pidfd'] as const) {
    const s = feature(n);
    if (!s.supported) return { available: false, reason: `${n}: ${s.reason}` };
  }
  if (!has('cgroup-v1') && !has('cgroup-v2')) return { available: false, reason: 'no usable cgroup hierarchy' };
  return { available: true };
}

/** The accelerator microVMs use here and why. */
export function microvmAccelerator(): { accel: 'kvm' | 'tcg'; why: string } {
  const forced = process.env.WARREN_MICROVM_ACCEL;
  if (forced === 'tcg') return { accel: 'tcg', why: 'WARREN_MICROVM_ACCEL=tcg' };
  const kvm = feature('kvm-hardware');
  return kvm.supported ? { accel: 'kvm', why: 'hardware virtualization' } : { accel: 'tcg', why: kvm.reason ?? 'no KVM' };
}

export function microvmBackendStatus(): { available: boolean; reason?: string; accelerator?: string } {
  for (const n of ['qemu', 'microvm-guest', 'native-helper'] as const) {
    const s = feature(n);
    if (!s.supported) return { available: false, reason: `${n}: ${s.reason}` };
  }
  const fc = feature('firecracker');
  if (microvmVmm() === 'firecracker') {
    if (!fc.supported) return { available: false, reason: `WARREN_MICROVM_VMM=firecracker, but: ${fc.reason}` };
    return { available: true, reason: `${fc.action}, ${feature('microvm-guest').action}`, accelerator: 'kvm (Firecracker runs only under KVM)' };
  }
  const a = microvmAccelerator();
  return { available: true, reason: `QEMU microvm, ${feature('microvm-guest').action}; Firecracker: ${fc.supported ? fc.action : fc.reason}`, accelerator: `${a.accel} (${a.why})` };
}

/** The VMM microVMs run under: QEMU unless WARREN_MICROVM_VMM=firecracker. */
export function microvmVmm(): 'qemu' | 'firecracker' {
  return process.env.WARREN_MICROVM_VMM === 'firecracker' ? 'firecracker' : 'qemu';
}

/** The accelerator full VMs use here and why (the same probe as microVMs: can this host's KVM run a guest?). */
export function vmAccelerator(): { accel: 'kvm' | 'tcg'; why: string } {
  const forced = process.env.WARREN_VM_ACCEL;
  if (forced === 'tcg') return { accel: 'tcg', why: 'WARREN_VM_ACCEL=tcg' };
  return microvmAccelerator();
}

export function vmBackendStatus(): { available: boolean; reason?: string; accelerator?: string } {
  for (const n of ['qemu', 'native-helper'] as const) {
    const s = feature(n);
    if (!s.supported) return { available: false, reason: `${n}: ${s.reason}` };
  }
  const { desktopBuildMissing, cachedDesktopImage } = require('./shim/backends/vm/image') as typeof import('./shim/backends/vm/image');
  const missing = desktopBuildMissing();
  if (missing !== null) return { available: false, reason: `the desktop image cannot be built: ${missing}` };
  const a = vmAccelerator();
  const img = cachedDesktopImage();
  return {
    available: true,
    reason: `QEMU q35 with a desktop (Xorg, twm, xterm; ${img ? `image cached in ${img.dir}` : 'image built on first use, a few minutes'}); screen, input and VNC over QMP`,
    accelerator: `${a.accel} (${a.why})`,
  };
}

function backendStatus(backend: BackendName): { available: boolean; reason?: string } {
  if (backend === 'container') return containerBackendStatus();
  if (backend === 'microvm') return microvmBackendStatus();
  if (backend === 'vm') return vmBackendStatus();
  return { available: false, reason: `${backend} backend is not implemented in this build` };
}

/** FnCall pools run on the container backend and are reached through /v1/functions, not POST /v1/sandboxes. */
export function functionsStatus(): { available: boolean; reason?: string } {
  const c = containerBackendStatus();
  return c.available ? { available: true, reason: 'invoked through /v1/functions/:pool/invoke, POST /run_code and POST /run_jupyter (container backend; which Python kernel runs where, ipykernel or the standard-library fallback: GET /v1/languages, kernels)' } : c;
}

export function featureReport(nodeId: string): FeatureReport {
  const features: FeatureReport['features'] = {};
  for (const name of Object.keys(probes) as FeatureName[]) features[name] = feature(name);
  const version = cgroupVersion();
  const controllers =
    version === 2
      ? (readText('/sys/fs/cgroup/cgroup.controllers') ?? '').trim().split(/\s+/).filter(Boolean)
      : readdirSync('/sys/fs/cgroup').filter((d) => !['unified', 'systemd'].includes(d) && !d.includes(','));
  const bpf = feature('cgroup2-bpf-hierarchy');
  const backends = {} as Record<BackendName, { available: boolean; reason?: string }>;
  for (const b of BACKEND_NAMES) backends[b] = backendStatus(b);
  return {
    node: nodeId,
    kernel: os.release(),
    cgroup: { version, controllers, bpfHierarchy: bpf.supported ? (bpf.action ?? null) : null },
    features,
    backends,
    functions: functionsStatus(),
    enforcer: activeEnforcer().description,
  };
}

/**
 * which LSM enforcer confines sandboxes here. AppArmor where the kernel has it, Landlock
 * otherwise (both when both are there); BPF-LSM is probed and reported, never used.
 */
export function activeEnforcer(): { lsm: 'apparmor' | 'landlock' | 'apparmor+landlock' | 'none'; seccomp: boolean; landlockAbi: number; description: string } {
  const aa = has('apparmor');
  const n = loadNative();
  const abi = n === null || !has('landlock') ? 0 : Math.max(0, n.landlockAbi());
  const ll = abi >= 1;
  const sc = has('seccomp');
  const lsm = aa && ll ? 'apparmor+landlock' : aa ? 'apparmor' : ll ? 'landlock' : 'none';
  const parts = [aa ? 'apparmor' : null, ll ? `landlock (ABI ${abi})` : null, sc ? 'seccomp' : null].filter((x) => x !== null);
  const description = `${parts.length ? parts.join(' + ') : 'none'}; namespaces+capabilities+no_new_privs`;
  return { lsm, seccomp: sc, landlockAbi: abi, description };
}
