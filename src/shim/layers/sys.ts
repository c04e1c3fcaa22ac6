/**
 * The few kernel calls the layer store needs and Node does not have: mount(2)
 * of a file-backed EROFS image, umount2(2) and lsetxattr(2); plus reading
 * /proc/self/mountinfo and removing scratch trees without crossing mounts.
 *
 * util-linux mount(8) turns a regular file into a loop device before calling
 * mount(2); a file-backed EROFS mount (Linux 6.12+) needs the file path passed
 * to mount(2) as is. The native helper does that when it is loaded (pass
 * `nativeMounter(addon)` to the store); without it these calls go through
 * perl's `syscall` (perl-base is part of every Debian system).
 */
import { execFileSync, spawnSync } from 'node:child_process';
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

const MS_RDONLY = 1;
const MNT_DETACH = 2;
const ENOTBLK = 15;

// mount, umount2, lsetxattr
const SYSCALLS: Record<string, [number, number, number]> = {
  x64: [165, 166, 189],
  arm64: [40, 39, 6],
  riscv64: [40, 39, 6],
  loong64: [40, 39, 6],
};

const PERL = String.raw`
use strict;
my ($nr_mount, $nr_umount2, $nr_lsetxattr) = split(/,/, shift @ARGV);
my $op = shift @ARGV;
if ($op eq 'mount') {
  my ($src, $dst, $fs, $flags) = @ARGV;
  my $r = syscall($nr_mount, $src, $dst, $fs, $flags + 0, 0);
  if ($r != 0) { my $e = $! + 0; print STDERR "$!\n"; exit($e || 1); }
} elsif ($op eq 'umount') {
  my ($dst, $flags) = @ARGV;
  my $r = syscall($nr_umount2, $dst, $flags + 0);
  if ($r != 0) { my $e = $! + 0; print STDERR "$!\n"; exit($e || 1); }
} elsif ($op eq 'xattrs') {
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
  if (nr === undefined) throw new WarrenError('NOT_SUPPORTED', `layer mounts without the native helper are not supported on ${process.arch}`);
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

/** mount(2) through perl; falls back to a loop device on kernels without file-backed EROFS. */
export class SyscallMounter implements LayerMounter {
  readonly description = 'mount(2) via perl syscall';
  constructor(private readonly log: (msg: string) => void = () => undefined) {}

  mountErofs(file: string, target: string): void {
    const r = perl(['mount', file, target, 'erofs', String(MS_RDONLY)]);
    if (r.status === 0) return;
    if (r.status === ENOTBLK) {
      // Kernel < 6.12 (or EROFS_FS_BACKED_BY_FILE off): only block devices. Use a loop device, autocleared on umount.
      this.log(`file-backed EROFS mounts unsupported here; using a loop device for ${file}`);
      try {
        execFileSync('mount', ['-t', 'erofs', '-o', 'ro,loop', file, target], { stdio: ['ignore', 'ignore', 'pipe'] });
        return;
      } catch (err) {
        const e = err as { stderr?: Buffer; status?: number };
        throw mountError(`mount -o loop ${file} ${target}`, e.status ?? 1, String(e.stderr ?? '').trim());
      }
    }
    throw mountError(`mount erofs ${file} on ${target}`, r.status, r.stderr);
  }

  umount(target: string, detach = false): void {
    const r = perl(['umount', target, String(detach ? MNT_DETACH : 0)]);
    if (r.status !== 0) throw mountError(`umount ${target}`, r.status, r.stderr);
  }
}

/** Use the native helper's mount(2)/umount2(2). */
export function nativeMounter(addon: Pick<NativeAddon, 'mount' | 'umount'>): LayerMounter {
  return {
    description: 'native helper',
    mountErofs(file, target) {
      addon.mount(file, target, 'erofs', ['ro'], '');
    },
    umount(target, detach = false) {
      addon.umount(target, detach);
    },
  };
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
