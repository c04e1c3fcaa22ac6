/** Scrub patterns: validation and expansion against a tree (no symlink following). */
import test from 'ava';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_SCRUB, expandPatterns, validateScrubPattern } from '../../src/shim/lifecycle/pack';

function tree(files: string[], links: Record<string, string> = {}): string {
  const root = mkdtempSync(join(tmpdir(), 'warren-scrub-'));
  for (const f of files) {
    const p = join(root, f);
    if (f.endsWith('/')) mkdirSync(p, { recursive: true });
    else {
      mkdirSync(join(p, '..'), { recursive: true });
      writeFileSync(p, 'x');
    }
  }
  for (const [l, target] of Object.entries(links)) symlinkSync(target, join(root, l));
  return root;
}

test('validateScrubPattern refuses relative, "..", "/" and partial "**"', (t) => {
  t.is(validateScrubPattern('/tmp//x/'), '/tmp/x');
  for (const bad of ['tmp', '/a/../b', '/', '/a/b**c', '']) t.throws(() => validateScrubPattern(bad));
});

test('expandPatterns: literals, * and ?, ** at any depth, parents cover children', (t) => {
  const root = tree([
    'root/.ash_history',
    'root/.cache/pip/w',
    'home/a/.cache/x',
    'home/b/.bash_history',
    'tmp/one',
    'tmp/dir/two',
    'srv/x/answers.txt',
    'srv/y/z/answers.txt',
    'srv/keep.txt',
    'etc/k1.key',
    'etc/k2.key',
    'etc/k10.key',
    'empty/',
  ], { 'link': '/etc' });
  try {
    t.deepEqual(expandPatterns(root, DEFAULT_SCRUB), ['/home/a/.cache', '/home/b/.bash_history', '/root/.ash_history', '/root/.cache', '/tmp/dir', '/tmp/one']);
    t.deepEqual(expandPatterns(root, ['/srv/**/answers.txt']), ['/srv/x/answers.txt', '/srv/y/z/answers.txt']);
    t.deepEqual(expandPatterns(root, ['/etc/k?.key']), ['/etc/k1.key', '/etc/k2.key']);
    t.deepEqual(expandPatterns(root, ['/srv/**']), ['/srv/keep.txt', '/srv/x', '/srv/y']);
    t.deepEqual(expandPatterns(root, ['/srv', '/srv/keep.txt']), ['/srv']);
    t.deepEqual(expandPatterns(root, ['/link/*.key']), [], 'symlinks are not followed');
    t.deepEqual(expandPatterns(root, ['/link']), ['/link'], 'the link itself can be scrubbed');
    t.deepEqual(expandPatterns(root, ['/nothing/*', '/empty/*']), []);
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
});

test('expandPatterns never descends through a symlink: a planted /var -> host dir matches nothing there', (t) => {
  const victim = tree(['tmp/precious', 'cache/apt/archives/x.deb', 'lists/y']);
  const root = tree(['root/'], { var: victim, home: victim, 'root/.cache': victim });
  try {
    const found = expandPatterns(root, [...DEFAULT_SCRUB, '/var/**', '/home/*/apt/archives/*']);
    // only the link itself may match (removing it removes the link), nothing beneath it
    t.deepEqual(found, ['/root/.cache']);
  } finally {
    rmSync(root, { recursive: true, force: true });
    rmSync(victim, { recursive: true, force: true });
  }
});
