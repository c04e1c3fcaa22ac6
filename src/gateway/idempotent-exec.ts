/**
 * `POST /v1/sandboxes/:id/exec` with an idempotency key (docs/idempotency.md).
 *
 * First request under a key: the command runs as usual and its result is
 * stored. A client that goes away meanwhile does not stop it (a streamed
 * exec without a key is killed when its reader leaves; with a key the output
 * is drained into the stored result instead), so that the retry finds it.
 * A retry while it runs in this gateway process waits for it and answers its
 * result; after it ended, the stored result is answered and nothing runs.
 *
 * Where the backend can (container sandboxes), a keyed exec runs under a
 * supervisor process of its own (src/shim/supervised-exec.ts) that keeps its
 * output and result in files: the run outlives a gateway kill -9, and the next
 * gateway process follows it to its result (at start, and on a retry), stores
 * it and removes the files. Elsewhere a run cut by a gateway restart has an
 * unknown outcome: 409 IDEMPOTENCY_INTERRUPTED, never a second run.
 */
import { randomBytes } from 'node:crypto';
import type { Response } from 'hyper-express';
import { WarrenError, asWarrenError } from '../errors';
import type { CapturedExec, CapturedOutput, ExecOutcome, ExecRequest, LiveExec } from '../shim/types';
import { OutputCapture, bufferOutput, captureInto } from '../shim/exec-output';
import type { Account } from './auth';
import { type GatewayContext, raceSafe } from './context';
import { type OutputEncoding, outputLine, sendCapturedJson, streamLiveNdjson } from './exec-stream';
import { endChunked, writeChunk } from './http';
import { NDJSON_CONTENT_TYPE } from './ndjson';
import { BoundedBytes, type IdempotencyRecord, type IdempotencyScope, type IdempotencyStore, bodyHash, recordError } from './idempotency';

/** What the gateway keeps for idempotent requests: the store, and the runs in flight in this process. */
export interface IdempotencyContext {
  store: IdempotencyStore;
  /** Scope (JSON) -> settles when the run in this process has stored its result (or let go of its key). */
  inflight: Map<string, Promise<void>>;
}

export const REPLAYED_HEADER = 'idempotency-replayed';

function scopeId(s: IdempotencyScope): string {
  return JSON.stringify([s.account, s.sandbox, s.key]);
}

function outcomeOf(o: ExecOutcome): Record<string, unknown> {
  return { exitCode: o.exitCode, signal: o.signal, status: o.status, durationMs: o.durationMs, truncated: o.truncated };
}

/** The first `cap` bytes of a captured stream. */
function head(out: CapturedOutput, cap: number): Buffer {
  if (out.size <= cap) return out.bytes();
  const parts: Buffer[] = [];
  let n = 0;
  for (const c of out.chunks(64 * 1024 * 3)) {
    const take = c.subarray(0, Math.min(c.length, cap - n));
    parts.push(Buffer.from(take));
    n += take.length;
    if (n >= cap) break;
  }
  return Buffer.concat(parts);
}

/** Errors that say the command did not start: the key is let go, so that a retry runs it. */
function nothingRan(err: unknown): boolean {
  return err instanceof WarrenError && err.status < 500;
}

/** Answer a stored result in the form the retry asked for. */
async function replay(res: Response, rec: IdempotencyRecord, encoding: OutputEncoding, ndjson: boolean): Promise<void> {
  const r = rec.result!;
  const o = r.outcome as unknown as ExecOutcome;
  const cut = r.stdoutBytes > r.stdout.length || r.stderrBytes > r.stderr.length;
  const outcome: ExecOutcome = { exitCode: o.exitCode, signal: o.signal, status: o.status, durationMs: o.durationMs, truncated: o.truncated || cut };
  res.header(REPLAYED_HEADER, 'true');
  if (!ndjson) {
    const c: CapturedExec = { ...outcome, stdout: bufferOutput(r.stdout, cut), stderr: bufferOutput(r.stderr, cut), release: () => undefined };
    await sendCapturedJson(res, c, encoding);
    return;
  }
  res.status(200);
  res.header('content-type', NDJSON_CONTENT_TYPE);
  res.header('cache-control', 'no-store');
  for (const stream of ['stdout', 'stderr'] as const) {
    const buf = r[stream];
    if (buf.length === 0) continue;
    if (!(await writeChunk(res, outputLine(stream, buf, encoding)))) return;
  }
  await writeChunk(res, `${JSON.stringify({ type: 'exit', ...outcome })}\n`);
  endChunked(res);
}

