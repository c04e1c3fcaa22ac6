/**
 * pack_diff: a sandbox's writable layer becomes a new content-addressed EROFS
 * layer, and parent layers + that layer become a new environment.
 *
 *   1. freeze the sandbox, copy its overlay upper dir (whiteouts = char 0/0
 *      devices and opaque-directory xattrs included, `cp -a`), thaw. The copy
 *      is the only time the sandbox is stopped.
 *   2. scrub: mount the copy as the upper dir of a host overlay over the
 *      sandbox's own lower layers and delete every match of the scrub patterns
 *      *through the overlay*. Overlayfs then records exactly "as if the builder
 *      had deleted these": entries only in the diff disappear, entries coming
 *      from lower layers get whiteouts. Scrubbed paths are absent from the
 *      result whatever layer they came from.
 *   3. mkfs.erofs (reproducible: erofs.ts) the scrubbed upper; the layer store
 *      takes the file under its sha256.
 *   4. register the environment: [new layer, ...the sandbox's layers].
 *
 * Squash: the pack layers of a chain (environment packed from a sandbox that
 * started from a packed environment, and so on) are merged into one layer by
 * replaying the chain's merged view onto an overlay over the base layers
 * (again letting overlayfs write the whiteouts), see `squashLayers`.
 */
import { execFile } from 'node:child_process';
import { lstatSync, mkdirSync, readdirSync, rmSync, statfsSync, type Stats } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { WarrenError } from '../../errors';
import { native } from '../../native';
import { type ErofsCompression, mkfsErofs } from '../layers/erofs';

const run = promisify(execFile);

/** Build-time residue removed from every pack (on top: operator policy and the request). */
export const DEFAULT_SCRUB: readonly string[] = [
  '/root/.bash_history',
  '/root/.ash_history',
  '/root/.sh_history',
  '/root/.zsh_history',
  '/root/.python_history',
  '/root/.node_repl_history',
  '/root/.lesshst',
  '/root/.viminfo',
  '/root/.wget-hsts',
  '/root/.cache',
  '/home/*/.bash_history',
  '/home/*/.ash_history',
  '/home/*/.sh_history',
  '/home/*/.python_history',
  '/home/*/.cache',
  '/tmp/*',
  '/var/tmp/*',
  '/var/cache/apt/*',
  '/var/lib/apt/lists/*',
  '/var/cache/debconf/*-old',
];


/** Validate a scrub pattern: absolute, `*`/`?` within a component, `**` as a whole component; no `..`. */
export function validateScrubPattern(p: string): string {
  if (typeof p !== 'string' || p.length === 0 || p.length > 4096 || p.includes('\0')) throw new WarrenError('INVALID_ARGUMENT', 'scrub patterns are non-empty strings', { field: 'scrub' });
  if (!p.startsWith('/')) throw new WarrenError('PATH_ESCAPE', `scrub pattern ${JSON.stringify(p)} is not absolute`, { field: 'scrub' });
  const parts = p.split('/').filter((x) => x !== '' && x !== '.');
  if (parts.includes('..')) throw new WarrenError('PATH_ESCAPE', `scrub pattern ${JSON.stringify(p)} has a ".." component`, { field: 'scrub' });
  if (parts.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'scrubbing "/" would remove everything', { field: 'scrub' });
  for (const part of parts) if (part.includes('**') && part !== '**') throw new WarrenError('INVALID_ARGUMENT', `"**" must be a whole path component in ${JSON.stringify(p)}`, { field: 'scrub' });
  return '/' + parts.join('/');
}

function componentRe(part: string): RegExp {
  const re = part.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*').replace(/\?/g, '[^/]');
  return new RegExp(`^${re}$`);
}

function lstatOrNull(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch {
    return null;
  }
}

/**
 * Expand glob patterns against the tree at `root` without following symlinks:
 * every component above a match is a real directory, so a match is always
 * inside the tree (a match may itself be a symlink; removing it removes the link).
 * Returns sandbox paths ("/tmp/x"), parents before children, no duplicates.
 */
