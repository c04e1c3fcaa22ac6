/**
 * Layers in a real OCI registry (docker-registry on loopback, its own storage):
 * push/pull round trips, lazily mounted layers that fetch only what is read
 * (bytes counted by a proxy in front of the registry), chunk verification
 * against a corrupted registry blob, the bound of the chunk cache, staging
 * checks, recovery after the file server dies, and no leaks.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, cpSync, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ExecutionContext } from 'ava';
import { chunkIndex } from '../../src/shim/layers/artifact';
import { lazyUnavailableReason } from '../../src/shim/layers/lazy';
import { isImageStaged, pullImage, pushImage, stageImage, stagedLayers } from '../../src/shim/layers/remote';
import type { LayerStore } from '../../src/shim/layers/store';
import { readMountInfo, removeTree } from '../../src/shim/layers/sys';
import { loopDevices, withTestStore } from '../helpers/images';
import { registryReason, startCountingProxy, startRegistry, type CountingProxy, type TestRegistry } from '../helpers/registry';
import { testUnless } from '../helpers/skip';
import { waitFor } from '../helpers/wait';

const reason = process.getuid?.() !== 0 ? 'requires root (mounts)' : registryReason;
const test = testUnless(reason);
const lazyTest = testUnless(reason ?? lazyUnavailableReason());

let registry: TestRegistry;
let proxy: CountingProxy;
let tree = '';
const BIG = 3 << 20;

test.before(async () => {
  registry = await startRegistry();
  proxy = await startCountingProxy(registry.host);
  // A layer of mostly incompressible data and a few small files.
  tree = mkdtempSync(join(tmpdir(), 'warren-lazy-tree-'));
  mkdirSync(join(tree, 'etc'), { recursive: true });
  mkdirSync(join(tree, 'data'), { recursive: true });
  mkdirSync(join(tree, 'bin'), { recursive: true });
  writeFileSync(join(tree, 'etc/hello'), 'hello from a lazily loaded layer\n');
  for (let i = 0; i < 3; i++) writeFileSync(join(tree, `data/blob${i}`), randomBytes(BIG / 3));
  writeFileSync(join(tree, 'data/big'), randomBytes(2 << 20));
});

test.after.always(async () => {
  await proxy?.close();
  await registry?.stop();
  if (tree) rmSync(tree, { recursive: true, force: true });
});

function fuseMountsUnder(dir: string): number {
  return readMountInfo().filter((m) => m.mountPoint.startsWith(dir) && m.fstype.startsWith('fuse')).length;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Run `fn` with a store, then check that it left no FUSE mount, mount, daemon or loop device behind. */
async function withStore(t: ExecutionContext, fn: (store: LayerStore, dataDir: string) => Promise<void>, opts: { lazyCacheBytes?: number } = {}): Promise<void> {
  const loops = loopDevices();
  let dataDir = '';
  let pids: number[] = [];
  await withTestStore(
    async ({ store, dataDir: d }) => {
      dataDir = d;
      try {
        await fn(store, d);
      } finally {
        const s = store.lazyStats();
        if (s) pids.push(s.pid);
      }
    },
    opts,
  );
  pids = pids.filter((p) => p > 0);
  await waitFor(() => pids.every((p) => !pidAlive(p)), 5000, 'warren-lazyfs to exit');
  t.is(fuseMountsUnder(dataDir), 0, 'no FUSE mount left');
  t.is(readMountInfo().filter((m) => m.mountPoint.startsWith(dataDir)).length, 0, 'no mount left');
  t.is(loopDevices(), loops, 'no loop device');
}

/** The test tree plus a file naming the image: every test has its own layer digest (the registry shares blobs by digest). */
function treeFor(name: string): string {
  const dir = join(tree, '..', `${tree.split('/').pop()}-${name}`);
  cpSync(tree, dir, { recursive: true });
  writeFileSync(join(dir, 'etc/name'), name);
  return dir;
}

async function pushed(store: LayerStore, name: string, tag: string): Promise<{ digest: string; ref: string }> {
  const dir = treeFor(name);
  const img = await store.importDirectory(dir, { name, compression: 'lz4' });
  rmSync(dir, { recursive: true, force: true });
  const ref = `${proxy.host}/warren/${name}:${tag}`;
  await pushImage(store, name, ref);
  return { digest: img.digest, ref };
}

