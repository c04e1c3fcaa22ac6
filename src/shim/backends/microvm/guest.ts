/**
 * The guest side of a microVM that lives on the host: the kernel (Debian's
 * cloud kernel, installed by scripts/setup.sh) and an initramfs made of
 * busybox-static, the kernel modules the guest needs (every virtio driver is a
 * module in that kernel, so there is no boot without them) and warren-agent.
 *
 * The initramfs is built once per set of inputs and cached under
 * /var/cache/warren/microvm/, keyed by the sha256 of everything that goes into
 * it (kernel release, module files, busybox, agent, /init).
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { WarrenError } from '../../../errors';

export const GUEST_CACHE = process.env.WARREN_MICROVM_CACHE ?? '/var/cache/warren/microvm';

/** Modules the guest loads, in this order after their dependencies (modprobe --show-depends). */
export const GUEST_MODULES = ['virtio_mmio', 'virtio_blk', 'virtio_console', 'erofs', 'overlay', 'virtio_net'];
/** Loaded only by a guest whose VMM has no virtio-serial (`warren.vsock=` on its command line): the agent listens on vsock. */
export const GUEST_VSOCK_MODULES = ['vmw_vsock_virtio_transport'];

export interface GuestKernel {
  release: string;
  image: string;
  modulesDir: string;
}

/** The newest installed cloud kernel with its modules, or null. */
export function findGuestKernel(): GuestKernel | null {
  const override = process.env.WARREN_MICROVM_KERNEL;
  let names: string[];
  try {
    names = readdirSync('/boot');
  } catch {
    return null;
  }
  const releases = names
    .map((n) => /^vmlinuz-(.+-cloud-amd64)$/.exec(n)?.[1])
    .filter((r): r is string => r !== undefined && existsSync(join('/lib/modules', r)))
    .sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
  const release = releases.at(-1);
  if (override !== undefined) {
    const r = /vmlinuz-(.+)$/.exec(override)?.[1];
    if (r === undefined || !existsSync(override)) return null;
    return { release: r, image: override, modulesDir: join('/lib/modules', r) };
  }
  if (release === undefined) return null;
  return { release, image: join('/boot', `vmlinuz-${release}`), modulesDir: join('/lib/modules', release) };
}

export function agentBinary(): string {
  const dir = process.env.WARREN_GUEST_AGENT_DIR ?? join(__dirname, '..', '..', '..', '..', '..', 'native', 'guest-agent', 'out');
  const alt = join(__dirname, '..', '..', '..', '..', 'native', 'guest-agent', 'out');
  for (const d of [dir, alt]) if (existsSync(join(d, 'warren-agent'))) return join(d, 'warren-agent');
  return join(dir, 'warren-agent');
}

/** The host end of microVM shell sessions (native/guest-agent/vmshell.c). */
export function vmshellBinary(): string {
  return join(dirname(agentBinary()), 'warren-vmshell');
}

/** Starts a restored microVM's VMM without transparent huge pages (native/guest-agent/vmm-exec.c); null when not built. */
export function vmmExecBinary(): string | null {
  const p = join(dirname(agentBinary()), 'warren-vmm-exec');
  return existsSync(p) ? p : null;
}

function busyboxBinary(): string | null {
  for (const p of ['/bin/busybox', '/usr/bin/busybox']) if (existsSync(p)) return p;
  return null;
}

const modulesMemo = new Map<string, string[]>();

/** Module files for `names`, dependencies first, each once (asked of modprobe once per kernel and modules.dep). */
export function moduleFiles(kernel: GuestKernel, names: readonly string[] = GUEST_MODULES): string[] {
  let depStamp = '';
  try {
    const st = statSync(join(kernel.modulesDir, 'modules.dep'));
    depStamp = `${st.size}:${st.mtimeMs}:${st.ino}`;
  } catch {
    /* no modules.dep: modprobe says what is wrong */
  }
  const memoKey = `${kernel.release}\0${kernel.modulesDir}\0${depStamp}\0${names.join(',')}`;
  const known = modulesMemo.get(memoKey);
  if (known !== undefined) return known;
  const out: string[] = [];
  for (const m of names) {
    const text = execFileSync('modprobe', ['-S', kernel.release, '--show-depends', m], { encoding: 'utf8', timeout: 10_000 });
    for (const line of text.split('\n')) {
      const f = /^insmod (\S+)/.exec(line.trim())?.[1];
      // crc32c-intel needs SSE4.2, which TCG's default CPU lacks; crc32c_generic is built in.
      if (f !== undefined && !out.includes(f) && !f.endsWith('/crc32c-intel.ko')) out.push(f);
    }
  }
  modulesMemo.set(memoKey, out);
  return out;
}

