import test from 'ava';
import { WarrenError, type ErrorCode } from '../../src/errors';
import {
  LIMITS,
  parseFileMode,
  parseIntParam,
  parseLabelFilter,
  parseSignal,
  validateAccountRequest,
  validateCmd,
  validateCommandId,
  validateExecRequest,
  validateHostPath,
  validateImageRef,
  validateImageRequest,
  validateSandboxId,
  validateSandboxPath,
  validateSessionId,
  validateShellQuery,
} from '../../src/validation';

function code(t: import('ava').ExecutionContext, fn: () => unknown, expected: ErrorCode, field?: string): WarrenError {
  const err = t.throws(fn) as WarrenError;
  t.true(err instanceof WarrenError, `expected a WarrenError, got ${String(err)}`);
  t.is(err.code, expected, err.message);
  if (field !== undefined) t.is(err.details?.field, field, err.message);
  return err;
}

// ---------------------------------------------------------------- ids

test('sandbox ids', (t) => {
  for (const id of ['a', 'n1a2b3-0011223344556677', '0', 'x'.repeat(63)]) t.is(validateSandboxId(id), id);
  for (const id of ['', '..', '../etc', 'a/b', 'a\0b', 'A', '-a', 'a_b', 'a.b', 'x'.repeat(64), ' a', 'a%2f', undefined, 5, null]) {
    code(t, () => validateSandboxId(id), 'INVALID_ID');
  }
  const e = code(t, () => validateSandboxId('a/..'), 'INVALID_ID');
  t.is(e.status, 400);
});

test('session ids', (t) => {
  for (const id of ['s-abcdefghijklmnop', 's-1f00f5d37865', 'S1']) t.is(validateSessionId(id), id);
  for (const id of ['', '..', 's-../x', 'a/b', 's\0', '-s', 's.1', 'x'.repeat(129)]) code(t, () => validateSessionId(id), 'INVALID_ID');
});

test('image refs', (t) => {
  t.is(validateImageRef('sha256:' + '0'.repeat(64)), 'sha256:' + '0'.repeat(64));
  for (const ref of ['..', 'a/..', 'a\0', 'a:b:c', 'a:../b', 'A']) code(t, () => validateImageRef(ref), 'INVALID_ID');
});

test('command ids: strings and non-negative integers', (t) => {
  t.is(validateCommandId('c1'), 'c1');
  t.is(validateCommandId(7), '7');
  t.is(validateCommandId('a:b.c_d-e'), 'a:b.c_d-e');
  for (const id of ['', '..', 'a/b', 'a b', -1, 1.5, null, undefined, 'x'.repeat(129), 'a\0']) code(t, () => validateCommandId(id), 'INVALID_ID');
});

// ---------------------------------------------------------------- paths

test('sandbox paths are normalised', (t) => {
  t.is(validateSandboxPath('/'), '/');
  t.is(validateSandboxPath('//a//b/'), '/a/b');
  t.is(validateSandboxPath('/a/./b/.'), '/a/b');
  t.is(validateSandboxPath('/tmp/x y/ü'), '/tmp/x y/ü');
  t.is(validateSandboxPath('/a..b/c..'), '/a..b/c..');
});

test('sandbox paths: relative, .., NUL are PATH_ESCAPE', (t) => {
  for (const p of ['relative', './x', '../x', '/..', '/a/../b', '/a/..', '/a/b/../../..', '/a\0b', '\0', 'a/b']) {
    code(t, () => validateSandboxPath(p), 'PATH_ESCAPE', 'path');
  }
  code(t, () => validateSandboxPath('/' + 'a'.repeat(256)), 'PATH_ESCAPE');
  code(t, () => validateSandboxPath('/a'.repeat(LIMITS.pathBytes)), 'PATH_ESCAPE');
  code(t, () => validateSandboxPath(''), 'INVALID_ARGUMENT');
  code(t, () => validateSandboxPath(undefined), 'INVALID_ARGUMENT');
  code(t, () => validateSandboxPath(42), 'INVALID_ARGUMENT');
  code(t, () => validateSandboxPath('x/../y', 'cwd'), 'PATH_ESCAPE', 'cwd');
});

