/**
 * Writing exec answers without building them in memory.
 *
 * JSON (`application/json`, the default): the node keeps the output (memory
 * up to 256 KiB per stream, then an unlinked spill file), and the answer is
 * written in chunks with back-pressure once the command has ended. Small
 * answers are sent in one piece. `stdout`/`stderr` are UTF-8 text (bytes that
 * are not UTF-8 become U+FFFD, as always), or with `"encoding":"base64"` in the
 * request, base64 of the exact bytes (and `"encoding":"base64"` in the answer).
 *
 * NDJSON (`Accept: application/x-ndjson`): the output is streamed while the
 * command runs, one line per chunk, then one `exit` line:
 *
 *   {"type":"stdout","data":"hello\n"}
 *   {"type":"stderr","data":"AAEC","encoding":"base64"}     a chunk that is not UTF-8
 *   {"type":"exit","exitCode":0,"signal":null,"status":"ok","durationMs":3.2,"truncated":false}
 *   {"type":"error","error":{"code":"...","message":"..."}}  instead of exit, if it failed after the start
 *
 * A slow reader holds the command back (its output pipes fill); nothing is
 * queued in the gateway beyond one chunk per stream.
 */
import { isUtf8 } from 'node:buffer';
import { StringDecoder } from 'node:string_decoder';
import type { Response } from 'hyper-express';
import { WarrenError, asWarrenError } from '../errors';
import type { CapturedExec, CapturedOutput, ExecOutcome, LiveExec } from '../shim/types';
import { NDJSON_CONTENT_TYPE } from './ndjson';
import { endChunked, writeChunk } from './http';

export type OutputEncoding = 'utf8' | 'base64';

/** Answers up to this size are built and sent in one piece. */
const SMALL_ANSWER_BYTES = 64 * 1024;
/** JSON text is written in pieces of about this size. */
const WRITE_CHUNK = 3 * 21_845;

/** Whether the client asked for the streamed form. */
export function wantsNdjson(accept: string | undefined): boolean {
  if (accept === undefined) return false;
  return accept.split(',').some((part) => part.trim().split(';')[0]!.trim().toLowerCase() === NDJSON_CONTENT_TYPE);
}

function outcomeFields(o: ExecOutcome): ExecOutcome {
  return { exitCode: o.exitCode, signal: o.signal, status: o.status, durationMs: o.durationMs, truncated: o.truncated };
}

/** The pieces of one JSON string's contents (no quotes) for a captured stream. */
function* jsonStringPieces(out: CapturedOutput, encoding: OutputEncoding): Generator<string> {
  if (encoding === 'base64') {
    // chunks() are multiples of 3 bytes (but the last), so base64 pieces concatenate.
    for (const c of out.chunks(WRITE_CHUNK)) yield c.toString('base64');
    return;
  }
  const dec = new StringDecoder('utf8');
  for (const c of out.chunks(WRITE_CHUNK)) {
    const s = dec.write(c);
    if (s.length > 0) yield JSON.stringify(s).slice(1, -1);
  }
  const tail = dec.end();
  if (tail.length > 0) yield JSON.stringify(tail).slice(1, -1);
}

/** The whole answer as an object (small outputs, and results kept for idempotent retries). */
export function capturedBody(c: CapturedExec, encoding: OutputEncoding): Record<string, unknown> {
  const body: Record<string, unknown> = {
    ...outcomeFields(c),
    stdout: encoding === 'base64' ? c.stdout.bytes().toString('base64') : c.stdout.bytes().toString('utf8'),
    stderr: encoding === 'base64' ? c.stderr.bytes().toString('base64') : c.stderr.bytes().toString('utf8'),
  };
  if (encoding === 'base64') body.encoding = 'base64';
  return body;
}

/**
 * Send a finished exec as the JSON answer, in pieces with back-pressure.
 * Resolves false when the client went away before the end.
 */
export async function sendCapturedJson(res: Response, c: CapturedExec, encoding: OutputEncoding): Promise<boolean> {
  if (res.completed) return false;
  res.status(200);
  res.header('content-type', 'application/json; charset=utf-8');
  res.header('cache-control', 'no-store');
  if (c.stdout.size + c.stderr.size <= SMALL_ANSWER_BYTES) {
    res.send(JSON.stringify(capturedBody(c, encoding)));
    return true;
  }
  const head: Record<string, unknown> = outcomeFields(c);
  if (encoding === 'base64') head.encoding = 'base64';
  const parts = (function* (): Generator<string> {
    yield `${JSON.stringify(head).slice(0, -1)},"stdout":"`;
    yield* jsonStringPieces(c.stdout, encoding);
    yield '","stderr":"';
    yield* jsonStringPieces(c.stderr, encoding);
    yield '"}';
  })();
  // Coalesce small pieces; write big ones as they come.
  let pending = '';
  for (const p of parts) {
    pending += p;
    if (pending.length < WRITE_CHUNK) continue;
    if (!(await writeChunk(res, pending))) return false;
    pending = '';
  }
  if (pending.length > 0 && !(await writeChunk(res, pending))) return false;
  endChunked(res);
  return true;
}

