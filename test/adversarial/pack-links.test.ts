/**
 * pack reads the sandbox's files on the host; links the sandbox plants must
 * not make it touch host files. The sandbox replaces /var/cache, /var/lib and
 * /var/tmp (the scrubbed /var/cache/apt/*, /var/lib/apt/lists/* and
 * /var/tmp/* live below them) and /root/.cache with links to a host
 * directory; packing leaves the host directory exactly as it was.
 */
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { testUnless } from '../helpers/skip';
import { rootSkipReason, spec, withShim } from '../helpers/warren';

const skip = rootSkipReason();
const it = testUnless(skip);

it(`scrubbing through planted links never removes host files`, async (t) => {
  const victim = mkdtempSync(join(tmpdir(), 'warren-victim-'));
  for (const d of ['tmp', 'cache/apt', 'lib/apt/lists']) mkdirSync(join(victim, d), { recursive: true });
  for (const f of ['tmp/precious', 'cache/apt/pkg.deb', 'lib/apt/lists/index']) writeFileSync(join(victim, f), 'host data');
  try {
    await withShim(t, async ({ shim }) => {
      const sb = await shim.createSandbox(spec());
      const plant = [
        `mkdir -p /var && rm -rf /var/cache /var/lib && ln -s ${victim}/cache /var/cache && ln -s ${victim}/lib /var/lib`,
        `rm -rf /var/tmp && ln -s ${victim}/tmp /var/tmp`,
        `mkdir -p /root && rm -rf /root/.cache && ln -s ${victim} /root/.cache`,
      ].join(' && ');
      const r = await shim.exec(sb.id, { cmd: plant });
      t.is(r.exitCode, 0, r.stderr);
      const packed = await shim.packSandbox(sb.id, { name: 'linked' }, 'test');
      t.true(packed.scrubbed.includes('/root/.cache'), JSON.stringify(packed.scrubbed));
      for (const f of ['tmp/precious', 'cache/apt/pkg.deb', 'lib/apt/lists/index']) t.true(existsSync(join(victim, f)), `host ${f} is still there`);
      t.deepEqual(readdirSync(join(victim, 'tmp')), ['precious']);
      await shim.deleteSandbox(sb.id);
    });
  } finally {
    rmSync(victim, { recursive: true, force: true });
  }
});

it(`squashing a chain where a later layer turned a directory into a link to / reads no host file`, async (t) => {
  const victim = mkdtempSync(join(tmpdir(), 'warren-victim-'));
  writeFileSync(join(victim, 'f'), 'host data');
  try {
    await withShim(t, async ({ shim }) => {
      const a = await shim.createSandbox(spec());
      t.is((await shim.exec(a.id, { cmd: `mkdir -p /work/data${victim} && echo sandbox > /work/data${victim}/f` })).exitCode, 0);
      await shim.packSandbox(a.id, { name: 'chain1' }, 'test');
      const b = await shim.createSandbox(spec({ image: 'chain1' }));
      t.is((await shim.exec(b.id, { cmd: 'rm -rf /work/data && ln -s / /work/data' })).exitCode, 0);
      const packed = await shim.packSandbox(b.id, { name: 'chain2', squash: true }, 'test');
      t.true(packed.squashed);
      const [l] = await shim.layers.acquire([packed.image.layers[0]!]);
      try {
        const { lstatSync, readFileSync } = await import('node:fs');
        t.true(lstatSync(join(l!.path, 'work/data')).isSymbolicLink(), 'the link is kept as a link');
        t.false(existsSync(join(l!.path, 'work', 'data-real')));
        t.is(readFileSync(join(victim, 'f'), 'utf8'), 'host data', 'the host file is untouched');
      } finally {
        shim.layers.release([packed.image.layers[0]!]);
      }
      const c = await shim.createSandbox(spec({ image: 'chain2' }));
      t.is((await shim.exec(c.id, { cmd: `readlink /work/data; cat /work/data${victim}/f 2>&1 | grep -c 'host data'` })).stdout, '/\n0\n', 'no host content in the layer');
      for (const s of [a, b, c]) await shim.deleteSandbox(s.id);
    });
  } finally {
    rmSync(victim, { recursive: true, force: true });
  }
});