test('host paths (image sources)', (t) => {
  t.is(validateHostPath('/srv/rootfs', 'source.path'), '/srv/rootfs');
  for (const p of ['rel', '/a/../b', '/a\0']) code(t, () => validateHostPath(p, 'source.path'), 'PATH_ESCAPE', 'source.path');
});

// ---------------------------------------------------------------- exec

test('exec: minimal and full requests', (t) => {
  t.deepEqual(validateExecRequest({ cmd: 'echo hi' }), { cmd: 'echo hi', maxOutputBytes: LIMITS.maxOutputBytes.default });
  const r = validateExecRequest({ cmd: ['ls', '-la', ''], stdin: 'in\0put', env: { A: '1' }, cwd: '/tmp//x/', timeoutMs: 1000, user: 'nobody', maxOutputBytes: 100 });
  t.deepEqual(r.cmd, ['ls', '-la', '']);
  t.is(r.cwd, '/tmp/x');
  t.is(r.stdin, 'in\0put');
  t.is(r.maxOutputBytes, 100);
});

test('exec: errors', (t) => {
  code(t, () => validateExecRequest({}), 'INVALID_ARGUMENT', 'cmd');
  code(t, () => validateExecRequest(null), 'INVALID_ARGUMENT');
  code(t, () => validateExecRequest({ cmd: 'x', shell: true }), 'UNKNOWN_FIELD', 'shell');
  code(t, () => validateExecRequest({ cmd: 5 }), 'INVALID_ARGUMENT', 'cmd');
  code(t, () => validateExecRequest({ cmd: [] }), 'INVALID_ARGUMENT', 'cmd');
  code(t, () => validateExecRequest({ cmd: [''] }), 'INVALID_ARGUMENT', 'cmd[0]');
  code(t, () => validateExecRequest({ cmd: ['ls', 3] }), 'INVALID_ARGUMENT', 'cmd[1]');
  code(t, () => validateExecRequest({ cmd: ['ls', 'a\0'] }), 'INVALID_ARGUMENT', 'cmd[1]');
  code(t, () => validateExecRequest({ cmd: 'a\0b' }), 'INVALID_ARGUMENT', 'cmd');
  code(t, () => validateExecRequest({ cmd: '' }), 'INVALID_ARGUMENT', 'cmd');
  code(t, () => validateExecRequest({ cmd: 'x'.repeat(LIMITS.cmdBytes + 1) }), 'LIMIT_OUT_OF_RANGE', 'cmd');
  code(t, () => validateExecRequest({ cmd: 'x', cwd: '../x' }), 'PATH_ESCAPE', 'cwd');
  code(t, () => validateExecRequest({ cmd: 'x', stdin: 5 }), 'INVALID_ARGUMENT', 'stdin');
  code(t, () => validateExecRequest({ cmd: 'x', env: { 'BAD-NAME': '1' } }), 'INVALID_ARGUMENT');
  for (const timeoutMs of [0, -1, 1.5, NaN, Infinity, 3_600_001, 2 ** 64]) code(t, () => validateExecRequest({ cmd: 'x', timeoutMs }), 'LIMIT_OUT_OF_RANGE', 'timeoutMs');
  code(t, () => validateExecRequest({ cmd: 'x', timeoutMs: '100' }), 'INVALID_ARGUMENT', 'timeoutMs');
  for (const maxOutputBytes of [0, -5, LIMITS.maxOutputBytes.max + 1, 0.5]) {
    code(t, () => validateExecRequest({ cmd: 'x', maxOutputBytes }), 'LIMIT_OUT_OF_RANGE', 'maxOutputBytes');
  }
  t.is(validateExecRequest({ cmd: 'x', timeoutMs: 3_600_000 }).timeoutMs, 3_600_000);
  t.is(validateExecRequest({ cmd: 'x', timeoutMs: 1 }).timeoutMs, 1);
});

