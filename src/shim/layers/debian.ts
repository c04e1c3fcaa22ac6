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
const RECIPE_VERSION = 3;

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

/** Bump when the layer recipe (runAptLayer, scrubLayerUpper) changes in a way that changes layers. */
const LAYER_RECIPE_VERSION = 2;

export interface DebianLayerOptions {
  /** Debian packages installed (with their dependencies, without recommends) into the layer. */
  packages: string[];
  /** Digests of the layers the packages are installed over, top-most first (the judge image at the bottom). */
  below: string[];
  mirror?: string;
  suite?: string;
  compression?: ErofsCompression;
}

export function normalizeLayerPackages(packages: string[]): string[] {
  const out = [...new Set(packages)].sort();
  if (out.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'a Debian layer needs at least one package');
  for (const p of out) if (typeof p !== 'string' || !PACKAGE_RE.test(p)) throw new WarrenError('INVALID_ARGUMENT', `invalid Debian package name ${JSON.stringify(p)}`);
  return out;
}

/**
 * What decides a toolkit layer's bytes: the exact layers below it (content digests), the
 * packages, the architecture, mkfs and the recipe. A new or upgraded package list changes
 * only its own layer's key; a new base changes every layer built over it.
 */
export function debianLayerCacheKey(o: DebianLayerOptions): string {
  const key = { recipe: LAYER_RECIPE_VERSION, below: o.below, packages: normalizeLayerPackages(o.packages), arch: dpkgArch(), suite: o.suite ?? 'bookworm', mkfs: mkfsArgs({ compression: o.compression ?? 'lz4' }) };
  return createHash('sha256').update(JSON.stringify(key)).digest('hex');
}

export function debianLayerCachePath(name: string, o: DebianLayerOptions & { cacheDir?: string }): string {
  if (!/^[a-z0-9][a-z0-9.-]{0,63}$/.test(name)) throw new WarrenError('INVALID_ARGUMENT', `invalid layer name ${JSON.stringify(name)}`);
  return join(o.cacheDir ?? process.env.WARREN_CACHE_DIR ?? DEFAULT_CACHE_DIR, `layer-${name}-${debianLayerCacheKey(o)}.erofs`);
}

/**
 * Install Debian packages over mounted read-only layers and keep only what changed: an overlay
 * (lower: `lowers`, top-most first; upper: `upper`) is mounted in a private mount and pid
 * namespace of a child (`unshare`), apt-get runs chrooted into it with the host's resolver and
 * Debian's own sources, and everything (overlay, proc, dev) goes with the namespace. No service
 * is started (policy-rc.d). The upper directory is the layer; scrubLayerUpper tidies it.
 */
