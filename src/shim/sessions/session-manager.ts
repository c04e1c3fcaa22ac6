/**
 * Starting, finding and attaching to session holders.
 *
 * A session is a `warren-session` holder process (native/helper/session/)
 * listening on `<dir>/<sessionId>.sock`. The holder, not the gateway, owns the
 * shell and the output buffer, so everything here can be redone by a restarted
 * gateway: `listSessions(dir)` finds the live holders and `attachSession()`
 * re-attaches from the offset the client last saw.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { lstatSync } from 'node:fs';
import { readdir, unlink } from 'node:fs/promises';
import path from 'node:path';
import { WarrenError } from '../../errors';
import { helperBinary } from '../../native';
import type { SessionInfo, SessionMode } from '../types';
import { HolderClient } from './holder-client';
import type { HolderInfo } from './holder-protocol';
import { ShellSession, type ShellSessionOptions } from './shell-session';

export interface SpawnHolderOptions {
  /** Absolute path of the unix socket to create (it must not exist); at most 100 bytes. */
  socketPath: string;
  mode: SessionMode;
  /** The holder's child: in production `warren-nsexec ... -- /bin/bash ...`. */
  argv: string[];
  /** Size of the holder's output ring, 4 KiB .. 4 GiB. */
  bufferBytes: number;
  cols?: number | undefined;
  rows?: number | undefined;
  /** pty mode: the ptmx to open (e.g. the sandbox's devpts), default /dev/ptmx. */
  ptmxPath?: string | undefined;
  /** Opaque metadata returned in INFO (sessionId and sandboxId are read back by attachments). */
  info?: Record<string, unknown> | undefined;
  /** How long the holder serves the tail after its child exits with nobody attached (default 300 s). */
  lingerSeconds?: number | undefined;
  /** Environment of the holder and its child (default: this process's). */
  env?: NodeJS.ProcessEnv | undefined;
  /** How long an attached client that takes no output may hold the child's output back before it is left behind (default 500 ms; 0: never). */
  stallMs?: number | undefined;
  /** How long to wait for the holder to listen (default 5000 ms). */
  readyTimeoutMs?: number | undefined;
  /**
   * Command mode: generations from `argv`'s process down to the shell (0: it is the shell; 1: it
   * is a launcher whose child is the shell, as warren-nsexec). A signal to the running command
   * never reaches these, also when the shell came up after the command was sent.
   */
  shellDepth?: number | undefined;
  /**
   * `argv`'s process is a bridge to a shell on the far side of a channel (warren-vmshell to a
   * microVM guest): the holder passes it MARKs and the SIGNALs meant for the shell, the command
   * or the tree as records on a pipe at this fd (4..9), for the far end to apply.
   */
  controlFd?: number | undefined;
}

/** SessionInfo plus what the holder knows about itself. */
export interface HolderSessionInfo extends SessionInfo {
  socketPath: string;
  holderPid: number;
  childPid: number;
  oldestOffset: number;
  bufferBytes: number;
  exitCode: number | null;
  exitSignal: number | null;
  clients: number;
  meta: Record<string, unknown>;
}

const BASE32 = 'abcdefghijklmnopqrstuvwxyz234567';

