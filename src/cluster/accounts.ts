/**
 * Accounts, tokens, roles and quotas of a cluster, in etcd. Only token
 * hashes are stored (`/warren/tokens/<sha256 hex>` -> account id). Every
 * gateway keeps a watched copy, so that requests to running sandboxes are
 * authenticated without a round trip and go on working while etcd has no
 * quorum; changes (new accounts, quotas) need etcd.
 */
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import type { Etcd3 } from 'etcd3';
import { WarrenError } from '../errors';
import { type Account, type Accounts, type Quota, TOKEN_RE, UNLIMITED, generateToken, hashToken } from '../gateway/auth';
import { dropBlocks, limited } from './quota-blocks';
import type { Role } from '../validation';
import { RecentMisses, keys, nextRevision, parseJson, readPrefix, store } from './etcd';

export interface ClusterAccount extends Account {
  quota?: Quota;
}

export class ClusterAccounts implements Accounts {
  private readonly accounts = new Map<string, ClusterAccount>();
  private readonly tokens = new Map<string, string>();
  private watchers: { cancel(): Promise<void> }[] = [];

  constructor(private readonly etcd: Etcd3) {}

  async start(): Promise<void> {
    for (const [prefix, apply, drop] of [
      [keys.accounts, (k: string, v: string) => this.putAccount(k, v), (k: string) => this.accounts.delete(k.slice(keys.accounts.length))],
      [`${keys.token('')}`, (k: string, v: string) => this.tokens.set(k.slice(keys.token('').length), v), (k: string) => this.tokens.delete(k.slice(keys.token('').length))],
    ] as const) {
      const res = await readPrefix(this.etcd, prefix);
      for (const kv of res.kvs) apply(kv.key, kv.value);
      const w = await this.etcd.watch().prefix(prefix).startRevision(nextRevision(res.revision)).create();
      w.on('put', (kv) => apply(kv.key.toString('utf8'), kv.value.toString('utf8')));
      w.on('delete', (kv) => drop(kv.key.toString('utf8')));
      this.watchers.push(w);
    }
  }

  private putAccount(key: string, value: string): void {
    const a = parseJson<ClusterAccount>(value);
    if (a) this.accounts.set(key.slice(keys.accounts.length), a);
  }

  /** The account of a token this gateway's copy holds, or null. */
  cached(token: string | undefined | null): Account | null {
    if (typeof token !== 'string' || !TOKEN_RE.test(token)) return null;
    const id = this.tokens.get(hashToken(token).toString('hex'));
    const a = id === undefined ? undefined : this.accounts.get(id);
    if (a === undefined) return null;
    return { id: a.id, name: a.name, role: a.role, createdAt: a.createdAt };
  }

  /**
   * The caller's account. A token this gateway has not seen may have just been made through
   * another gateway (the watch lags behind it), so a miss is read from etcd before it is refused;
   * misses are remembered for a second ({@link RecentMisses}), so a stream of bad tokens costs
   * etcd one read each per second at most.
   */
  async require(token: string | undefined | null): Promise<Account> {
    if (token === undefined || token === null || token === '') throw new WarrenError('UNAUTHENTICATED', 'missing bearer token (Authorization: Bearer <token>)');
    const a = this.cached(token) ?? (TOKEN_RE.test(token) ? await this.readToken(token) : null);
    if (a === null) throw new WarrenError('UNAUTHENTICATED', 'invalid or revoked token');
    return a;
  }

  private readonly misses = new RecentMisses();

  private async readToken(token: string): Promise<Account | null> {
    const hash = hashToken(token).toString('hex');
    if (this.misses.has(hash)) return null;
    const id = await store('read token', () => this.etcd.get(keys.token(hash)).string());
    if (id === null || (await this.readAccount(id)) === null) {
      this.misses.add(hash);
      return null;
    }
    this.tokens.set(hash, id);
    return this.cached(token);
  }

  /** An account as etcd has it now (cached), or null. */
  private async readAccount(id: string): Promise<ClusterAccount | null> {
    const v = await store('read account', () => this.etcd.get(keys.account(id)).string());
    const a = parseJson<ClusterAccount>(v);
    if (a) this.accounts.set(id, a);
    return a ?? null;
  }

