import test from 'ava';
import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync, linkSync } from 'node:fs';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { createGunzip, gzipSync } from 'node:zlib';
import { indexTarFile, readTarStream, scanTar, type TarEntry } from '../../src/shim/layers/tar';
import { makeTar, paxRecords } from '../helpers/images';
import { tempDir } from '../helpers/tmp';

function errCode(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return (err as { code?: string }).code ?? String(err);
  }
  return 'no error';
}

const LONG_DIR = 'd'.repeat(60) + '/' + 'e'.repeat(60);
const LONG_FILE = `${LONG_DIR}/${'f'.repeat(90)}.txt`; // > 200 bytes in total, components < 100
const LONG_TARGET = '../'.repeat(1) + 'x'.repeat(150);

/** A tree with long names, a long symlink target, a hard link and unicode, tarred by GNU tar in `format`. */
function gnuTar(format: 'gnu' | 'posix' | 'ustar'): { tar: Buffer; files: Record<string, string> } {
  const dir = tempDir('warren-tar-');
  try {
    const root = join(dir, 'root');
    mkdirSync(join(root, LONG_DIR), { recursive: true });
    const files: Record<string, string> = {
      'hello.txt': 'hello world\n',
      [LONG_FILE]: 'deep\n',
      'big.bin': 'z'.repeat(5000),
      'empty': '',
    };
    if (format !== 'ustar') files['ünïcödé-名前.txt'] = 'unicode\n';
    for (const [p, c] of Object.entries(files)) writeFileSync(join(root, p), c);
    linkSync(join(root, 'hello.txt'), join(root, 'zz-hardlink.txt'));
    if (format !== 'ustar') symlinkSync(LONG_TARGET, join(root, 'longlink'));
    symlinkSync('hello.txt', join(root, 'short-link'));
    const out = join(dir, 'out.tar');
    execFileSync('tar', [`--format=${format}`, '--sort=name', '-C', root, '-cf', out, '.']);
    return { tar: readFileSync(out), files };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

function byPath(entries: TarEntry[]): Map<string, TarEntry> {
  return new Map(entries.map((e) => [e.path.replace(/^\.\//, '').replace(/\/$/, ''), e]));
}

for (const format of ['gnu', 'posix', 'ustar'] as const) {
  test(`scanTar reads a GNU tar ${format} archive: long names, links, data offsets`, (t) => {
    const { tar, files } = gnuTar(format);
    const entries = scanTar(tar);
    const m = byPath(entries);
    for (const [p, content] of Object.entries(files)) {
      const e = m.get(p);
      t.truthy(e, `missing ${p}; have ${[...m.keys()].join(', ')}`);
      if (!e) continue;
      // GNU tar may store the second name of a hard-linked file as a link; hello.txt is first in sort order.
      t.is(e.type, 'file', p);
      t.is(e.size, Buffer.byteLength(content), p);
      t.is(tar.subarray(e.offset, e.offset + e.size).toString(), content, p);
    }
    t.true(LONG_FILE.length > 100);
    t.is(m.get(LONG_DIR)?.type, 'dir');
    t.is(m.get('zz-hardlink.txt')?.type, 'hardlink');
    t.is(m.get('zz-hardlink.txt')?.linkpath.replace(/^\.\//, ''), 'hello.txt');
    t.is(m.get('short-link')?.type, 'symlink');
    t.is(m.get('short-link')?.linkpath, 'hello.txt');
    if (format !== 'ustar') t.is(m.get('longlink')?.linkpath, LONG_TARGET);
    t.is(m.get('')?.type, 'dir'); // "./"
    t.is(m.get('hello.txt')?.mode, 0o644);
  });
}

test('readTarStream and indexTarFile agree with scanTar (through gzip)', async (t) => {
  const { tar } = gnuTar('posix');
  const expected = scanTar(tar);
  const streamed: Array<{ entry: TarEntry; data: string }> = [];
  const gz = Readable.from([gzipSync(tar)]).pipe(createGunzip());
  for await (const { entry, body } of readTarStream(gz)) {
    const chunks: Buffer[] = [];
    // Read only some bodies: unread ones must be skipped correctly.
    if (entry.path.endsWith('.txt')) for await (const c of body) chunks.push(c);
    streamed.push({ entry, data: Buffer.concat(chunks).toString() });
  }
  t.deepEqual(
    streamed.map((s) => s.entry),
    expected,
  );
  for (const s of streamed) if (s.entry.path.endsWith('.txt') && s.entry.type === 'file') t.is(s.data, tar.subarray(s.entry.offset, s.entry.offset + s.entry.size).toString());
  const dir = tempDir('warren-tar-');
  try {
    writeFileSync(join(dir, 'a.tar'), tar);
    t.deepEqual(indexTarFile(join(dir, 'a.tar')), expected);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('pax global and per-entry headers apply (path, linkpath, uid, xattrs)', (t) => {
  const tar = makeTar([
    { name: 'pax_global_header', typeflag: 'g', data: paxRecords({ uid: '4242', uname: 'glob' }) },
    { name: 'PaxHeaders/x', typeflag: 'x', data: paxRecords({ path: 'a/' + 'p'.repeat(200), 'SCHILY.xattr.user.test': 'v1' }) },
    { name: 'short-name', data: 'data' },
    { name: 'PaxHeaders/y', typeflag: 'x', data: paxRecords({ linkpath: 'l'.repeat(180), uid: '7' }) },
    { name: 'sym', type: 'symlink', linkname: 'ignored' },
  ]);
  const [file, sym] = scanTar(tar);
  t.is(file!.path, 'a/' + 'p'.repeat(200));
  t.is(file!.uid, 4242);
  t.is(file!.uname, 'glob');
  t.is(file!.xattrs?.['user.test']?.toString(), 'v1');
  t.is(tar.subarray(file!.offset, file!.offset + file!.size).toString(), 'data');
  t.is(sym!.linkpath, 'l'.repeat(180));
  t.is(sym!.uid, 7);
  t.is(sym!.path, 'sym');
});

test('corrupt, truncated and non-tar input is INVALID_ARCHIVE', (t) => {
  const good = makeTar([{ name: 'a.txt', data: 'hello' }]);
  t.is(scanTar(good).length, 1);
  t.is(errCode(() => scanTar(makeTar([{ name: 'a.txt', data: 'x', badChecksum: true }]))), 'INVALID_ARCHIVE');
  t.is(errCode(() => scanTar(good.subarray(0, 700))), 'INVALID_ARCHIVE'); // data cut
  t.is(errCode(() => scanTar(good.subarray(0, 300))), 'INVALID_ARCHIVE'); // header cut
  t.is(errCode(() => scanTar(Buffer.from('this is not a tar archive'.repeat(40)))), 'INVALID_ARCHIVE');
  t.is(errCode(() => scanTar(Buffer.alloc(0))), 'INVALID_ARCHIVE');
  const corrupt = Buffer.from(good);
  corrupt.write('9x', 124, 'latin1'); // size field not octal (checksum also off)
  t.is(errCode(() => scanTar(corrupt)), 'INVALID_ARCHIVE');
  // A pax header claiming a bogus record length.
  t.is(errCode(() => scanTar(makeTar([{ name: 'x', typeflag: 'x', data: '99 path=a\n' }, { name: 'a' }]))), 'INVALID_ARCHIVE');
  // Extended header at the very end, with no entry after it.
  t.is(errCode(() => scanTar(makeTar([{ name: 'x', typeflag: 'x', data: paxRecords({ path: 'a' }) }]))), 'INVALID_ARCHIVE');
});

test('an archive without end-of-archive blocks still scans', (t) => {
  const tar = makeTar([{ name: 'a.txt', data: 'hello' }]);
  t.is(scanTar(tar.subarray(0, 1024)).length, 1);
});