test('validateCmd argv size bound', (t) => {
  code(t, () => validateCmd(Array.from({ length: LIMITS.argvEntries + 1 }, () => 'a')), 'LIMIT_OUT_OF_RANGE', 'cmd');
  code(t, () => validateCmd(['a', 'x'.repeat(LIMITS.cmdBytes)]), 'LIMIT_OUT_OF_RANGE', 'cmd');
});

// ---------------------------------------------------------------- query values

test('file modes are octal permission bits', (t) => {
  t.is(parseFileMode(undefined), undefined);
  t.is(parseFileMode('644'), 0o644);
  t.is(parseFileMode('0755'), 0o755);
  t.is(parseFileMode('7777'), 0o7777);
  code(t, () => parseFileMode('rwx'), 'INVALID_ARGUMENT', 'mode');
  code(t, () => parseFileMode('888'), 'INVALID_ARGUMENT', 'mode');
  code(t, () => parseFileMode('-1'), 'INVALID_ARGUMENT', 'mode');
  code(t, () => parseFileMode('17777'), 'LIMIT_OUT_OF_RANGE', 'mode');
});

test('integer query parameters', (t) => {
  t.is(parseIntParam(undefined, 'offset', 0, 10), undefined);
  t.is(parseIntParam('5', 'offset', 0, 10), 5);
  code(t, () => parseIntParam('abc', 'offset', 0, 10), 'INVALID_ARGUMENT', 'offset');
  code(t, () => parseIntParam('11', 'offset', 0, 10), 'LIMIT_OUT_OF_RANGE', 'offset');
  code(t, () => parseIntParam('-1', 'offset', 0, 10), 'LIMIT_OUT_OF_RANGE', 'offset');
  code(t, () => parseIntParam('1.5', 'offset', 0, 10), 'LIMIT_OUT_OF_RANGE', 'offset');
  code(t, () => parseIntParam('1e30', 'offset', 0, Number.MAX_SAFE_INTEGER), 'LIMIT_OUT_OF_RANGE', 'offset');
  code(t, () => parseIntParam('18446744073709551616', 'offset', 0, Number.MAX_SAFE_INTEGER), 'LIMIT_OUT_OF_RANGE', 'offset');
});

test('label filters', (t) => {
  t.is(parseLabelFilter([]), undefined);
  t.deepEqual(parseLabelFilter(['a=b', 'c=d=e', 'e=']), { a: 'b', c: 'd=e', e: '' });
  code(t, () => parseLabelFilter(['nokey']), 'INVALID_ARGUMENT', 'label');
  code(t, () => parseLabelFilter(['=v']), 'INVALID_ARGUMENT', 'label');
  code(t, () => parseLabelFilter(['a b=c']), 'INVALID_ARGUMENT');
});

test('shell query', (t) => {
  t.deepEqual(validateShellQuery(new URLSearchParams('')), { mode: 'command' });
  t.deepEqual(validateShellQuery(new URLSearchParams('mode=pty&cols=80&rows=24')), { mode: 'pty', cols: 80, rows: 24 });
  t.deepEqual(validateShellQuery(new URLSearchParams('session=s-abc&offset=100')), { mode: 'command', session: 's-abc', offset: 100 });
  code(t, () => validateShellQuery(new URLSearchParams('mode=bash')), 'INVALID_ARGUMENT', 'mode');
  code(t, () => validateShellQuery(new URLSearchParams('session=../x')), 'INVALID_ID');
  code(t, () => validateShellQuery(new URLSearchParams('offset=5')), 'INVALID_ARGUMENT', 'offset');
  code(t, () => validateShellQuery(new URLSearchParams('session=s-a&offset=-1')), 'LIMIT_OUT_OF_RANGE', 'offset');
  code(t, () => validateShellQuery(new URLSearchParams('cols=0')), 'LIMIT_OUT_OF_RANGE', 'cols');
  code(t, () => validateShellQuery(new URLSearchParams('rows=100000')), 'LIMIT_OUT_OF_RANGE', 'rows');
  code(t, () => validateShellQuery(new URLSearchParams('token=abc')), 'UNKNOWN_FIELD', 'token');
});