test.serial('push then eager pull: same digests, same bytes; a second push sends no layer bytes', async (t) => {
  await withStore(t, async (a) => {
    const phases: string[] = [];
    let t0 = Date.now();
    const img = await a.importDirectory(tree, { name: 'rt', compression: 'lz4' });
    t.log(`import ${Date.now() - t0} ms`);
    t0 = Date.now();
    const ref = `${proxy.host}/warren/rt:v1`;
    const res = await pushImage(a, 'rt', ref, { onProgress: (p) => phases.push(p.phase) });
    t.log(`push ${Date.now() - t0} ms`);
    t.is(res.layers.length, 1);
    t.true(res.layers[0]!.uploaded);
    t.true(phases.includes('push'));
    t.true(res.bytesUploaded >= img.sizeBytes);
    const again = await pushImage(a, 'rt', ref);
    t.false(again.layers[0]!.uploaded);
    t.is(again.bytesUploaded, 0);
    t.is(again.manifestDigest, res.manifestDigest);

    await withStore(t, async (b) => {
      await proxy.reset();
      t0 = Date.now();
      const pulled = await pullImage(b, ref, { mode: 'eager', name: 'rt-copy' });
      t.log(`eager pull ${Date.now() - t0} ms`);
      t.is(pulled.image.digest, img.digest);
      t.deepEqual(pulled.image.layers, img.layers);
      t.is(pulled.image.name, 'rt-copy');
      t.deepEqual(b.layerStates(img.layers).map((s) => s.state), ['local']);
      t.true((await proxy.counts()).blobBytes >= img.sizeBytes);
      t.deepEqual(readFileSync(b.blobPath(img.digest)), readFileSync(a.blobPath(img.digest)));
      const [l] = await b.acquire(pulled.image.layers);
      t.is(readFileSync(join(l!.path, 'etc/hello'), 'utf8'), 'hello from a lazily loaded layer\n');
      b.release(pulled.image.layers);
      // Pulled again: nothing to fetch.
      const twice = await pullImage(b, ref, { mode: 'eager', name: 'rt-copy' });
      t.deepEqual(twice.layers.map((l) => l.fetched), ['none']);
    });
  });
});

lazyTest.serial('a lazily mounted layer serves a small file after fetching a small fraction of its bytes; the cache serves re-reads', async (t) => {
  await withStore(t, async (a) => {
    const { digest, ref } = await pushed(a, 'lazy1', 'v1');
    const size = a.resolveImage('lazy1').sizeBytes;
    await withStore(t, async (b) => {
      await proxy.reset();
      const pulled = await pullImage(b, ref, { mode: 'lazy' });
      t.is(pulled.image.digest, digest);
      t.deepEqual(b.layerStates([digest]), [{ digest, state: 'lazy', mounted: false }]);
      t.is(existsSync(b.blobPath(digest)), false);
      const indexBytes = (await proxy.counts()).blobBytes;
      t.true(indexBytes < size / 100, `pull fetched ${indexBytes} bytes (index and config only)`);

      await proxy.reset();
      const [l] = await b.acquire([digest]);
      t.deepEqual(b.layerStates([digest]).map((s) => [s.state, s.mounted]), [['lazy', true]]);
      t.is(readMountInfo().find((m) => m.mountPoint === l!.path)?.source, b.lazy.filePath(digest));
      t.is(await readFile(join(l!.path, 'etc/hello'), 'utf8'), 'hello from a lazily loaded layer\n');
      const c = await proxy.counts();
      const fetched = c.blobBytes;
      t.log(`layer ${size} bytes; mount + reading etc/hello fetched ${fetched} bytes (${((100 * fetched) / size).toFixed(2)}%) in ${c.rangeRequests} range requests`);
      t.true(fetched > 0);
      t.true(fetched < size * 0.05, `fetched ${fetched} of ${size}`);
      t.true(c.rangeRequests > 0);

      // Whole-file read matches the source tree.
      t.deepEqual(await readFile(join(l!.path, 'data/big')), readFileSync(join(tree, 'data/big')));
      const stats = b.lazyStats()!;
      t.true(stats.fetchedBytes >= 2 << 20);
      t.is(stats.verifyFailures, 0);
      b.release([digest]);
    });
  });
});

