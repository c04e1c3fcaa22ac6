/**
 * Importing `docker save` and OCI layout archives built with GNU tar: layer
 * flattening with whiteouts, compression, nested indexes, digests, and hostile
 * archives that must be refused before anything is written.
 */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, lstatSync, readlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ImportProgress } from '../../src/shim/types';
import { buildBusyboxRootfs, buildLayerDir, buildOciArchive, makeTar, mountsAt, withTestStore, type TestStore } from '../helpers/images';
import { readMountInfo } from '../../src/shim/layers/sys';
import { testUnless } from '../helpers/skip';

const skip = process.getuid?.() !== 0 ? 'requires root (mounts)' : null;
const rootTest = testUnless(skip);

const LONG = 'opt/' + 'long-directory-name-'.repeat(4) + '/' + 'a-file-with-a-rather-long-name-'.repeat(3) + '.txt';

let work = '';
let rootfs = '';
let upper = '';
test.before(async () => {
  work = mkdtempSync(join(tmpdir(), 'warren-arch-'));
  rootfs = join(work, 'rootfs');
  await buildBusyboxRootfs(rootfs);
  // Things the second layer deletes or replaces.
  buildLayerDir(rootfs, { files: { 'opt/app/old1': 'old1\n', 'opt/app/sub/old2': 'old2\n', 'etc/motd': 'base motd\n' } });
  upper = join(work, 'upper');
  buildLayerDir(upper, {
    remove: ['etc/motd'],
    opaque: ['opt/app'],
    files: { 'opt/app/new': 'new\n', 'etc/issue': 'warren test\n', [LONG]: 'long\n' },
  });
});
test.after.always(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

function errCode(err: unknown): string {
  return (err as { code?: string }).code ?? String(err);
}

/** The flattened image must show the whiteouts of the second layer. */
async function checkImported(t: import('ava').ExecutionContext, store: TestStore['store'], name: string): Promise<void> {
  const img = store.resolveImage(name);
  t.is(img.layers.length, 1); // flattened
  const [layer] = await store.acquire(img.layers);
  try {
    const p = layer!.path;
    t.true(existsSync(join(p, 'bin/busybox')));
    t.false(existsSync(join(p, 'etc/motd')), 'whiteout deletes etc/motd');
    t.deepEqual(readdirSync(join(p, 'opt/app')), ['new'], 'opaque dir keeps only the new layer');
    t.is(readFileSync(join(p, 'etc/issue'), 'utf8'), 'warren test\n');
    t.is(readFileSync(join(p, LONG), 'utf8'), 'long\n');
    t.is(lstatSync(join(p, 'tmp')).mode & 0o7777, 0o1777);
    t.is(readlinkSync(join(p, 'bin/sh')), 'busybox');
    t.false(readdirSync(join(p, 'etc')).some((n) => n.startsWith('.wh.')));
    t.false(readdirSync(join(p, 'opt/app')).some((n) => n.startsWith('.wh.')));
  } finally {
    store.release(img.layers);
  }
}

function assertNothingLeft(t: import('ava').ExecutionContext, dataDir: string): void {
  t.deepEqual(readdirSync(join(dataDir, 'layers/tmp')), [], 'no scratch dirs');
  t.deepEqual(readdirSync(join(dataDir, 'layers/blobs')), [], 'no blobs');
  t.deepEqual(
    readMountInfo().filter((m) => m.mountPoint.startsWith(dataDir)),
    [],
    'no mounts',
  );
}

rootTest('docker save archive (two layers, whiteout + opaque dir) imports flattened', async (t) => {
  const tar = join(work, 'docker.tar');
  buildOciArchive(rootfs, tar, { format: 'docker', layers: [upper], tag: 'bb:1' });
  await withTestStore(async ({ store }) => {
    const phases: ImportProgress[] = [];
    const started = Date.now();
    const img = await store.importOciArchive(tar, { name: 'bb-docker', onProgress: (p) => phases.push(p) });
    t.log(`docker archive import: ${Date.now() - started} ms`);
    t.true(img.source.startsWith('docker-archive:'), img.source);
    for (const phase of ['fetch', 'verify', 'extract', 'mkfs', 'register']) t.true(phases.some((p) => p.phase === phase), `phase ${phase}`);
    t.true(phases.every((p) => p.fraction === undefined || (p.fraction >= 0 && p.fraction <= 1)));
    await checkImported(t, store, 'bb-docker');
    t.deepEqual(store.imageConfig('bb-docker'), { env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin'], cmd: ['/bin/sh'], workingDir: '/root' });
  });
});

rootTest('OCI layout archive (gzip + zstd layers, nested index, gzipped outer tar) imports flattened', async (t) => {
  const tar = join(work, 'oci.tar.gz');
  buildOciArchive(rootfs, tar, { format: 'oci', layers: [upper], compression: ['gzip', 'zstd'], nestedIndex: true, outerCompression: 'gzip' });
  await withTestStore(async ({ store }) => {
    const img = await store.importOciArchive(tar, { name: 'bb-oci' });
    t.true(img.source.startsWith('oci-archive:'), img.source);
    await checkImported(t, store, 'bb-oci');
    const [l] = await store.acquire(img.layers);
    t.false(existsSync(join(l!.path, 'etc/decoy')), 'the manifest for this platform was chosen');
    store.release(img.layers);
  });
});

rootTest('docker and OCI archives of the same layers give the same digest; reimport is idempotent', async (t) => {
  const docker = join(work, 'same-docker.tar');
  const oci = join(work, 'same-oci.tar');
  buildOciArchive(rootfs, docker, { format: 'docker', layers: [upper] });
  buildOciArchive(rootfs, oci, { format: 'oci', layers: [upper], compression: 'none', tarFormat: 'posix' });
  await withTestStore(async ({ store, dataDir }) => {
    const a = await store.importOciArchive(docker, { name: 'a' });
    const b = await store.importOciArchive(oci, { name: 'b' });
    const c = await store.importOciArchive(docker, { name: 'a' });
    t.is(a.digest, b.digest);
    t.is(a.digest, c.digest);
    t.is(readdirSync(join(dataDir, 'layers/blobs')).length, 1);
  });
});

rootTest('single-layer archive equals a directory import of the same tree', async (t) => {
  const tar = join(work, 'single.tar');
  buildOciArchive(rootfs, tar, { format: 'oci', compression: 'zstd' });
  await withTestStore(async ({ store }) => {
    const a = await store.importOciArchive(tar, { name: 'from-archive' });
    const b = await store.importDirectory(rootfs, { name: 'from-dir' });
    t.is(a.digest, b.digest);
  });
});

/** A docker archive whose second layer is `layerTar` (crafted, possibly hostile). */
function hostileArchive(name: string, layerTar: Buffer): string {
  const layerFile = join(work, `${name}.layer.tar`);
  writeFileSync(layerFile, layerTar);
  const out = join(work, `${name}.tar`);
  buildOciArchive(rootfs, out, { format: 'docker', layers: [{ tar: layerFile }] });
  return out;
}

for (const [label, entries, entry] of [
  ['".." entry', [{ name: '../../../../../../tmp/warren-evil-dotdot', data: 'pwned' }], '../../../../../../tmp/warren-evil-dotdot'],
  ['absolute entry', [{ name: '/tmp/warren-evil-abs', data: 'pwned' }], '/tmp/warren-evil-abs'],
  ['hard link out', [{ name: 'h', type: 'hardlink' as const, linkname: '../../../../etc/passwd' }], 'h'],
] as const) {
  rootTest(`an archive with a ${label} is refused with ARCHIVE_ESCAPE and leaves nothing`, async (t) => {
    const tar = hostileArchive(label.replace(/\W+/g, '-'), makeTar([{ name: 'ok/', type: 'dir' }, { name: 'ok/file', data: 'fine' }, ...entries]));
    await withTestStore(async ({ store, dataDir }) => {
      const err = (await store.importOciArchive(tar, { name: 'evil' }).catch((e: unknown) => e)) as Error;
      t.is(errCode(err), 'ARCHIVE_ESCAPE', err.message);
      t.true(err.message.includes(JSON.stringify(entry)), err.message);
      assertNothingLeft(t, dataDir);
      t.deepEqual(store.listImages(), []);
      t.false(existsSync('/tmp/warren-evil-dotdot'));
      t.false(existsSync('/tmp/warren-evil-abs'));
    });
  });
}

rootTest('symlinks from a lower layer resolve inside the image root, never on the host', async (t) => {
  const outside = mkdtempSync(join(tmpdir(), 'warren-outside-'));
  try {
    const lower = join(work, 'sym-lower');
    buildLayerDir(lower, { symlinks: { escape: outside, up: '../../../../..', 'etc/rel': '../../../..' } });
    // No directory entries for the symlinked parents: the writes go through the symlinks.
    const top = join(work, 'sym-top.tar');
    writeFileSync(top, makeTar([{ name: 'escape/pwned', data: 'x' }, { name: 'up/etc/via-up', data: 'y' }, { name: 'etc/rel/via-rel', data: 'z' }]));
    // A directory entry over a lower symlink replaces the symlink (it is not followed).
    const dirOver = join(work, 'sym-dir.tar');
    writeFileSync(dirOver, makeTar([{ name: 'up/', type: 'dir' }, { name: 'up/inside', data: 'w' }]));
    const tar = join(work, 'symlinks.tar');
    buildOciArchive(rootfs, tar, { format: 'oci', layers: [lower, { tar: top }, { tar: dirOver }] });
    await withTestStore(async ({ store }) => {
      const img = await store.importOciArchive(tar, { name: 'sym' });
      t.deepEqual(readdirSync(outside), [], 'nothing written through the absolute symlink on the host');
      const [l] = await store.acquire(img.layers);
      t.is(readFileSync(join(l!.path, outside, 'pwned'), 'utf8'), 'x'); // landed at <root>/<outside>/pwned
      t.is(readFileSync(join(l!.path, 'etc/via-up'), 'utf8'), 'y');
      t.is(readFileSync(join(l!.path, 'via-rel'), 'utf8'), 'z');
      t.true(lstatSync(join(l!.path, 'up')).isDirectory());
      t.deepEqual(readdirSync(join(l!.path, 'up')), ['inside']);
      store.release(img.layers);
    });
  } finally {
    rmSync(outside, { recursive: true, force: true });
  }
});

rootTest('a tampered layer (digest mismatch) and a non-archive are INVALID_ARCHIVE and leave nothing', async (t) => {
  const good = join(work, 'tamper.tar');
  buildOciArchive(rootfs, good, { format: 'oci', layers: [upper], compression: 'none' });
  const unpacked = join(work, 'tamper');
  mkdirSync(unpacked);
  execFileSync('tar', ['-xf', good, '-C', unpacked]);
  const manifest = JSON.parse(readFileSync(join(unpacked, 'index.json'), 'utf8')).manifests[0].digest.slice(7);
  const layerHex = JSON.parse(readFileSync(join(unpacked, 'blobs/sha256', manifest), 'utf8')).layers[1].digest.slice(7);
  const blob = join(unpacked, 'blobs/sha256', layerHex);
  const bytes = readFileSync(blob);
  const at = bytes.indexOf('warren test');
  t.true(at > 0);
  bytes.write('WARREN', at);
  writeFileSync(blob, bytes);
  const bad = join(work, 'tampered.tar');
  execFileSync('tar', ['-C', unpacked, '-cf', bad, '.']);
  const junk = join(work, 'junk.tar');
  writeFileSync(junk, 'not an archive at all\n'.repeat(100));
  await withTestStore(async ({ store, dataDir }) => {
    const err = (await store.importOciArchive(bad, { name: 'x' }).catch((e: unknown) => e)) as Error;
    t.is(errCode(err), 'INVALID_ARCHIVE', err.message);
    t.regex(err.message, /digest/);
    t.is(errCode(await store.importOciArchive(junk, { name: 'x' }).catch((e: unknown) => e)), 'INVALID_ARCHIVE');
    t.is(errCode(await store.importOciArchive(join(work, 'missing.tar'), { name: 'x' }).catch((e: unknown) => e)), 'INVALID_ARGUMENT');
    assertNothingLeft(t, dataDir);
    t.is(mountsAt(join(dataDir, 'layers')), 0);
  });
});
