import test from 'ava';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, utimesSync, writeFileSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { crc32c, mkfsErofs, sha256File } from '../../src/shim/layers/erofs';
import { testUnless } from '../helpers/skip';

test('crc32c matches the standard check value', (t) => {
  t.is((crc32c(0xffffffff, Buffer.from("123456789")) ^ 0xffffffff) >>> 0, 0xe3069283);
});

const hasMkfs = (() => {
  try {
    execFileSync('mkfs.erofs', ['--help'], { stdio: 'ignore' });
    return true;
  } catch (err) {
    return (err as { status?: number }).status !== undefined; // --help exits non-zero on some versions
  }
})();

function tree(dir: string, mtime: number): void {
  mkdirSync(join(dir, 'a/b'), { recursive: true });
  writeFileSync(join(dir, 'a/b/file'), 'content\n');
  writeFileSync(join(dir, 'top'), 'x'.repeat(10000));
  symlinkSync('a/b/file', join(dir, 'link'));
  for (const p of ['a/b/file', 'top', 'a/b', 'a', '.']) utimesSync(join(dir, p), mtime, mtime);
}

testUnless(hasMkfs ? null : 'requires mkfs.erofs')('the same tree gives the same image bytes; UUIDs differ per content', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-erofs-'));
  try {
    tree(join(dir, 'one'), 1000);
    tree(join(dir, 'two'), 2_000_000_000); // other mtimes: same image
    mkdirSync(join(dir, 'three'));
    writeFileSync(join(dir, 'three', 'other'), 'other');
    const a = await mkfsErofs(join(dir, 'one.img'), join(dir, 'one'));
    const b = await mkfsErofs(join(dir, 'two.img'), join(dir, 'two'));
    const c = await mkfsErofs(join(dir, 'three.img'), join(dir, 'three'));
    t.is(a, b);
    t.not(a, c);
    t.is(await sha256File(join(dir, 'one.img')), a);
    const uuid = (f: string) => readFileSync(join(dir, f)).subarray(1024 + 48, 1024 + 64).toString('hex');
    t.is(uuid('one.img'), uuid('two.img'));
    t.not(uuid('one.img'), uuid('three.img'));
    t.is(uuid('one.img')[12], '8'); // version 8
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