test('signals', (t) => {
  t.is(parseSignal('INT'), 2);
  t.is(parseSignal('SIGTERM'), 15);
  t.is(parseSignal('kill'), 9);
  t.is(parseSignal(2), 2);
  for (const s of ['NOPE', 'constructor', '__proto__', 0, 65, 1.5, null]) code(t, () => parseSignal(s), 'INVALID_ARGUMENT', 'signal');
});

// ---------------------------------------------------------------- images, accounts

test('image requests', (t) => {
  t.deepEqual(validateImageRequest({ name: 'bb', source: { type: 'directory', path: '/srv/bb' } }), { name: 'bb', source: { type: 'directory', path: '/srv/bb' } });
  t.deepEqual(validateImageRequest({ name: 'deb', kind: 'base', source: { type: 'debootstrap', suite: 'bookworm', include: ['python3', 'g++'] } }), {
    name: 'deb',
    kind: 'base',
    source: { type: 'debootstrap', suite: 'bookworm', include: ['python3', 'g++'] },
  });
  code(t, () => validateImageRequest({ source: { type: 'debootstrap' } }), 'INVALID_ARGUMENT', 'name');
  code(t, () => validateImageRequest({ name: '../x', source: { type: 'debootstrap' } }), 'INVALID_ID');
  code(t, () => validateImageRequest({ name: 'sha256:abc', source: { type: 'debootstrap' } }), 'INVALID_ARGUMENT', 'name');
  code(t, () => validateImageRequest({ name: 'x' }), 'INVALID_ARGUMENT', 'source');
  code(t, () => validateImageRequest({ name: 'x', source: { type: 'http' } }), 'INVALID_ARGUMENT', 'source.type');
  code(t, () => validateImageRequest({ name: 'x', source: { type: 'directory', path: 'rel' } }), 'PATH_ESCAPE', 'source.path');
  code(t, () => validateImageRequest({ name: 'x', source: { type: 'directory', path: '/a', suite: 'x' } }), 'UNKNOWN_FIELD', 'source.suite');
  code(t, () => validateImageRequest({ name: 'x', source: { type: 'debootstrap', include: ['bad pkg'] } }), 'INVALID_ARGUMENT', 'source.include[0]');
  code(t, () => validateImageRequest({ name: 'x', source: { type: 'debootstrap', suite: '../sid' } }), 'INVALID_ARGUMENT', 'source.suite');
  code(t, () => validateImageRequest({ name: 'x', kind: 'other', source: { type: 'debootstrap' } }), 'INVALID_ARGUMENT', 'kind');
  code(t, () => validateImageRequest({ name: 'x', source: { type: 'debootstrap' }, extra: 1 }), 'UNKNOWN_FIELD', 'extra');
});

test('account requests', (t) => {
  t.deepEqual(validateAccountRequest({ name: 'alice', role: 'builder' }), { name: 'alice', role: 'builder' });
  t.deepEqual(validateAccountRequest({ name: 'bot@ci' }), { name: 'bot@ci', role: 'runtime' });
  code(t, () => validateAccountRequest({ name: 'x', role: 'root' }), 'INVALID_ARGUMENT', 'role');
  code(t, () => validateAccountRequest({ name: '' }), 'INVALID_ARGUMENT', 'name');
  code(t, () => validateAccountRequest({ name: 'a b' }), 'INVALID_ARGUMENT', 'name');
  code(t, () => validateAccountRequest({ name: 'x', id: 'y' }), 'UNKNOWN_FIELD', 'id');
});
