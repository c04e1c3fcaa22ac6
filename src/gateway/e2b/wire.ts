/**
 * Wire formats of the E2B surface, as E2B's SDKs speak them:
 *
 * - the control plane's error body `{"code": <http status>, "message"}`;
 * - the Connect protocol with the JSON codec (envd's process and filesystem
 *   services): unary answers are plain JSON, errors `{"code": "not_found",
 *   "message"}` with the status Connect assigns to the code; server streams
 *   are `application/connect+json` envelopes (1 flag byte, 4-byte big-endian
 *   length, JSON) ending with an end-of-stream envelope (flag 0x02) that
 *   carries `{}` or `{"error": {...}}`;
 * - request bodies that arrive chunked (the SDKs stream their POST bodies).
 *
 * Pure functions except the body reader; the unit tests cover each.
 */
import type { Req, Res } from './http';
import { WarrenError } from '../../errors';

// ---------------------------------------------------------------- errors

/** Connect error codes (https://connectrpc.com/docs/protocol#error-codes) and the HTTP status each maps to. */
export const CONNECT_CODES = {
  canceled: 499,
  unknown: 500,
  invalid_argument: 400,
  deadline_exceeded: 504,
  not_found: 404,
  already_exists: 409,
  permission_denied: 403,
  resource_exhausted: 429,
  failed_precondition: 400,
  aborted: 409,
  out_of_range: 400,
  unimplemented: 501,
  internal: 500,
  unavailable: 503,
  data_loss: 500,
  unauthenticated: 401,
} as const;

export type ConnectCode = keyof typeof CONNECT_CODES;

/** An error of the E2B surface: the HTTP status for REST/plain answers, the Connect code for RPCs. */
export class E2bError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly connectCode: ConnectCode = connectCodeForStatus(status),
  ) {
    super(message);
    this.name = 'E2bError';
  }
}

export function connectCodeForStatus(status: number): ConnectCode {
  switch (status) {
    case 400:
    case 413:
      return 'invalid_argument';
    case 401:
      return 'unauthenticated';
    case 403:
      return 'permission_denied';
    case 404:
      return 'not_found';
    case 409:
      return 'already_exists';
    case 429:
      return 'resource_exhausted';
    case 501:
      return 'unimplemented';
    case 502:
    case 503:
      return 'unavailable';
    case 504:
      return 'deadline_exceeded';
    default:
      return status >= 500 ? 'internal' : 'unknown';
  }
}

/** The Connect code for a Warren error (its code says more than its status). */
export function connectCodeForWarren(e: WarrenError): ConnectCode {
  switch (e.code) {
    case 'SANDBOX_NOT_FOUND':
    case 'FILE_NOT_FOUND':
    case 'NOT_FOUND':
    case 'SESSION_NOT_FOUND':
      return 'not_found';
    case 'ALREADY_EXISTS':
      return 'already_exists';
    case 'SANDBOX_NOT_RUNNING':
      return 'unavailable';
    case 'QUOTA_EXCEEDED':
    case 'RESOURCE_EXHAUSTED':
    case 'PAYLOAD_TOO_LARGE':
      return 'resource_exhausted';
    case 'TIMEOUT':
      return 'deadline_exceeded';
    default:
      return connectCodeForStatus(e.status);
  }
}

/**
 * The E2B view of any error: E2bErrors pass, WarrenErrors keep their status
 * and message (a stopped sandbox looks like E2B's "not running": 502 on the
 * sandbox plane is what the SDK reads as "the sandbox timed out"). Anything
 * else is a 500 with a log reference, never internals.
 */
export function toE2bError(err: unknown, publicError: (err: unknown) => WarrenError): E2bError {
  if (err instanceof E2bError) return err;
  const e = publicError(err);
  return new E2bError(e.status, e.message, connectCodeForWarren(e));
}

/** Control-plane error body: `{"code": <status>, "message"}`. */
export function restErrorBody(e: E2bError): string {
  return JSON.stringify({ code: e.status, message: e.message });
}

/** Connect unary error body. */
export function connectErrorBody(e: E2bError): string {
  return JSON.stringify({ code: e.connectCode, message: e.message });
}

// ---------------------------------------------------------------- envelopes

export const FLAG_COMPRESSED = 0x01;
export const FLAG_END_STREAM = 0x02;
/** Largest envelope accepted from a client (requests are small JSON messages). */
export const MAX_ENVELOPE_BYTES = 4 * 1024 * 1024;

export function encodeEnvelope(flags: number, payload: Buffer | string): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload, 'utf8') : payload;
  const out = Buffer.allocUnsafe(5 + body.length);
  out[0] = flags;
  out.writeUInt32BE(body.length, 1);
  body.copy(out, 5);
  return out;
}

/** A message envelope (flag 0) carrying a JSON message. */
export function messageEnvelope(msg: unknown): Buffer {
  return encodeEnvelope(0, JSON.stringify(msg));
}

