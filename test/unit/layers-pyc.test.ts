import { execFileSync } from 'node:child_process';
import { mkdirSync, readFileSync, readdirSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { LAYER_EPOCH } from '../../src/shim/layers/erofs';
import { alignPycTimestamps } from '../../src/shim/layers/pyc';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';

const python = ['/usr/bin/python3', '/usr/local/bin/python3'].find((p) => {
  try {
    execFileSync(p, ['-c', 'pass']);
    return true;
  } catch {
    return false;
  }
});
const it = testUnless(python === undefined ? 'no python3 on this host to write caches with' : null);

/** What Python does with `mod`'s cache when it imports it from `dir` without writing caches. */
function importVerdict(dir: string, mod: string): 'used' | 'stale' | 'recompiled' {
  // -v reports on stderr which cache it took or why it did not
  const out = execFileSync('/bin/sh', ['-c', `"$0" -B -v -c "import $1" 2>&1 >/dev/null`, python!, mod], { cwd: dir, encoding: 'utf8', env: { PATH: '/usr/bin:/bin', PYTHONPATH: dir } });
  if (out.includes(`code object from '${join(dir, '__pycache__')}`)) return 'used';
  if (out.includes(`bytecode is stale for '${mod}'`)) return 'stale';
  return 'recompiled';
}

/** Every inode of the tree dated `epoch`, as mkfs.erofs -T makes them. */
function dateAll(dir: string, epoch: number): void {
  for (const name of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, name.name);
    if (name.isSymbolicLink()) continue;
    if (name.isDirectory()) dateAll(p, epoch);
    utimesSync(p, epoch, epoch);
  }
}

it('valid timestamp caches stay valid once every inode carries the layer timestamp; the rest are left alone', (t) => {
  const dir = tempDir('warren-pyc-');
  try {
    writeFileSync(join(dir, 'fresh.py'), 'X = 1\n');
    writeFileSync(join(dir, 'stale.py'), 'X = 2\n');
    writeFileSync(join(dir, 'hashed.py'), 'X = 3\n');
    writeFileSync(join(dir, 'target.py'), 'X = 4\n');
    symlinkSync('target.py', join(dir, 'linked.py'));
    for (const f of ['fresh', 'stale', 'linked']) execFileSync(python!, ['-m', 'py_compile', join(dir, `${f}.py`)]);
    execFileSync(python!, ['-c', `import py_compile; py_compile.compile(${JSON.stringify(join(dir, 'hashed.py'))}, invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)`]);
    // the source changed after its cache was written: the cache is stale already
    writeFileSync(join(dir, 'stale.py'), 'X = 22\n');
    utimesSync(join(dir, 'stale.py'), 1_700_000_000, 1_700_000_000);
    const cache = (m: string) => readdirSync(join(dir, '__pycache__')).find((n) => n.startsWith(`${m}.`))!;
    const hashedBefore = readFileSync(join(dir, '__pycache__', cache('hashed')));
    const staleBefore = readFileSync(join(dir, '__pycache__', cache('stale')));

    const r = alignPycTimestamps(dir, LAYER_EPOCH);
    t.is(r.aligned, 1, 'only the valid timestamp cache of a regular source');
    t.is(r.skipped, 3, 'the stale, the hash-based and the symlinked source');
    t.is(readFileSync(join(dir, '__pycache__', cache('fresh'))).readUInt32LE(8), LAYER_EPOCH);
    t.deepEqual(readFileSync(join(dir, '__pycache__', cache('hashed'))), hashedBefore);
    t.deepEqual(readFileSync(join(dir, '__pycache__', cache('stale'))), staleBefore);

    dateAll(dir, LAYER_EPOCH);
    t.is(importVerdict(dir, 'fresh'), 'used', 'Python takes the aligned cache');
    t.is(importVerdict(dir, 'stale'), 'stale', 'a stale cache stays stale: the source is compiled');
    t.is(importVerdict(dir, 'hashed'), 'used', 'hash-based caches never depended on mtimes');
    const run = execFileSync(python!, ['-B', '-c', 'import fresh, stale; print(fresh.X, stale.X)'], { cwd: dir, encoding: 'utf8', env: { PATH: '/usr/bin:/bin', PYTHONPATH: dir } });
    t.is(run, '1 22\n', 'the programs see their sources');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

it('junk under __pycache__ (short files, wrong magic, directories named like caches) is skipped, never written', (t) => {
  const dir = tempDir('warren-pyc-');
  try {
    mkdirSync(join(dir, '__pycache__', 'd.cpython-311.pyc'), { recursive: true });
    writeFileSync(join(dir, 'd.py'), '');
    writeFileSync(join(dir, 'short.py'), '');
    writeFileSync(join(dir, '__pycache__', 'short.cpython-311.pyc'), 'abc');
    writeFileSync(join(dir, 'magic.py'), '');
    const junk = Buffer.alloc(32, 0x41);
    writeFileSync(join(dir, '__pycache__', 'magic.cpython-311.pyc'), junk);
    writeFileSync(join(dir, '__pycache__', 'orphan.cpython-311.pyc'), junk);
    const r = alignPycTimestamps(dir, LAYER_EPOCH);
    t.is(r.aligned, 0);
    t.is(r.skipped, 4);
    t.deepEqual(readFileSync(join(dir, '__pycache__', 'magic.cpython-311.pyc')), junk);
    t.is(readFileSync(join(dir, '__pycache__', 'short.cpython-311.pyc'), 'utf8'), 'abc');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
