/**
 * LayerStore on the real kernel: directory imports, file-backed EROFS mounts
 * (once per node, refcounted, adopted after a restart), overlay composition,
 * reference resolution and removal.
 */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LayerStore } from '../../src/shim/layers/store';
import { buildBusyboxRootfs, loopDevices, mountsAt, withTestStore } from '../helpers/images';
import { tempDir } from '../helpers/tmp';
import { testUnless } from '../helpers/skip';

const skip = process.getuid?.() !== 0 ? 'requires root (mounts)' : null;
const rootTest = testUnless(skip);

let busybox = '';
test.before(async () => {
  busybox = mkdtempSync(join(tmpdir(), 'warren-bb-'));
  await buildBusyboxRootfs(busybox);
});
test.after.always(() => {
  if (busybox) rmSync(busybox, { recursive: true, force: true });
});

function errCode(err: unknown): string {
  return (err as { code?: string }).code ?? String(err);
}

rootTest('directory import -> mount -> files readable; one mount for two acquires; unmountUnused leaves nothing', async (t) => {
  const loopsBefore = loopDevices();
  await withTestStore(async ({ store }) => {
    let started = Date.now();
    const img = await store.importDirectory(busybox, { name: 'busybox' });
    t.log(`import (mkfs.erofs lz4hc) of busybox: ${Date.now() - started} ms, ${img.sizeBytes} bytes`);
    t.regex(img.digest, /^sha256:[a-f0-9]{64}$/);
    t.deepEqual(img.layers, [img.digest]);
    t.is(img.kind, 'base');
    t.true(existsSync(store.blobPath(img.digest)));

    started = Date.now();
    const [a] = await store.acquire(img.layers);
    t.log(`first acquire (mount): ${Date.now() - started} ms`);
    const [b] = await store.acquire(img.layers);
    t.is(a!.path, b!.path);
    t.is(a!.path, store.mountPath(img.digest));
    t.is(mountsAt(a!.path), 1);
    t.is(store.counters.mounts, 1);
    t.is(readFileSync(join(a!.path, 'etc/passwd'), 'utf8').split('\n')[0], 'root:x:0:0:root:/root:/bin/sh');
    t.true(readdirSync(join(a!.path, 'bin')).includes('sh'));
    t.is((await import('node:fs')).statSync(join(a!.path, 'tmp')).mode & 0o7777, 0o1777);
    t.throws(() => writeFileSync(join(a!.path, 'new'), 'x'), { code: 'EROFS' });
    t.deepEqual(
      store.mountStates().map((s) => [s.digest, s.refs, s.mounted]),
      [[img.digest, 2, true]],
    );

    store.release(img.layers);
    t.deepEqual(store.unmountUnused(), []); // still held once
    t.is(mountsAt(a!.path), 1);
    store.release(img.layers);
    t.is(mountsAt(a!.path), 1); // a released layer stays mounted: node-level cache
    t.deepEqual(store.unmountUnused(), [img.digest]);
    t.is(mountsAt(a!.path), 0);
    t.false(existsSync(a!.path));
    t.is(loopDevices(), loopsBefore);
    // Mount again after unmounting.
    await store.acquire(img.layers);
    t.is(mountsAt(a!.path), 1);
    t.is(store.counters.mounts, 2);
    store.release(img.layers);
  });
  t.is(loopDevices(), loopsBefore);
});

rootTest('concurrent acquires of one layer share one mount', async (t) => {
  await withTestStore(async ({ store }) => {
    const img = await store.importDirectory(busybox, { name: 'busybox' });
    const results = await Promise.all([store.acquire(img.layers), store.acquire(img.layers), store.acquire([...img.layers, ...img.layers])]);
    t.is(store.counters.mounts, 1);
    t.is(mountsAt(results[0]![0]!.path), 1);
    t.is(store.mountStates()[0]!.refs, 4);
    store.release([...img.layers, ...img.layers, ...img.layers, ...img.layers]);
    t.is(store.mountStates()[0]!.refs, 0);
  });
});