/** The end-of-stream envelope: `{}` or `{"error": {code, message}}`. */
export function endEnvelope(error?: E2bError): Buffer {
  return encodeEnvelope(FLAG_END_STREAM, JSON.stringify(error ? { error: { code: error.connectCode, message: error.message } } : {}));
}

export interface Envelope {
  flags: number;
  data: Buffer;
}

/** Split a buffer into whole envelopes; throws E2bError on truncation, compression or oversize. */
export function decodeEnvelopes(buf: Buffer): Envelope[] {
  const out: Envelope[] = [];
  let off = 0;
  while (off < buf.length) {
    if (buf.length - off < 5) throw new E2bError(400, 'truncated Connect envelope header', 'invalid_argument');
    const flags = buf[off]!;
    const len = buf.readUInt32BE(off + 1);
    if (len > MAX_ENVELOPE_BYTES) throw new E2bError(400, `Connect envelope of ${len} bytes exceeds ${MAX_ENVELOPE_BYTES}`, 'resource_exhausted');
    if (flags & FLAG_COMPRESSED) throw new E2bError(400, 'compressed Connect envelopes are not supported (send identity encoding)', 'unimplemented');
    if (buf.length - off - 5 < len) throw new E2bError(400, 'truncated Connect envelope', 'invalid_argument');
    out.push({ flags, data: buf.subarray(off + 5, off + 5 + len) });
    off += 5 + len;
  }
  return out;
}

/**
 * The request message of an RPC: a unary call's body is the JSON message; a
 * streaming call's body is one envelope holding it.
 */
export function decodeRequestMessage(body: Buffer, streaming: boolean): Record<string, unknown> {
  let json: Buffer = body;
  if (streaming) {
    const envs = decodeEnvelopes(body).filter((e) => (e.flags & FLAG_END_STREAM) === 0);
    if (envs.length !== 1) throw new E2bError(400, `a server-streaming request carries exactly one message (got ${envs.length})`, 'invalid_argument');
    json = envs[0]!.data;
  }
  if (json.length === 0) return {};
  let parsed: unknown;
  try {
    parsed = JSON.parse(json.toString('utf8'));
  } catch (err) {
    throw new E2bError(400, `request message is not valid JSON: ${(err as Error).message}`, 'invalid_argument');
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new E2bError(400, 'request message must be a JSON object', 'invalid_argument');
  return parsed as Record<string, unknown>;
}

/** `Connect-Timeout-Ms`: a positive integer of at most 10 digits, else undefined. */
export function parseConnectTimeout(header: string | undefined): number | undefined {
  if (header === undefined || !/^\d{1,10}$/.test(header)) return undefined;
  const n = Number(header);
  return n > 0 ? n : undefined;
}

// ---------------------------------------------------------------- proto3 JSON helpers

/** A proto3 JSON bytes field (standard or URL-safe base64) to a Buffer. */
export function bytesField(v: unknown, field: string): Buffer {
  if (v === undefined || v === null) return Buffer.alloc(0);
  if (typeof v !== 'string' || !/^[A-Za-z0-9+/_-]*={0,2}$/.test(v)) throw new E2bError(400, `${field}: must be base64`, 'invalid_argument');
  return Buffer.from(v, 'base64');
}

export function stringField(v: unknown, field: string, fallback = ''): string {
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'string') throw new E2bError(400, `${field}: must be a string`, 'invalid_argument');
  if (v.includes('\0')) throw new E2bError(400, `${field}: must not contain NUL`, 'invalid_argument');
  return v;
}

/** A proto3 uint32 (JSON number or decimal string). */
export function uintField(v: unknown, field: string, fallback = 0): number {
  if (v === undefined || v === null) return fallback;
  const n = typeof v === 'string' && /^\d{1,10}$/.test(v) ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 0 || n > 0xffffffff) throw new E2bError(400, `${field}: must be an unsigned integer`, 'invalid_argument');
  return n;
}

export function boolField(v: unknown, field: string): boolean {
  if (v === undefined || v === null) return false;
  if (typeof v !== 'boolean') throw new E2bError(400, `${field}: must be true or false`, 'invalid_argument');
  return v;
}

export function objectField(v: unknown, field: string): Record<string, unknown> {
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw new E2bError(400, `${field}: must be an object`, 'invalid_argument');
  return v as Record<string, unknown>;
}

/** A proto3 enum given by name or number. */
export function enumField<T extends string>(v: unknown, field: string, names: Record<T, number>): number {
  if (v === undefined || v === null) return 0;
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  if (typeof v === 'string' && Object.prototype.hasOwnProperty.call(names, v)) return names[v as T];
  throw new E2bError(400, `${field}: unknown value ${JSON.stringify(v)}`, 'invalid_argument');
}

/** google.protobuf.Timestamp in proto3 JSON (RFC 3339, UTC). */
export function timestampJson(ms: number): string {
  return new Date(Math.floor(ms)).toISOString();
}

// ---------------------------------------------------------------- basic auth user

/** `Authorization: Basic base64("<user>:")` → the user name (envd's way of choosing the user), else undefined. */
export function userFromBasicAuth(header: string | undefined): string | undefined {
  if (header === undefined) return undefined;
  const m = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header);
  if (m === null) return undefined;
  const decoded = Buffer.from(m[1]!, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  const user = colon === -1 ? decoded : decoded.slice(0, colon);
  return user === '' ? undefined : user;
}

