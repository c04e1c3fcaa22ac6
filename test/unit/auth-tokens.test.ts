import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { openDatabase } from '../../src/state/db';
import { WarrenError } from '../../src/errors';
import {
  ADMIN_TOKEN_FILE,
  Auth,
  TOKEN_RE,
  bearerFromHeader,
  bearerFromSubprotocols,
  can,
  generateToken,
  hashToken,
  hashesEqual,
  initAuth,
  requirePermission,
} from '../../src/gateway/auth';

function freshDb() {
  return openDatabase(':memory:');
}

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'warren-auth-'));
}

test('tokens are wrn_ + 32 random bytes in base64url', (t) => {
  const a = generateToken();
  const b = generateToken();
  t.regex(a, TOKEN_RE);
  t.is(a.length, 4 + 43);
  t.is(Buffer.from(a.slice(4), 'base64url').length, 32);
  t.not(a, b);
});

test('tokens are stored as sha256 only', (t) => {
  const db = freshDb();
  const auth = new Auth(db);
  const { token, account } = auth.createAccount('alice', 'runtime');
  const rows = db.prepare('SELECT hash, account_id FROM auth_tokens').all() as { hash: Buffer; account_id: string }[];
  t.is(rows.length, 1);
  t.deepEqual(rows[0]!.hash, hashToken(token));
  t.is(rows[0]!.hash.length, 32);
  t.is(rows[0]!.account_id, account.id);
  const dump = JSON.stringify(db.prepare('SELECT * FROM auth_accounts').all()) + rows.map((r) => r.hash.toString('latin1')).join('');
  t.false(dump.includes(token));
  t.false(dump.includes(token.slice(4)));
});

test('authenticate: right token, wrong token, malformed, empty', (t) => {
  const auth = new Auth(freshDb());
  const { token, account } = auth.createAccount('alice', 'builder');
  t.deepEqual(auth.authenticate(token), account);
  t.is(auth.authenticate(generateToken()), null);
  t.is(auth.authenticate(token.slice(0, -1) + (token.endsWith('A') ? 'B' : 'A')), null);
  t.is(auth.authenticate(token + 'x'), null);
  t.is(auth.authenticate('Bearer ' + token), null);
  t.is(auth.authenticate(''), null);
  t.is(auth.authenticate(undefined), null);
  t.is(auth.authenticate(`wrn_${'a'.repeat(42)}\0`), null);
});

test('require throws UNAUTHENTICATED (401) for missing and bad tokens', (t) => {
  const auth = new Auth(freshDb());
  for (const token of [undefined, '', 'nope', generateToken()]) {
    const err = t.throws(() => auth.require(token)) as WarrenError;
    t.true(err instanceof WarrenError);
    t.is(err.code, 'UNAUTHENTICATED');
    t.is(err.status, 401);
  }
});

test('revoked tokens no longer authenticate', (t) => {
  const db = freshDb();
  const auth = new Auth(db);
  const { token } = auth.createAccount('bob', 'runtime');
  db.prepare('UPDATE auth_tokens SET revoked_at = ?').run(new Date().toISOString());
  t.is(auth.authenticate(token), null);
});

test('hashesEqual is a length-checked constant-time compare', (t) => {
  const h = hashToken('x');
  t.true(hashesEqual(h, hashToken('x')));
  t.false(hashesEqual(h, hashToken('y')));
  t.false(hashesEqual(h, h.subarray(0, 31)));
});

test('initAuth is idempotent and shares the database', (t) => {
  const db = freshDb();
  initAuth(db);
  initAuth(db);
  db.exec('CREATE TABLE other (x)');
  const a1 = new Auth(db);
  const { token } = a1.createAccount('c', 'runtime');
  t.truthy(new Auth(db).authenticate(token));
});