/** Run (first request) or answer (retry) an exec under `key`. */
export async function idempotentExec(
  ctx: GatewayContext,
  idem: IdempotencyContext,
  res: Response,
  account: Account,
  sandboxId: string,
  key: string,
  execReq: ExecRequest,
  encoding: OutputEncoding,
  ndjson: boolean,
): Promise<void> {
  const scope: IdempotencyScope = { account: account.id, sandbox: sandboxId, key };
  // The hash covers what the command is, not how the answer is presented (JSON or NDJSON, utf8 or base64).
  const hash = bodyHash(execReq);
  const unsupervised = await ctx.shim.supervisedReason(sandboxId);
  for (let attempt = 0; ; attempt++) {
    const run = randomBytes(8).toString('hex');
    const begun = idem.store.begin(scope, 'exec', hash, unsupervised === null ? { run } : { unsupervised });
    if (begun.first) {
      await runFirst(ctx, idem, res, scope, sandboxId, execReq, encoding, ndjson, unsupervised === null ? run : null);
      return;
    }
    const rec = begun.record;
    if (rec.state === 'done') return replay(res, rec, encoding, ndjson);
    if (rec.state !== 'running') throw recordError(rec);
    if (!idem.inflight.has(scopeId(scope)) && rec.instance !== idem.store.instance && typeof rec.meta.run === 'string') {
      // A supervised run of an earlier gateway process: follow it to its result from here.
      followElsewhere(ctx, idem, rec);
    }
    const running = idem.inflight.get(scopeId(scope));
    if (running === undefined || attempt > 8) {
      if (rec.instance !== idem.store.instance) {
        idem.store.markInterrupted();
        throw recordError(idem.store.get(scope) ?? rec);
      }
      throw new WarrenError('IDEMPOTENCY_IN_PROGRESS', `the request with idempotency key ${JSON.stringify(key)} is still running and cannot be attached to; retry later`, { key });
    }
    // Attach: wait for the first run, then answer what it stored (or run, if it let go of the key).
    await running;
  }
}

async function runFirst(
  ctx: GatewayContext,
  idem: IdempotencyContext,
  res: Response,
  scope: IdempotencyScope,
  sandboxId: string,
  execReq: ExecRequest,
  encoding: OutputEncoding,
  ndjson: boolean,
  run: string | null,
): Promise<void> {
  let settle!: () => void;
  idem.inflight.set(scopeId(scope), new Promise<void>((r) => (settle = r)));
  const cap = idem.store.maxStoredOutputBytes;
  let started = false;
  try {
    if (run !== null) {
      const live = await raceSafe(ctx, sandboxId, () => ctx.shim.execSupervised(sandboxId, execReq, run));
      started = true;
      try {
        await answerSupervised(ctx, idem, res, scope, live, execReq, encoding, ndjson);
      } finally {
        await ctx.shim.dropSupervised(sandboxId, run).catch(() => undefined);
      }
      return;
    }
    if (ndjson) {
      const live = await raceSafe(ctx, sandboxId, () => ctx.shim.execLive(sandboxId, execReq));
      started = true;
      const out = new BoundedBytes(cap);
      const err = new BoundedBytes(cap);
      live.stdout.on('data', (c: Buffer) => out.push(c));
      live.stderr.on('data', (c: Buffer) => err.push(c));
      const outcome = await streamLiveNdjson(res, live, encoding, ctx.log, { keepRunning: true });
      if (outcome === null) {
        idem.store.fail(scope, { code: 'IDEMPOTENCY_INTERRUPTED', message: 'the streamed exec failed after it started (the first answer carried the error); its outcome is unknown' }, 'interrupted');
      } else {
        idem.store.finish(scope, outcomeOf(outcome), out.bytes(), err.bytes(), out.total, err.total);
      }
      return;
    }
    const captured = await raceSafe(ctx, sandboxId, () => ctx.shim.execCaptured(sandboxId, execReq));
    started = true;
    try {
      idem.store.finish(scope, outcomeOf(captured), head(captured.stdout, cap), head(captured.stderr, cap), captured.stdout.size, captured.stderr.size);
      await sendCapturedJson(res, captured, encoding);
    } finally {
      captured.release();
      if (captured.stdout.size + captured.stderr.size > 1024 * 1024) ctx.reclaimer?.note();
    }
  } catch (e) {
    if (!started && nothingRan(e)) idem.store.release(scope);
    else if (idem.store.get(scope)?.state === 'running') {
      const w = asWarrenError(e);
      idem.store.fail(scope, { code: w.code, message: w.message, ...(w.details ? { details: w.details } : {}) });
    }
    throw e;
  } finally {
    idem.inflight.delete(scopeId(scope));
    settle();
  }
}