rootTest('the same content gives the same digest and one blob; other content another', async (t) => {
  await withTestStore(async ({ store, dataDir }) => {
    const copy = mkdtempSync(join(tmpdir(), 'warren-bb-copy-'));
    try {
      cpSync(busybox, copy, { recursive: true, verbatimSymlinks: true });
      chmodSync(copy, 0o755); // the root directory's mode is part of the content (mkdtemp made it 0700)
      utimesSync(join(copy, 'etc/passwd'), 12345, 12345); // mtimes do not matter
      const a = await store.importDirectory(busybox, { name: 'one' });
      const b = await store.importDirectory(copy, { name: 'two:v1' });
      t.is(a.digest, b.digest);
      const again = await store.importDirectory(busybox, { name: 'one' });
      t.is(again.digest, a.digest);
      t.is(again.createdAt, a.createdAt);
      t.is(readdirSync(join(dataDir, 'layers/blobs')).length, 1);
      writeFileSync(join(copy, 'etc/hostname'), 'other\n');
      const c = await store.importDirectory(copy, { name: 'three' });
      t.not(c.digest, a.digest);
      t.is(readdirSync(join(dataDir, 'layers/blobs')).length, 2);
      t.deepEqual(
        store.listImages().map((i) => i.name),
        ['one', 'three', 'two:v1'],
      );
      t.deepEqual(readdirSync(join(dataDir, 'layers/tmp')), []);
    } finally {
      rmSync(copy, { recursive: true, force: true });
    }
  });
});

rootTest('references: names, tags, digests; unknown and invalid refs give stable codes', async (t) => {
  await withTestStore(async ({ store }) => {
    const wsDir = tempDir('warren-ws-');
    try {
      mkdirSync(join(wsDir, 'workspace/repo-x'), { recursive: true });
      writeFileSync(join(wsDir, 'workspace/repo-x/README'), 'repo x\n');
      const base = await store.importDirectory(busybox, { name: 'busybox' });
      const ws = await store.importDirectory(wsDir, { name: 'repo-x', kind: 'workspace' });
      t.is(store.resolveImage('busybox').digest, base.digest);
      t.is(store.resolveImage('busybox:latest').name, 'busybox');
      t.is(store.resolveImage(base.digest).name, 'busybox');
      t.is(store.resolveLayer('repo-x', 'workspace').digest, ws.digest);
      t.is(store.resolveLayer(ws.digest).name, 'repo-x');
      t.is(store.resolveLayer(ws.digest, 'toolkit').digest, ws.digest); // a digest is unambiguous
      // A composed image: workspace over base.
      const composed = store.composeImage({ name: 'busybox-with-x', layers: [ws.digest, base.digest] });
      t.deepEqual(composed.layers, [ws.digest, base.digest]);
      t.is(store.resolveImage(composed.digest).name, 'busybox-with-x');
      t.not(composed.digest, base.digest);
      t.is(composed.sizeBytes, base.sizeBytes + ws.sizeBytes);

      const cases: Array<[() => unknown, string, string]> = [
        [() => store.resolveImage('nope'), 'IMAGE_NOT_FOUND', 'nope'],
        [() => store.resolveImage('busybox:1.0'), 'IMAGE_NOT_FOUND', 'busybox:1.0'],
        [() => store.resolveImage('sha256:' + '0'.repeat(64)), 'IMAGE_NOT_FOUND', '0'.repeat(64)],
        [() => store.resolveLayer('nope', 'workspace'), 'LAYER_NOT_FOUND', 'nope'],
        [() => store.resolveLayer('busybox', 'toolkit'), 'LAYER_NOT_FOUND', 'busybox'],
        [() => store.resolveLayer('sha256:' + '1'.repeat(64)), 'LAYER_NOT_FOUND', '1'.repeat(64)],
        [() => store.resolveLayer('busybox-with-x'), 'INVALID_ARGUMENT', 'busybox-with-x'],
        [() => store.resolveImage('../etc'), 'INVALID_ARGUMENT', '../etc'],
        [() => store.resolveImage('a/../b'), 'INVALID_ARGUMENT', 'a/../b'],
        [() => store.resolveImage('/abs'), 'INVALID_ARGUMENT', '/abs'],
        [() => store.resolveImage('x\0y'), 'INVALID_ARGUMENT', 'x'],
        [() => store.resolveImage('x'.repeat(300)), 'INVALID_ARGUMENT', 'xxxx'],
        [() => store.resolveLayer('Bad Name', 'workspace'), 'INVALID_ARGUMENT', 'Bad Name'],
      ];
      for (const [fn, code, inMessage] of cases) {
        const err = t.throws(fn) as Error;
        t.is(errCode(err), code, err?.message);
        t.true(err.message.includes(inMessage), err.message);
      }
      const acq = await store.acquire(['sha256:' + '2'.repeat(64)]).catch((e: unknown) => e);
      t.is(errCode(acq), 'LAYER_NOT_FOUND');
      t.is(errCode(await store.acquire(['../../x']).catch((e: unknown) => e)), 'INVALID_ARGUMENT');
      t.is(errCode(await store.importDirectory(busybox, { name: '../x' }).catch((e: unknown) => e)), 'INVALID_ARGUMENT');
      t.is(errCode(await store.importDirectory('/nonexistent/dir', { name: 'x' }).catch((e: unknown) => e)), 'INVALID_ARGUMENT');
      // A failed acquire of several layers keeps no reference.
      t.is(errCode(await store.acquire([base.digest, 'sha256:' + '3'.repeat(64)]).catch((e: unknown) => e)), 'LAYER_NOT_FOUND');
      t.deepEqual(store.mountStates(), []);
    } finally {
      rmSync(wsDir, { recursive: true, force: true });
    }
  });
});

