import test from 'ava';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WarrenError } from '../../src/errors';
import { assertTarConfined } from '../../src/shim/layers/tar';
import { makeTar, type RawTarEntry } from '../helpers/images';

function escapes(t: import('ava').ExecutionContext, tar: Buffer, entry: string, opts?: Parameters<typeof assertTarConfined>[1]): void {
  const err = t.throws(() => assertTarConfined(tar, opts), { instanceOf: WarrenError as unknown as new () => Error }) as unknown as WarrenError;
  t.is(err.code, 'ARCHIVE_ESCAPE');
  t.true(err.message.includes(JSON.stringify(entry)), err.message);
}

const raw = (entries: RawTarEntry[]) => makeTar(entries);

/** Run GNU tar in a scratch dir laid out by `setup`. */
function gnu(setup: (dir: string) => void, args: string[]): Buffer {
  const dir = mkdtempSync(join(tmpdir(), 'warren-confine-'));
  try {
    setup(dir);
    execFileSync('tar', ['-cf', join(dir, 'out.tar'), ...args], { cwd: dir, stdio: ['ignore', 'ignore', 'pipe'] });
    return readFileSync(join(dir, 'out.tar'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

test('a plain archive with relative links inside passes and returns its entries', (t) => {
  const tar = gnu(
    (d) => {
      mkdirSync(join(d, 'src/sub'), { recursive: true });
      writeFileSync(join(d, 'src/sub/f'), 'x');
      symlinkSync('sub/f', join(d, 'src/link'));
      symlinkSync('../sub', join(d, 'src/sub/up'));
      symlinkSync('.', join(d, 'src/self'));
    },
    ['-C', 'src', '.'],
  );
  const entries = assertTarConfined(tar);
  t.true(entries.length >= 5);
});

test('absolute entry names escape (GNU tar -P)', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-abs-'));
  try {
    writeFileSync(join(dir, 'f'), 'x');
    const tar = gnu(() => undefined, ['-P', join(dir, 'f')]);
    escapes(t, tar, join(dir, 'f'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('".." components escape (GNU tar -P and crafted)', (t) => {
  const tar = gnu(
    (d) => {
      mkdirSync(join(d, 'sub'));
      writeFileSync(join(d, 'evil'), 'x');
    },
    ['-P', '-C', 'sub', '../evil'],
  );
  escapes(t, tar, '../evil');
  escapes(t, raw([{ name: 'ok/../../evil', data: 'x' }]), 'ok/../../evil');
  escapes(t, raw([{ name: 'a/b/..', type: 'dir' }]), 'a/b/..');
  // Even with in-root symlink semantics.
  escapes(t, raw([{ name: '../evil', data: 'x' }]), '../evil', { symlinks: 'in-root' });
});

test('symlinks leaving the directory escape (GNU tar)', (t) => {
  const abs = gnu((d) => symlinkSync('/etc/passwd', join(d, 'pw')), ['pw']);
  escapes(t, abs, 'pw');
  const up = gnu(
    (d) => {
      mkdirSync(join(d, 'a'));
      symlinkSync('../../outside', join(d, 'a/l'));
    },
    ['a'],
  );
  escapes(t, up, 'a/l');
  // In a root filesystem (image layers) symlinks resolve inside the root: fine.
  t.notThrows(() => assertTarConfined(abs, { symlinks: 'in-root' }));
  t.notThrows(() => assertTarConfined(up, { symlinks: 'in-root' }));
});

test('symlink chains that leave through another symlink escape', (t) => {
  // b -> . is harmless alone, but a -> b/.. is the parent of the extraction dir.
  escapes(t, raw([{ name: 'b', type: 'symlink', linkname: '.' }, { name: 'a', type: 'symlink', linkname: 'b/..' }]), 'a');
  // Order does not matter.
  escapes(t, raw([{ name: 'a', type: 'symlink', linkname: 'b/..' }, { name: 'b', type: 'symlink', linkname: '.' }]), 'a');
  // A deeper chain that stays inside is fine.
  t.notThrows(() =>
    assertTarConfined(raw([{ name: 'd/e', type: 'dir' }, { name: 'b', type: 'symlink', linkname: 'd/e' }, { name: 'a', type: 'symlink', linkname: 'b/..' }])),
  );
  // Loops cannot escape.
  t.notThrows(() => assertTarConfined(raw([{ name: 'x', type: 'symlink', linkname: 'y' }, { name: 'y', type: 'symlink', linkname: 'x' }])));
});

test('writing through an escaping symlink escapes', (t) => {
  escapes(t, raw([{ name: 'l', type: 'symlink', linkname: '..' }, { name: 'l/evil', data: 'x' }]), 'l');
  t.notThrows(() => assertTarConfined(raw([{ name: 'l', type: 'symlink', linkname: 'sub' }, { name: 'l/ok', data: 'x' }])));
});

test('hard links to outside escape', (t) => {
  escapes(t, raw([{ name: 'h', type: 'hardlink', linkname: '../etc/shadow' }]), 'h');
  escapes(t, raw([{ name: 'h', type: 'hardlink', linkname: '/etc/shadow' }]), 'h');
  escapes(t, raw([{ name: 'l', type: 'symlink', linkname: '..' }, { name: 'h', type: 'hardlink', linkname: 'l/etc/shadow' }]), 'l');
  t.notThrows(() => assertTarConfined(raw([{ name: 'f', data: 'x' }, { name: 'h', type: 'hardlink', linkname: 'f' }])));
});

test('corrupt headers are INVALID_ARCHIVE, not ARCHIVE_ESCAPE', (t) => {
  const err = t.throws(() => assertTarConfined(raw([{ name: '../evil', data: 'x', badChecksum: true }]))) as unknown as WarrenError;
  t.is(err.code, 'INVALID_ARCHIVE');
});
