import type { Database } from 'better-sqlite3';
import type { SandboxRecord, SandboxSpec, SandboxState } from './types';

interface Row {
  id: string;
  spec: string;
  layers: string;
  state: SandboxState;
  created_at: string;
  runtime: string;
  lifecycle: string | null;
}

/**
 * The node's sandbox registry, in the embedded SQLite database. It records what
 * is needed to re-adopt a running sandbox after the gateway crashes: the
 * sandbox's processes are its own and keep running; only this record moves.
 */
export class SandboxRegistry {
  private readonly insertStmt;
  private readonly updateStmt;
  private readonly deleteStmt;
  private readonly getStmt;
  private readonly allStmt;
  private readonly lifecycleStmt;

  constructor(db: Database) {
    db.exec(`CREATE TABLE IF NOT EXISTS sandboxes (
      id TEXT PRIMARY KEY,
      spec TEXT NOT NULL,
      layers TEXT NOT NULL,
      state TEXT NOT NULL,
      created_at TEXT NOT NULL,
      runtime TEXT NOT NULL DEFAULT '{}'
    )`);
    // Lifetime clocks and pause state (src/shim/lifecycle): added by a later version, so added in place.
    const columns = (db.prepare('PRAGMA table_info(sandboxes)').all() as Array<{ name: string }>).map((c) => c.name);
    if (!columns.includes('lifecycle')) db.exec('ALTER TABLE sandboxes ADD COLUMN lifecycle TEXT');
    this.insertStmt = db.prepare('INSERT INTO sandboxes (id, spec, layers, state, created_at, runtime, lifecycle) VALUES (?, ?, ?, ?, ?, ?, ?)');
    this.updateStmt = db.prepare('UPDATE sandboxes SET state = ?, runtime = ? WHERE id = ?');
    this.deleteStmt = db.prepare('DELETE FROM sandboxes WHERE id = ?');
    this.getStmt = db.prepare('SELECT * FROM sandboxes WHERE id = ?');
    this.allStmt = db.prepare('SELECT * FROM sandboxes ORDER BY created_at');
    this.lifecycleStmt = db.prepare('UPDATE sandboxes SET lifecycle = ? WHERE id = ?');
  }

  setLifecycle(id: string, lifecycle: Record<string, unknown>): void {
    this.lifecycleStmt.run(JSON.stringify(lifecycle), id);
  }

  insert(record: SandboxRecord): void {
    this.insertStmt.run(record.id, JSON.stringify(record.spec), JSON.stringify(record.layers), record.state, record.createdAt, JSON.stringify(record.runtime), record.lifecycle ? JSON.stringify(record.lifecycle) : null);
  }

  update(id: string, state: SandboxState, runtime: Record<string, unknown>): void {
    this.updateStmt.run(state, JSON.stringify(runtime), id);
  }

  remove(id: string): void {
    this.deleteStmt.run(id);
  }

  get(id: string): SandboxRecord | undefined {
    const row = this.getStmt.get(id) as Row | undefined;
    return row === undefined ? undefined : toRecord(row);
  }

  all(): SandboxRecord[] {
    return (this.allStmt.all() as Row[]).map(toRecord);
  }
}

function toRecord(row: Row): SandboxRecord {
  return {
    id: row.id,
    spec: JSON.parse(row.spec) as SandboxSpec,
    layers: JSON.parse(row.layers) as string[],
    state: row.state,
    createdAt: row.created_at,
    runtime: JSON.parse(row.runtime) as Record<string, unknown>,
    ...(row.lifecycle ? { lifecycle: JSON.parse(row.lifecycle) as Record<string, unknown> } : {}),
  };
}