/** A new session id: "s-" + 16 base32 characters (80 random bits). */
export function newSessionId(): string {
  const bytes = randomBytes(10);
  let bits = 0;
  let value = 0;
  let out = 's-';
  for (const b of bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  return out;
}

export const SESSION_ID = /^s-[a-z0-9]{1,64}$/;

export function sessionSocketPath(dir: string, sessionId: string): string {
  if (!SESSION_ID.test(sessionId)) throw new WarrenError('INVALID_ID', `invalid session id: ${sessionId}`);
  return path.join(dir, `${sessionId}.sock`);
}

/**
 * Path of the warren-session binary: WARREN_SESSION_BINARY when set (e.g. a
 * sanitizer build), else native/helper/out/warren-session via helperBinary()
 * (which honours WARREN_HELPER_DIR).
 */
export function holderBinary(): string {
  const override = process.env.WARREN_SESSION_BINARY;
  if (override) return path.resolve(override);
  return helperBinary('warren-session');
}

function validateSpawn(o: SpawnHolderOptions): void {
  const bad = (msg: string): never => {
    throw new WarrenError('INVALID_ARGUMENT', msg);
  };
  if (typeof o.socketPath !== 'string' || !path.isAbsolute(o.socketPath)) bad('socketPath must be an absolute path');
  if (Buffer.byteLength(o.socketPath) > 100) bad(`socketPath is longer than 100 bytes (unix socket limit): ${o.socketPath}`);
  if (o.mode !== 'command' && o.mode !== 'pty') bad(`mode must be "command" or "pty", got ${String(o.mode)}`);
  if (!Array.isArray(o.argv) || o.argv.length === 0) bad('argv must be a non-empty array');
  for (const a of o.argv) if (typeof a !== 'string' || a.includes('\0')) bad('argv entries must be strings without NUL bytes');
  if (!Number.isInteger(o.bufferBytes) || o.bufferBytes < 4096 || o.bufferBytes > 2 ** 32) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `bufferBytes must be an integer in 4096..${2 ** 32}, got ${o.bufferBytes}`);
  }
  for (const [k, v] of [['cols', o.cols], ['rows', o.rows]] as const) {
    if (v !== undefined && (!Number.isInteger(v) || v < 1 || v > 65535)) bad(`${k} must be an integer in 1..65535`);
  }
  if (o.lingerSeconds !== undefined && (!Number.isInteger(o.lingerSeconds) || o.lingerSeconds < 0 || o.lingerSeconds > 30 * 86400)) {
    bad('lingerSeconds must be an integer in 0..2592000');
  }
  if (o.stallMs !== undefined && (!Number.isInteger(o.stallMs) || o.stallMs < 0 || o.stallMs > 3_600_000)) bad('stallMs must be an integer in 0..3600000');
  if (o.ptmxPath !== undefined && !path.isAbsolute(o.ptmxPath)) bad('ptmxPath must be an absolute path');
  if (o.controlFd !== undefined && (!Number.isInteger(o.controlFd) || o.controlFd < 4 || o.controlFd > 9)) bad('controlFd must be an integer in 4..9');
}

/**
 * Start a holder for a new session and wait until its socket listens. The
 * holder is detached (own session, stdio on /dev/null): it outlives this
 * process. Readiness: the holder writes "ready <pid> <childPid>\n" (or
 * "error <message>\n") on the pipe given with --ready-fd; it publishes the
 * socket path atomically before that.
 */
export async function spawnHolder(opts: SpawnHolderOptions): Promise<{ pid: number; childPid: number }> {
  validateSpawn(opts);
  const args = ['--socket', opts.socketPath, '--mode', opts.mode, '--buffer-bytes', String(opts.bufferBytes), '--ready-fd', '3'];
  if (opts.cols !== undefined) args.push('--cols', String(opts.cols));
  if (opts.rows !== undefined) args.push('--rows', String(opts.rows));
  if (opts.ptmxPath !== undefined) args.push('--ptmx', opts.ptmxPath);
  if (opts.lingerSeconds !== undefined) args.push('--linger-seconds', String(opts.lingerSeconds));
  if (opts.stallMs !== undefined) args.push('--stall-ms', String(opts.stallMs));
  if (opts.shellDepth !== undefined) args.push('--shell-depth', String(opts.shellDepth));
  if (opts.controlFd !== undefined) args.push('--control-fd', String(opts.controlFd));
  if (opts.info !== undefined) {
    const json = JSON.stringify(opts.info);
    if (Buffer.byteLength(json) > 16384) throw new WarrenError('INVALID_ARGUMENT', 'session info is larger than 16 KiB');
    args.push('--info', json);
  }
  args.push('--', ...opts.argv);
  const bin = holderBinary();
  const timeoutMs = opts.readyTimeoutMs ?? 5000;

  return await new Promise((resolve, reject) => {
    const child = spawn(bin, args, { detached: true, stdio: ['ignore', 'ignore', 'pipe', 'pipe'], env: opts.env ?? process.env });
    const ready = child.stdio[3] as NodeJS.ReadableStream & { destroy(): void };
    const stderr = child.stdio[2] as NodeJS.ReadableStream & { destroy(): void };
    let out = '';
    let errText = '';
    let done = false;
    const finish = (err: WarrenError | null, value?: { pid: number; childPid: number }): void => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      ready.destroy();
      stderr.destroy();
      child.removeAllListeners('close');
      child.removeAllListeners('error');
      child.unref();
      if (err) reject(err);
      else resolve(value!);
    };
    const timer = setTimeout(() => {
      // SIGTERM makes a holder close: it kills its child and removes its socket.
      child.kill('SIGTERM');
      finish(new WarrenError('SPAWN_ERROR', `session holder did not become ready within ${timeoutMs} ms`, { socketPath: opts.socketPath }));
    }, timeoutMs);
    child.on('error', (e) => finish(new WarrenError('SPAWN_ERROR', `cannot start session holder ${bin}: ${e.message}`)));
    // 'close', not 'exit': the ready pipe has been read to its end by then.
    child.on('close', (code, signal) => {
      const why = out.startsWith('error ') ? out.slice(6).trim() : errText.trim() || `exited with ${signal ?? code}`;
      finish(new WarrenError('SPAWN_ERROR', `session holder failed: ${why}`, { socketPath: opts.socketPath }));
    });
    stderr.on('data', (d: Buffer) => {
      if (errText.length < 4096) errText += d.toString('utf8');
    });
    ready.on('data', (d: Buffer) => {
      out += d.toString('utf8');
      const nl = out.indexOf('\n');
      if (nl < 0) return;
      const line = out.slice(0, nl);
      const m = /^ready (\d+) (\d+)$/.exec(line);
      if (m) finish(null, { pid: Number(m[1]), childPid: Number(m[2]) });
      else if (line.startsWith('error ')) finish(new WarrenError('SPAWN_ERROR', `session holder failed: ${line.slice(6)}`, { socketPath: opts.socketPath }));
    });
    ready.on('error', () => undefined);
    stderr.on('error', () => undefined);
  });
}