// ---------------------------------------------------------------- multipart

export interface MultipartPart {
  name: string;
  filename: string | undefined;
  data: Buffer;
}

/** The boundary of a `multipart/form-data` content type, or undefined. */
export function multipartBoundary(contentType: string | undefined): string | undefined {
  if (contentType === undefined || !/^multipart\/form-data\s*;/i.test(contentType)) return undefined;
  const m = /;\s*boundary=(?:"([^"]{1,200})"|([^\s;"]{1,200}))/i.exec(contentType);
  return m === null ? undefined : (m[1] ?? m[2]);
}

const MAX_PARTS = 1000;

/**
 * Parse a whole `multipart/form-data` body. Headers of each part are bounded
 * (8 KiB); filenames are returned raw (the caller validates them as paths).
 */
export function parseMultipart(body: Buffer, boundary: string): MultipartPart[] {
  const delim = Buffer.from(`--${boundary}`);
  const parts: MultipartPart[] = [];
  let pos = body.indexOf(delim);
  if (pos === -1) throw new E2bError(400, 'multipart body has no boundary line', 'invalid_argument');
  for (;;) {
    pos += delim.length;
    if (body[pos] === 0x2d && body[pos + 1] === 0x2d) break; // closing "--"
    if (body[pos] === 0x0d && body[pos + 1] === 0x0a) pos += 2;
    else throw new E2bError(400, 'malformed multipart boundary line', 'invalid_argument');
    const headEnd = body.indexOf('\r\n\r\n', pos);
    if (headEnd === -1 || headEnd - pos > 8192) throw new E2bError(400, 'malformed or oversized multipart part headers', 'invalid_argument');
    const headers = body.subarray(pos, headEnd).toString('utf8').split('\r\n');
    const next = body.indexOf(Buffer.concat([Buffer.from('\r\n'), delim]), headEnd + 4);
    if (next === -1) throw new E2bError(400, 'multipart body is truncated (no closing boundary)', 'invalid_argument');
    let name = '';
    let filename: string | undefined;
    for (const h of headers) {
      const colon = h.indexOf(':');
      if (colon === -1) continue;
      if (h.slice(0, colon).trim().toLowerCase() !== 'content-disposition') continue;
      const value = h.slice(colon + 1);
      const n = /;\s*name="((?:[^"\\]|\\.)*)"/i.exec(value);
      if (n) name = n[1]!.replace(/\\(.)/g, '$1');
      const f = /;\s*filename="((?:[^"\\]|\\.)*)"/i.exec(value);
      if (f) filename = decodeFilename(f[1]!.replace(/\\(.)/g, '$1'));
    }
    parts.push({ name, filename, data: body.subarray(headEnd + 4, next) });
    if (parts.length > MAX_PARTS) throw new E2bError(400, `at most ${MAX_PARTS} files per upload`, 'invalid_argument');
    pos = next + 2;
  }
  return parts;
}

/** Browsers and undici percent-encode `"`, CR and LF in multipart filenames. */
function decodeFilename(raw: string): string {
  return raw.replace(/%22/g, '"').replace(/%0D/gi, '\r').replace(/%0A/gi, '\n');
}

// ---------------------------------------------------------------- request bodies

/**
 * Read a request body of at most `limit` bytes, with a Content-Length or
 * chunked (the SDKs stream their POST bodies). Oversized bodies are refused
 * with 413: from Content-Length before reading, chunked ones as soon as the
 * count passes the limit.
 */
export function readBodyAnyEncoding(req: Req, limit: number): Promise<Buffer> {
  const cl = req.headers['content-length'];
  if (cl !== undefined && cl !== '') {
    if (!/^\d{1,16}$/.test(cl)) return Promise.reject(new E2bError(400, 'invalid Content-Length'));
    const n = Number(cl);
    if (n > limit) return Promise.reject(tooLarge(n, limit));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const raw = req.raw;
    const onData = (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        raw.off('data', onData);
        raw.pause();
        reject(tooLarge(size, limit));
        return;
      }
      chunks.push(c);
    };
    raw.on('data', onData);
    raw.once('end', () => resolve(Buffer.concat(chunks, size)));
    raw.once('error', (err) => reject(new E2bError(400, `reading the request body failed: ${err.message}`)));
  });
}

function tooLarge(n: number, limit: number): E2bError {
  return new E2bError(413, `request body of ${n} bytes exceeds the limit of ${limit} bytes`, 'resource_exhausted');
}

/** Whether the request body has not been consumed (the connection is then closed after an error answer). */
export function bodyPending(req: Req): boolean {
  return !req.received;
}

/** Write a JSON body with a status (no-op once the response is done). */
export function sendJsonBody(res: Res, status: number, body: string, contentType = 'application/json'): void {
  if (res.completed) return;
  res.status(status);
  res.header('content-type', contentType);
  res.send(body);
}
