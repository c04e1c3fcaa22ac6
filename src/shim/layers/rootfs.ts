/**
 * Applies OCI layer tars, in order, onto one root filesystem directory.
 *
 * Paths are resolved inside the root the way a chroot would (absolute symlinks
 * restart at the root, `..` stops at it), one component at a time with lstat,
 * so no entry and no symlink left by an earlier layer can make a write land
 * outside the root. Semantics follow the OCI image spec (and Docker's
 * UnpackLayer):
 *   - `.wh.<name>` deletes <name> from the layers below;
 *   - `.wh..wh..opq` empties its directory of everything from the layers below;
 *   - an entry replaces whatever is at its path, except that a directory over a
 *     directory merges.
 * The root directory must be private to the caller (nobody else writes there).
 */
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  lchownSync,
  linkSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  type Stats,
} from 'node:fs';
import { open } from 'node:fs/promises';
import { constants } from 'node:fs';
import { join } from 'node:path';
import { WarrenError } from '../../errors';
import { lsetxattrs } from './sys';
import { entryComponents, readTarStream, type TarEntry } from './tar';

const WH_PREFIX = '.wh.';
const WH_OPAQUE = '.wh..wh..opq';

function lstatOrNull(p: string): Stats | null {
  try {
    return lstatSync(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}

export interface ApplyStats {
  entries: number;
  bytes: number;
  whiteouts: number;
}

export class RootfsBuilder {
  constructor(readonly root: string) {}

  /**
   * Resolve `parts` inside the root. Intermediate symlinks are followed within
   * the root; the last component is followed only when `followLast`. Missing
   * intermediate directories are created when `create`; otherwise null is
   * returned for a missing path.
   */
  resolve(parts: string[], opts: { create: boolean; followLast: boolean }): string | null {
    let resolved: string[] = [];
    const queue = [...parts];
    let hops = 0;
    while (queue.length > 0) {
      const c = queue.shift()!;
      if (c === '' || c === '.') continue;
      if (c === '..') {
        resolved.pop();
        continue;
      }
      const last = queue.length === 0;
      const p = join(this.root, ...resolved, c);
      const st = lstatOrNull(p);
      if (st?.isSymbolicLink() && (!last || opts.followLast)) {
        if (++hops > 40) throw new WarrenError('INVALID_ARCHIVE', `too many levels of symbolic links resolving /${parts.join('/')}`);
        const target = readlinkSync(p);
        if (target.startsWith('/')) resolved = [];
        queue.unshift(...target.split('/'));
        continue;
      }
      if (st === null) {
        if (last) {
          resolved.push(c);
          break;
        }
        if (!opts.create) return null;
        mkdirSync(p, { mode: 0o755 });
        chmodSync(p, 0o755);
      } else if (!last && !st.isDirectory()) {
        if (!opts.create) return null;
        throw new WarrenError('INVALID_ARCHIVE', `/${parts.join('/')}: /${[...resolved, c].join('/')} is not a directory`);
      }
      resolved.push(c);
    }
    return join(this.root, ...resolved);
  }

  /**
   * Apply one layer (an uncompressed tar stream). Entry names must already have
   * been checked (`checkConfined(..., 'in-root')`); they are checked again here.
   */
  async applyLayer(source: AsyncIterable<Buffer>, onEntry?: (e: TarEntry) => void): Promise<ApplyStats> {
    const stats: ApplyStats = { entries: 0, bytes: 0, whiteouts: 0 };
    // Paths this layer wrote: an opaque marker keeps them and drops the rest.
    const written = new Set<string>();
    const xattrs: Array<{ path: string; name: string; value: Buffer }> = [];
    const opaque: string[] = [];
    for await (const { entry, body } of readTarStream(source)) {
      stats.entries++;
      onEntry?.(entry);
      const parts = entryComponents(entry.path);
      const base = parts[parts.length - 1] ?? '';
      if (base === WH_OPAQUE) {
        const dir = this.resolve(parts.slice(0, -1), { create: false, followLast: true });
        if (dir !== null) opaque.push(dir);
        // Applied after the whole layer: entries of this layer in that directory may come later in the tar.
        stats.whiteouts++;
        continue;
      }
      if (base.startsWith(WH_PREFIX)) {
        const parent = this.resolve(parts.slice(0, -1), { create: false, followLast: true });
        if (parent !== null) {
          const victim = join(parent, base.slice(WH_PREFIX.length));
          if (victim !== this.root && lstatOrNull(victim) !== null) rmSync(victim, { recursive: true, force: true });
        }
        stats.whiteouts++;
        continue;
      }
      if (parts.length === 0) {
        // The root itself ("./"): only its metadata.
        if (entry.type === 'dir') this.setMeta(this.root, entry, xattrs);
        continue;
      }
      const dest = this.resolve(parts, { create: true, followLast: false })!;
      const existing = lstatOrNull(dest);
      if (existing !== null && !(existing.isDirectory() && entry.type === 'dir')) {
        if (dest === this.root) throw new WarrenError('INVALID_ARCHIVE', `${entry.path} would replace the root`);
        rmSync(dest, { recursive: true, force: true });
      }
      switch (entry.type) {
        case 'dir':
          if (existing === null || !existing.isDirectory()) mkdirSync(dest, { mode: 0o755 });
          break;
        case 'file': {
          const fh = await open(dest, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
          try {
            for await (const chunk of body) {
              await fh.write(chunk);
              stats.bytes += chunk.length;
            }
          } finally {
            await fh.close();
          }
          break;
        }
        case 'symlink':
          symlinkSync(entry.linkpath, dest);
          break;
        case 'hardlink': {
          const target = this.resolve(entryComponents(entry.linkpath, entry.path), { create: false, followLast: false });
          const st = target === null ? null : lstatOrNull(target);
          if (target === null || st === null) throw new WarrenError('INVALID_ARCHIVE', `hard link ${entry.path}: target ${entry.linkpath} does not exist`);
          if (st.isDirectory()) throw new WarrenError('INVALID_ARCHIVE', `hard link ${entry.path}: target ${entry.linkpath} is a directory`);
          linkSync(target, dest);
          written.add(dest);
          continue; // a hard link shares its target's metadata
        }
        case 'char':
        case 'block':
          execFileSync('mknod', ['-m', '0600', dest, entry.type === 'char' ? 'c' : 'b', String(entry.devmajor), String(entry.devminor)], { stdio: ['ignore', 'ignore', 'pipe'] });
          break;
        case 'fifo':
          execFileSync('mkfifo', ['-m', '0600', dest], { stdio: ['ignore', 'ignore', 'pipe'] });
          break;
        default:
          // Unknown vendor types carry nothing we can represent.
          continue;
      }
      written.add(dest);
      this.setMeta(dest, entry, xattrs);
    }
    for (const dir of opaque) this.makeOpaque(dir, written);
    lsetxattrs(xattrs.filter((x) => lstatOrNull(x.path) !== null));
    return stats;
  }

  private setMeta(path: string, entry: TarEntry, xattrs: Array<{ path: string; name: string; value: Buffer }>): void {
    lchownSync(path, entry.uid, entry.gid);
    // After chown, which clears set-id bits.
    if (entry.type !== 'symlink') chmodSync(path, entry.mode & 0o7777);
    for (const [name, value] of Object.entries(entry.xattrs ?? {})) xattrs.push({ path, name, value });
  }

  /** Remove everything below `dir` that this layer did not write. */
  private makeOpaque(dir: string, written: Set<string>): void {
    const st = lstatOrNull(dir);
    if (st === null || !st.isDirectory()) return;
    for (const name of readdirSync(dir)) {
      const p = join(dir, name);
      if (!written.has(p)) {
        rmSync(p, { recursive: true, force: true });
        continue;
      }
      const cst = lstatOrNull(p);
      if (cst?.isDirectory()) this.makeOpaque(p, written);
    }
  }
}
