/**
 * Python byte-code caches that stay valid in a reproducible layer.
 *
 * A timestamp-based `.pyc` (PEP 552 flags 0) records its source's mtime and
 * size; Python uses it only while both match. mkfs.erofs is run with one
 * timestamp for every inode (erofs.ts), so without this every cache in a
 * layer names an mtime its source no longer has: Python then compiles each
 * module it imports from source, at every start, and cannot write the result
 * to the read-only layer (a fresh python3 cost four times a host start).
 *
 * Before the tree is packed, each cache that is valid for its source now
 * (same mtime and size) is rewritten to record the layer's timestamp instead:
 * it is then exactly as valid in the image as it was in the tree. Caches that
 * are stale already, hash-based ones and anything that is not a regular file
 * are left as they are. Only trees Warren built itself are touched (debootstrap
 * roots, apt layers, unpacked OCI images), never a caller's directory.
 */
import { closeSync, lstatSync, openSync, readSync, readdirSync, writeSync } from 'node:fs';
import { join } from 'node:path';

/** `name.cpython-311.pyc`, `name.cpython-311.opt-1.pyc`: the source is `../name.py`. */
const CACHE_NAME = /^(.+?)\.[A-Za-z]+-\d+(?:\.opt-\d+)?\.pyc$/;

export interface PycAlignment {
  /** Caches rewritten to the layer's timestamp. */
  aligned: number;
  /** Caches left alone: stale already, hash-based, not regular files, or without a source. */
  skipped: number;
}

/** The names in `dir`, none if it cannot be read. */
function names(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return [];
  }
}

/** Rewrite the valid timestamp-based caches under `root` to record `epoch` (seconds). */
export function alignPycTimestamps(root: string, epoch: number): PycAlignment {
  const out: PycAlignment = { aligned: 0, skipped: 0 };
  const head = Buffer.alloc(16);
  const stamp = Buffer.alloc(4);
  stamp.writeUInt32LE(epoch >>> 0);
  const visit = (dir: string): void => {
    for (const name of names(dir)) {
      const p = join(dir, name);
      let st;
      try {
        st = lstatSync(p);
      } catch {
        continue;
      }
      if (!st.isDirectory()) continue;
      if (name === '__pycache__') alignDir(dir, p);
      else visit(p);
    }
  };
  const alignDir = (srcDir: string, cacheDir: string): void => {
    for (const name of names(cacheDir)) {
      const m = CACHE_NAME.exec(name);
      if (m === null) continue;
      const pyc = join(cacheDir, name);
      try {
        const src = lstatSync(join(srcDir, `${m[1]}.py`));
        const cst = lstatSync(pyc);
        if (!src.isFile() || !cst.isFile() || cst.size < 16) {
          out.skipped++;
          continue;
        }
        const fd = openSync(pyc, 'r+');
        try {
          // magic (ends in \r\n), flags, source mtime, source size (both mod 2^32)
          if (readSync(fd, head, 0, 16, 0) !== 16 || head[2] !== 0x0d || head[3] !== 0x0a || head.readUInt32LE(4) !== 0) {
            out.skipped++;
            continue;
          }
          const valid = head.readUInt32LE(8) === Math.floor(src.mtimeMs / 1000) >>> 0 && head.readUInt32LE(12) === src.size >>> 0;
          if (!valid) {
            out.skipped++;
            continue;
          }
          writeSync(fd, stamp, 0, 4, 8);
          out.aligned++;
        } finally {
          closeSync(fd);
        }
      } catch {
        out.skipped++;
      }
    }
  };
  visit(root);
  return out;
}