/** Attach to the session at `socketPath`, receiving its output from `fromOffset` on. */
export function attachSession(socketPath: string, fromOffset: number, opts?: ShellSessionOptions): Promise<ShellSession> {
  return ShellSession.attach(socketPath, fromOffset, opts);
}

function toSessionInfo(socketPath: string, h: HolderInfo): HolderSessionInfo {
  const meta = h.info ?? {};
  return {
    id: typeof meta.sessionId === 'string' ? meta.sessionId : path.basename(socketPath, '.sock'),
    sandboxId: typeof meta.sandboxId === 'string' ? meta.sandboxId : '',
    mode: h.mode,
    createdAt: h.createdAt,
    outputOffset: h.outputOffset,
    alive: h.alive,
    socketPath,
    holderPid: h.pid,
    childPid: h.childPid,
    oldestOffset: h.oldestOffset,
    bufferBytes: h.bufferBytes,
    exitCode: h.exitCode,
    exitSignal: h.exitSignal,
    clients: h.clients,
    meta,
  };
}

/** Ask one holder for INFO (SESSION_NOT_FOUND when nothing listens at the path). */
export async function sessionInfo(socketPath: string, timeoutMs = 5000): Promise<HolderSessionInfo> {
  const client = await HolderClient.connect(socketPath, timeoutMs);
  try {
    return toSessionInfo(socketPath, await client.info(timeoutMs));
  } finally {
    client.destroy();
  }
}

/**
 * Every live session in `dir` (sockets named `<sessionId>.sock`), oldest
 * first. Sockets nobody listens on any more (a holder killed with -9) are
 * removed; holders that do not answer in time are skipped but kept.
 */
export async function listSessions(dir: string, timeoutMs = 2000): Promise<HolderSessionInfo[]> {
  let names: string[];
  try {
    names = await readdir(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
  const found = await Promise.all(
    names
      .filter((n) => n.endsWith('.sock'))
      .map(async (n) => {
        const p = path.join(dir, n);
        try {
          return await sessionInfo(p, timeoutMs);
        } catch (e) {
          if (e instanceof WarrenError && e.code === 'SESSION_NOT_FOUND') {
            try {
              if (lstatSync(p).isSocket()) await unlink(p);
            } catch {
              /* gone already */
            }
          }
          return null;
        }
      }),
  );
  return found.filter((x): x is HolderSessionInfo => x !== null).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
}
