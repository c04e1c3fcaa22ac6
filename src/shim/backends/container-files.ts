/**
 * The container backend's files facet: every path is resolved inside the
 * sandbox's root (/proc/<pid 1>/root) by the native walk (openat2
 * RESOLVE_IN_ROOT where the kernel has it), so symlinks and ".." cannot leave it.
 */
import { closeSync, fstatSync, lstatSync, readSync, readdirSync, writeSync } from 'node:fs';
import { posix } from 'node:path';
import { WarrenError } from '../../errors';
import { native } from '../../native';
import type { DirWatch, FileEntry, FilesFacet } from '../types';
import { watchInRoot } from './container-watch';

const ENOTDIR = 20;

type Creds = { uid: number; gid: number; groups: number[] };

export class RootFiles implements FilesFacet {
  /** `creds`: the identity file access runs with (the sandbox user's), so the API can do what an exec as that user could, no more. */
  constructor(
    private readonly root: () => string,
    private readonly creds: () => Creds,
  ) {}

  async readFile(path: string, maxBytes: number): Promise<Buffer> {
    const fd = native.openInRoot(this.root(), path, 'r', 0, this.creds());
    try {
      const st = fstatSync(fd);
      if (!st.isFile()) throw new WarrenError('INVALID_ARGUMENT', `${path} is not a regular file`);
      if (st.size > maxBytes) throw new WarrenError('PAYLOAD_TOO_LARGE', `${path} is ${st.size} bytes; the limit is ${maxBytes}`);
      const buf = Buffer.alloc(Math.min(st.size, maxBytes) + 1);
      let size = 0;
      while (size < buf.length) {
        const n = readSync(fd, buf, size, buf.length - size, null);
        if (n === 0) break;
        size += n;
      }
      if (size > maxBytes) throw new WarrenError('PAYLOAD_TOO_LARGE', `${path} grew past the limit of ${maxBytes} bytes`);
      return buf.subarray(0, size);
    } finally {
      closeSync(fd);
    }
  }

  async writeFile(path: string, data: Buffer, mode: number): Promise<void> {
    const parent = posix.dirname(path);
    const creds = this.creds();
    if (parent !== '/') native.mkdirInRoot(this.root(), parent, 0o755, true, creds);
    const fd = native.openInRoot(this.root(), path, 'w', mode, creds);
    try {
      let off = 0;
      while (off < data.length) off += writeSync(fd, data, off, data.length - off);
    } finally {
      closeSync(fd);
    }
  }

  async listDir(path: string): Promise<FileEntry[]> {
    const fd = native.openInRoot(this.root(), path, 'dir', 0, this.creds());
    try {
      // /proc/self/fd/N is the directory we already opened safely; entries are lstat'ed one component deep.
      const base = `/proc/self/fd/${fd}`;
      return readdirSync(base).map((name) => {
        const st = lstatSync(`${base}/${name}`);
        const type: FileEntry['type'] = st.isFile() ? 'file' : st.isDirectory() ? 'dir' : st.isSymbolicLink() ? 'symlink' : 'other';
        return { name, type, size: st.size, mode: st.mode & 0o7777, mtime: st.mtime.toISOString() };
      });
    } finally {
      closeSync(fd);
    }
  }

  async mkdirs(path: string, mode: number): Promise<void> {
    native.mkdirInRoot(this.root(), path, mode, true, this.creds());
  }

  async watch(path: string, recursive: boolean): Promise<DirWatch> {
    return watchInRoot(this.root(), this.creds(), path, recursive, (p) => this.listDir(p));
  }

  async kind(path: string): Promise<'file' | 'dir' | 'other'> {
    try {
      closeSync(native.openInRoot(this.root(), path, 'dir', 0, this.creds()));
      return 'dir';
    } catch (err) {
      // ENOTDIR on the last component: it exists and is not a directory
      if (!(err instanceof WarrenError) || err.errno !== ENOTDIR || err.code === 'FORBIDDEN') throw err;
    }
    const fd = native.openInRoot(this.root(), path, 'r', 0, this.creds());
    try {
      return fstatSync(fd).isFile() ? 'file' : 'other';
    } finally {
      closeSync(fd);
    }
  }
}