  /** The quota as etcd has it now (a quorum read): admissions do not act on a stale copy. */
  async quota(id: string, fallback: Quota = UNLIMITED): Promise<Quota> {
    return (await this.readAccount(id))?.quota ?? fallback;
  }

  async authenticate(token: string | undefined | null): Promise<Account | null> {
    try {
      return await this.require(token);
    } catch (err) {
      if (err instanceof WarrenError && err.code === 'UNAUTHENTICATED') return null;
      throw err;
    }
  }

  async listAccounts(): Promise<Account[]> {
    return this.list();
  }

  createAccount(name: string, role: Role): Promise<{ account: Account; token: string }> {
    return this.create(name, role);
  }

  list(): Account[] {
    return [...this.accounts.values()].map((a) => ({ id: a.id, name: a.name, role: a.role, createdAt: a.createdAt }));
  }

  async create(name: string, role: Role, token = generateToken()): Promise<{ account: Account; token: string }> {
    const account: Account = { id: `acct-${randomUUID().replace(/-/g, '').slice(0, 16)}`, name, role, createdAt: new Date().toISOString() };
    const tk = keys.token(hashToken(token).toString('hex'));
    const res = await store('create account', () =>
      this.etcd.if(tk, 'Create', '==', 0).then(this.etcd.put(keys.account(account.id)).value(JSON.stringify(account)), this.etcd.put(tk).value(account.id)).commit(),
    );
    if (!res.succeeded) throw new WarrenError('ALREADY_EXISTS', 'that token is already registered');
    this.accounts.set(account.id, account);
    this.tokens.set(tk.slice(keys.token('').length), account.id);
    return { account, token };
  }

  /** Patch an account's quota; concurrent patches through other gateways are not lost (compare on the record's revision). */
  async setQuota(id: string, patch: Partial<Quota>, fallback: Quota = UNLIMITED): Promise<Quota> {
    for (let attempt = 0; attempt < 8; attempt++) {
      const res = await store('read account', () => this.etcd.get(keys.account(id)).exec());
      const kv = res.kvs[0];
      const cur = kv === undefined ? null : parseJson<ClusterAccount>(kv.value.toString('utf8'));
      if (!kv || !cur) throw new WarrenError('NOT_FOUND', `no account ${id}`);
      const q = { ...(cur.quota ?? fallback), ...patch };
      const next = { ...cur, quota: q };
      const put = await store('set quota', () => this.etcd.if(keys.account(id), 'Mod', '==', kv.mod_revision).then(this.etcd.put(keys.account(id)).value(JSON.stringify(next))).commit());
      if (!put.succeeded) continue;
      this.accounts.set(id, next);
      // without any limit the account takes no blocks: its nodes admit it as unlimited again
      if (!limited(q)) await dropBlocks(this.etcd, id);
      return q;
    }
    throw new WarrenError('CLUSTER_UNAVAILABLE', `the quota of ${id} kept changing under this update (retry)`, { retryAfterS: 1 });
  }

  /**
   * The operator's admin token: the one in `file` when it exists (registered
   * if it is not yet), else a new one (the caller writes it). Two gateways
   * starting on one file register it once (create-if-absent on its hash).
   */
  async ensureAdmin(file: string): Promise<{ token: string; created: boolean }> {
    if (existsSync(file)) {
      const token = readFileSync(file, 'utf8').trim();
      if (!TOKEN_RE.test(token)) throw new WarrenError('INVALID_ARGUMENT', `${file} does not hold a Warren token`);
      if (this.cached(token) === null) {
        try {
          await this.create('admin', 'admin', token);
        } catch (err) {
          if (!(err instanceof WarrenError && err.code === 'ALREADY_EXISTS')) throw err;
        }
      }
      return { token, created: false };
    }
    const { token } = await this.create('admin', 'admin');
    return { token, created: true };
  }

  async close(): Promise<void> {
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)));
  }
}