export function expandPatterns(root: string, patterns: readonly string[]): string[] {
  const out = new Set<string>();
  const walk = (rel: string, parts: string[]): void => {
    if (parts.length === 0) {
      if (rel !== '') out.add(rel);
      return;
    }
    const [head, ...rest] = parts as [string, ...string[]];
    const here = join(root, rel);
    if (head === '**') {
      const st = lstatOrNull(here);
      if (st === null || !st.isDirectory()) return;
      if (rest.length === 0) {
        // "/a/**": everything inside /a (not /a itself).
        for (const name of safeReaddir(here)) out.add(`${rel}/${name}`);
        return;
      }
      walk(rel, rest); // "**" as zero components
      for (const name of safeReaddir(here)) if (lstatOrNull(join(here, name))?.isDirectory()) walk(`${rel}/${name}`, parts);
      return;
    }
    if (!/[*?]/.test(head)) {
      const st = lstatOrNull(join(here, head));
      // Descend only into real directories: `here` is a host path, and a symlink the
      // sandbox planted (/var -> /) would be resolved by the host, outside the tree.
      if (st !== null && (rest.length === 0 || st.isDirectory())) walk(`${rel}/${head}`, rest);
      return;
    }
    const st = lstatOrNull(here);
    if (st === null || !st.isDirectory()) return;
    const re = componentRe(head);
    for (const name of safeReaddir(here)) {
      if (!re.test(name)) continue;
      if (rest.length === 0 || lstatOrNull(join(here, name))?.isDirectory()) walk(`${rel}/${name}`, rest);
    }
  };
  for (const p of patterns) walk('', validateScrubPattern(p).split('/').filter(Boolean));
  // Drop paths below another match: deleting the parent covers them.
  const sorted = [...out].sort();
  return sorted.filter((p, i) => !sorted.slice(0, i).some((q) => p.startsWith(q + '/')));
}

function safeReaddir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

function overlayOptions(lower: string[], upper?: string, work?: string): string {
  for (const p of [...lower, upper ?? '', work ?? '']) {
    if (/[,:\\]/.test(p)) throw new WarrenError('INVALID_ARGUMENT', `overlay path ${p} contains ',', ':' or '\\'`);
  }
  let opts = `lowerdir=${lower.join(':')}`;
  if (upper !== undefined) opts += `,upperdir=${upper},workdir=${work}`;
  return opts;
}

async function withMount<T>(target: string, data: string, fn: () => Promise<T>): Promise<T> {
  mkdirSync(target, { recursive: true, mode: 0o700 });
  // Host-side views of a sandbox's files (scrub, squash): nothing in them is a device, set-uid or run here.
  native.mount('overlay', target, 'overlay', ['nodev', 'nosuid', 'noexec'], data);
  try {
    return await fn();
  } finally {
    native.umount(target, false);
  }
}

/** `cp -a` of a tree (whiteouts and xattrs included): how a host-side writable layer is exported. */
export async function copyTree(from: string, to: string): Promise<void> {
  try {
    // --sparse=always: holes stay holes (and zero runs become holes) on the host disk.
    await run('cp', ['-a', '--sparse=always', '--no-target-directory', from, to], { maxBuffer: 1 << 20 });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new WarrenError('INTERNAL', `copying ${from}: ${(e.stderr || e.message).toString().trim().split('\n').slice(0, 5).join(' | ')}`);
  }
}

/** Apparent bytes (holes included), allocated bytes and entries of a tree (symlinks not followed). */
export function treeBytes(dir: string): { bytes: number; allocated: number; entries: number } {
  let bytes = 0;
  let allocated = 0;
  let entries = 0;
  const walk = (d: string): void => {
    for (const name of safeReaddir(d)) {
      const p = join(d, name);
      const st = lstatOrNull(p);
      if (st === null) continue;
      entries++;
      allocated += st.blocks * 512;
      if (st.isDirectory()) walk(p);
      else if (st.isFile()) bytes += st.size;
    }
  };
  walk(dir);
  return { bytes, allocated, entries };
}

/** What one pack may cost (the packing sandbox's profile: limits.packMb, limits.packSeconds). */
export interface PackBudget {
  maxBytes: number;
  seconds: number;
}