export function runAptLayer(
  dirs: { lowers: string[]; upper: string; work: string; merged: string; aptCache?: string; aptLists?: string },
  packages: string[],
  opts: { mirror?: string; suite?: string; onLine?: (line: string) => void; signal?: AbortSignal; update?: boolean },
): Promise<void> {
  const pkgs = normalizeLayerPackages(packages);
  const mirror = opts.mirror ?? DEFAULT_MIRROR;
  const suite = opts.suite ?? 'bookworm';
  if (!/^(https?|file):\/\/[^\s'"`$\\]+$/.test(mirror)) throw new WarrenError('INVALID_ARGUMENT', `invalid Debian mirror ${JSON.stringify(mirror)}`);
  if (!SUITE_RE.test(suite)) throw new WarrenError('INVALID_ARGUMENT', `invalid Debian suite ${JSON.stringify(suite)}`);
  for (const d of [...dirs.lowers, dirs.upper, dirs.work, dirs.merged, ...(dirs.aptCache ? [dirs.aptCache] : []), ...(dirs.aptLists ? [dirs.aptLists] : [])]) {
    if (!/^\/[A-Za-z0-9._/-]+$/.test(d) || d.includes(':') || d.includes(',')) throw new WarrenError('INVALID_ARGUMENT', `unusable build path ${JSON.stringify(d)}`);
  }
  const m = dirs.merged;
  const apt = 'DEBIAN_FRONTEND=noninteractive LC_ALL=C LANG=C PATH=/usr/sbin:/usr/bin:/sbin:/bin';
  const aptOpts = '-o Acquire::Retries=3 -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0';
  // Everything in one shell of a private mount + pid namespace: nothing outlives it.
  const script = [
    'set -eu',
    `mount -t overlay overlay -o lowerdir=${dirs.lowers.join(':')},upperdir=${dirs.upper},workdir=${dirs.work} ${m}`,
    `mount -t proc proc ${m}/proc`,
    `mount -t tmpfs -o mode=755 tmpfs ${m}/dev`,
    ...['null', 'zero', 'full', 'random', 'urandom', 'tty'].map((d) => `touch ${m}/dev/${d} && mount --bind /dev/${d} ${m}/dev/${d}`),
    `mount -t tmpfs -o mode=1777 tmpfs ${m}/tmp`,
    `mkdir -p ${m}/var/lib/apt/lists/partial ${m}/var/cache/apt/archives/partial`,
    ...(dirs.aptCache ? [`mount --bind ${dirs.aptCache} ${m}/var/cache/apt/archives`] : []),
    // apt's package lists, shared by the builds of one process (fetched once, not once per layer)
    ...(dirs.aptLists ? [`mkdir -p ${dirs.aptLists}/partial`, `mount --bind ${dirs.aptLists} ${m}/var/lib/apt/lists`] : []),
    `cp /etc/resolv.conf ${m}/etc/resolv.conf`,
    `printf '#!/bin/sh\\nexit 101\\n' > ${m}/usr/sbin/policy-rc.d && chmod 755 ${m}/usr/sbin/policy-rc.d`,
    `printf 'deb ${mirror} ${suite} main\\ndeb ${mirror} ${suite}-updates main\\ndeb http://security.debian.org/debian-security ${suite}-security main\\n' > ${m}/etc/apt/sources.list`,
    ...(opts.update === false ? [] : [`chroot ${m} /usr/bin/env -i ${apt} apt-get ${aptOpts} -q update`]),
    `chroot ${m} /usr/bin/env -i ${apt} apt-get ${aptOpts} -q -y --no-install-recommends install ${pkgs.join(' ')}`,
    `chroot ${m} /usr/bin/env -i ${apt} ldconfig`,
    `rm -f ${m}/usr/sbin/policy-rc.d`,
  ].join('\n');
  return new Promise((resolve, reject) => {
    const child = spawn('unshare', ['--mount', '--propagation', 'private', '--pid', '--fork', '--kill-child', 'sh', '-c', script], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { PATH: '/usr/sbin:/usr/bin:/sbin:/bin', LC_ALL: 'C', LANG: 'C' },
      signal: opts.signal,
    });
    let tail = '';
    let partial = '';
    const onData = (d: Buffer) => {
      const lines = (partial + d.toString()).split('\n');
      partial = lines.pop() ?? '';
      for (const line of lines) {
        tail = (tail + line + '\n').slice(-6000);
        opts.onLine?.(line);
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('error', (err) => reject(new WarrenError('IMAGE_BUILD_FAILED', `apt layer: ${err.message}`)));
    child.on('close', (code, sig) => {
      if (code === 0) return resolve();
      reject(new WarrenError('IMAGE_BUILD_FAILED', `installing ${pkgs.join(' ')} failed (${sig ?? `exit ${code}`}): ${tail.trim().split('\n').slice(-12).join(' | ')}`));
    });
  });
}

/**
 * Drop from a layer's upper directory what the build left that is not the packages: apt's
 * lists and caches, logs, the build host's resolver, and copies of base files it only touched.
 * The dpkg database stays (the top-most layer's is what a program sees; nothing runs dpkg there).
 */
export function scrubLayerUpper(upper: string): void {
  for (const p of [
    'var/lib/apt/lists',
    'var/cache/apt',
    'var/log',
    'etc/resolv.conf',
    'etc/apt/sources.list',
    'usr/sbin/policy-rc.d',
    'var/cache/ldconfig',
    'tmp',
    'proc',
    'dev',
    'root/.bash_history',
  ]) {
    rmSync(join(upper, p), { recursive: true, force: true });
  }
  const debconf = join(upper, 'var/cache/debconf');
  if (existsSync(debconf)) for (const name of readdirSync(debconf)) if (name.endsWith('-old')) rmSync(join(debconf, name), { force: true });
  chmodSync(upper, 0o755);
}
