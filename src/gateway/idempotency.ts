/**
 * Idempotency keys: a client request id on exec and shell-session commands,
 * so that a client that lost its connection (a preempted trainer, a gateway
 * restart) can send the same request again without the command running twice.
 *
 * The keys live in the node's SQLite database (the same file as the sandbox
 * registry), scoped per account and sandbox, for a window (24 h by default)
 * after the first request. A key names one request: the same key with another
 * request body is refused (422 IDEMPOTENCY_KEY_REUSED). While the first run is
 * going, a retry waits for it and gets its result; after it ended, a retry
 * gets the stored result without running anything. The full contract is in
 * docs/idempotency.md.
 *
 * What is stored: the outcome and the first `maxStoredOutputBytes` of each
 * output stream (raw bytes, presented in either encoding on replay). A replay
 * of an output that was longer says `truncated: true`.
 */
import { createHash, randomBytes } from 'node:crypto';
import type { Database } from 'better-sqlite3';
import { WarrenError } from '../errors';
import { defineKey } from '../validation';

export type IdempotentKind = 'exec' | 'shell';

/** Keys: what clients put in `Idempotency-Key` (UUIDs, ULIDs, "job-17/step-3", ...). */
export const IDEMPOTENCY_KEY_RE = /^[A-Za-z0-9_.:/+=-]{1,200}$/;

export const IDEMPOTENCY_DEFAULTS = {
  /** How long a key is remembered after its first request. */
  windowMs: 24 * 3600 * 1000,
  /** Output bytes kept per stream for replays. */
  maxStoredOutputBytes: 4 * 1024 * 1024,
  /** How often expired keys and keys of deleted sandboxes are removed. */
  gcIntervalMs: 10 * 60 * 1000,
} as const;

export interface IdempotencyOptions {
  windowMs?: number;
  maxStoredOutputBytes?: number;
}

export interface IdempotencyScope {
  account: string;
  sandbox: string;
  key: string;
}

/** What a finished run left: its outcome fields (JSON), and the kept output. */
export interface StoredResult {
  /** exec: ExecOutcome fields; shell: { exitCode, timedOut, commandId }. */
  outcome: Record<string, unknown>;
  stdout: Buffer;
  stderr: Buffer;
  /** Bytes the run produced per stream (more than stored when the storage cap cut it). */
  stdoutBytes: number;
  stderrBytes: number;
}

export type IdempotencyState = 'running' | 'done' | 'failed' | 'interrupted';

export interface IdempotencyRecord {
  scope: IdempotencyScope;
  kind: IdempotentKind;
  bodyHash: string;
  state: IdempotencyState;
  /** The gateway process that ran it (a record 'running' under another instance was cut by a restart). */
  instance: string;
  createdAt: number;
  expiresAt: number;
  /** Where the run can be found again (shell: session, command id, start offset). */
  meta: Record<string, unknown>;
  /** state 'done'. */
  result?: StoredResult;
  /** state 'failed' or 'interrupted': the error a retry gets. */
  error?: { code: string; message: string; details?: Record<string, unknown> };
}

export type BeginResult = { first: true; record: IdempotencyRecord } | { first: false; record: IdempotencyRecord };

interface Row {
  account: string;
  sandbox: string;
  key: string;
  kind: IdempotentKind;
  body_hash: string;
  state: IdempotencyState;
  instance: string;
  created_at: number;
  expires_at: number;
  meta: string;
  outcome: string | null;
  stdout: Buffer | null;
  stderr: Buffer | null;
  stdout_bytes: number;
  stderr_bytes: number;
}

/** Key from a header and/or a body field: either one, or both equal; undefined when neither. */
export function idempotencyKeyOf(header: string | undefined, bodyField: unknown): string | undefined {
  const h = header === undefined || header === '' ? undefined : validateIdempotencyKey(header, 'Idempotency-Key');
  const b = bodyField === undefined ? undefined : validateIdempotencyKey(bodyField, 'idempotencyKey');
  if (h !== undefined && b !== undefined && h !== b) {
    throw new WarrenError('INVALID_ARGUMENT', 'the Idempotency-Key header and the idempotencyKey field differ; send one, or both equal', { field: 'idempotencyKey' });
  }
  return h ?? b;
}