const MiB = 1024 * 1024;

export interface PackInput {
  sandboxId: string;
  /** The backend's export facet: how big the upper dir is (apparent and allocated bytes), before anything is copied. */
  measureUpper(): Promise<{ bytes: number; allocated: number }>;
  /** Mount paths of the sandbox's lower layers, top-most first. */
  lowerPaths: string[];
  scrub: readonly string[];
  compression: ErofsCompression;
  /** The backend's export facet: writes the sandbox's upper dir to `dest` (the only time the sandbox is stopped). */
  exportUpper(dest: string): Promise<{ frozenMs: number }>;
  scratch: string;
  budget: PackBudget;
  log?: (line: string) => void;
}

export interface PackedLayer {
  /** The finished image file (in scratch) and its sha256 (hex). */
  file: string;
  hex: string;
  diffBytes: number;
  diffEntries: number;
  scrubbed: string[];
  frozenMs: number;
  copyMs: number;
  scrubMs: number;
  mkfsMs: number;
}

/** Steps 1-3: copy (frozen), scrub, mkfs. The caller registers the layer. */
export async function packUpper(input: PackInput): Promise<PackedLayer> {
  const upper = join(input.scratch, 'upper');
  const work = join(input.scratch, 'work');
  const merged = join(input.scratch, 'merged');
  mkdirSync(work, { mode: 0o700 });
  const t0 = performance.now();
  const deadline = t0 + input.budget.seconds * 1000;
  // Refuse before anything is copied: the budget counts apparent sizes (a 4 GiB sparse
  // file is 4 GiB of image work), the host disk must hold what the copy allocates.
  const before = await input.measureUpper();
  if (before.bytes > input.budget.maxBytes) {
    throw new WarrenError('PAYLOAD_TOO_LARGE', `the diff of sandbox ${input.sandboxId} holds ${before.bytes} bytes (file sizes, holes included); this sandbox's pack budget is ${input.budget.maxBytes} bytes (limits.packMb of its profile)`, {
      diffBytes: before.bytes,
      limitBytes: input.budget.maxBytes,
    });
  }
  const fs = statfsSync(input.scratch);
  const free = fs.bavail * fs.bsize;
  if (before.allocated * 2 + 64 * MiB > free) {
    throw new WarrenError('RESOURCE_EXHAUSTED', `packing sandbox ${input.sandboxId} needs about ${before.allocated * 2 + 64 * MiB} bytes on the node's disk; ${free} are free`, { neededBytes: before.allocated * 2 + 64 * MiB, freeBytes: free });
  }
  const { frozenMs } = await input.exportUpper(upper);
  const t1 = performance.now();
  let scrubbed: string[] = [];
  await withMount(merged, overlayOptions(input.lowerPaths, upper, work), async () => {
    scrubbed = expandPatterns(merged, input.scrub);
    for (const p of scrubbed) rmSync(join(merged, p), { recursive: true, force: true });
  });
  rmSync(work, { recursive: true, force: true });
  const t2 = performance.now();
  const size = treeBytes(upper);
  const file = join(input.scratch, 'layer.erofs');
  const hex = await withDeadline(deadline, input.budget.seconds, (signal) => mkfsErofs(file, upper, { compression: input.compression, chunked: true, log: input.log, signal }));
  const t3 = performance.now();
  return {
    file,
    hex,
    diffBytes: size.bytes,
    diffEntries: size.entries,
    scrubbed,
    frozenMs,
    copyMs: round(t1 - t0),
    scrubMs: round(t2 - t1),
    mkfsMs: round(t3 - t2),
  };
}

/**
 * Merge the pack layers `diffPaths` (top-most first) that sit on `basePaths`
 * into one layer directory `out` (an overlay upper dir: whiteouts and opaque
 * directories relative to the base). Every path any diff layer touches is made
 * to look, over the base, exactly as the full chain shows it.
 */
