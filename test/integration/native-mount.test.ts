/** mount/umount through the addon: tmpfs with flags, bind + ro remount, private, file-backed EROFS, errors. */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import { native, warrenErrorOf } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';

const maybe = testUnless(rootReason);

function mountLine(target: string): string | undefined {
  return fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .reverse()
    .find((l) => l.split(' ')[4] === target);
}

function tmp(): string {
  return fs.mkdtempSync(path.join(os.tmpdir(), 'warren-native-mnt-'));
}

maybe('tmpfs with flags and data, then umount', (t) => {
  const dir = tmp();
  try {
    native.mount('tmpfs', dir, 'tmpfs', ['nosuid', 'nodev', 'noexec'], 'size=1m,mode=0750');
    const line = mountLine(dir)!;
    t.truthy(line);
    t.regex(line, /nosuid,nodev,noexec/);
    t.regex(line, /size=1024k/);
    native.umount(dir, false);
    t.is(mountLine(dir), undefined);
  } finally {
    try {
      native.umount(dir, true);
    } catch {
      /* not mounted */
    }
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

maybe('bind + ro is remounted read-only; private changes propagation', (t) => {
  const src = tmp();
  const dst = tmp();
  try {
    fs.writeFileSync(path.join(src, 'f'), 'x');
    native.mount(src, dst, '', ['bind', 'ro', 'nosuid'], '');
    t.regex(mountLine(dst)!, / ro,nosuid/);
    t.is(fs.readFileSync(path.join(dst, 'f'), 'utf8'), 'x');
    t.throws(() => fs.writeFileSync(path.join(dst, 'g'), 'y'), { code: 'EROFS' });
    native.mount('', dst, '', ['private'], '');
    t.notRegex(mountLine(dst)!, /shared:/);
    native.umount(dst, true);
    t.is(mountLine(dst), undefined);
  } finally {
    for (const d of [dst]) {
      try {
        native.umount(d, true);
      } catch {
        /* not mounted */
      }
    }
    fs.rmSync(src, { recursive: true, force: true });
    fs.rmSync(dst, { recursive: true, force: true });
  }
});

const hasErofs = fs.existsSync('/usr/bin/mkfs.erofs') || fs.existsSync('/sbin/mkfs.erofs') || fs.existsSync('/usr/sbin/mkfs.erofs');
testUnless(rootReason ?? (hasErofs ? null : 'mkfs.erofs is not installed'))('file-backed EROFS layer mounts read-only', (t) => {
  const base = tmp();
  const content = path.join(base, 'content');
  const image = path.join(base, 'layer.erofs');
  const mnt = path.join(base, 'mnt');
  fs.mkdirSync(content);
  fs.mkdirSync(mnt);
  fs.writeFileSync(path.join(content, 'hello.txt'), 'from erofs\n');
  try {
    execFileSync('mkfs.erofs', ['--quiet', image, content]);
    native.mount(image, mnt, 'erofs', ['ro', 'nodev', 'nosuid'], '');
    t.is(fs.readFileSync(path.join(mnt, 'hello.txt'), 'utf8'), 'from erofs\n');
    t.regex(mountLine(mnt)!, /erofs/);
    native.umount(mnt, false);
  } finally {
    try {
      native.umount(mnt, true);
    } catch {
      /* not mounted */
    }
    fs.rmSync(base, { recursive: true, force: true });
  }
});

maybe('mount errors: MOUNT_ERROR with errno and the step; bad input is INVALID_ARGUMENT', (t) => {
  const dir = tmp();
  try {
    const nodev = warrenErrorOf(t, () => native.mount('none', dir, 'nosuchfs', [], ''));
    t.is(nodev.code, 'MOUNT_ERROR');
    t.is(nodev.errno, 19);
    t.regex(nodev.message, new RegExp(`mount nosuchfs none on ${dir}: ENODEV`));
    const notmounted = warrenErrorOf(t, () => native.umount(dir, false));
    t.is(notmounted.code, 'MOUNT_ERROR');
    t.is(notmounted.errno, 22);
    for (const args of [
      ['tmpfs', 'relative', 'tmpfs', [], ''],
      ['tmpfs', '/a/../b', 'tmpfs', [], ''],
      ['tmpfs', dir, 'tmpfs', ['remount'], ''],
      ['tmpfs', dir, 'tm pfs', [], ''],
      ['tm;pfs', dir, 'tmpfs', [], ''],
      ['tmpfs', dir, 'tmpfs', [], 'a\0b'],
      ['/src', dir, '', ['bind'], 'size=1'],
    ] as const) {
      const e = warrenErrorOf(t, () => native.mount(args[0], args[1], args[2], [...args[3]] as never, args[4]));
      t.is(e.code, 'INVALID_ARGUMENT', JSON.stringify(args));
    }
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

/** Mount points of the mount namespace behind `fd` (an nsfs descriptor of this process). */
function templateMounts(fd: number): string[] {
  return execFileSync('nsenter', [`--mount=/proc/${process.pid}/fd/${fd}`, 'cat', '/proc/self/mountinfo'], { encoding: 'utf8' })
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => l.split(' ')[4]!);
}

maybe('mount template: keeps /, /proc, /sys, /dev and the mounts holding the kept paths; drops every other mount, and nothing mounted later reaches it', (t) => {
  const base = tmp();
  const holder = path.join(base, 'holder'); // a mount holding the kept path
  const kept = path.join(holder, 'data');
  const inside = path.join(kept, 'sandboxes', 'a'); // a sandbox's disk, under the kept path
  const other = path.join(base, 'other'); // an unrelated mount
  const later = path.join(base, 'later');
  for (const d of [holder, other, later]) fs.mkdirSync(d, { recursive: true });
  const mounted: string[] = [];
  let fd = -1;
  try {
    native.mount('tmpfs', holder, 'tmpfs', [], 'size=1m');
    mounted.push(holder);
    fs.mkdirSync(inside, { recursive: true });
    for (const d of [inside, other]) {
      native.mount('tmpfs', d, 'tmpfs', [], 'size=1m');
      mounted.push(d);
    }
    const mask = path.join(kept, 'mask');
    const sysfs = path.join(kept, 'sysfs');
    fs.mkdirSync(mask);
    fs.mkdirSync(sysfs);
    fd = native.mountTemplateCreate([kept], mask, sysfs);
    native.mount('tmpfs', later, 'tmpfs', [], 'size=1m');
    mounted.push(later);
    const mps = templateMounts(fd);
    for (const m of ['/', '/proc', '/sys', '/dev', holder]) t.true(mps.includes(m), `${m} is kept (${mps.join(' ')})`);
    for (const m of [inside, other, later]) t.false(mps.includes(m), `${m} is not in the template`);
    t.true(mps.includes(mask), 'the mask tmpfs is mounted in the template');
    t.is(mountLine(mask), undefined, 'and only there');
    // the sandboxes' sysfs: read-only, of a network namespace of its own that has no interface left
    const sys = execFileSync('nsenter', [`--mount=/proc/${process.pid}/fd/${fd}`, 'sh', '-c', `grep " ${sysfs} " /proc/self/mountinfo; ls ${sysfs}/class/net | wc -l; ls ${sysfs}/kernel >/dev/null && echo kernel`], { encoding: 'utf8' });
    t.regex(sys, new RegExp(` ${sysfs} ro,nosuid,nodev,noexec[^ ]*( .*)? - sysfs sysfs `), sys);
    t.regex(sys, /\n0\nkernel\n$/, `no network interface, the kernel's objects: ${sys}`);
    t.is(mountLine(sysfs), undefined, 'the sysfs is mounted in the template only');
    t.true(mps.length < fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').length, 'the template holds fewer mounts than this namespace');
    // the host's own mounts are untouched
    for (const m of [holder, inside, other]) t.truthy(mountLine(m), `${m} is still mounted here`);
  } finally {
    if (fd >= 0) native.close(fd);
    for (const m of mounted.reverse()) native.umount(m, true);
    fs.rmSync(base, { recursive: true, force: true });
  }
});

maybe('mount template: bad keep paths are INVALID_ARGUMENT', (t) => {
  for (const bad of [['relative'], ['/a/../b'], [''], 'x' as unknown as string[]]) {
    t.is(warrenErrorOf(t, () => native.mountTemplateCreate(bad)).code, 'INVALID_ARGUMENT', JSON.stringify(bad));
  }
  t.is(warrenErrorOf(t, () => native.mountTemplateCreate(['/tmp'], undefined, 'relative')).code, 'INVALID_ARGUMENT', 'a relative sysfs directory');
});
