/**
 * Directory watches of the container backend's files facet: inotify
 * (fs.watch) on each directory opened by the native confined walk and watched
 * through /proc/self/fd, so a symlink cannot point a watch outside the
 * sandbox. A recursive watch opens each subdirectory the same way, up to
 * MAX_WATCHES directories per watch.
 */
import { type FSWatcher, closeSync, watch } from 'node:fs';
import { posix } from 'node:path';
import { WarrenError } from '../../errors';
import { native } from '../../native';
import type { DirEvent, DirWatch, FileEntry } from '../types';

const MAX_WATCHES = 4096;
/** Events kept for a watch nobody listens to yet. */
const MAX_QUEUED = 4096;

export function watchInRoot(
  root: string,
  creds: { uid: number; gid: number; groups: number[] },
  path: string,
  recursive: boolean,
  listDir: (path: string) => Promise<FileEntry[]>,
): DirWatch {
  const watchers = new Map<string, { w: FSWatcher; fd: number }>();
  const listeners: Array<(e: DirEvent) => void> = [];
  let queued: DirEvent[] = [];
  let closed = false;
  const emit = (e: DirEvent) => {
    if (closed) return;
    if (listeners.length === 0) {
      if (queued.length < MAX_QUEUED) queued.push(e);
      return;
    }
    for (const l of listeners) l(e);
  };
  const drop = (rel: string) => {
    const gone = watchers.get(rel);
    if (gone === undefined) return;
    gone.w.close();
    closeSync(gone.fd);
    watchers.delete(rel);
  };
  const add = (rel: string): boolean => {
    if (closed || watchers.has(rel) || watchers.size >= MAX_WATCHES) return false;
    let fd: number;
    try {
      fd = native.openInRoot(root, rel === '' ? path : posix.join(path, rel), 'dir', 0, creds);
    } catch {
      return false;
    }
    let w: FSWatcher;
    try {
      w = watch(`/proc/self/fd/${fd}`, { persistent: false }, (kind, name) => onEvent(rel, kind, name === null ? '' : String(name)));
    } catch {
      closeSync(fd);
      return false;
    }
    w.on('error', () => undefined);
    watchers.set(rel, { w, fd });
    if (recursive) {
      void listDir(rel === '' ? path : posix.join(path, rel))
        .then((entries) => entries.filter((e) => e.type === 'dir').forEach((e) => add(rel === '' ? e.name : `${rel}/${e.name}`)))
        .catch(() => undefined);
    }
    return true;
  };
  const onEvent = (rel: string, kind: string, name: string) => {
    if (name === '' || closed) return;
    const relName = rel === '' ? name : `${rel}/${name}`;
    const full = posix.join(path, relName);
    if (kind === 'change') return emit({ name: relName, type: 'write' });
    // 'rename' covers create, delete and both ends of a rename: look at what is there now.
    void listDir(posix.dirname(full))
      .then((entries) => {
        const e = entries.find((x) => x.name === posix.basename(full));
        if (e) {
          emit({ name: relName, type: 'create' });
          if (recursive && e.type === 'dir') add(relName);
        } else {
          emit({ name: relName, type: 'remove' });
          drop(relName);
        }
      })
      .catch(() => emit({ name: relName, type: 'remove' }));
  };
  if (!add('')) throw new WarrenError('FILE_NOT_FOUND', `cannot watch ${path}: it is not a directory this sandbox's user can open`, { path });
  return {
    onEvent(listener) {
      listeners.push(listener);
      const q = queued;
      queued = [];
      for (const e of q) listener(e);
    },
    close() {
      if (closed) return;
      closed = true;
      for (const rel of [...watchers.keys()]) drop(rel);
    },
  };
}
