/**
 * Layers are mounted on the host nodev, nosuid and noexec: a device node, a
 * set-uid program or an executable carried in a layer is inert under the host
 * mount, whatever confines the sandbox; a mount left by an older process
 * without those options is replaced when it is next taken. Sandboxes built on
 * such layers still run their programs (through their own overlay).
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, mkdirSync, mkdtempSync, openSync, closeSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { testUnless } from '../helpers/skip';
import { readMountInfo } from '../../src/shim/layers/sys';
import { withTestStore } from '../helpers/images';
import { spec, withShim } from '../helpers/warren';

const skip = process.getuid?.() !== 0 ? 'requires root (mknod, mounts)' : null;
const rootTest = testUnless(skip).serial;

function hostileTree(): string {
  const dir = mkdtempSync(join(tmpdir(), 'warren-hostile-'));
  mkdirSync(join(dir, 'bin'));
  // /dev/mem and the null device as nodes inside the layer
  execFileSync('mknod', [join(dir, 'mem'), 'c', '1', '1']);
  execFileSync('mknod', [join(dir, 'null'), 'c', '1', '3']);
  copyFileSync('/bin/true', join(dir, 'bin', 'suid-true'));
  chmodSync(join(dir, 'bin', 'suid-true'), 0o4755);
  writeFileSync(join(dir, 'bin', 'script'), '#!/bin/sh\necho ran\n', { mode: 0o755 });
  return dir;
}

function optionsAt(path: string): string[] {
  const m = readMountInfo().filter((x) => x.mountPoint === path);
  return m.length === 0 ? [] : m[m.length - 1]!.options.split(',');
}

rootTest(`a device node, set-uid file or program in a layer is inert under the host mount`, async (t) => {
  const tree = hostileTree();
  try {
    await withTestStore(async ({ store }) => {
      const img = await store.importDirectory(tree, { name: 'hostile' });
      const [l] = await store.acquire(img.layers);
      const opts = optionsAt(l!.path);
      for (const o of ['ro', 'nodev', 'nosuid', 'noexec']) t.true(opts.includes(o), `${o} in ${opts.join(',')}`);
      for (const node of ['mem', 'null']) {
        const err = t.throws(() => closeSync(openSync(join(l!.path, node), 'r')));
        t.is((err as NodeJS.ErrnoException).code, 'EACCES', `opening ${node} through the host mount`);
      }
      const exec = t.throws(() => execFileSync(join(l!.path, 'bin', 'script')));
      t.is((exec as NodeJS.ErrnoException).code, 'EACCES', 'no program runs from the host mount');
      store.release(img.layers);
      store.unmountUnused();

      // A mount without the options (left by an older process) is replaced when taken.
      mkdirSync(l!.path, { recursive: true });
      execFileSync('mount', ['-t', 'erofs', '-o', 'ro', store.blobPath(img.digest), l!.path]);
      t.false(optionsAt(l!.path).includes('nodev'));
      await store.acquire(img.layers);
      t.true(optionsAt(l!.path).includes('nodev'));
      t.true(optionsAt(l!.path).includes('noexec'));
      t.is(readMountInfo().filter((x) => x.mountPoint === l!.path).length, 1, 'the old mount is gone');
      store.release(img.layers);
    });
  } finally {
    rmSync(tree, { recursive: true, force: true });
  }
});

rootTest(`sandboxes still run programs from layers mounted noexec on the host`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec());
    const r = await shim.exec(sb.id, { cmd: 'echo ok; /bin/busybox true && echo exec-ok' });
    t.is(r.stdout, 'ok\nexec-ok\n');
    const layer = shim.layers.mountPath(sb.layers[0]!);
    t.true(optionsAt(layer).includes('noexec'));
    await shim.deleteSandbox(sb.id);
  });
});