/** Answer a supervised run's output and outcome (streamed or whole) and store its result. */
async function answerSupervised(
  ctx: GatewayContext,
  idem: IdempotencyContext,
  res: Response,
  scope: IdempotencyScope,
  live: LiveExec,
  execReq: ExecRequest,
  encoding: OutputEncoding,
  ndjson: boolean,
): Promise<void> {
  const cap = idem.store.maxStoredOutputBytes;
  if (ndjson) {
    const out = new BoundedBytes(cap);
    const err = new BoundedBytes(cap);
    live.stdout.on('data', (c: Buffer) => out.push(c));
    live.stderr.on('data', (c: Buffer) => err.push(c));
    const outcome = await streamLiveNdjson(res, live, encoding, ctx.log, { keepRunning: true });
    // The run's own result, even when the answer failed on the way (the files have it).
    const final = outcome ?? (await live.done.catch(() => null));
    if (final === null) idem.store.fail(scope, { code: 'IDEMPOTENCY_INTERRUPTED', message: 'the streamed exec failed after it started (the first answer carried the error); its outcome is unknown' }, 'interrupted');
    else idem.store.finish(scope, outcomeOf(final), out.bytes(), err.bytes(), out.total, err.total);
    return;
  }
  const limit = execReq.maxOutputBytes ?? Number.MAX_SAFE_INTEGER;
  const out = new OutputCapture(limit);
  const err = new OutputCapture(limit);
  try {
    const [, , outcome] = await Promise.all([captureInto(live.stdout, out), captureInto(live.stderr, err), live.done]);
    const captured: CapturedExec = { ...outcome, stdout: out, stderr: err, release: () => undefined };
    idem.store.finish(scope, outcomeOf(captured), head(out, cap), head(err, cap), out.size, err.size);
    await sendCapturedJson(res, captured, encoding);
    if (out.size + err.size > 1024 * 1024) ctx.reclaimer?.note();
  } finally {
    out.release();
    err.release();
  }
}

/**
 * Follow a supervised run of an earlier gateway process in the background:
 * its result is stored when it ends (a retry waits in `inflight` meanwhile),
 * then its files are removed. A run with no files left, or whose supervisor
 * ended without a result, is interrupted.
 */
export function followElsewhere(ctx: GatewayContext, idem: IdempotencyContext, rec: IdempotencyRecord): void {
  const id = scopeId(rec.scope);
  if (idem.inflight.has(id)) return;
  const run = rec.meta.run as string;
  const sandbox = rec.scope.sandbox;
  const lost = (why: string) => idem.store.fail(rec.scope, { code: 'IDEMPOTENCY_INTERRUPTED', message: why }, 'interrupted');
  // In `inflight` from the start (before the node answers): a retry of this key waits for it.
  const done = (async () => {
    let live: LiveExec | null;
    try {
      live = await ctx.shim.followSupervised(sandbox, run);
    } catch {
      live = null;
    }
    if (live === null) {
      lost('the gateway that ran this request ended while it was running, and its run left nothing to follow (its sandbox was stopped or deleted); its outcome is unknown and it is not run again under this key');
      idem.inflight.delete(id);
      return;
    }
    const cap = idem.store.maxStoredOutputBytes;
    const out = new BoundedBytes(cap);
    const err = new BoundedBytes(cap);
    live.stdout.on('data', (c: Buffer) => out.push(c));
    live.stderr.on('data', (c: Buffer) => err.push(c));
    const ended = (s: NodeJS.ReadableStream) =>
      new Promise<void>((r) => {
        s.once('end', r);
        s.once('close', r);
      });
    try {
      const [, , outcome] = await Promise.all([ended(live.stdout), ended(live.stderr), live.done]);
      idem.store.finish(rec.scope, outcomeOf(outcome), out.bytes(), err.bytes(), out.total, err.total);
    } catch (e) {
      lost(asWarrenError(e).message);
    } finally {
      idem.inflight.delete(id);
      await ctx.shim.dropSupervised(sandbox, run).catch(() => undefined);
    }
  })();
  idem.inflight.set(id, done);
}
