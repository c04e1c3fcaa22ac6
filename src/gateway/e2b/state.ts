/**
 * What the E2B surface keeps beside the sandbox itself (table `e2b_sandboxes`
 * in the node's database): the template name the client asked for, the
 * timeout action, the end of its timeout, and whether traffic may resume it.
 *
 * Per-sandbox access tokens are not stored: they are an HMAC of the sandbox
 * id under a node secret (table `e2b_secret`, created once), so they survive
 * gateway restarts, can be handed out again on connect, and are compared in
 * constant time.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Database } from '../../state/db';

export type TimeoutAction = 'kill' | 'pause';

export interface E2bRecord {
  id: string;
  template: string;
  onTimeout: TimeoutAction;
  autoResume: boolean;
  /** Unix ms when the timeout fires (kill: the lifecycle ttl does it; pause: the surface's timer). */
  endAt: number;
  startedAt: number;
}

interface Row {
  id: string;
  template: string;
  on_timeout: TimeoutAction;
  auto_resume: number;
  end_at: number;
  started_at: number;
}

export class E2bState {
  private readonly secret: Buffer;
  private readonly getStmt;
  private readonly putStmt;
  private readonly delStmt;
  private readonly allStmt;

  constructor(db: Database) {
    db.exec(`
      CREATE TABLE IF NOT EXISTS e2b_sandboxes (
        id TEXT PRIMARY KEY,
        template TEXT NOT NULL,
        on_timeout TEXT NOT NULL CHECK (on_timeout IN ('kill', 'pause')),
        auto_resume INTEGER NOT NULL DEFAULT 0,
        end_at INTEGER NOT NULL,
        started_at INTEGER NOT NULL
      );
      CREATE TABLE IF NOT EXISTS e2b_secret (id INTEGER PRIMARY KEY CHECK (id = 1), secret BLOB NOT NULL);
    `);
    db.prepare('INSERT OR IGNORE INTO e2b_secret (id, secret) VALUES (1, ?)').run(randomBytes(32));
    this.secret = (db.prepare('SELECT secret FROM e2b_secret WHERE id = 1').get() as { secret: Buffer }).secret;
    this.getStmt = db.prepare('SELECT * FROM e2b_sandboxes WHERE id = ?');
    this.putStmt = db.prepare(
      `INSERT INTO e2b_sandboxes (id, template, on_timeout, auto_resume, end_at, started_at) VALUES (?, ?, ?, ?, ?, ?)
       ON CONFLICT(id) DO UPDATE SET template = excluded.template, on_timeout = excluded.on_timeout,
         auto_resume = excluded.auto_resume, end_at = excluded.end_at, started_at = excluded.started_at`,
    );
    this.delStmt = db.prepare('DELETE FROM e2b_sandboxes WHERE id = ?');
    this.allStmt = db.prepare('SELECT * FROM e2b_sandboxes');
  }

  get(id: string): E2bRecord | undefined {
    const r = this.getStmt.get(id) as Row | undefined;
    return r === undefined ? undefined : fromRow(r);
  }

  put(rec: E2bRecord): void {
    this.putStmt.run(rec.id, rec.template, rec.onTimeout, rec.autoResume ? 1 : 0, Math.floor(rec.endAt), Math.floor(rec.startedAt));
  }

  remove(id: string): void {
    this.delStmt.run(id);
  }

  all(): E2bRecord[] {
    return (this.allStmt.all() as Row[]).map(fromRow);
  }

  /** The sandbox-plane token of a sandbox (X-Access-Token). */
  envdToken(id: string): string {
    return 'e2ba_' + createHmac('sha256', this.secret).update(`envd\0${id}`).digest('base64url');
  }

  /** The token the code interpreter sends on /contexts (E2B-Traffic-Access-Token). */
  trafficToken(id: string): string {
    return 'e2bt_' + createHmac('sha256', this.secret).update(`traffic\0${id}`).digest('base64url');
  }

  /** Constant-time check of a presented token against the expected one. */
  static tokenMatches(presented: string | undefined, expected: string): boolean {
    if (presented === undefined) return false;
    const a = Buffer.from(presented);
    const b = Buffer.from(expected);
    return a.length === b.length && timingSafeEqual(a, b);
  }
}

function fromRow(r: Row): E2bRecord {
  return { id: r.id, template: r.template, onTimeout: r.on_timeout, autoResume: r.auto_resume === 1, endAt: r.end_at, startedAt: r.started_at };
}