export async function squashLayers(diffPaths: string[], basePaths: string[], scratch: string): Promise<string> {
  const out = join(scratch, 'squash-upper');
  const work = join(scratch, 'squash-work');
  const chainView = join(scratch, 'chain');
  const target = join(scratch, 'target');
  mkdirSync(out, { mode: 0o755 });
  mkdirSync(work, { mode: 0o700 });
  // Every path a diff layer mentions (files, dirs, whiteouts), parents first.
  const touched = new Set<string>();
  const collect = (root: string, rel: string): void => {
    for (const name of safeReaddir(join(root, rel))) {
      const r = rel === '' ? name : `${rel}/${name}`;
      touched.add(r);
      const st = lstatOrNull(join(root, r));
      if (st?.isDirectory()) collect(root, r);
    }
  };
  for (const d of diffPaths) collect(d, '');
  const paths = [...touched].sort((a, b) => a.split('/').length - b.split('/').length || (a < b ? -1 : 1));
  await withMount(chainView, overlayOptions([...diffPaths, ...basePaths]), () =>
    withMount(target, overlayOptions(basePaths, out, work), async () => {
      const copy: string[] = [];
      // Host paths: a component above `rel` that is not a real directory (a diff layer
      // replaced a directory by a link, say to /) would be resolved by the host. Such a
      // path is covered by its parent, which is copied as what it is (the link).
      const parentsReal = (root: string, rel: string): boolean => {
        const parts = rel.split('/');
        for (let i = 1; i < parts.length; i++) {
          const st = lstatOrNull(join(root, ...parts.slice(0, i)));
          if (st !== null && !st.isDirectory()) return false;
          if (st === null && root === chainView) return false;
        }
        return true;
      };
      for (const rel of paths) {
        if (!parentsReal(chainView, rel) || !parentsReal(target, rel)) continue;
        const want = lstatOrNull(join(chainView, rel));
        const have = lstatOrNull(join(target, rel));
        if (want === null) {
          if (have !== null) rmSync(join(target, rel), { recursive: true, force: true });
          continue;
        }
        if (have !== null && (want.isDirectory() !== have.isDirectory() || !want.isDirectory())) {
          rmSync(join(target, rel), { recursive: true, force: true });
        }
        if (want.isDirectory() && have?.isDirectory()) {
          // Children the chain hides (deleted, or an opaque directory) go.
          const keep = new Set(safeReaddir(join(chainView, rel)));
          for (const name of safeReaddir(join(target, rel))) if (!keep.has(name)) rmSync(join(target, rel, name), { recursive: true, force: true });
        }
        copy.push(rel);
      }
      // One tar pass copies contents, modes, owners, times and xattrs, parents first.
      if (copy.length > 0) await tarCopy(chainView, target, copy);
    }),
  );
  rmSync(work, { recursive: true, force: true });
  return out;
}