export function validateIdempotencyKey(value: unknown, field = 'idempotencyKey'): string {
  if (typeof value !== 'string' || !IDEMPOTENCY_KEY_RE.test(value)) {
    throw new WarrenError('INVALID_ARGUMENT', `${field}: must be 1..200 characters of [A-Za-z0-9_.:/+=-] (a UUID fits)`, { field });
  }
  return value;
}

/** A stable hash of a request body: object keys sorted, so field order does not matter. */
export function bodyHash(value: unknown): string {
  const canon = (v: unknown): unknown => {
    if (Buffer.isBuffer(v)) return { $bytes: v.toString('base64') };
    if (Array.isArray(v)) return v.map(canon);
    if (v !== null && typeof v === 'object') {
      const out: Record<string, unknown> = {};
      for (const k of Object.keys(v).sort()) {
        const x = (v as Record<string, unknown>)[k];
        // a field named __proto__ is part of the body like any other
        if (x !== undefined) defineKey(out, k, canon(x));
      }
      return out;
    }
    return v;
  };
  return createHash('sha256').update(JSON.stringify(canon(value))).digest('hex');
}

export class IdempotencyStore {
  /** This gateway process: records 'running' under another instance were cut by a restart. */
  readonly instance = randomBytes(8).toString('hex');
  readonly windowMs: number;
  readonly maxStoredOutputBytes: number;
  private readonly getStmt;
  private readonly insertStmt;
  private readonly deleteStmt;
  private readonly finishStmt;
  private readonly failStmt;
  private readonly expireStmt;
  private readonly sandboxesStmt;
  private readonly dropSandboxStmt;
  private readonly interruptStmt;
  private readonly countStmt;
  private readonly supervisedStmt;

  constructor(
    private readonly db: Database,
    opts: IdempotencyOptions = {},
    private readonly now: () => number = Date.now,
  ) {
    this.windowMs = opts.windowMs ?? IDEMPOTENCY_DEFAULTS.windowMs;
    this.maxStoredOutputBytes = opts.maxStoredOutputBytes ?? IDEMPOTENCY_DEFAULTS.maxStoredOutputBytes;
    if (!Number.isSafeInteger(this.windowMs) || this.windowMs < 1) throw new WarrenError('INVALID_ARGUMENT', `idempotency window must be a positive number of milliseconds (got ${this.windowMs})`);
    if (!Number.isSafeInteger(this.maxStoredOutputBytes) || this.maxStoredOutputBytes < 0) {
      throw new WarrenError('INVALID_ARGUMENT', `stored output bound must be a non-negative number of bytes (got ${this.maxStoredOutputBytes})`);
    }
    db.exec(`CREATE TABLE IF NOT EXISTS idempotency_keys (
      account TEXT NOT NULL,
      sandbox TEXT NOT NULL,
      key TEXT NOT NULL,
      kind TEXT NOT NULL,
      body_hash TEXT NOT NULL,
      state TEXT NOT NULL,
      instance TEXT NOT NULL,
      created_at INTEGER NOT NULL,
      expires_at INTEGER NOT NULL,
      meta TEXT NOT NULL DEFAULT '{}',
      outcome TEXT,
      stdout BLOB,
      stderr BLOB,
      stdout_bytes INTEGER NOT NULL DEFAULT 0,
      stderr_bytes INTEGER NOT NULL DEFAULT 0,
      PRIMARY KEY (account, sandbox, key)
    )`);
    db.exec('CREATE INDEX IF NOT EXISTS idempotency_keys_expiry ON idempotency_keys (expires_at)');
    this.getStmt = db.prepare('SELECT * FROM idempotency_keys WHERE account = ? AND sandbox = ? AND key = ?');
    this.insertStmt = db.prepare(
      'INSERT INTO idempotency_keys (account, sandbox, key, kind, body_hash, state, instance, created_at, expires_at, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)',
    );
    this.deleteStmt = db.prepare('DELETE FROM idempotency_keys WHERE account = ? AND sandbox = ? AND key = ?');
    this.finishStmt = db.prepare(
      "UPDATE idempotency_keys SET state = 'done', outcome = ?, stdout = ?, stderr = ?, stdout_bytes = ?, stderr_bytes = ? WHERE account = ? AND sandbox = ? AND key = ? AND state IN ('running', 'interrupted')",
    );
    this.failStmt = db.prepare("UPDATE idempotency_keys SET state = ?, outcome = ? WHERE account = ? AND sandbox = ? AND key = ? AND state = 'running'");
    this.expireStmt = db.prepare('DELETE FROM idempotency_keys WHERE expires_at <= ?');
    this.sandboxesStmt = db.prepare('SELECT DISTINCT sandbox FROM idempotency_keys');
    this.dropSandboxStmt = db.prepare('DELETE FROM idempotency_keys WHERE sandbox = ?');
    // Supervised execs (meta.run) outlive the gateway: they are followed again, not interrupted.
    this.interruptStmt = db.prepare(
      "UPDATE idempotency_keys SET state = 'interrupted', outcome = ? WHERE state = 'running' AND kind = 'exec' AND instance != ? AND json_extract(meta, '$.run') IS NULL",
    );
    this.supervisedStmt = db.prepare(
      "SELECT * FROM idempotency_keys WHERE state = 'running' AND kind = 'exec' AND instance != ? AND json_extract(meta, '$.run') IS NOT NULL AND expires_at > ?",
    );
    this.countStmt = db.prepare('SELECT COUNT(*) AS n FROM idempotency_keys');
  }

