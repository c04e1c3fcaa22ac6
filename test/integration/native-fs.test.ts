/** openInRoot / mkdirInRoot: confinement to the root against .., symlinks and procfs magic links. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import { native, run, warrenErrorOf, withSandbox } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';

const maybe = testUnless(rootReason);

function readFdAll(fd: number): string {
  try {
    return fs.readFileSync(fd, 'utf8');
  } finally {
    native.close(fd);
  }
}

function isCloexec(fd: number): boolean {
  const flags = /flags:\s+(\d+)/.exec(fs.readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))![1]!;
  return (parseInt(flags, 8) & 0o2000000) !== 0;
}

/** root/ with etc/inside, and host-only files next to it. */
function makeTree(): { base: string; root: string; secret: string } {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-native-fs-'));
  const root = path.join(base, 'root');
  fs.mkdirSync(path.join(root, 'etc'), { recursive: true });
  fs.mkdirSync(path.join(root, 'data/sub'), { recursive: true });
  fs.writeFileSync(path.join(root, 'etc/inside'), 'inside\n');
  const secret = path.join(base, 'host-secret');
  fs.writeFileSync(secret, 'HOST SECRET\n');
  fs.symlinkSync('/', path.join(root, 'abs-root'));
  fs.symlinkSync('../../..', path.join(root, 'up'));
  fs.symlinkSync(secret, path.join(root, 'abs-secret')); // absolute host path: resolves inside the root
  fs.symlinkSync('../host-secret', path.join(root, 'rel-secret'));
  fs.symlinkSync('/../../../etc/inside', path.join(root, 'abs-dotdot'));
  fs.symlinkSync('etc', path.join(root, 'rel-etc'));
  fs.symlinkSync('loop', path.join(root, 'loop'));
  fs.symlinkSync('/new/file.txt', path.join(root, 'dangling'));
  fs.mkdirSync(path.join(root, 'new'));
  return { base, root, secret };
}

maybe('openInRoot reads inside the root and follows symlinks inside it', (t) => {
  const { base, root } = makeTree();
  try {
    t.is(readFdAll(native.openInRoot(root, '/etc/inside', 'r', 0)), 'inside\n');
    t.is(readFdAll(native.openInRoot(root, 'etc/inside', 'r', 0)), 'inside\n');
    t.is(readFdAll(native.openInRoot(root, '/data/sub/../../etc/./inside', 'r', 0)), 'inside\n');
    t.is(readFdAll(native.openInRoot(root, '/abs-root/etc/inside', 'r', 0)), 'inside\n');
    t.is(readFdAll(native.openInRoot(root, '/abs-root/abs-root/rel-etc/inside', 'r', 0)), 'inside\n');
    const fd = native.openInRoot(root, '/rel-etc/inside', 'r', 0);
    t.true(isCloexec(fd));
    native.close(fd);
    const dfd = native.openInRoot(root, '/abs-root/data', 'dir', 0);
    t.true(fs.fstatSync(dfd).isDirectory());
    t.true(isCloexec(dfd));
    native.close(dfd);
  } finally {
    fs.rmSync(base, { recursive: true, force: true });
  }
});

maybe('openInRoot refuses .. escapes and never reaches host files through symlinks', (t) => {
  const { base, root } = makeTree();
  try {
    for (const p of ['../host-secret', '/../host-secret', '/data/../../host-secret', 'up/host-secret', 'up', 'rel-secret', 'abs-dotdot']) {
      const e = warrenErrorOf(t, () => native.openInRoot(root, p, 'r', 0));
      t.is(e.code, 'PATH_ESCAPE', p);
    }
    // an absolute symlink to a host path is resolved inside the root: not found, never the host file
    const abs = warrenErrorOf(t, () => native.openInRoot(root, '/abs-secret', 'r', 0));
    t.is(abs.code, 'FILE_NOT_FOUND');
    t.is(warrenErrorOf(t, () => native.openInRoot(root, '/missing', 'r', 0)).code, 'FILE_NOT_FOUND');
    t.is(warrenErrorOf(t, () => native.openInRoot(root, '/etc/inside/x', 'r', 0)).code, 'FILE_NOT_FOUND');
    const loop = warrenErrorOf(t, () => native.openInRoot(root, '/loop', 'r', 0));
    t.is(loop.errno, 40);
    t.is(warrenErrorOf(t, () => native.openInRoot(root, '/etc', 'r', 0)).errno, 21);
    t.is(warrenErrorOf(t, () => native.openInRoot('relative/root', '/x', 'r', 0)).code, 'INVALID_ARGUMENT');
    t.is(warrenErrorOf(t, () => native.openInRoot(root, 'a\0b', 'r', 0)).code, 'INVALID_ARGUMENT');
    t.is(warrenErrorOf(t, () => native.openInRoot(root, '/x', 'rw' as never, 0)).code, 'INVALID_ARGUMENT');
  } finally {
    fs.rmSync(base, { recursive: true, force: true });
  }
});