/**
 * /init: mount the sandbox root and hand over to the agent.
 *   - disks are found by their virtio serial: "rw" is the writable disk
 *     (ext4, made on the host), "l0".."lN" the EROFS layers, top-most first;
 *   - overlay(lower = layers, upper = rw/upper) on /newroot, with /proc, /sys,
 *     /dev and /dev/pts inside it;
 *   - the agent's port is the virtio port named "warren.agent", or with
 *     `warren.vsock=PORT,FIRST:COUNT` (a VMM without virtio-serial) the vsock
 *     port PORT, and the shell sessions' ports FIRST..FIRST+COUNT-1.
 * Anything that fails prints WARREN_BOOT_FAILED and powers off, so the host
 * sees a quick, explained failure instead of a timeout.
 */
export const INIT_SCRIPT = `#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
fail() { echo "WARREN_BOOT_FAILED: $*" > /dev/console; sync; poweroff -f; sleep 5; exit 1; }
mount -t proc proc /proc && mount -t sysfs sys /sys && mount -t devtmpfs dev /dev || fail "cannot mount proc/sys/dev"
for m in $(cat /etc/modules.list); do insmod "/lib/modules/$m" 2>/dev/null || fail "insmod $m"; done
id=; layers=0; net=; pids=; hold=; mac=; vsock=
for a in $(cat /proc/cmdline); do
  case "$a" in warren.id=*) id="\${a#warren.id=}";; warren.layers=*) layers="\${a#warren.layers=}";; warren.net=*) net="\${a#warren.net=}";; warren.pids=*) pids="\${a#warren.pids=}";; warren.hold=1) hold=1;; warren.vsock=*) vsock="\${a#warren.vsock=}";; esac
done
if [ -n "$vsock" ]; then
  for m in $(cat /etc/modules.vsock); do insmod "/lib/modules/$m" 2>/dev/null || fail "insmod $m"; done
fi
disk() { for s in /sys/block/vd*; do [ "$(cat "$s/serial" 2>/dev/null)" = "$1" ] && { echo "/dev/\${s##*/}"; return 0; }; done; return 1; }
i=0
while [ "$i" -lt 50 ] && ! disk rw >/dev/null; do sleep 0.02; i=$((i+1)); done
rw=$(disk rw) || fail "no writable disk"
mkdir -p /rw /newroot && mount -t ext4 -o nosuid,nodev "$rw" /rw || fail "mount $rw"
mkdir -p /rw/upper /rw/work
lower=; n=0
while [ "$n" -lt "$layers" ]; do
  d=$(disk "l$n") || fail "no layer disk l$n"
  mkdir -p "/layers/$n" && mount -t erofs -o ro "$d" "/layers/$n" || fail "mount layer $n"
  lower="\${lower:+$lower:}/layers/$n"; n=$((n+1))
done
mount -t overlay overlay -o "lowerdir=$lower,upperdir=/rw/upper,workdir=/rw/work" /newroot || fail "overlay"
mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/tmp /newroot/work 2>/dev/null
mount -t proc proc /newroot/proc && mount -t sysfs sys /newroot/sys && mount -t devtmpfs dev /newroot/dev || fail "mounts in root"
mkdir -p /newroot/dev/pts /newroot/dev/shm && mount -t devpts -o newinstance,ptmxmode=0666 devpts /newroot/dev/pts && mount -t tmpfs -o nosuid,nodev shm /newroot/dev/shm
ip link set dev lo up
port=
if [ -n "$vsock" ]; then
  # templates are snapshots of a QEMU guest: a vsock guest always boots, and never holds
  [ -z "$hold" ] || fail "a vsock guest cannot be a template"
  port="vsock:\${vsock%%,*}"; spec="\${vsock#*,}"; first="\${spec%%:*}"; count="\${spec#*:}"
  ports=; i=0
  while [ "$i" -lt "$count" ]; do ports="\${ports:+$ports,}vsock:$((first+i))"; i=$((i+1)); done
  export WARREN_SESSION_PORTS="$ports"
else
  for p in /sys/class/virtio-ports/*; do [ "$(cat "$p/name" 2>/dev/null)" = warren.agent ] && port="/dev/\${p##*/}"; done
fi
[ -n "$port" ] || fail "no agent port"
# The sandbox's processes (not the agent) run in one group with the sandbox's pids limit, as a
# container's do; a guest kernel without cgroup2 boots anyway, and the host reports it.
cgroups=
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null && echo +pids > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null && mkdir -p /sys/fs/cgroup/sandbox && cgroups=1
if [ -n "$hold" ]; then
  # A template: the host snapshots the guest while it waits here, and every microVM of the same
  # shape is restored from that snapshot instead of booting. Everything above is the same in all
  # of them: the writable disk each gets is a copy of the template's as it was at the snapshot.
  # Free memory is zeroed first, so the snapshot holds only pages in use. The port's fd stays
  # open throughout: data for a virtio port no guest process holds open is discarded. From here
  # on only shell builtins run until the agent: every new program costs a restored TCG guest
  # its translation again.
  echo 3 > /proc/sys/vm/drop_caches; /sbin/warren-agent --scrub || echo "warren: scrub failed, the snapshot keeps the free memory"
  exec 3<>"$port" || fail "agent port"
  line=
  while :; do
    echo WARREN_HOLD >&3 || fail "agent port"
    read -r line <&3
    case "$line" in "WARREN_CONFIG "*) break;; esac
    sleep 0.05
  done
  for a in \${line#WARREN_CONFIG }; do
    case "$a" in id=*) id="\${a#id=}";; pids=*) pids="\${a#pids=}";; net=*) net="\${a#net=}";; mac=*) mac="\${a#mac=}";; seed=*) export WARREN_SEED="\${a#seed=}";; clock=*) export WARREN_CLOCK="\${a#clock=}";; esac
  done
  echo WARREN_GO >&3
  exec 3>&-
fi
if [ -n "$net" ]; then
  # address/prefix,gateway: the sandbox's address on the node subnet; the gateway is also its only resolver
  gw="\${net#*,}"
  i=0; while [ "$i" -lt 50 ] && [ ! -e /sys/class/net/eth0 ]; do sleep 0.02; i=$((i+1)); done
  # restored from a template: its NIC came up with the template's MAC; the tap's programs pin this one
  [ -z "$mac" ] || ip link set dev eth0 address "$mac" || fail "network MAC"
  ip link set dev eth0 up && ip address add "\${net%%,*}" dev eth0 && ip route add default via "$gw" dev eth0 || fail "network setup"
  rm -f /newroot/etc/resolv.conf && printf 'nameserver %s\noptions timeout:2 attempts:2\n' "$gw" > /newroot/etc/resolv.conf || fail "resolv.conf"
fi
[ -n "$id" ] && echo "$id" > /proc/sys/kernel/hostname && { [ -L /newroot/etc/hostname ] || echo "$id" > /newroot/etc/hostname 2>/dev/null; }
cg=
if [ -n "$pids" ] && [ -n "$cgroups" ]; then
  echo "$pids" > /sys/fs/cgroup/sandbox/pids.max && cg=/sys/fs/cgroup/sandbox || fail "pids limit"
  echo "WARREN_PIDS_LIMIT $pids"
fi
export WARREN_AGENT_PORT="$port" WARREN_ROOT=/newroot WARREN_CGROUP="$cg"
echo "WARREN_BOOT_OK"
exec /sbin/warren-agent
`;

