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
import test from 'ava';
import { rootSkipReason, spec, withShim } from '../helpers/warren';

const skip = rootSkipReason();
const it = skip === null ? test : test.skip;
const why = skip === null ? '' : ` (skipped: ${skip})`;

it(`scrubbing through planted links never removes host files${why}`, async (t) => {
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
