import test from 'ava';
import { WarrenError } from '../../src/errors';
import { nameCandidates, parseName, parseRef } from '../../src/shim/layers/refs';

const valid = ['busybox', 'busybox:1.36', 'library/debian:bookworm', 'repo-x', 'py_tools', 'a.b', 'a__b', 'a--b', 'x/y/z:TAG_1.0-rc'];
const invalid = ['', '..', 'a/../b', '../x', '/abs', 'a//b', 'a/', 'Busybox', 'a\0b', 'a\nb', 'x'.repeat(256), 'a:', 'a:b:c', 'a:-x', 'sha256:abc', 'sha256:' + 'A'.repeat(64), 'a b', 'a..b', 'x:a..b', '.a', 'a.', 'host:5000/x'];

for (const ref of valid) {
  test(`valid reference ${JSON.stringify(ref)}`, (t) => {
    const r = parseRef(ref);
    t.is(r.type, 'name');
  });
}

for (const ref of invalid) {
  test(`invalid reference ${JSON.stringify(ref.slice(0, 40))}`, (t) => {
    const err = t.throws(() => parseRef(ref)) as unknown as WarrenError;
    t.is(err.code, 'INVALID_ARGUMENT');
  });
}

test('digests', (t) => {
  const d = 'sha256:' + 'a'.repeat(64);
  t.deepEqual(parseRef(d), { type: 'digest', digest: d });
  t.is((t.throws(() => parseName(d)) as unknown as WarrenError).code, 'INVALID_ARGUMENT');
  t.is((t.throws(() => parseRef(42)) as unknown as WarrenError).code, 'INVALID_ARGUMENT');
});

test('"x" and "x:latest" denote the same image', (t) => {
  t.deepEqual(nameCandidates(parseName('x')), ['x', 'x:latest']);
  t.deepEqual(nameCandidates(parseName('x:latest')), ['x:latest', 'x']);
  t.deepEqual(nameCandidates(parseName('x:1')), ['x:1']);
  t.deepEqual(nameCandidates(parseName('a/b')), ['a/b', 'a/b:latest']);
});
