/**
 * Building a Debian base layer with debootstrap (variant minbase), and the
 * node-wide cache of built images that makes it a one-time cost per node.
 */
import { spawn, execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, rmSync, writeFileSync, chmodSync } from 'node:fs';
import { join } from 'node:path';
import { WarrenError } from '../../errors';
import type { ImportProgress } from '../types';
import { mkfsArgs, type ErofsCompression } from './erofs';

export const DEFAULT_CACHE_DIR = '/var/cache/warren';
export const DEFAULT_MIRROR = 'http://deb.debian.org/debian';
/** Bump when the build recipe changes in a way that changes the image. */
const RECIPE_VERSION = 2;

export interface DebianOptions {
  suite?: string;
  include?: string[];
  mirror?: string;
  compression?: ErofsCompression;
}

const SUITE_RE = /^[a-z][a-z0-9.-]{0,31}$/;
const PACKAGE_RE = /^[a-z0-9][a-z0-9+.-]{0,127}(?::[a-z0-9-]+)?$/;

export function normalizeDebianOptions(opts: DebianOptions): { suite: string; include: string[]; mirror: string; compression: ErofsCompression } {
  const suite = opts.suite ?? 'bookworm';
  if (!SUITE_RE.test(suite)) throw new WarrenError('INVALID_ARGUMENT', `invalid Debian suite ${JSON.stringify(suite)}`);
  const include = [...new Set(opts.include ?? ['python3', 'git'])].sort();
  for (const p of include) if (typeof p !== 'string' || !PACKAGE_RE.test(p)) throw new WarrenError('INVALID_ARGUMENT', `invalid Debian package name ${JSON.stringify(p)}`);
  const mirror = opts.mirror ?? DEFAULT_MIRROR;
  if (!/^(https?|file):\/\/[^\s'"`$\\]+$/.test(mirror)) throw new WarrenError('INVALID_ARGUMENT', `invalid Debian mirror ${JSON.stringify(mirror)}`);
  return { suite, include, mirror, compression: opts.compression ?? 'lz4hc' };
}

function dpkgArch(): string {
  const map: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'armhf', ia32: 'i386', ppc64: 'ppc64el', s390x: 's390x', riscv64: 'riscv64' };
  return map[process.arch] ?? process.arch;
}

/**
 * What decides the bytes of the image: suite, packages, architecture, the
 * mkfs arguments and the recipe. The mirror is where packages come from, not
 * what they are, so it is not part of the key.
 */
export function debianCacheKey(opts: DebianOptions): string {
  const o = normalizeDebianOptions(opts);
  const key = { recipe: RECIPE_VERSION, variant: 'minbase', suite: o.suite, include: o.include, arch: dpkgArch(), mkfs: mkfsArgs({ compression: o.compression }) };
  return createHash('sha256').update(JSON.stringify(key)).digest('hex');
}

export function debianCachePath(opts: DebianOptions & { cacheDir?: string } = {}): string {
  const o = normalizeDebianOptions(opts);
  return join(opts.cacheDir ?? process.env.WARREN_CACHE_DIR ?? DEFAULT_CACHE_DIR, `debian-${o.suite}-${debianCacheKey(opts)}.erofs`);
}

/** Rough progress through debootstrap's stages, from its "I: ..." lines. */
const STAGES: Array<[RegExp, number]> = [
  [/^I: Retrieving InRelease|^I: Checking Release/, 0.02],
  [/^I: Retrieving Packages|^I: Validating Packages/, 0.05],
  [/^I: Resolving dependencies/, 0.08],
  [/^I: Retrieving /, 0.1],
  [/^I: Validating /, 0.3],
  [/^I: Extracting /, 0.35],
  [/^I: Installing core packages/, 0.45],
  [/^I: Unpacking required packages|^I: Unpacking /, 0.5],
  [/^I: Configuring required packages|^I: Configuring /, 0.7],
  [/^I: Unpacking the base system/, 0.8],
  [/^I: Configuring the base system/, 0.9],
  [/^I: Base system installed successfully/, 1],
];

/** Run debootstrap into `target`; throws IMAGE_BUILD_FAILED with the end of its log. */
export function runDebootstrap(target: string, opts: DebianOptions, onProgress: (p: ImportProgress) => void, signal?: AbortSignal): Promise<void> {
  const o = normalizeDebianOptions(opts);
  const args = ['--variant=minbase', `--include=${o.include.join(',')}`, `--arch=${dpkgArch()}`, o.suite, target, o.mirror];
  return new Promise((resolve, reject) => {
    const child = spawn('debootstrap', args, {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive', LC_ALL: 'C', LANG: 'C' },
      signal,
    });
    let tail = '';
    let fraction = 0;
    let partial = '';
    const onData = (d: Buffer) => {
      const text = partial + d.toString();
      const lines = text.split('\n');
      partial = lines.pop() ?? '';
      for (const line of lines) {
        tail = (tail + line + '\n').slice(-6000);
        if (!line.startsWith('I: ') && !line.startsWith('W: ') && !line.startsWith('E: ')) continue;
        for (const [re, f] of STAGES) if (re.test(line) && f > fraction) fraction = f;
        onProgress({ phase: 'fetch', message: line.slice(3), fraction: Math.min(fraction, 0.99) });
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('error', (err) => reject(new WarrenError('IMAGE_BUILD_FAILED', `debootstrap: ${err.message}`)));
    child.on('close', (code, sig) => {
      if (code === 0) return resolve();
      let log = '';
      try {
        log = execFileSync('tail', ['-n', '15', join(target, 'debootstrap', 'debootstrap.log')], { encoding: 'utf8' });
      } catch {
        /* no log */
      }
      reject(new WarrenError('IMAGE_BUILD_FAILED', `debootstrap ${o.suite} failed (${sig ?? `exit ${code}`}): ${(tail + log).trim().split('\n').slice(-12).join(' | ')}`));
    });
  });
}

/** Drop build-time residue that only makes the layer bigger or leaks the build host. */
export function scrubDebianRoot(root: string): void {
  const emptyDir = (dir: string, keep: string[] = []) => {
    const p = join(root, dir);
    if (!existsSync(p)) return;
    for (const name of readdirSync(p)) if (!keep.includes(name)) rmSync(join(p, name), { recursive: true, force: true });
  };
  emptyDir('var/cache/apt/archives', ['partial', 'lock']);
  emptyDir('var/cache/apt/archives/partial');
  emptyDir('var/lib/apt/lists', ['partial', 'lock']);
  emptyDir('var/lib/apt/lists/partial');
  for (const f of [
    'var/cache/apt/pkgcache.bin',
    'var/cache/apt/srcpkgcache.bin',
    'var/cache/ldconfig/aux-cache',
    'var/log/bootstrap.log',
    'var/log/dpkg.log',
    'var/log/alternatives.log',
  ]) {
    rmSync(join(root, f), { force: true });
  }
  emptyDir('var/log/apt');
  const debconf = join(root, 'var/cache/debconf');
  if (existsSync(debconf)) for (const name of readdirSync(debconf)) if (name.endsWith('-old')) rmSync(join(debconf, name), { force: true });
  // Copied from the build host by debootstrap; the sandbox gets its own.
  writeFileSync(join(root, 'etc/hostname'), 'sandbox\n');
  writeFileSync(join(root, 'etc/resolv.conf'), '');
  rmSync(join(root, 'etc/machine-id'), { force: true });
  writeFileSync(join(root, 'etc/machine-id'), '');
  chmodSync(root, 0o755);
}
