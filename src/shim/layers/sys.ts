/**
 * The few kernel calls the layer store needs and Node does not have: mount(2)
 * of a file-backed EROFS image, umount2(2) and lsetxattr(2); plus reading
 * /proc/self/mountinfo and removing scratch trees without crossing mounts.
 *
 * util-linux mount(8) turns a regular file into a loop device before calling
 * mount(2); a file-backed EROFS mount (Linux 6.12+) needs the file path passed
 * to mount(2) as is, which the native helper does. lsetxattr(2) goes through
 * perl's `syscall` (perl-base is an essential Debian package).
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, rmSync } from 'node:fs';
import { WarrenError } from '../../errors';
import type { NativeAddon } from '../../native/types';

export interface LayerMounter {
  /** Mount the EROFS image `file` read-only on `target` (synchronous, a few ms). */
  mountErofs(file: string, target: string): void;
  /** Unmount `target` (the top-most mount there). `detach` = MNT_DETACH. */
  umount(target: string, detach?: boolean): void;
  /** Human-readable description for logs. */
  readonly description: string;
}

const ENOTBLK = 15;

// lsetxattr
const SYSCALLS: Record<string, [number]> = {
  x64: [189],
  arm64: [6],
  riscv64: [6],
  loong64: [6],
};

const PERL = String.raw`
use strict;
my ($nr_lsetxattr) = split(/,/, shift @ARGV);
my $op = shift @ARGV;
if ($op eq 'xattrs') {
  my $n = 0;
  while (my $line = <STDIN>) {
    chomp $line;
    my ($p, $k, $v) = map { pack('H*', $_) } split(/ /, $line, -1);
    my $r = syscall($nr_lsetxattr, $p, $k, $v, length($v), 0);
    if ($r != 0) { my $e = $! + 0; print STDERR "$p: $k: $!\n"; exit($e || 1); }
    $n++;
  }
} else { exit 100; }
`;

function syscallNumbers(): string {
  const nr = SYSCALLS[process.arch];
  if (nr === undefined) throw new WarrenError('NOT_SUPPORTED', `restoring extended attributes is not supported on ${process.arch}`);
  return nr.join(',');
}

function perl(args: string[], input?: string): { status: number; stderr: string } {
  const r = spawnSync('perl', ['-e', PERL, syscallNumbers(), ...args], { input, encoding: 'utf8', maxBuffer: 1 << 20 });
  if (r.error) throw new WarrenError('NOT_SUPPORTED', `cannot run perl for a raw syscall: ${r.error.message}`);
  return { status: r.status ?? 128, stderr: (r.stderr ?? '').trim() };
}

function mountError(what: string, status: number, stderr: string): WarrenError {
  return new WarrenError('MOUNT_ERROR', `${what}: ${stderr || `errno ${status}`}`, { errno: status }, status);
}

/**
 * mount(2)/umount2(2) through the native helper. On kernels without file-backed
 * EROFS (< 6.12) mount(2) answers ENOTBLK; then a loop device is used, which the
 * kernel frees on umount (autoclear).
 */
/**
 * Options of every layer mount on the host. Layers are only ever read through
 * a sandbox's overlay (which applies its own mount options), so on the host
 * nothing in them is a device, a set-uid program or an executable: a device
 * node or set-uid binary carried in a layer is inert under the host mount,
 * whatever confines the sandbox.
 */
export const LAYER_MOUNT_FLAGS = ['ro', 'nodev', 'nosuid', 'noexec'] as const;

/** Whether a mount (from mountinfo) has every per-mount option of LAYER_MOUNT_FLAGS. */
export function hasLayerMountFlags(m: Pick<MountInfo, 'options'>): boolean {
  const opts = m.options.split(',');
  return LAYER_MOUNT_FLAGS.every((f) => opts.includes(f));
}

export function nativeMounter(addon: Pick<NativeAddon, 'mount' | 'umount'>, log: (msg: string) => void = () => undefined): LayerMounter {
  return {
    description: 'native helper',
    mountErofs(file, target) {
      try {
        addon.mount(file, target, 'erofs', [...LAYER_MOUNT_FLAGS], '');
      } catch (err) {
        if (!(err instanceof WarrenError) || err.errno !== ENOTBLK) throw err;
        log(`file-backed EROFS mounts unsupported here; using a loop device for ${file}`);
        try {
          execFileSync('mount', ['-t', 'erofs', '-o', `${LAYER_MOUNT_FLAGS.join(',')},loop`, file, target], { stdio: ['ignore', 'ignore', 'pipe'] });
        } catch (e) {
          const x = e as { stderr?: Buffer; status?: number };
          throw mountError(`mount -o loop ${file} ${target}`, x.status ?? 1, String(x.stderr ?? '').trim());
        }
      }
    },
    umount(target, detach = false) {
      addon.umount(target, detach);
    },
  };
}

