/**
 * `POST /v1/sandboxes/:id/exec` with an idempotency key (docs/idempotency.md).
 *
 * First request under a key: the command runs as usual and its result is
 * stored. A client that goes away meanwhile does not stop it (a streamed
 * exec without a key is killed when its reader leaves; with a key the output
 * is drained into the stored result instead), so that the retry finds it.
 * A retry while it runs in this gateway process waits for it and answers its
 * result; after it ended, the stored result is answered and nothing runs. A
 * run cut by a gateway restart (its output pipes ended with the process) has
 * an unknown outcome: 409 IDEMPOTENCY_INTERRUPTED, never a second run.
 */
import type { Response } from 'hyper-express';
import { WarrenError, asWarrenError } from '../errors';
import type { CapturedExec, CapturedOutput, ExecOutcome, ExecRequest } from '../shim/types';
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

function bufferOutput(buf: Buffer, truncated: boolean): CapturedOutput {
  return {
    size: buf.length,
    truncated,
    *chunks(chunkBytes = 3 * 21_845) {
      const step = Math.max(3, chunkBytes - (chunkBytes % 3));
      for (let i = 0; i < buf.length; i += step) yield buf.subarray(i, i + step);
    },
    bytes: () => buf,
  };
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
  for (let attempt = 0; ; attempt++) {
    const begun = idem.store.begin(scope, 'exec', hash);
    if (begun.first) {
      await runFirst(ctx, idem, res, scope, sandboxId, execReq, encoding, ndjson);
      return;
    }
    const rec = begun.record;
    if (rec.state === 'done') return replay(res, rec, encoding, ndjson);
    if (rec.state !== 'running') throw recordError(rec);
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
): Promise<void> {
  let settle!: () => void;
  idem.inflight.set(scopeId(scope), new Promise<void>((r) => (settle = r)));
  const cap = idem.store.maxStoredOutputBytes;
  let started = false;
  try {
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
