import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { WarrenError } from '../../src/errors';
import { DEFAULT_URL, connection, describeError, main } from '../../src/cli/main';
import { formatTable, progressLine } from '../../src/cli/output';

function io(env: NodeJS.ProcessEnv = {}) {
  const out: string[] = [];
  const err: string[] = [];
  return { io: { out: (s: string) => void out.push(s), err: (s: string) => void err.push(s), env }, out, err };
}

test('connection: flags beat environment beat the token file', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-cli-'));
  try {
    writeFileSync(join(dir, 'admin.token'), 'wrn_fromfile\n');
    t.deepEqual(connection({ 'data-dir': dir }, {}), { url: DEFAULT_URL, token: 'wrn_fromfile' });
    t.deepEqual(connection({ 'data-dir': dir }, { WARREN_TOKEN: 'wrn_env', WARREN_URL: 'http://h:1' }), { url: 'http://h:1', token: 'wrn_env' });
    t.deepEqual(connection({ 'data-dir': dir, token: 'wrn_flag', url: 'http://f:2' }, { WARREN_TOKEN: 'wrn_env' }), { url: 'http://f:2', token: 'wrn_flag' });
    t.deepEqual(connection({}, { WARREN_DATA_DIR: dir }), { url: DEFAULT_URL, token: 'wrn_fromfile' });
    const e = t.throws(() => connection({ 'data-dir': join(dir, 'missing') }, {})) as WarrenError;
    t.is(e.code, 'UNAUTHENTICATED');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('usage errors exit 2 with a clear message', async (t) => {
  for (const argv of [['bogus'], ['constructor'], ['toString'], ['__proto__'], ['exec'], ['exec', 'id'], ['create', '--cpu', 'lots'], ['create', '--nope'], ['rm'], ['up', '--listen', 'nohostport'], ['create', '--label', 'novalue']]) {
    const r = io({ WARREN_URL: 'http://127.0.0.1:9' });
    t.is(await main(argv, r.io), 2, argv.join(' '));
    t.regex(r.err.join(''), /^warren: /);
  }
});

test('warren node: --pull-staged takes eager or on-demand, and only with --lazy-layers', async (t) => {
  const base = ['node', '--etcd', '127.0.0.1:9', '--cluster-credential', '/nonexistent'];
  const cases: Array<[string[], RegExp]> = [
    [[...base, '--lazy-layers', '--pull-staged', 'sometimes'], /--pull-staged must be eager or on-demand \(got "sometimes"\)/],
    [[...base, '--pull-staged', 'on-demand'], /--pull-staged needs --lazy-layers/],
  ];
  for (const [argv, message] of cases) {
    const r = io();
    t.is(await main(argv, r.io), 2, argv.join(' '));
    t.regex(r.err.join(''), message);
  }
});

test('no command prints usage and exits 2; help exits 0', async (t) => {
  const r = io();
  t.is(await main([], r.io), 2);
  t.regex(r.err.join(''), /usage: warren <command>/);
  const h = io();
  t.is(await main(['--help'], h.io), 0);
  t.regex(h.out.join(''), /exec ID .* -- CMD/);
});

test('version prints the package version', async (t) => {
  const r = io();
  t.is(await main(['version'], r.io), 0);
  t.regex(r.out.join(''), /^warren \d+\.\d+\.\d+/);
});

test('unreachable server: UNAVAILABLE and exit 1', async (t) => {
  const r = io({ WARREN_TOKEN: 'wrn_x' });
  t.is(await main(['ls', '--url', 'http://127.0.0.1:9'], r.io), 1);
  t.regex(r.err.join(''), /warren: UNAVAILABLE: cannot reach Warren/);
});

test('describeError shows the stable code', (t) => {
  t.is(describeError(new WarrenError('SANDBOX_NOT_FOUND', 'sandbox "x" not found')), 'SANDBOX_NOT_FOUND: sandbox "x" not found');
  t.is(describeError(new Error('plain')), 'plain');
});

test('tables and progress lines', (t) => {
  t.is(formatTable([{ A: 'x', B: 'long value' }, { A: 'yyyy', B: '' }], ['A', 'B']), 'A     B\nx     long value\nyyyy\n');
  t.is(progressLine({ phase: 'unpack', message: 'layer 1', fraction: 0.5 }, 10), '[#####.....]  50% unpack: layer 1');
  t.is(progressLine({ phase: 'fetch', message: 'debootstrap' }), 'fetch: debootstrap');
  t.is(progressLine({ phase: 'x', message: 'y', fraction: 2 }, 4), '[####] 100% x: y');
});