  /**
   * Claim `scope.key` for a request, or find who has it. First request: a
   * 'running' record is written and returned with `first: true` (run it,
   * then finish() or fail()). A key seen before within the window: its record
   * (`first: false`), after checking that it names the same request.
   */
  begin(scope: IdempotencyScope, kind: IdempotentKind, hash: string, meta: Record<string, unknown> = {}): BeginResult {
    const tx = this.db.transaction((): BeginResult => {
      const now = this.now();
      const row = this.getStmt.get(scope.account, scope.sandbox, scope.key) as Row | undefined;
      if (row !== undefined && row.expires_at > now) {
        if (row.kind !== kind || row.body_hash !== hash) {
          throw new WarrenError(
            'IDEMPOTENCY_KEY_REUSED',
            `idempotency key ${JSON.stringify(scope.key)} was used for a different ${row.kind === kind ? 'request' : `kind of request (${row.kind})`} on this sandbox within the window; use a new key per request`,
            { key: scope.key, firstUsedAt: new Date(row.created_at).toISOString() },
          );
        }
        return { first: false, record: toRecord(row) };
      }
      if (row !== undefined) this.deleteStmt.run(scope.account, scope.sandbox, scope.key);
      this.insertStmt.run(scope.account, scope.sandbox, scope.key, kind, hash, 'running', this.instance, now, now + this.windowMs, JSON.stringify(meta));
      return { first: true, record: toRecord(this.getStmt.get(scope.account, scope.sandbox, scope.key) as Row) };
    });
    return tx.immediate();
  }

  get(scope: IdempotencyScope): IdempotencyRecord | undefined {
    const row = this.getStmt.get(scope.account, scope.sandbox, scope.key) as Row | undefined;
    return row === undefined || row.expires_at <= this.now() ? undefined : toRecord(row);
  }

  /** Store the result of a run (its output cut to the storage bound). */
  finish(scope: IdempotencyScope, outcome: Record<string, unknown>, stdout: Buffer, stderr: Buffer, stdoutBytes = stdout.length, stderrBytes = stderr.length): void {
    const cap = this.maxStoredOutputBytes;
    this.finishStmt.run(
      JSON.stringify(outcome),
      stdout.length > cap ? stdout.subarray(0, cap) : stdout,
      stderr.length > cap ? stderr.subarray(0, cap) : stderr,
      Math.max(stdoutBytes, stdout.length),
      Math.max(stderrBytes, stderr.length),
      scope.account,
      scope.sandbox,
      scope.key,
    );
  }

  /** The run failed in a way a retry must see again (state 'failed'), or its outcome is unknown ('interrupted'). */
  fail(scope: IdempotencyScope, error: { code: string; message: string; details?: Record<string, unknown> }, state: 'failed' | 'interrupted' = 'failed'): void {
    this.failStmt.run(state, JSON.stringify(error), scope.account, scope.sandbox, scope.key);
  }

