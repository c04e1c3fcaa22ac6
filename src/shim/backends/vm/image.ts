/**
 * The vm backend's desktop image: a Debian root filesystem with a small X
 * desktop, Debian's generic kernel and an initramfs holding warren-agent,
 * built offline from Debian packages by scripts/vm-desktop-image.sh and cached
 * under /var/cache/warren/vm/, keyed by the sha256 of everything that goes
 * into it (the build script and guest files, the agent, busybox, the kernel
 * package it takes). Every vm boots this image read-only, through its own
 * qcow2 overlay.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { WarrenError } from '../../../errors';
import { agentBinary } from '../microvm/guest';

export const VM_CACHE = process.env.WARREN_VM_CACHE ?? '/var/cache/warren/vm';

export interface DesktopImage {
  dir: string;
  /** Read-only ext4 root (raw), the backing file of every overlay. */
  base: string;
  kernel: string;
  initrd: string;
  kernelRelease: string;
  /** Size of the base filesystem: the smallest diskMb a vm can have. */
  baseMb: number;
}

function scriptsDir(): string {
  for (const rel of ['../../../../../scripts', '../../../../scripts']) {
    const d = join(__dirname, rel);
    if (existsSync(join(d, 'vm-desktop-image.sh'))) return d;
  }
  return join(__dirname, '../../../../../scripts');
}

function busyboxBinary(): string | null {
  for (const p of ['/bin/busybox', '/usr/bin/busybox']) if (existsSync(p)) return p;
  return null;
}

/** What the build needs on the host, or the reason it cannot run. */
export function desktopBuildMissing(): string | null {
  if (busyboxBinary() === null) return 'busybox-static is not installed';
  if (!existsSync(agentBinary())) return `the guest agent is not built (${agentBinary()})`;
  for (const b of ['flock', 'debootstrap', 'mkfs.ext4', 'cpio', 'depmod', 'modprobe', 'dpkg-deb', 'apt-get', 'qemu-img']) {
    if (!['/usr/sbin', '/usr/bin', '/sbin', '/bin'].some((d) => existsSync(join(d, b)))) return `${b} is not installed`;
  }
  if (!existsSync(join(scriptsDir(), 'vm-desktop-image.sh'))) return 'scripts/vm-desktop-image.sh is missing';
  return null;
}

let keyMemo: { stamp: string; key: string } | null = null;

/**
 * The sha256 of the image's inputs. It is asked for on every create (the feature report says
 * whether the vm backend has its image): the hash is kept while no input changed its size,
 * mtime or inode, so the files are read again only when one did.
 */
function cacheKey(): string {
  const scripts = scriptsDir();
  const files = [...['vm-desktop-image.sh', ...readdirSync(join(scripts, 'vm-guest')).sort().map((n) => `vm-guest/${n}`)].map((f) => join(scripts, f)), agentBinary(), busyboxBinary()!];
  const stamp = files.map((f) => {
    const st = statSync(f);
    return `${f}\0${st.size}\0${st.mtimeMs}\0${st.ino}`;
  }).join('\0');
  if (keyMemo?.stamp === stamp) return keyMemo.key;
  const h = createHash('sha256').update('vm-desktop-1\0');
  for (const f of files.slice(0, -2)) h.update(f.slice(scripts.length + 1)).update('\0').update(readFileSync(f)).update('\0');
  for (const f of files.slice(-2)) h.update(readFileSync(f));
  keyMemo = { stamp, key: h.digest('hex').slice(0, 16) };
  return keyMemo.key;
}

function load(dir: string): DesktopImage | null {
  const env = join(dir, 'image.env');
  if (!existsSync(env)) return null;
  const vars = Object.fromEntries(
    readFileSync(env, 'utf8')
      .split('\n')
      .map((l) => l.split('='))
      .filter((p) => p.length === 2) as Array<[string, string]>,
  );
  return { dir, base: join(dir, 'base.img'), kernel: join(dir, 'vmlinuz'), initrd: join(dir, 'initrd'), kernelRelease: vars.KERNEL_RELEASE ?? '', baseMb: Number(vars.BASE_MB) };
}

/** The cached image for the current inputs, or null when it is not built yet. */
export function cachedDesktopImage(): DesktopImage | null {
  if (desktopBuildMissing() !== null) return null;
  return load(join(VM_CACHE, `desktop-${cacheKey()}`));
}

let building: Promise<DesktopImage> | null = null;

/**
 * The desktop image, built on first use (a few minutes: debootstrap of about
 * 200 packages from the mirror). Concurrent callers in this process share one
 * build, and a lock file makes other processes wait for it instead of building
 * again.
 */
export function desktopImage(log: (line: string) => void = () => undefined, mirror = process.env.WARREN_DEBIAN_MIRROR): Promise<DesktopImage> {
  const missing = desktopBuildMissing();
  if (missing !== null) return Promise.reject(new WarrenError('NOT_SUPPORTED', `the vm desktop image cannot be built here: ${missing}`));
  const key = cacheKey();
  const dir = join(VM_CACHE, `desktop-${key}`);
  const ready = load(dir);
  if (ready !== null) return Promise.resolve(ready);
  building ??= build(key, dir, log, mirror).finally(() => (building = null));
  return building;
}

async function build(key: string, dir: string, log: (line: string) => void, mirror: string | undefined): Promise<DesktopImage> {
  mkdirSync(VM_CACHE, { recursive: true, mode: 0o755 });
  const work = join(VM_CACHE, `.build-${process.pid}-${key}`);
  rmSync(work, { recursive: true, force: true });
  const out: string[] = [];
  try {
    await new Promise<void>((resolve, reject) => {
      // One build per node at a time (test files and nodes may ask at once): under the lock,
      // whoever comes second finds the image made and builds nothing.
      const script = '[ -e "$1/image.env" ] && exit 0; /bin/bash "$2" "$3" "$4" "$5" ${6:+"$6"} && mv -T "$3" "$1"';
      const args = [join(VM_CACHE, '.build.lock'), '/bin/bash', '-c', script, 'vm-image', dir, join(scriptsDir(), 'vm-desktop-image.sh'), work, agentBinary(), busyboxBinary()!, ...(mirror ? [mirror] : [])];
      const child = spawn('flock', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      const keep = (d: Buffer) => {
        for (const line of d.toString('utf8').split('\n')) {
          if (line.trim() === '') continue;
          out.push(line);
          if (out.length > 40) out.shift();
          if (line.startsWith('vm-image:')) log(line);
        }
      };
      child.stdout.on('data', keep);
      child.stderr.on('data', keep);
      child.on('error', reject);
      child.on('close', (code) => (code === 0 ? resolve() : reject(new WarrenError('IMAGE_BUILD_FAILED', `building the vm desktop image failed (exit ${code}): ${out.slice(-10).join(' | ')}`))));
    });
    // Older builds stay: paused vms' overlays name their base image by path.
    const img = load(dir);
    if (img === null) throw new WarrenError('IMAGE_BUILD_FAILED', 'the vm desktop image build left no image.env');
    return img;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
