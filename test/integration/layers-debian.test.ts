/**
 * The Debian default image: debootstrap (minbase + python3, git) -> EROFS, and
 * the node cache that makes every later build on this node instant.
 *
 * Runs when WARREN_TEST_DEBIAN=1 (builds, ~1 min, needs deb.debian.org) or when
 * the cache file already exists (then it only imports from the cache).
 */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { debianCachePath } from '../../src/shim/layers/debian';
import { withTestStore } from '../helpers/images';

const cachePath = debianCachePath({});
const wanted = process.env.WARREN_TEST_DEBIAN === '1';
const cached = existsSync(cachePath);
const reason = process.getuid?.() !== 0 ? 'requires root' : !wanted && !cached ? `set WARREN_TEST_DEBIAN=1 to build (no cache file ${cachePath})` : null;

if (reason !== null) {
  test.skip(`debian image build (skipped: ${reason})`, () => undefined);
} else {
  test('debian bookworm minbase with python3 and git: build or cache -> mount -> runs', async (t) => {
    t.timeout(20 * 60_000);
    await withTestStore(async ({ store }) => {
      const phases = new Set<string>();
      let started = Date.now();
      const img = await store.buildDebian({ name: 'default', onProgress: (p) => phases.add(p.phase) });
      const took = Date.now() - started;
      t.log(`${cached ? 'import from cache' : 'debootstrap + mkfs'}: ${(took / 1000).toFixed(1)} s, layer ${(img.sizeBytes / 1048576).toFixed(1)} MiB, phases ${[...phases].join(',')}`);
      t.true(existsSync(cachePath), 'the node cache holds the image');
      t.is(statSync(cachePath).size, img.sizeBytes);
      t.is(img.kind, 'base');

      started = Date.now();
      const [layer] = await store.acquire(img.layers);
      t.log(`mount: ${Date.now() - started} ms`);
      const root = layer!.path;
      t.true(existsSync(join(root, 'usr/bin/python3')), 'python3');
      t.true(existsSync(join(root, 'usr/bin/git')), 'git');
      t.deepEqual(
        readdirSync(join(root, 'var/cache/apt/archives')).filter((n) => n.endsWith('.deb')),
        [],
      );
      t.deepEqual(
        readdirSync(join(root, 'var/lib/apt/lists')).filter((n) => n !== 'partial' && n !== 'lock'),
        [],
      );
      // It runs (read-only root is enough for these). The node's layer mounts are noexec, so the
      // check runs in a private mount namespace where its copy of the mount allows exec.
      const inLayer = (cmd: string) => execFileSync('unshare', ['-m', '--propagation', 'private', 'sh', '-c', `mount -o remount,exec,dev ${root} && chroot ${root} ${cmd}`], { encoding: 'utf8' });
      t.regex(inLayer("/usr/bin/python3 -B -c 'import sys; print(sys.version)'"), /^3\.\d+/);
      t.regex(inLayer('/usr/bin/git --version'), /^git version/);
      store.release(img.layers);

      // Second build (another data dir would do the same): straight from the cache, same digest.
      started = Date.now();
      const again = await store.buildDebian({ name: 'default-2' });
      t.log(`second build (cache): ${Date.now() - started} ms`);
      t.is(again.digest, img.digest);
    });
  });
}