async function tarCopy(from: string, to: string, rels: string[]): Promise<void> {
  const { spawn } = await import('node:child_process');
  await new Promise<void>((resolve, reject) => {
    const src = spawn('tar', ['-C', from, '--xattrs', '--xattrs-include=*', '--numeric-owner', '--no-recursion', '-c', '-f', '-', '--null', '-T', '-'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const dst = spawn('tar', ['-C', to, '--xattrs', '--xattrs-include=*', '--numeric-owner', '--same-permissions', '--same-owner', '-x', '-f', '-'], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    src.stderr.on('data', (c: Buffer) => (err += c.toString()));
    dst.stderr.on('data', (c: Buffer) => (err += c.toString()));
    src.stdout.pipe(dst.stdin);
    src.stdin.end(rels.map((r) => `./${r}\0`).join(''));
    let pending = 2;
    let failed = false;
    const done = (code: number | null) => {
      if (code !== 0) failed = true;
      if (--pending === 0) (failed ? reject(new WarrenError('INTERNAL', `squash copy failed: ${err.trim().slice(0, 500)}`)) : resolve());
    };
    src.on('close', done);
    dst.on('close', done);
  });
}

/** Run `fn` with a signal that aborts at `deadline` (performance.now() ms); then TIMEOUT. */
export async function withDeadline<T>(deadline: number, seconds: number, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const left = deadline - performance.now();
  const timeout = () => new WarrenError('TIMEOUT', `pack took longer than its budget of ${seconds} s (limits.packSeconds of the sandbox's profile)`, { limitSeconds: seconds });
  if (left <= 0) throw timeout();
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), left);
  try {
    return await fn(ac.signal);
  } catch (err) {
    if (ac.signal.aborted) throw timeout();
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}

// ---------------------------------------------------------------- environments

export interface EnvironmentRecord {
  name: string;
  /** Image digest of the environment (from the layer store). */
  digest: string;
  owner: string;
  published: boolean;
  /** The image the packed sandbox was created from. */
  parent: string;
  sourceSandbox: string;
  /** Layers made by pack (top-most first) and the layers below them. */
  diffLayers: string[];
  baseLayers: string[];
  scrub: string[];
  createdAt: string;
}

interface EnvRow {
  name: string;
  digest: string;
  owner: string;
  published: number;
  parent: string;
  source_sandbox: string;
  diff_layers: string;
  base_layers: string;
  scrub: string;
  created_at: string;
}

/** Who may use which packed environment (table `lifecycle_environments`). Images not listed here are node images, usable by all. */
export class EnvironmentRegistry {
  constructor(private readonly db: import('better-sqlite3').Database) {
    db.exec(`CREATE TABLE IF NOT EXISTS lifecycle_environments (
      name TEXT PRIMARY KEY,
      digest TEXT NOT NULL,
      owner TEXT NOT NULL,
      published INTEGER NOT NULL DEFAULT 0,
      parent TEXT NOT NULL,
      source_sandbox TEXT NOT NULL,
      diff_layers TEXT NOT NULL,
      base_layers TEXT NOT NULL,
      scrub TEXT NOT NULL,
      created_at TEXT NOT NULL
    )`);
  }

  put(r: EnvironmentRecord): void {
    this.db
      .prepare(
        `INSERT INTO lifecycle_environments (name, digest, owner, published, parent, source_sandbox, diff_layers, base_layers, scrub, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
         ON CONFLICT(name) DO UPDATE SET digest = excluded.digest, owner = excluded.owner, published = excluded.published, parent = excluded.parent,
           source_sandbox = excluded.source_sandbox, diff_layers = excluded.diff_layers, base_layers = excluded.base_layers, scrub = excluded.scrub,
           created_at = excluded.created_at`,
      )
      .run(r.name, r.digest, r.owner, r.published ? 1 : 0, r.parent, r.sourceSandbox, JSON.stringify(r.diffLayers), JSON.stringify(r.baseLayers), JSON.stringify(r.scrub), r.createdAt);
  }

  get(name: string): EnvironmentRecord | null {
    const row = this.db.prepare('SELECT * FROM lifecycle_environments WHERE name = ?').get(name) as EnvRow | undefined;
    return row === undefined ? null : toEnv(row);
  }

  byDigest(digest: string): EnvironmentRecord | null {
    const row = this.db.prepare('SELECT * FROM lifecycle_environments WHERE digest = ? ORDER BY created_at DESC LIMIT 1').get(digest) as EnvRow | undefined;
    return row === undefined ? null : toEnv(row);
  }

  remove(name: string): void {
    this.db.prepare('DELETE FROM lifecycle_environments WHERE name = ?').run(name);
  }

  setPublished(name: string, published: boolean): void {
    this.db.prepare('UPDATE lifecycle_environments SET published = ? WHERE name = ?').run(published ? 1 : 0, name);
  }

  list(): EnvironmentRecord[] {
    return (this.db.prepare('SELECT * FROM lifecycle_environments ORDER BY created_at, name').all() as EnvRow[]).map(toEnv);
  }
}

function toEnv(r: EnvRow): EnvironmentRecord {
  return {
    name: r.name,
    digest: r.digest,
    owner: r.owner,
    published: r.published === 1,
    parent: r.parent,
    sourceSandbox: r.source_sandbox,
    diffLayers: JSON.parse(r.diff_layers) as string[],
    baseLayers: JSON.parse(r.base_layers) as string[],
    scrub: JSON.parse(r.scrub) as string[],
    createdAt: r.created_at,
  };
}