lazyTest.serial('a corrupted chunk in the registry gives EIO, never wrong bytes, and a clear log line', async (t) => {
  await withStore(t, async (a) => {
    const { digest, ref } = await pushed(a, 'corrupt1', 'v1');
    await withStore(t, async (b) => {
      await pullImage(b, ref, { mode: 'lazy' });
      // Damage the registry's copy in the middle of the data (one byte per 64 KiB over 1 MiB).
      const file = registry.blobFile(digest);
      const size = a.resolveImage('corrupt1').sizeBytes;
      const fd = openSync(file, 'r+');
      const start = Math.floor(size / 2);
      for (let off = start; off < start + (1 << 20); off += 65536) writeSync(fd, Buffer.from([0x5a ^ readFileSync(file).subarray(off, off + 1)[0]!]), 0, 1, off);
      closeSync(fd);
      const [l] = await b.acquire([digest]);
      // The small file may be elsewhere; read every data file: some must fail, none may return bytes other than the source's.
      let failures = 0;
      for (const f of ['data/blob0', 'data/blob1', 'data/blob2', 'data/big']) {
        try {
          const got = await readFile(join(l!.path, f));
          t.deepEqual(got, readFileSync(join(tree, f)), `${f} read back wrong bytes`);
        } catch (err) {
          t.is((err as NodeJS.ErrnoException).code, 'EIO');
          failures++;
        }
      }
      t.true(failures > 0, 'a corrupted chunk was served');
      t.true(b.lazyStats()!.verifyFailures > 0);
      t.regex(b.lazy.logTail(20), /fails verification: sha256 [0-9a-f]{64}, expected [0-9a-f]{64}; the registry's blob is corrupt/);
      b.release([digest]);
    });
  });
});

lazyTest.serial('the chunk cache stays within its bound while reading more than it holds', async (t) => {
  const bound = 512 * 1024;
  await withStore(t, async (a) => {
    const { digest, ref } = await pushed(a, 'bound1', 'v1');
    await withStore(
      t,
      async (b) => {
        await pullImage(b, ref, { mode: 'lazy' });
        const [l] = await b.acquire([digest]);
        for (const f of ['data/blob0', 'data/big']) t.deepEqual(await readFile(join(l!.path, f)), readFileSync(join(tree, f)));
        const s = b.lazyStats()!;
        t.true(s.fetchedBytes > 4 * bound, `read ${s.fetchedBytes} bytes`);
        t.true(s.cacheBytes <= bound, `daemon counts ${s.cacheBytes}`);
        t.true(b.lazy.cacheDiskBytes() <= bound, `cache files hold ${b.lazy.cacheDiskBytes()} bytes`);
        t.true(s.evictions > 0);
        b.release([digest]);
      },
      { lazyCacheBytes: bound },
    );
  });
});

lazyTest.serial('a dead file server is cleaned up and replaced by the next store; a live one is adopted', async (t) => {
  await withStore(t, async (a) => {
    const { digest, ref } = await pushed(a, 'crash1', 'v1');
    await withStore(t, async (b, dataDir) => {
      await pullImage(b, ref, { mode: 'lazy' });
      const [l] = await b.acquire([digest]);
      t.truthy(readFileSync(join(l!.path, 'etc/hello'), 'utf8'));
      b.release([digest]);
      const { openSqlite } = await import('../helpers/images');
      const { LayerStore } = await import('../../src/shim/layers/store');
      // Another process (a restarted gateway) adopts the running daemon and its mount.
      const db2 = openSqlite(join(dataDir, 'warren.db'));
      const c = new LayerStore({ dataDir, db: db2 });
      c.init();
      t.is(c.lazy.counters.adopted, 1);
      t.true(c.lazy.running());
      const [l2] = await c.acquire([digest]);
      t.is(c.counters.adoptions, 1);
      t.is(readFileSync(join(l2!.path, 'etc/hello'), 'utf8'), 'hello from a lazily loaded layer\n');
      c.release([digest]);
      // kill -9 of the daemon: its EROFS mount can only fail now; the next store detaches it and starts anew.
      const pid = c.lazyStats()!.pid;
      process.kill(pid, 'SIGKILL');
      await waitFor(() => !pidAlive(pid), 5000, 'the daemon to die');
      const db3 = openSqlite(join(dataDir, 'warren.db'));
      const d = new LayerStore({ dataDir, db: db3 });
      d.init();
      t.is(d.lazy.counters.staleCleaned, 1);
      t.is(fuseMountsUnder(dataDir), 0);
      await proxy.reset();
      const [l3] = await d.acquire([digest]);
      t.is(d.lazy.counters.started, 1);
      t.is(readFileSync(join(l3!.path, 'etc/hello'), 'utf8'), 'hello from a lazily loaded layer\n');
      // The new daemon took over the chunks on disk: mounting and re-reading fetched nothing.
      t.is((await proxy.counts()).blobBytes, 0, 'served from the node-local chunk cache');
      t.true(d.lazyStats()!.hits > 0);
      d.release([digest]);
      d.unmountUnused();
      await d.closeLazy();
      t.is(fuseMountsUnder(dataDir), 0);
      db2.close();
      db3.close();
    });
  });
});

test.serial('staging: every layer of an image is at the overflow registry, or it is not', async (t) => {
  await withStore(t, async (a) => {
    const dir = treeFor('stage1');
    const img = await a.importDirectory(dir, { name: 'stage1', compression: 'lz4' });
    rmSync(dir, { recursive: true, force: true });
    const repo = `${proxy.host}/overflow/images`;
    t.false(await isImageStaged(img, repo));
    t.deepEqual(await stagedLayers(repo, img.layers), [{ digest: img.digest, staged: false }]);
    await stageImage(a, 'stage1', repo);
    t.true(await isImageStaged(img, repo));
    t.deepEqual(await stagedLayers(repo, img.layers), [{ digest: img.digest, staged: true }]);
    // A blob missing at the registry (deleted behind its back) makes it unstaged again.
    const idx = await chunkIndex(a.blobPath(img.digest));
    t.is(idx.digest, img.digest);
    const del = await fetch(`http://${proxy.host}/v2/overflow/images/blobs/${img.digest}`, { method: 'DELETE' });
    t.is(del.status, 202);
    t.false(await isImageStaged(img, repo));
  });
});

test.serial('bad references and non-Warren manifests are refused with clear codes', async (t) => {
  await withStore(t, async (a) => {
    await t.throwsAsync(pullImage(a, 'no-host-here'), { code: 'INVALID_ARGUMENT' });
    await t.throwsAsync(pullImage(a, `${proxy.host}/Bad/Repo:x`), { code: 'INVALID_ARGUMENT' });
    await t.throwsAsync(pullImage(a, `${proxy.host}/warren/missing:v1`, { mode: 'eager' }), { code: 'IMAGE_NOT_FOUND' });
    // A plain OCI image manifest (not a Warren artifact).
    const cfg = Buffer.from('{}');
    const { createHash } = await import('node:crypto');
    const cd = 'sha256:' + createHash('sha256').update(cfg).digest('hex');
    const up = await fetch(`http://${proxy.host}/v2/other/img/blobs/uploads/`, { method: 'POST' });
    const loc = new URL(up.headers.get('location')!, `http://${proxy.host}`);
    loc.searchParams.set('digest', cd);
    t.is((await fetch(loc, { method: 'PUT', body: cfg, headers: { 'content-type': 'application/octet-stream' } })).status, 201);
    const man = JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: cd, size: cfg.length }, layers: [] });
    t.is((await fetch(`http://${proxy.host}/v2/other/img/manifests/v1`, { method: 'PUT', body: man, headers: { 'content-type': 'application/vnd.oci.image.manifest.v1+json' } })).status, 201);
    await t.throwsAsync(pullImage(a, `${proxy.host}/other/img:v1`, { mode: 'eager' }), { code: 'INVALID_ARCHIVE', message: /not a Warren image artifact/ });
    await t.throwsAsync(pullImage(a, `127.0.0.1:1/warren/x:v1`, { mode: 'eager' }), { code: 'REGISTRY_ERROR' });
  });
});