rootTest('overlay over a busybox base and a workspace layer shows both', async (t) => {
  await withTestStore(async ({ store, dataDir }) => {
    const wsDir = tempDir('warren-ws-');
    const ovl = join(dataDir, 'ovl');
    try {
      mkdirSync(join(wsDir, 'workspace/repo-x'), { recursive: true });
      writeFileSync(join(wsDir, 'workspace/repo-x/README'), 'repo x\n');
      writeFileSync(join(wsDir, 'workspace/repo-x/run.sh'), '#!/bin/sh\necho hello from $(cat /etc/hostname)\n', { mode: 0o755 });
      const base = await store.importDirectory(busybox, { name: 'busybox' });
      const ws = await store.importDirectory(wsDir, { name: 'repo-x', kind: 'workspace' });
      const layers = await store.acquire([store.resolveLayer('repo-x', 'workspace').digest, ...store.resolveImage('busybox').layers]);
      t.deepEqual(
        layers.map((l) => l.digest),
        [ws.digest, base.digest],
      );
      for (const d of ['upper', 'work', 'merged']) mkdirSync(join(ovl, d), { recursive: true });
      const started = Date.now();
      execFileSync('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${layers.map((l) => l.path).join(':')},upperdir=${ovl}/upper,workdir=${ovl}/work`, `${ovl}/merged`]);
      t.log(`overlay mount: ${Date.now() - started} ms`);
      try {
        const merged = join(ovl, 'merged');
        t.is(readFileSync(join(merged, 'workspace/repo-x/README'), 'utf8'), 'repo x\n');
        t.true(existsSync(join(merged, 'bin/busybox')));
        writeFileSync(join(merged, 'workspace/repo-x/new'), 'written\n');
        t.true(existsSync(join(ovl, 'upper/workspace/repo-x/new')));
        const out = execFileSync('chroot', [merged, '/bin/sh', '/workspace/repo-x/run.sh'], { encoding: 'utf8' });
        t.is(out, 'hello from busybox\n');
      } finally {
        execFileSync('umount', [`${ovl}/merged`]);
      }
      store.release(layers.map((l) => l.digest));
    } finally {
      rmSync(wsDir, { recursive: true, force: true });
    }
  });
});

rootTest('a new store over the same data dir adopts existing mounts instead of mounting again', async (t) => {
  await withTestStore(async ({ store, dataDir, db }) => {
    const img = await store.importDirectory(busybox, { name: 'busybox' });
    const [first] = await store.acquire(img.layers);
    store.close(); // the "gateway" goes away; mounts stay
    t.is(mountsAt(first!.path), 1);

    const second = new LayerStore({ dataDir, db });
    second.init();
    t.deepEqual(
      second.mountStates().map((s) => [s.digest, s.refs, s.mounted]),
      [[img.digest, 0, true]],
    );
    const [again] = await second.acquire(img.layers);
    t.is(again!.path, first!.path);
    t.is(mountsAt(first!.path), 1);
    t.is(second.counters.mounts, 0);
    t.is(second.counters.adoptions, 1);
    t.true(existsSync(join(again!.path, 'bin/busybox')));
    // A stale mount point (mount gone behind our back) is mounted again, not trusted.
    second.release(img.layers);
    t.deepEqual(second.unmountUnused(), [img.digest]);
    const third = new LayerStore({ dataDir, db });
    third.init();
    await third.acquire(img.layers);
    t.is(third.counters.mounts, 1);
    t.is(third.counters.adoptions, 0);
    t.is(mountsAt(first!.path), 1);
    third.release(img.layers);
    third.unmountUnused();
    t.is(mountsAt(first!.path), 0);
  });
});

rootTest('removeImage refuses while a layer is held and then removes blob, mount and rows', async (t) => {
  await withTestStore(async ({ store, dataDir }) => {
    const img = await store.importDirectory(busybox, { name: 'busybox' });
    const alias = await store.importDirectory(busybox, { name: 'alias' });
    t.is(alias.digest, img.digest);
    const [l] = await store.acquire(img.layers);
    t.is(errCode(await store.removeImage('busybox').catch((e: unknown) => e)), 'IMAGE_IN_USE');
    store.release(img.layers);
    // Shared with "alias": the blob stays.
    t.deepEqual((await store.removeImage('busybox')).removedLayers, []);
    t.true(existsSync(store.blobPath(img.digest)));
    t.is(errCode(t.throws(() => store.resolveImage('busybox'))), 'IMAGE_NOT_FOUND');
    t.deepEqual((await store.removeImage('alias:latest')).removedLayers, [img.digest]);
    t.false(existsSync(store.blobPath(img.digest)));
    t.is(mountsAt(l!.path), 0);
    t.deepEqual(store.listImages(), []);
    t.deepEqual(readdirSync(join(dataDir, 'layers/blobs')), []);
    t.is(errCode(await store.removeImage('alias').catch((e: unknown) => e)), 'IMAGE_NOT_FOUND');
    // Re-import after removal works.
    const back = await store.importDirectory(busybox, { name: 'busybox' });
    t.is(back.digest, img.digest);
  });
});

rootTest('a moved name leaves an orphan layer that prune() deletes', async (t) => {
  await withTestStore(async ({ store }) => {
    const other = mkdtempSync(join(tmpdir(), 'warren-other-'));
    try {
      writeFileSync(join(other, 'f'), 'v1');
      const v1 = await store.importDirectory(other, { name: 'thing' });
      writeFileSync(join(other, 'f'), 'v2');
      const v2 = await store.importDirectory(other, { name: 'thing' });
      t.not(v1.digest, v2.digest);
      t.is(store.resolveImage('thing').digest, v2.digest);
      await store.acquire([v1.digest]); // a sandbox still runs on v1
      t.deepEqual(store.prune(), []);
      store.release([v1.digest]);
      t.deepEqual(store.prune(), [v1.digest]);
      t.false(existsSync(store.blobPath(v1.digest)));
    } finally {
      rmSync(other, { recursive: true, force: true });
    }
  });
});

rootTest('init() removes scratch left by a crashed import, unmounting (not deleting through) mounts inside it', async (t) => {
  await withTestStore(async ({ dataDir, db }) => {
    // A pid that certainly is not running any more.
    const dead = execFileSync('sh', ['-c', 'sh -c "echo \\$\\$"'], { encoding: 'utf8' }).trim();
    const scratch = join(dataDir, 'layers/tmp', `debian-${dead}-abcdef`);
    const live = join(dataDir, 'layers/tmp', `oci-${process.pid}-abcdef`); // ours: left alone
    mkdirSync(join(scratch, 'rootfs/dev'), { recursive: true });
    mkdirSync(live);
    // Like a debootstrap killed with /dev bind-mounted into its target.
    const precious = mkdtempSync(join(tmpdir(), 'warren-precious-'));
    writeFileSync(join(precious, 'keep-me'), 'x');
    execFileSync('mount', ['--bind', precious, join(scratch, 'rootfs/dev')]);
    try {
      const store = new LayerStore({ dataDir, db });
      store.init();
      t.false(existsSync(scratch));
      t.true(existsSync(live));
      t.is(readFileSync(join(precious, 'keep-me'), 'utf8'), 'x', 'the bind-mounted source is untouched');
      t.is(mountsAt(join(scratch, 'rootfs/dev')), 0);
    } finally {
      if (mountsAt(join(scratch, 'rootfs/dev')) > 0) execFileSync('umount', ['-l', join(scratch, 'rootfs/dev')]);
      rmSync(precious, { recursive: true, force: true });
    }
  });
});