maybe('openInRoot writes and appends inside the root; dangling symlinks create inside it', (t) => {
  const { base, root } = makeTree();
  try {
    let fd = native.openInRoot(root, '/data/out.txt', 'w', 0o640);
    fs.writeSync(fd, 'one\n');
    native.close(fd);
    fd = native.openInRoot(root, '/data/out.txt', 'a', 0o640);
    fs.writeSync(fd, 'two\n');
    native.close(fd);
    t.is(fs.readFileSync(path.join(root, 'data/out.txt'), 'utf8'), 'one\ntwo\n');
    t.is(fs.statSync(path.join(root, 'data/out.txt')).mode & 0o777, 0o640 & ~process.umask());
    fd = native.openInRoot(root, '/data/out.txt', 'w', 0o640);
    native.close(fd);
    t.is(fs.readFileSync(path.join(root, 'data/out.txt'), 'utf8'), '', 'w truncates');

    fd = native.openInRoot(root, '/dangling', 'w', 0o644);
    fs.writeSync(fd, 'via link');
    native.close(fd);
    t.is(fs.readFileSync(path.join(root, 'new/file.txt'), 'utf8'), 'via link');
    // writing through a link to a host path writes inside the root
    fd = native.openInRoot(root, '/abs-root/host-secret', 'w', 0o644);
    native.close(fd);
    t.is(fs.readFileSync(path.join(base, 'host-secret'), 'utf8'), 'HOST SECRET\n');
    t.true(fs.existsSync(path.join(root, 'host-secret')));
  } finally {
    fs.rmSync(base, { recursive: true, force: true });
  }
});

maybe('mkdirInRoot: recursive, through symlinks, confined', (t) => {
  const { base, root } = makeTree();
  try {
    native.mkdirInRoot(root, '/a/b/c', 0o755, true);
    t.true(fs.statSync(path.join(root, 'a/b/c')).isDirectory());
    native.mkdirInRoot(root, '/a/b/c', 0o755, true);
    t.is(warrenErrorOf(t, () => native.mkdirInRoot(root, '/a/b/c', 0o755, false)).code, 'ALREADY_EXISTS');
    t.is(warrenErrorOf(t, () => native.mkdirInRoot(root, '/x/y', 0o755, false)).code, 'FILE_NOT_FOUND');
    native.mkdirInRoot(root, '/abs-root/rel-etc/conf.d', 0o700, false);
    t.true(fs.statSync(path.join(root, 'etc/conf.d')).isDirectory());
    t.is(warrenErrorOf(t, () => native.mkdirInRoot(root, '/up/escaped', 0o755, true)).code, 'PATH_ESCAPE');
    t.is(warrenErrorOf(t, () => native.mkdirInRoot(root, '../escaped', 0o755, true)).code, 'PATH_ESCAPE');
    t.false(fs.existsSync(path.join(base, 'escaped')));
  } finally {
    fs.rmSync(base, { recursive: true, force: true });
  }
});

maybe('through /proc/<pid>/root of a sandbox: reads its files, refuses procfs magic links', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const rootDir = `/proc/${sb.pid}/root`;
    t.regex(readFdAll(native.openInRoot(rootDir, '/etc/passwd', 'r', 0)), /^root:x:0:0/);
    const fd = native.openInRoot(rootDir, '/tmp/from-host', 'w', 0o644);
    fs.writeSync(fd, 'written from the host');
    native.close(fd);
    t.is((await run(sb, ['cat', '/tmp/from-host'])).stdout, 'written from the host');
    native.mkdirInRoot(rootDir, '/work/deep/dir', 0o755, true);
    t.is((await run(sb, ['ls', '-d', '/work/deep/dir'])).exitCode, 0);

    for (const p of ['/proc/1/root/etc/passwd', '/proc/self/root/etc/passwd', '/proc/version']) {
      t.is(warrenErrorOf(t, () => native.openInRoot(rootDir, p, 'r', 0)).code, 'PATH_ESCAPE', p);
    }
    // a symlink planted inside the sandbox into procfs is refused too
    await run(sb, ['ln', '-s', '/proc/1/root', '/tmp/magic']);
    t.is(warrenErrorOf(t, () => native.openInRoot(rootDir, '/tmp/magic/etc/passwd', 'r', 0)).code, 'PATH_ESCAPE');
    // and a symlink to / stays inside the sandbox: no host-only file is visible through it
    await run(sb, ['ln', '-s', '/', '/tmp/slash']);
    const hostOnly = path.join(sb.dir, 'host-only-file');
    fs.writeFileSync(hostOnly, 'host');
    t.is(warrenErrorOf(t, () => native.openInRoot(rootDir, `/tmp/slash${hostOnly}`, 'r', 0)).code, 'FILE_NOT_FOUND');
  });
});