lazyTest.serial('a sandbox on a lazily pulled image runs exec; deleting it and closing the node leaves nothing', async (t) => {
  const { ShimNode } = await import('../../src/shim/node');
  const { openDatabase } = await import('../../src/state/db');
  const { busyboxRootfs, spec } = await import('../helpers/warren');
  const loops = loopDevices();
  let ref = '';
  await withStore(t, async (a) => {
    // busybox plus data the sandbox never reads: a lazy node fetches busybox, not the rest.
    const root = join(tree, '..', `${tree.split('/').pop()}-bb`);
    cpSync(await busyboxRootfs(), root, { recursive: true, verbatimSymlinks: true });
    mkdirSync(join(root, 'opt'), { recursive: true });
    writeFileSync(join(root, 'opt/unused'), randomBytes(4 << 20));
    await a.importDirectory(root, { name: 'bb', compression: 'lz4' });
    rmSync(root, { recursive: true, force: true });
    ref = `${proxy.host}/warren/busybox:lazy`;
    await pushImage(a, 'bb', ref);
  });
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-lazy-node-'));
  const db = openDatabase(join(dataDir, 'warren.db'));
  const node = new ShimNode({ dataDir, db, nodeId: 'lz' + process.pid.toString(36) });
  let pid = 0;
  try {
    await node.start();
    await proxy.reset();
    const img = await node.importImage({ name: 'bb-lazy', source: { type: 'registry', ref, mode: 'lazy' } });
    t.deepEqual(node.layerStates(img.layers).map((s) => s.state), ['lazy']);
    const sb = await node.createSandbox(spec({ image: 'bb-lazy' }));
    const r = await node.exec(sb.id, { cmd: ['/bin/sh', '-c', 'cat /etc/hostname; echo ok > /tmp/x; cat /tmp/x'] });
    t.is(r.exitCode, 0, r.stderr);
    t.is(r.stdout, 'busybox\nok\n');
    const c = await proxy.counts();
    t.log(`busybox layer ${img.sizeBytes} bytes; create + exec fetched ${c.blobBytes} bytes in ${c.rangeRequests} range requests`);
    t.true(c.blobBytes < img.sizeBytes * 0.6, 'the data the sandbox does not read was not downloaded');
    pid = node.layers.lazyStats()!.pid;
    await node.deleteSandbox(sb.id);
  } finally {
    for (const s of node.listSandboxes()) await node.deleteSandbox(s.id).catch(() => undefined);
    await node.close();
    db.close();
  }
  try {
    if (pid) await waitFor(() => !pidAlive(pid), 5000, 'warren-lazyfs to exit at node shutdown');
    t.is(readMountInfo().filter((m) => m.mountPoint.startsWith(dataDir) || m.source.startsWith(dataDir)).length, 0, 'no mount left after node shutdown');
    t.is(loopDevices(), loops);
  } finally {
    removeTree(dataDir);
  }
});

const skopeoTest = testUnless(reason ?? (existsSync('/usr/bin/skopeo') ? null : 'skopeo is not installed (apt-get install skopeo)'));

skopeoTest.serial('staging with skopeo copy: the artifact copies as it is and counts as staged', async (t) => {
  const { execFileSync } = await import('node:child_process');
  const { stagedRef } = await import('../../src/shim/layers/remote');
  await withStore(t, async (a) => {
    const dir = treeFor('skopeo1');
    const img = await a.importDirectory(dir, { name: 'skopeo1', compression: 'lz4' });
    rmSync(dir, { recursive: true, force: true });
    await pushImage(a, 'skopeo1', `${proxy.host}/src/skopeo1:v1`);
    const repo = `${proxy.host}/overflow/skopeo`;
    t.false(await isImageStaged(img, repo));
    const dest = stagedRef(repo, img).replace(/^http:\/\//, '');
    execFileSync('skopeo', ['copy', '--src-tls-verify=false', '--dest-tls-verify=false', `docker://${proxy.host}/src/skopeo1:v1`, `docker://${dest}`], { stdio: 'pipe' });
    t.true(await isImageStaged(img, repo));
  });
});
