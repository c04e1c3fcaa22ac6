/**
 * Accounts, roles and bearer tokens.
 *
 * Tokens are `wrn_` + 32 random bytes in base64url. Only their SHA-256 is
 * stored (table `auth_tokens`); a presented token is hashed, looked up by hash
 * and compared with timingSafeEqual. The first start creates an admin account
 * and writes its token to `<dataDir>/admin.token` (created 0600, never
 * chmod-ed afterwards); the token is handed back once so the caller can print
 * it, and never again on later starts.
 */
import { createHash, randomBytes, randomUUID, timingSafeEqual } from 'node:crypto';
import { closeSync, openSync, unlinkSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import type { Principal } from '../shim/types';
import type { Database } from '../state/db';
import { WarrenError } from '../errors';
import type { Role } from '../validation';

export type { Role } from '../validation';

export interface Account {
  id: string;
  name: string;
  role: Role;
  createdAt: string;
}

export const TOKEN_PREFIX = 'wrn_';
/** `wrn_` + base64url of 32 bytes (43 characters, no padding). */
export const TOKEN_RE = /^wrn_[A-Za-z0-9_-]{43}$/;
export const ADMIN_TOKEN_FILE = 'admin.token';

export function generateToken(): string {
  return TOKEN_PREFIX + randomBytes(32).toString('base64url');
}

export function hashToken(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest();
}

/** Constant-time equality of two hashes (false on length mismatch). */
export function hashesEqual(a: Buffer, b: Buffer): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

/** What each role may do beyond its own sandboxes. */
export const PERMISSIONS = {
  /** see and touch every account's sandboxes */
  allSandboxes: ['admin'],
  /** manage accounts */
  accounts: ['admin'],
  /** read and apply the security policy */
  policy: ['admin'],
  /** import or build images */
  buildImages: ['admin', 'builder'],
  /** import images from paths on the host (reads host files) */
  importHostPaths: ['admin'],
  /** create sandboxes, exec, files, shells on own sandboxes */
  sandboxes: ['admin', 'builder', 'runtime'],
  /** pack_diff a sandbox into a new environment */
  packEnvironments: ['admin', 'builder'],
  /** publish environments (make them usable by runtime accounts) */
  publishEnvironments: ['admin', 'builder'],
  /** create sandboxes from environments that are not published (own ones; admins: all) */
  unpublishedEnvironments: ['admin', 'builder'],
  /** set account quotas */
  quotas: ['admin'],
} as const satisfies Record<string, readonly Role[]>;

export type Permission = keyof typeof PERMISSIONS;

export function can(account: Pick<Account, 'role'>, permission: Permission): boolean {
  return (PERMISSIONS[permission] as readonly Role[]).includes(account.role);
}

/** The shim's view of an account for content checks (src/shim/access.ts). */
export function principalOf(account: Pick<Account, 'id' | 'role'>): Principal {
  return { account: account.id, unpublished: can(account, 'allSandboxes') ? 'all' : can(account, 'unpublishedEnvironments') ? 'own' : 'none' };
}

export function requirePermission(account: Pick<Account, 'role'>, permission: Permission): void {
  if (!can(account, permission)) {
    throw new WarrenError('FORBIDDEN', `role "${account.role}" may not do this (needs one of: ${PERMISSIONS[permission].join(', ')})`, { permission });
  }
}

interface AccountRow {
  id: string;
  name: string;
  role: Role;
  created_at: string;
}

interface TokenRow extends AccountRow {
  hash: Buffer;
}

/** Per-account limits on what it may hold at once; null = unlimited. */
export interface Quota {
  maxSandboxes: number | null;
  maxCpu: number | null;
  maxMemoryMb: number | null;
}

export const UNLIMITED: Quota = { maxSandboxes: null, maxCpu: null, maxMemoryMb: null };

/** What an account holds now (live sandboxes: running, paused, hibernated, being created). */
export interface Usage {
  sandboxes: number;
  cpu: number;
  memoryMb: number;
}

/**
 * Refuse (429 QUOTA_EXCEEDED, with the quota, the usage and the request in
 * details) when adding `request` to `usage` would pass a limit of `quota`.
 */
export function checkQuota(quota: Quota, usage: Usage, request: { cpu: number; memoryMb: number }): void {
  const fail = (what: string, limit: number, used: number, asked: number) =>
    new WarrenError('QUOTA_EXCEEDED', `account quota exceeded: ${what} (limit ${limit}, in use ${used}, requested ${asked})`, { quota: what, limit, used, requested: asked });
  if (quota.maxSandboxes !== null && usage.sandboxes + 1 > quota.maxSandboxes) throw fail('maxSandboxes', quota.maxSandboxes, usage.sandboxes, 1);
  if (quota.maxCpu !== null && usage.cpu + request.cpu > quota.maxCpu + 1e-9) throw fail('maxCpu', quota.maxCpu, usage.cpu, request.cpu);
  if (quota.maxMemoryMb !== null && usage.memoryMb + request.memoryMb > quota.maxMemoryMb) throw fail('maxMemoryMb', quota.maxMemoryMb, usage.memoryMb, request.memoryMb);
}

/**
 * Who may call, and with what quota: the gateway's whole view of accounts.
 * One node keeps them in its SQLite database ({@link Auth}, through
 * {@link localAccounts}); a cluster keeps them in etcd (ClusterAccounts), where
 * a lookup may be a read over the network, hence every method is async.
 */
export interface Accounts {
  /** The account a bearer token belongs to, or null. */
  authenticate(token: string | undefined | null): Promise<Account | null>;
  /** Like authenticate, but throws UNAUTHENTICATED. */
  require(token: string | undefined | null): Promise<Account>;
  /** The quota to admit against now (in a cluster a quorum read, so it is also the check that etcd answers). */
  quota(accountId: string, fallback?: Quota): Promise<Quota>;
  /** Merge `patch` into an account's quota; NOT_FOUND for unknown accounts. */
  setQuota(accountId: string, patch: Partial<Quota>, fallback?: Quota): Promise<Quota>;
  createAccount(name: string, role: Role): Promise<{ account: Account; token: string }>;
  listAccounts(): Promise<Account[]>;
}

/** The {@link Accounts} of one node: its SQLite tables. */
export function localAccounts(auth: Auth): Accounts {
  return {
    authenticate: async (token) => auth.authenticate(token),
    require: async (token) => auth.require(token),
    quota: async (id, fallback) => auth.quota(id, fallback),
    setQuota: async (id, patch, fallback) => auth.setQuota(id, patch, fallback),
    createAccount: async (name, role) => auth.createAccount(name, role),
    listAccounts: async () => auth.listAccounts(),
  };
}

export class Auth {
  private readonly byHash;
  private readonly insertAccount;
  private readonly insertToken;
  private readonly countAdmins;
  private readonly listStmt;
  private readonly quotaStmt;

  constructor(private readonly db: Database) {
    initAuth(db);
    this.byHash = db.prepare(
      `SELECT t.hash AS hash, a.id AS id, a.name AS name, a.role AS role, a.created_at AS created_at
         FROM auth_tokens t JOIN auth_accounts a ON a.id = t.account_id
        WHERE t.hash = ? AND t.revoked_at IS NULL`,
    );
    this.insertAccount = db.prepare('INSERT INTO auth_accounts (id, name, role, created_at) VALUES (?, ?, ?, ?)');
    this.insertToken = db.prepare('INSERT INTO auth_tokens (hash, account_id, created_at) VALUES (?, ?, ?)');
    this.countAdmins = db.prepare(
      `SELECT count(*) AS n FROM auth_accounts a JOIN auth_tokens t ON t.account_id = a.id
        WHERE a.role = 'admin' AND t.revoked_at IS NULL`,
    );
    this.listStmt = db.prepare('SELECT id, name, role, created_at FROM auth_accounts ORDER BY created_at, id');
    // read by every create
    this.quotaStmt = db.prepare('SELECT max_sandboxes, max_cpu, max_memory_mb FROM auth_quotas WHERE account_id = ?');
  }

  /** The account's quota: its own row, else `fallback` (the gateway's default). */
  quota(accountId: string, fallback: Quota = UNLIMITED): Quota {
    const row = this.quotaStmt.get(accountId) as
      | { max_sandboxes: number | null; max_cpu: number | null; max_memory_mb: number | null }
      | undefined;
    if (row === undefined) return fallback;
    return { maxSandboxes: row.max_sandboxes, maxCpu: row.max_cpu, maxMemoryMb: row.max_memory_mb };
  }

  /** Set (merge) an account's quota. Throws NOT_FOUND for unknown accounts. */
  setQuota(accountId: string, patch: Partial<Quota>, fallback: Quota = UNLIMITED): Quota {
    if (!this.db.prepare('SELECT 1 FROM auth_accounts WHERE id = ?').get(accountId)) throw new WarrenError('NOT_FOUND', `no account ${accountId}`);
    const q = { ...this.quota(accountId, fallback), ...patch };
    this.db
      .prepare(
        `INSERT INTO auth_quotas (account_id, max_sandboxes, max_cpu, max_memory_mb) VALUES (?, ?, ?, ?)
         ON CONFLICT(account_id) DO UPDATE SET max_sandboxes = excluded.max_sandboxes, max_cpu = excluded.max_cpu, max_memory_mb = excluded.max_memory_mb`,
      )
      .run(accountId, q.maxSandboxes, q.maxCpu, q.maxMemoryMb);
    return q;
  }

  /** The account a bearer token belongs to, or null. */
  authenticate(token: string | undefined | null): Account | null {
    if (typeof token !== 'string' || !TOKEN_RE.test(token)) return null;
    const hash = hashToken(token);
    const row = this.byHash.get(hash) as TokenRow | undefined;
    if (row === undefined || !hashesEqual(row.hash, hash)) return null;
    return { id: row.id, name: row.name, role: row.role, createdAt: row.created_at };
  }

  /** Like authenticate, but throws UNAUTHENTICATED. */
  require(token: string | undefined | null): Account {
    if (token === undefined || token === null || token === '') {
      throw new WarrenError('UNAUTHENTICATED', 'missing bearer token (Authorization: Bearer <token>)');
    }
    const account = this.authenticate(token);
    if (account === null) throw new WarrenError('UNAUTHENTICATED', 'invalid or revoked token');
    return account;
  }

  createAccount(name: string, role: Role): { account: Account; token: string } {
    const account: Account = { id: `acct-${randomUUID().replace(/-/g, '').slice(0, 16)}`, name, role, createdAt: new Date().toISOString() };
    const token = generateToken();
    this.db.transaction(() => {
      this.insertAccount.run(account.id, account.name, account.role, account.createdAt);
      this.insertToken.run(hashToken(token), account.id, account.createdAt);
    })();
    return { account, token };
  }

  listAccounts(): Account[] {
    return (this.listStmt.all() as AccountRow[]).map((r) => ({ id: r.id, name: r.name, role: r.role, createdAt: r.created_at }));
  }

  hasAdmin(): boolean {
    return (this.countAdmins.get() as { n: number }).n > 0;
  }

  /**
   * First start: create the admin account, write its token to
   * `<dataDir>/admin.token` (mode 0600 at creation) and return the token so the
   * caller can print it once. Later starts return null.
   */
  ensureAdminToken(dataDir: string): string | null {
    if (this.hasAdmin()) return null;
    const file = join(dataDir, ADMIN_TOKEN_FILE);
    // A token file without a matching admin in the database is stale (the
    // database was reset): replace it rather than trust it.
    try {
      unlinkSync(file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    const { token } = this.createAccount('admin', 'admin');
    const fd = openSync(file, 'wx', 0o600);
    try {
      writeSync(fd, `${token}\n`);
    } finally {
      closeSync(fd);
    }
    return token;
  }
}

/** Create the auth tables on the shared database (idempotent). */
export function initAuth(db: Database): void {
  db.exec(`
    CREATE TABLE IF NOT EXISTS auth_accounts (
      id TEXT PRIMARY KEY,
      name TEXT NOT NULL,
      role TEXT NOT NULL CHECK (role IN ('admin', 'builder', 'runtime')),
      created_at TEXT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS auth_tokens (
      hash BLOB PRIMARY KEY,
      account_id TEXT NOT NULL REFERENCES auth_accounts(id) ON DELETE CASCADE,
      created_at TEXT NOT NULL,
      last_used_at TEXT,
      revoked_at TEXT
    );
    CREATE TABLE IF NOT EXISTS auth_quotas (
      account_id TEXT PRIMARY KEY REFERENCES auth_accounts(id) ON DELETE CASCADE,
      max_sandboxes INTEGER,
      max_cpu REAL,
      max_memory_mb INTEGER
    );
  `);
}

/** The token from an `Authorization: Bearer <token>` header, or undefined. */
export function bearerFromHeader(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const m = /^Bearer[ ]+(\S+)\s*$/i.exec(header);
  return m === null ? '' : m[1];
}

/**
 * Browser WebSocket auth: `Sec-WebSocket-Protocol: warren.v1, bearer.<token>`.
 * Returns the token and whether `warren.v1` was offered (the server then
 * selects exactly that subprotocol, never echoing the token).
 */
export function bearerFromSubprotocols(header: string | undefined): { token: string | undefined; offered: boolean } {
  if (header === undefined || header === '') return { token: undefined, offered: false };
  let token: string | undefined;
  let offered = false;
  for (const raw of header.split(',')) {
    const p = raw.trim();
    if (p === 'warren.v1') offered = true;
    else if (p.startsWith('bearer.')) token = p.slice('bearer.'.length);
  }
  return { token, offered };
}
