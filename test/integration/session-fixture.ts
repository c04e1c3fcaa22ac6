/**
 * Fixtures for the session-holder tests: start holders on host shells in a
 * temp dir, collect output, and make sure every holder (and its tree) is gone
 * when the test ends (session ids are logged when a test fails).
 */
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ExecutionContext } from 'ava';
import type { SessionOutput } from '../../src/shim/types';
import { attachSession, newSessionId, spawnHolder, type SpawnHolderOptions } from '../../src/shim/sessions/session-manager';
import type { ShellSession, ShellSessionOptions } from '../../src/shim/sessions/shell-session';
import { waitFor } from '../helpers/wait';

export const BASH = ['/bin/bash', '--noprofile', '--norc'];

let dir: string | undefined;
/** A private socket directory for this test process (short: unix socket paths are limited). */
export function socketDir(): string {
  dir ??= freshSocketDir();
  return dir;
}

/** Another private socket directory (for tests that list or clean a directory while others run). */
export function freshSocketDir(): string {
  const d = mkdtempSync(join(tmpdir(), 'wss-'));
  process.once('exit', () => rmSync(d, { recursive: true, force: true }));
  return d;
}

export interface TestSession {
  id: string;
  socketPath: string;
  pid: number;
  childPid: number;
  session: ShellSession;
}

export function pidAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2)[0];
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** VmRSS of a process, in KiB. */
export function rssKb(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : 0;
}


export { waitFor };

/** Kill a holder we started, whatever state it is in. */
export async function destroyHolder(t: ExecutionContext, s: { id: string; socketPath: string; pid: number }): Promise<void> {
  if (!t.passed) t.log(`session ${s.id} (holder pid ${s.pid}, socket ${s.socketPath})`);
  if (!pidAlive(s.pid) && !existsSync(s.socketPath)) return;
  try {
    const a = await attachSession(s.socketPath, 0, { connectTimeoutMs: 1000 });
    await a.close();
  } catch {
    /* fall through to SIGTERM / SIGKILL */
  }
  if (pidAlive(s.pid)) {
    try {
      process.kill(s.pid, 'SIGTERM'); // the holder closes: kills its tree, removes its socket
      await waitFor(() => !pidAlive(s.pid), 3000, 'holder exit');
    } catch {
      try { process.kill(s.pid, 'SIGKILL'); } catch { /* gone */ }
    }
  }
  rmSync(s.socketPath, { force: true });
}

/** Spawn a holder (bash in command mode unless told otherwise) and attach to it from offset 0. */
export async function openSession(
  t: ExecutionContext,
  opts: Partial<SpawnHolderOptions> & ShellSessionOptions & { dir?: string } = {},
): Promise<TestSession> {
  const id = newSessionId();
  const { graceMs, connectTimeoutMs, dir: inDir, ...spawnOpts } = opts;
  const socketPath = join(inDir ?? socketDir(), `${id}.sock`);
  const h = await spawnHolder({ socketPath, mode: 'command', argv: BASH, bufferBytes: 1 << 20, info: { sessionId: id, sandboxId: 'test' }, ...spawnOpts });
  const rec = { id, socketPath, pid: h.pid, childPid: h.childPid };
  t.teardown(() => destroyHolder(t, rec));
  const session = await attachSession(socketPath, 0, { graceMs, connectTimeoutMs });
  t.teardown(() => session.detach());
  return { ...rec, session };
}

export interface Collected {
  chunks: SessionOutput[];
  text(stream?: SessionOutput['stream']): string;
  bytes(stream?: SessionOutput['stream']): number;
}

export function collect(session: ShellSession): Collected {
  const chunks: SessionOutput[] = [];
  session.onOutput((o) => chunks.push(o));
  return {
    chunks,
    text: (stream) => Buffer.concat(chunks.filter((c) => !stream || c.stream === stream).map((c) => c.data)).toString('utf8'),
    bytes: (stream) => chunks.filter((c) => !stream || c.stream === stream).reduce((n, c) => n + c.data.length, 0),
  };
}
