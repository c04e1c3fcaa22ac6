/**
 * pack_diff: files added, modified and deleted in a sandbox (opaque directory
 * included) appear exactly so in a new sandbox started from the packed
 * environment; build residue and requested paths are scrubbed; chains of packs
 * work and squash into one layer with the same result.
 */
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { readMountInfo } from '../../src/shim/layers/sys';
import type { ShimNode } from '../../src/shim/node';
import { spec, withShim } from '../helpers/warren';
import { packBaseRootfs } from './lifecycle-fixture';
import { testUnless } from '../helpers/skip';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer', 'mkfs-erofs');
const it = testUnless(skip);

async function sh(shim: ShimNode, id: string, cmd: string): Promise<string> {
  const r = await shim.exec(id, { cmd });
  if (r.exitCode !== 0) throw new Error(`${cmd}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}

/** What a sandbox from a packed environment must show (the check is one shell script). */
const EXPECT_V1 = [
  'cat /work/app/new.txt', // added
  'readlink /work/app/link',
  'stat -c %a /work/app/run.sh',
  'cat /work/app/modify.txt /work/app/keep.txt', // modified, untouched
  'test ! -e /work/app/delete.txt && echo file-deleted', // deleted base file: whiteout
  'test ! -e /work/app/deldir && echo dir-deleted', // deleted base dir
  'ls -A /work/app/opaque | tr "\\n" " "', // opaque dir: only the new content
  'stat -c %a /tmp',
  'ls -A /tmp | wc -l', // scrubbed residue
  'for p in /root/.ash_history /root/.cache /work/answers /work/app/secret.key /var/tmp/build.log; do test -e $p && echo LEAK $p; done; true',
].join('; echo "|"; ');

it(`pack_diff keeps additions, modifications and deletions exactly, scrubs residue, chains and squashes`, async (t) => {
  await withShim(t, async ({ shim, dataDir }) => {
    await shim.importImage({ name: 'packbase', source: { type: 'directory', path: await packBaseRootfs() } });
    const sb = await shim.createSandbox(spec({ image: 'packbase' }));
    t.log(`builder sandbox ${sb.id}`);
    await sh(
      shim,
      sb.id,
      [
        'mkdir -p /work/answers /root/.cache/pip',
        'echo added > /work/app/new.txt',
        'ln -s new.txt /work/app/link',
        'echo "#!/bin/sh" > /work/app/run.sh && chmod 750 /work/app/run.sh',
        'echo modified > /work/app/modify.txt',
        'rm /work/app/delete.txt',
        'rm -rf /work/app/deldir',
        'rm -rf /work/app/opaque && mkdir /work/app/opaque && echo x > /work/app/opaque/only',
        // residue
        'echo "cat /work/answers/ref.txt" > /root/.ash_history',
        'echo tmp > /tmp/scratch && mkdir /tmp/d && echo y > /tmp/d/z',
        'echo cache > /root/.cache/pip/wheel',
        'echo 42 > /work/answers/ref.txt',
        'echo key > /work/app/secret.key',
        'echo log > /var/tmp/build.log',
      ].join(' && '),
    );
    // something keeps writing while we pack: the copy is taken frozen
    await sh(shim, sb.id, '(while :; do date > /work/busy; done >/dev/null 2>&1 &)');
    const v1 = await shim.packSandbox(sb.id, { name: 'envtest:v1', scrub: ['/work/answers', '/work/app/*.key'] }, 'builder-1');
    t.log(`pack v1: ${JSON.stringify({ ...v1, image: v1.image.layers.length })}`);
    t.true(v1.frozenMs > 0);
    t.is(v1.squashed, false);
    for (const p of ['/root/.ash_history', '/root/.cache', '/work/answers', '/work/app/secret.key', '/tmp/scratch', '/tmp/d', '/var/tmp/build.log']) t.true(v1.scrubbed.includes(p), `${p} scrubbed (${v1.scrubbed.join(', ')})`);
    t.is(v1.image.layers.length, 2);
    t.is(v1.environment.owner, 'builder-1');
    t.false(v1.environment.published);
    t.deepEqual(v1.environment.diffLayers, [v1.layer]);
    t.is(shim.getSandbox(sb.id).state, 'running', 'the sandbox runs on after the pack');
    await sh(shim, sb.id, 'cat /work/answers/ref.txt'); // the builder's own sandbox is untouched

    const expected = 'added\n|\nnew.txt\n|\n750\n|\nmodified\nkeep\n|\nfile-deleted\n|\ndir-deleted\n|\nonly |\n1777\n|\n0\n|\n';
    const a = await shim.createSandbox(spec({ image: 'envtest:v1' }));
    const got = await sh(shim, a.id, EXPECT_V1);
    t.is(got, expected);
    t.deepEqual(a.layers, v1.image.layers);

    // chain: pack a sandbox started from the packed environment
    await sh(shim, a.id, 'echo two > /work/app/v2.txt && rm /work/app/new.txt && echo hist > /root/.ash_history');
    const v2 = await shim.packSandbox(a.id, { name: 'envtest:v2' }, 'builder-1');
    t.is(v2.image.layers.length, 3);
    t.deepEqual(v2.environment.diffLayers, [v2.layer, v1.layer]);
    const b = await shim.createSandbox(spec({ image: 'envtest:v2' }));
    t.is(await sh(shim, b.id, 'cat /work/app/v2.txt; test ! -e /work/app/new.txt && echo new-deleted; test ! -e /root/.ash_history && echo no-history; cat /work/app/modify.txt; ls -A /work/app/opaque'), 'two\nnew-deleted\nno-history\nmodified\nonly\n');

    // squash: the pack layers become one, same view
    await sh(shim, b.id, 'echo three > /work/app/v3.txt && echo again > /work/app/delete.txt');
    const v3 = await shim.packSandbox(b.id, { name: 'envtest:v3', squash: true }, 'builder-1');
    t.true(v3.squashed);
    t.is(v3.environment.diffLayers.length, 1);
    t.is(v3.image.layers.length, 2);
    const c = await shim.createSandbox(spec({ image: 'envtest:v3' }));
    t.is(
      await sh(shim, c.id, 'cat /work/app/v2.txt /work/app/v3.txt /work/app/delete.txt /work/app/modify.txt /work/app/keep.txt; test ! -e /work/app/new.txt && echo new-deleted; test ! -e /work/app/deldir && echo dir-deleted; ls -A /work/app/opaque; readlink /work/app/link; stat -c %a /work/app/run.sh'),
      'two\nthree\nagain\nmodified\nkeep\nnew-deleted\ndir-deleted\nonly\nnew.txt\n750\n',
    );

    // A paused sandbox packs too (already frozen) and stays paused.
    await shim.pauseSandbox(c.id);
    const v4 = await shim.packSandbox(c.id, { name: 'envtest:v4' }, 'builder-1');
    t.is(v4.frozenMs, 0);
    t.is(shim.getSandbox(c.id).state, 'paused');

    // Names of node images and of other accounts' environments are refused.
    const clash = await t.throwsAsync(shim.packSandbox(c.id, { name: 'busybox' }, 'builder-1'));
    t.is((clash as { code?: string }).code, 'ALREADY_EXISTS');
    const theirs = await t.throwsAsync(shim.packSandbox(c.id, { name: 'envtest:v1' }, 'builder-2'));
    t.is((theirs as { code?: string }).code, 'ALREADY_EXISTS');

    for (const s of [sb, a, b, c]) await shim.deleteSandbox(s.id);
    t.deepEqual(readdirSync(join(dataDir, 'lifecycle', 'tmp')), [], 'no pack scratch left');
    t.deepEqual(readMountInfo().filter((m) => m.mountPoint.startsWith(join(dataDir, 'lifecycle'))), [], 'no scrub/squash overlay left mounted');
  });
});