test('roles: admin, builder, runtime', (t) => {
  const admin = { role: 'admin' as const };
  const builder = { role: 'builder' as const };
  const runtime = { role: 'runtime' as const };
  t.true(can(admin, 'accounts'));
  t.true(can(admin, 'allSandboxes'));
  t.true(can(admin, 'importHostPaths'));
  t.false(can(builder, 'accounts'));
  t.false(can(builder, 'allSandboxes'));
  t.true(can(builder, 'buildImages'));
  t.false(can(builder, 'importHostPaths'));
  t.false(can(runtime, 'buildImages'));
  t.true(can(runtime, 'sandboxes'));
  const err = t.throws(() => requirePermission(runtime, 'accounts')) as WarrenError;
  t.is(err.code, 'FORBIDDEN');
  t.is(err.status, 403);
  t.notThrows(() => requirePermission(admin, 'accounts'));
});

test('role column refuses unknown roles', (t) => {
  const db = freshDb();
  initAuth(db);
  let code: unknown;
  try {
    db.prepare("INSERT INTO auth_accounts (id, name, role, created_at) VALUES ('x', 'x', 'root', 'now')").run();
  } catch (err) {
    code = (err as { code?: unknown }).code;
  }
  t.is(code, 'SQLITE_CONSTRAINT_CHECK');
});

test('first start: admin token written 0600 and returned once; later starts return null', (t) => {
  const dir = tempDir();
  const oldUmask = process.umask(0o000); // even a permissive umask must not widen the file
  try {
    const db = freshDb();
    const first = new Auth(db).ensureAdminToken(dir);
    t.truthy(first);
    t.regex(first!, TOKEN_RE);
    const file = join(dir, ADMIN_TOKEN_FILE);
    t.is(statSync(file).mode & 0o777, 0o600);
    t.is(readFileSync(file, 'utf8').trim(), first!);
    const auth = new Auth(db);
    t.is(auth.authenticate(first)?.role, 'admin');
    // second and third starts: nothing to print, file unchanged
    t.is(new Auth(db).ensureAdminToken(dir), null);
    t.is(new Auth(db).ensureAdminToken(dir), null);
    t.is(readFileSync(file, 'utf8').trim(), first!);
    t.is(auth.listAccounts().filter((a) => a.role === 'admin').length, 1);
  } finally {
    process.umask(oldUmask);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a stale admin.token without a matching admin account is replaced, with a fresh 0600 file', (t) => {
  const dir = tempDir();
  try {
    const file = join(dir, ADMIN_TOKEN_FILE);
    writeFileSync(file, 'wrn_stale\n', { mode: 0o644 });
    const token = new Auth(freshDb()).ensureAdminToken(dir);
    t.truthy(token);
    t.is(statSync(file).mode & 0o777, 0o600);
    t.is(readFileSync(file, 'utf8').trim(), token!);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the admin token survives a restart on the same database file', (t) => {
  const dir = tempDir();
  try {
    const path = join(dir, 'warren.db');
    const db1 = openDatabase(path);
    const token = new Auth(db1).ensureAdminToken(dir);
    db1.close();
    const db2 = openDatabase(path);
    t.is(new Auth(db2).ensureAdminToken(dir), null);
    t.is(new Auth(db2).authenticate(token)?.role, 'admin');
    db2.close();
    t.true(existsSync(join(dir, ADMIN_TOKEN_FILE)));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('Authorization header parsing', (t) => {
  t.is(bearerFromHeader(undefined), undefined);
  t.is(bearerFromHeader('Bearer abc'), 'abc');
  t.is(bearerFromHeader('bearer   abc'), 'abc');
  t.is(bearerFromHeader('Basic abc'), '');
  t.is(bearerFromHeader('Bearer'), '');
  t.is(bearerFromHeader('Bearer a b'), '');
});

test('WebSocket subprotocol auth parsing', (t) => {
  t.deepEqual(bearerFromSubprotocols(undefined), { token: undefined, offered: false });
  t.deepEqual(bearerFromSubprotocols('warren.v1, bearer.wrn_abc'), { token: 'wrn_abc', offered: true });
  t.deepEqual(bearerFromSubprotocols('bearer.wrn_abc,warren.v1'), { token: 'wrn_abc', offered: true });
  t.deepEqual(bearerFromSubprotocols('chat'), { token: undefined, offered: false });
  t.deepEqual(bearerFromSubprotocols('bearer.x'), { token: 'x', offered: false });
});
