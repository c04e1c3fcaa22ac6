/**
 * scripts/setup.sh installs every package a feature probe needs to say what
 * the kernel itself lacks, rather than that a tool is missing.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import test from 'ava';

function aptPackages(): string[] {
  const sh = readFileSync(join(__dirname, '..', '..', '..', 'scripts', 'setup.sh'), 'utf8');
  const block = /APT_PACKAGES=\(([\s\S]*?)\n\)/.exec(sh);
  if (block === null) throw new Error('no APT_PACKAGES in scripts/setup.sh');
  return block[1]!.split('\n').flatMap((l) => l.replace(/#.*/, '').trim().split(/\s+/)).filter(Boolean);
}

test('setup.sh installs the tools the feature probes run (criu, erofs-utils, debootstrap, runc)', (t) => {
  const pkgs = aptPackages();
  for (const p of ['criu', 'erofs-utils', 'debootstrap', 'runc']) t.true(pkgs.includes(p), p);
});
