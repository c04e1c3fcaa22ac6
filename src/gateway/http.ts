/**
 * HTTP plumbing shared by the routes: error bodies, bounded body reading,
 * streaming responses.
 */
import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import type { Request, Response } from 'hyper-express';
import { WarrenError, asWarrenError } from '../errors';

export const JSON_BODY_LIMIT = 1024 * 1024;
export const DEFAULT_UPLOAD_LIMIT = 256 * 1024 * 1024;

export type Log = (line: string) => void;

/**
 * The error a client may see. WarrenErrors pass through (their messages are
 * written for clients); anything else becomes INTERNAL with a reference, and
 * the details (stack included) go to the log only.
 */
export function publicError(err: unknown, log: Log): WarrenError {
  const known = asWarrenError(err);
  if (err instanceof WarrenError || known.code !== 'INTERNAL') {
    // The platform's own failures are worth a log line; a full (sandbox) disk is the caller's news.
    if (known.status >= 500 && known.code !== 'DISK_FULL' && known.code !== 'NOT_SUPPORTED') log(`error ${known.code}: ${known.message}`);
    return known;
  }
  const ref = randomBytes(6).toString('hex');
  const detail = err instanceof Error ? (err.stack ?? err.message) : String(err);
  log(`internal error ref=${ref}: ${detail}`);
  return new WarrenError('INTERNAL', `internal error (ref ${ref})`);
}

export function errorBody(err: WarrenError): string {
  return JSON.stringify(err.toJSON());
}

/** Send `{error:{code,message}}` with the error's status. `close` also closes the connection (used when a body was not read). */
export function sendError(res: Response, err: unknown, log: Log, close = false): void {
  if (res.completed) return;
  writeError(res, publicError(err, log), close);
}

/** Write an error that is already public (see publicError). */
export function writeError(res: Response, e: WarrenError, close = false): void {
  if (res.completed) return;
  res.status(e.status);
  res.header('content-type', 'application/json; charset=utf-8');
  res.header('cache-control', 'no-store');
  if (close) res.header('connection', 'close');
  res.send(errorBody(e), close);
}

export function sendJson(res: Response, status: number, body: unknown): void {
  if (res.completed) return;
  res.status(status);
  res.header('content-type', 'application/json; charset=utf-8');
  res.header('cache-control', 'no-store');
  res.send(JSON.stringify(body));
}

export function sendEmpty(res: Response, status = 204): void {
  if (res.completed) return;
  res.status(status).send();
}

/**
 * Read a request body of at most `limit` bytes. Oversized bodies are refused
 * from their Content-Length before a byte is read (413 PAYLOAD_TOO_LARGE; the
 * caller answers and closes the connection). Bodies must carry a
 * Content-Length: chunked request bodies are refused.
 */
export async function readBody(req: Request, limit: number): Promise<Buffer> {
  const cl = req.headers['content-length'];
  if (cl === undefined || cl === '') {
    if (req.headers['transfer-encoding'] !== undefined) {
      throw new WarrenError('INVALID_ARGUMENT', 'request bodies must have a Content-Length (chunked uploads are not supported)');
    }
    return Buffer.alloc(0);
  }
  if (!/^\d{1,16}$/.test(cl)) throw new WarrenError('INVALID_ARGUMENT', 'invalid Content-Length');
  const length = Number(cl);
  if (length > limit) throw tooLarge(length, limit);
  if (length === 0) return Buffer.alloc(0);
  const buf = await req.buffer();
  if (buf.length > limit) throw tooLarge(buf.length, limit);
  return buf;
}

export function tooLarge(length: number, limit: number): WarrenError {
  return new WarrenError('PAYLOAD_TOO_LARGE', `request body of ${length} bytes exceeds the limit of ${limit} bytes`, { limit });
}

/** Parse a JSON body (≤ 1 MiB). An empty body is `undefined`. */
export async function readJson(req: Request, limit = JSON_BODY_LIMIT): Promise<unknown> {
  const buf = await readBody(req, limit);
  if (buf.length === 0) return undefined;
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch (err) {
    throw new WarrenError('INVALID_ARGUMENT', `request body is not valid JSON: ${(err as Error).message}`);
  }
}

/** Query string of a request as URLSearchParams. */
export function queryOf(req: Request): URLSearchParams {
  return new URLSearchParams(req.path_query);
}

/** The single value of a query parameter; repeated parameters are refused. */
export function queryOne(q: URLSearchParams, name: string): string | undefined {
  const all = q.getAll(name);
  if (all.length > 1) throw new WarrenError('INVALID_ARGUMENT', `query parameter "${name}" given more than once`, { field: name });
  return all[0];
}

/** Refuse query parameters a route does not know. */
export function rejectUnknownQuery(q: URLSearchParams, allowed: readonly string[]): void {
  for (const key of q.keys()) {
    if (!allowed.includes(key)) {
      throw new WarrenError('UNKNOWN_FIELD', `unknown query parameter "${key}"${allowed.length ? ` (allowed: ${allowed.join(', ')})` : ''}`, { field: key });
    }
  }
}

/** The parts of hyper-express's Response that chunked writing needs. */
interface ChunkedInternals {
  _streaming: boolean;
  _initiate_response(): void;
  _raw_response: { write(chunk: string | Buffer): boolean };
}

/**
 * Write one chunk of a chunked answer, respecting back-pressure. Resolves
 * false when the client is gone.
 *
 * This goes to uWS directly: uWS keeps everything `write()` is given and its
 * `false` only means "wait for writable". hyper-express's Writable `write()`
 * sends the chunk again on drain, which duplicates data in the body whenever
 * the client is slower than the server.
 */
export function writeChunk(res: Response, chunk: string | Buffer): Promise<boolean> {
  if (res.completed) return Promise.resolve(false);
  const r = res as unknown as ChunkedInternals;
  r._streaming = true;
  let ok = false;
  res.atomic(() => {
    if (res.completed) return;
    r._initiate_response();
    ok = r._raw_response.write(chunk);
  });
  if (ok || res.completed) return Promise.resolve(!res.completed);
  return new Promise((resolve) => {
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      res.off('close', finish);
      resolve(!res.completed);
    };
    res.once('close', finish);
    res.drain(() => {
      finish();
      return true;
    });
  });
}

/** End a chunked answer begun with writeChunk. */
export function endChunked(res: Response): void {
  if (res.completed) return;
  (res as unknown as ChunkedInternals)._streaming = true;
  res.send();
}

/**
 * Stream a Readable as the response body (chunked). If the source fails after
 * the headers went out, the connection is aborted so the client sees a
 * truncated transfer instead of a short but well-formed body.
 */
export async function streamBody(res: Response, source: Readable, contentType: string, log: Log): Promise<void> {
  res.status(200);
  res.header('content-type', contentType);
  res.header('cache-control', 'no-store');
  const onClose = () => source.destroy();
  res.once('close', onClose);
  try {
    for await (const chunk of source) {
      if (!(await writeChunk(res, chunk as Buffer))) {
        source.destroy();
        return;
      }
    }
    endChunked(res);
  } catch (err) {
    log(`stream aborted: ${asWarrenError(err).message}`);
    if (!res.completed) res.close();
  } finally {
    res.off('close', onClose);
  }
}