const MOUNT_NR: Record<string, number> = { x64: 165, arm64: 40, riscv64: 40, loong64: 40 };
const MS_LAYER = 1 | 2 | 4 | 8; // MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC: LAYER_MOUNT_FLAGS

/**
 * mount(2) of a file-backed EROFS image in a child process. For images whose
 * backing file is served over the network (a lazily loaded layer), mount(2)
 * reads the superblock and root inode through it and may wait for a registry:
 * that wait must not block the gateway's event loop.
 */
export function mountErofsAsync(file: string, target: string): Promise<void> {
  const nr = MOUNT_NR[process.arch];
  if (nr === undefined) return Promise.reject(new WarrenError('NOT_SUPPORTED', `lazy layer mounts are not supported on ${process.arch}`));
  const script = `my $fs = "erofs"; my $r = syscall(${nr}, $ARGV[0], $ARGV[1], $fs, ${MS_LAYER}, 0); if ($r != 0) { my $e = $! + 0; print STDERR "$!\n"; exit($e || 1); }`;
  return new Promise((resolve, reject) => {
    const child = spawn('perl', ['-e', script, file, target], { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', (e) => reject(new WarrenError('MOUNT_ERROR', `cannot run perl for mount(2): ${e.message}`)));
    child.on('close', (code) => {
      if (code === 0) resolve();
      else reject(mountError(`mount erofs ${file} on ${target}`, code ?? 1, err.trim()));
    });
  });
}

/** Set extended attributes without following symlinks. */
export function lsetxattrs(items: Array<{ path: string; name: string; value: Buffer }>): void {
  if (items.length === 0) return;
  const hex = (b: Buffer | string) => Buffer.from(b).toString('hex');
  const input = items.map((i) => `${hex(i.path)} ${hex(i.name)} ${hex(i.value)}`).join('\n') + '\n';
  const r = perl(['xattrs'], input);
  if (r.status !== 0) throw new WarrenError('IMAGE_BUILD_FAILED', `setting extended attributes failed: ${r.stderr}`, { errno: r.status }, r.status);
}

// ---------------------------------------------------------------------------

export interface MountInfo {
  id: number;
  parent: number;
  root: string;
  mountPoint: string;
  options: string;
  fstype: string;
  source: string;
  superOptions: string;
}

/** mountinfo escapes space, tab, newline and backslash as \ooo. */
function unescape(s: string): string {
  return s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
}

export function readMountInfo(file = '/proc/self/mountinfo'): MountInfo[] {
  const out: MountInfo[] = [];
  for (const line of readFileSync(file, 'utf8').split('\n')) {
    if (line === '') continue;
    const f = line.split(' ');
    const sep = f.indexOf('-', 6);
    if (sep < 0) continue;
    out.push({
      id: Number(f[0]),
      parent: Number(f[1]),
      root: unescape(f[3]!),
      mountPoint: unescape(f[4]!),
      options: f[5]!,
      fstype: f[sep + 1]!,
      source: unescape(f[sep + 2] ?? ''),
      superOptions: f[sep + 3] ?? '',
    });
  }
  return out;
}

/** Mounts on `dir` or below it, deepest first. */
export function mountsUnder(dir: string, infos = readMountInfo()): MountInfo[] {
  const prefix = dir.endsWith('/') ? dir : dir + '/';
  return infos.filter((m) => m.mountPoint === dir || m.mountPoint.startsWith(prefix)).sort((a, b) => b.mountPoint.length - a.mountPoint.length);
}

/**
 * Remove a scratch tree that a failed build may have left mounts in (debootstrap
 * binds /dev, /proc, /sys into its target): detach every mount below it first,
 * then delete without crossing into any mount that is left.
 */
export function removeTree(dir: string, mounter?: LayerMounter): void {
  if (!existsSync(dir)) return;
  for (const m of mountsUnder(dir)) {
    try {
      if (mounter) mounter.umount(m.mountPoint, true);
      else execFileSync('umount', ['-l', m.mountPoint], { stdio: 'ignore' });
    } catch {
      /* reported by the check below */
    }
  }
  if (mountsUnder(dir).length > 0) throw new WarrenError('MOUNT_ERROR', `cannot remove ${dir}: mounts below it remain`);
  const r = spawnSync('rm', ['-rf', '--one-file-system', '--', dir], { encoding: 'utf8' });
  if (r.status !== 0 && existsSync(dir)) {
    // rm may be missing in minimal environments; nothing below is a mount any more.
    rmSync(dir, { recursive: true, force: true });
  }
}
