import { readSync, closeSync } from 'node:fs';
import { native } from '../native';
import { WarrenError } from '../errors';

export interface SandboxUser {
  name: string;
  uid: number;
  gid: number;
  home: string;
}

const ROOT: SandboxUser = { name: 'root', uid: 0, gid: 0, home: '/root' };
const MAX_PASSWD_BYTES = 1024 * 1024;

/**
 * Resolve "root", "1000", "1000:1000" or a user name from the sandbox's own
 * /etc/passwd (read through the confined path walk, never the host's).
 */
export function resolveUser(rootPath: string, user: string | undefined): SandboxUser {
  return resolveUserWith(user, () => passwdEntries(rootPath));
}

/** The same resolution over a passwd list obtained some other way (a microVM's, through its agent). */
export function resolveUserWith(user: string | undefined, entries: () => SandboxUser[]): SandboxUser {
  if (user === undefined || user === '' || user === 'root' || user === '0') return ROOT;
  const numeric = /^(\d{1,10})(?::(\d{1,10}))?$/.exec(user);
  if (numeric) {
    const uid = Number(numeric[1]);
    const entry = entries().find((e) => e.uid === uid);
    const gid = numeric[2] !== undefined ? Number(numeric[2]) : (entry?.gid ?? uid);
    if (uid > 0xfffffffe || gid > 0xfffffffe) throw new WarrenError('INVALID_ARGUMENT', `user id out of range: ${user}`);
    return { name: entry?.name ?? String(uid), uid, gid, home: entry?.home ?? '/' };
  }
  const entry = entries().find((e) => e.name === user);
  if (entry === undefined) throw new WarrenError('INVALID_ARGUMENT', `no user "${user}" in the sandbox's /etc/passwd`);
  return entry;
}

function passwdEntries(rootPath: string): SandboxUser[] {
  let fd: number;
  try {
    fd = native.openInRoot(rootPath, '/etc/passwd', 'r', 0);
  } catch (err) {
    if (err instanceof WarrenError && err.code === 'FILE_NOT_FOUND') return [];
    throw err;
  }
  try {
    const buf = Buffer.alloc(MAX_PASSWD_BYTES);
    let size = 0;
    for (;;) {
      const n = readSync(fd, buf, size, buf.length - size, null);
      if (n === 0 || size + n >= buf.length) {
        size += n;
        break;
      }
      size += n;
    }
    return parsePasswd(buf.subarray(0, size).toString('utf8'));
  } finally {
    closeSync(fd);
  }
}

export function parsePasswd(text: string): SandboxUser[] {
  return text
    .split('\n')
    .map((line) => line.split(':'))
    .filter((f) => f.length >= 7 && /^\d+$/.test(f[2]!) && /^\d+$/.test(f[3]!))
    .map((f) => ({ name: f[0]!, uid: Number(f[2]), gid: Number(f[3]), home: f[5] || '/' }));
}