/** Cut `buf` before an incomplete UTF-8 sequence at its end; returns [whole part, carried tail]. */
export function splitUtf8Tail(buf: Buffer): [Buffer, Buffer] {
  const n = buf.length;
  for (let back = 1; back <= Math.min(3, n); back++) {
    const b = buf[n - back]!;
    if ((b & 0xc0) === 0x80) continue; // continuation byte: look further back
    const need = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
    if (need > back) return [buf.subarray(0, n - back), buf.subarray(n - back)];
    break;
  }
  return [buf, buf.subarray(n)];
}

/** One NDJSON output line for a chunk (UTF-8 text when it is, base64 otherwise or when asked). */
export function outputLine(stream: 'stdout' | 'stderr', chunk: Buffer, encoding: OutputEncoding): string {
  if (encoding === 'utf8' && isUtf8(chunk)) return `${JSON.stringify({ type: stream, data: chunk.toString('utf8') })}\n`;
  return `${JSON.stringify({ type: stream, data: chunk.toString('base64'), encoding: 'base64' })}\n`;
}

/**
 * Stream a running exec as NDJSON. Both output streams are written as they
 * come; when the client cannot take more, both pipes are paused (the command
 * blocks on them). A client that goes away kills the command, unless
 * `keepRunning` (an idempotent exec): then its output is drained unread.
 */
export async function streamLiveNdjson(
  res: Response,
  live: LiveExec,
  encoding: OutputEncoding,
  log: (line: string) => void,
  opts: { keepRunning?: boolean } = {},
): Promise<ExecOutcome | null> {
  res.status(200);
  res.header('content-type', NDJSON_CONTENT_TYPE);
  res.header('cache-control', 'no-store');
  let gone = false;
  const onGone = () => {
    if (gone) return;
    gone = true;
    // An idempotent exec goes on without its reader (a retry attaches to it): its output is drained.
    if (opts.keepRunning) return;
    live.kill();
    live.stdout.destroy();
    live.stderr.destroy();
  };
  res.once('close', onGone);
  // One writer at a time, in order; a stream that has a write waiting is paused.
  let chain: Promise<void> = Promise.resolve();
  const pump = (stream: 'stdout' | 'stderr') => {
    const src = live[stream];
    let carry: Buffer = Buffer.alloc(0);
    src.on('data', (chunk: Buffer) => {
      let data = carry.length > 0 ? Buffer.concat([carry, chunk]) : chunk;
      if (encoding === 'utf8') [data, carry] = splitUtf8Tail(data);
      if (carry.length > 0) carry = Buffer.from(carry);
      if (data.length === 0) return;
      const line = outputLine(stream, data, encoding);
      src.pause();
      chain = chain.then(async () => {
        if (!gone && !(await writeChunk(res, line))) onGone();
        if (!src.destroyed) src.resume();
      });
    });
    return new Promise<void>((resolve) => {
      const end = () => {
        if (carry.length > 0) {
          const line = outputLine(stream, carry, encoding);
          carry = Buffer.alloc(0);
          chain = chain.then(async () => {
            if (!gone && !(await writeChunk(res, line))) onGone();
          });
        }
        resolve();
      };
      src.once('end', end);
      src.once('close', end);
    });
  };
  try {
    const [, , outcome] = await Promise.all([pump('stdout'), pump('stderr'), live.done]);
    await chain;
    if (gone || res.completed) return outcome;
    await writeChunk(res, `${JSON.stringify({ type: 'exit', ...outcomeFields(outcome) })}\n`);
    endChunked(res);
    return outcome;
  } catch (err) {
    const e = err instanceof WarrenError ? err : asWarrenError(err);
    log(`exec stream failed: ${e.code}: ${e.message}`);
    if (!res.completed) {
      await writeChunk(res, `${JSON.stringify({ type: 'error', error: { code: e.code, message: e.message } })}\n`);
      endChunked(res);
    }
    return null;
  } finally {
    res.off('close', onGone);
  }
}