function sha256File(h: ReturnType<typeof createHash>, path: string): void {
  h.update(path).update('\0').update(readFileSync(path)).update('\0');
}

let keyMemo: { stamp: string; key: string } | null = null;

/**
 * The sha256 of everything that goes into the initramfs. Every microVM create asks for it: the
 * hash is kept while no input changed its size, mtime or inode.
 */
function initramfsKey(kernel: GuestKernel, files: string[]): string {
  const stamp = [kernel.release, ...files.map((f) => {
    const st = statSync(f);
    return `${f}\0${st.size}\0${st.mtimeMs}\0${st.ino}`;
  })].join('\0');
  if (keyMemo?.stamp === stamp) return keyMemo.key;
  const h = createHash('sha256').update(kernel.release).update('\0').update(INIT_SCRIPT);
  for (const f of files) sha256File(h, f);
  keyMemo = { stamp, key: h.digest('hex').slice(0, 16) };
  return keyMemo.key;
}

/** Build (or take from the cache) the initramfs; returns its path. */
export function guestInitramfs(kernel: GuestKernel): string {
  const busybox = busyboxBinary();
  if (busybox === null) throw new WarrenError('NOT_SUPPORTED', 'busybox-static is not installed (the microVM initramfs needs it)');
  const agent = agentBinary();
  if (!existsSync(agent)) throw new WarrenError('NOT_SUPPORTED', `the guest agent is not built (${agent}; npm run build:native)`);
  const modules = moduleFiles(kernel);
  const vsockModules = moduleFiles(kernel, GUEST_VSOCK_MODULES).filter((f) => !modules.includes(f));
  const key = initramfsKey(kernel, [busybox, agent, ...modules, ...vsockModules]);
  const out = join(GUEST_CACHE, `initrd-${kernel.release}-${key}.cpio`);
  if (existsSync(out)) return out;
  mkdirSync(GUEST_CACHE, { recursive: true, mode: 0o755 });
  const tmp = join(GUEST_CACHE, `.build-${process.pid}-${key}`);
  rmSync(tmp, { recursive: true, force: true });
  try {
    for (const d of ['bin', 'sbin', 'etc', 'proc', 'sys', 'dev', 'lib/modules', 'newroot', 'rw', 'layers']) mkdirSync(join(tmp, d), { recursive: true });
    copyFileSync(busybox, join(tmp, 'bin/busybox'));
    copyFileSync(agent, join(tmp, 'sbin/warren-agent'));
    chmodSync(join(tmp, 'bin/busybox'), 0o755);
    chmodSync(join(tmp, 'sbin/warren-agent'), 0o755);
    const pack = (files: string[]) =>
      files.map((f) => {
        const rel = f.slice(kernel.modulesDir.length + 1);
        mkdirSync(dirname(join(tmp, 'lib/modules', rel)), { recursive: true });
        copyFileSync(f, join(tmp, 'lib/modules', rel));
        return rel;
      });
    writeFileSync(join(tmp, 'etc/modules.list'), pack(modules).join('\n') + '\n');
    writeFileSync(join(tmp, 'etc/modules.vsock'), pack(vsockModules).join('\n') + '\n');
    writeFileSync(join(tmp, 'init'), INIT_SCRIPT, { mode: 0o755 });
    const files = execFileSync('find', ['.', '-mindepth', '1'], { cwd: tmp, encoding: 'utf8' });
    const cpio = execFileSync('cpio', ['--quiet', '-o', '-H', 'newc', '--owner', '0:0'], { cwd: tmp, input: files, maxBuffer: 256 << 20 });
    writeFileSync(`${out}.tmp`, cpio);
    renameSync(`${out}.tmp`, out);
    // Older builds (other inputs) are not used again: each microVM holds a link to the one it booted.
    for (const name of readdirSync(GUEST_CACHE)) {
      if (name.startsWith('initrd-') && join(GUEST_CACHE, name) !== out) rmSync(join(GUEST_CACHE, name), { force: true });
    }
    return out;
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

export function initramfsBytes(path: string): number {
  return statSync(path).size;
}