  /** Nothing ran (the request was refused before it started): forget the key, so a retry runs. */
  release(scope: IdempotencyScope): void {
    this.deleteStmt.run(scope.account, scope.sandbox, scope.key);
  }

  /**
   * Execs still 'running' under another gateway process were cut by its end
   * (their output pipes went with it): their outcome is unknown, and they are
   * never run again under the same key.
   */
  markInterrupted(): number {
    const error = {
      code: 'IDEMPOTENCY_INTERRUPTED',
      message:
        'the gateway that ran this request ended while it was running; its outcome is unknown (the command may have finished, or been stopped when its output pipes closed) and it is not run again under this key',
    };
    return this.interruptStmt.run(JSON.stringify(error), this.instance).changes;
  }

  /** Supervised execs 'running' under an earlier gateway process: they are followed to their result from here. */
  runningElsewhere(): IdempotencyRecord[] {
    return (this.supervisedStmt.all(this.instance, this.now()) as Row[]).map(toRecord);
  }

  /** Remove expired keys and keys of sandboxes that no longer exist; returns how many went. */
  async gc(sandboxExists: (id: string) => Promise<boolean>): Promise<number> {
    let removed = this.expireStmt.run(this.now()).changes;
    // One sandbox at a time, each asked after its keys were seen: a sandbox found gone never
    // comes back (ids are not reused), so keys written meanwhile are never dropped by mistake.
    for (const { sandbox } of this.sandboxesStmt.all() as Array<{ sandbox: string }>) {
      if (!(await sandboxExists(sandbox))) removed += this.dropSandboxStmt.run(sandbox).changes;
    }
    return removed;
  }

  /** A sandbox was deleted: its keys go with it. */
  dropSandbox(id: string): void {
    this.dropSandboxStmt.run(id);
  }

  get size(): number {
    return (this.countStmt.get() as { n: number }).n;
  }
}

function toRecord(row: Row): IdempotencyRecord {
  const rec: IdempotencyRecord = {
    scope: { account: row.account, sandbox: row.sandbox, key: row.key },
    kind: row.kind,
    bodyHash: row.body_hash,
    state: row.state,
    instance: row.instance,
    createdAt: row.created_at,
    expiresAt: row.expires_at,
    meta: JSON.parse(row.meta) as Record<string, unknown>,
  };
  if (row.state === 'done' && row.outcome !== null) {
    rec.result = {
      outcome: JSON.parse(row.outcome) as Record<string, unknown>,
      stdout: row.stdout ?? Buffer.alloc(0),
      stderr: row.stderr ?? Buffer.alloc(0),
      stdoutBytes: row.stdout_bytes,
      stderrBytes: row.stderr_bytes,
    };
  } else if ((row.state === 'failed' || row.state === 'interrupted') && row.outcome !== null) {
    rec.error = JSON.parse(row.outcome) as IdempotencyRecord['error'];
  }
  return rec;
}

/** The error a retry of an interrupted or failed run gets. */
export function recordError(rec: IdempotencyRecord): WarrenError {
  const e = rec.error;
  const details = { key: rec.scope.key, firstRequestAt: new Date(rec.createdAt).toISOString(), ...(e?.details ?? {}) };
  if (rec.state === 'interrupted' || e === undefined) {
    // Why this run could not outlive the gateway (the backend's reason), when it is known.
    const why = typeof rec.meta.unsupervised === 'string' ? ` (${rec.meta.unsupervised})` : '';
    return new WarrenError('IDEMPOTENCY_INTERRUPTED', `${e?.message ?? 'the first run of this request was interrupted; its outcome is unknown'}${why}`, details);
  }
  return new WarrenError(e.code as ConstructorParameters<typeof WarrenError>[0], e.message, details);
}

/** Keeps the first `cap` bytes of a stream, and counts all of them. */
export class BoundedBytes {
  private parts: Buffer[] = [];
  private kept = 0;
  total = 0;

  constructor(private readonly cap: number) {}

  push(chunk: Buffer): void {
    this.total += chunk.length;
    if (this.kept >= this.cap) return;
    const take = chunk.length <= this.cap - this.kept ? chunk : chunk.subarray(0, this.cap - this.kept);
    this.parts.push(Buffer.from(take));
    this.kept += take.length;
  }

  bytes(): Buffer {
    return Buffer.concat(this.parts);
  }
}
