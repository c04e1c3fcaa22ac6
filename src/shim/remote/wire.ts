/**
 * The shim protocol's wire: what a gateway and a node exchange to carry the
 * Shim contract across machines (docs/shim-protocol.md). Both ends import
 * this one description, so a method's kind and arity cannot drift apart.
 *
 * - Values are JSON; a Buffer travels as {"$b": base64} and a Set as
 *   {"$set": [...]}. Nothing else needs tagging: the contract's arguments and
 *   answers are data.
 * - Errors travel as Warren's own error body ({error: {code, message,
 *   details}}) and are rebuilt as WarrenError with the same stable code.
 */
import { ErrorCodes, WarrenError, asWarrenError } from '../../errors';
import { defineKey, lookupTable } from '../../validation';

export const SHIM_PROTOCOL_VERSION = 1;
export const SHIM_BASE = '/shim/v1';

/** Largest JSON request or answer line the server reads (file bodies and tars travel raw). */
export const MAX_JSON_BYTES = 16 * 1024 * 1024;

/**
 * How each method travels:
 * - call:   one JSON request, one JSON answer
 * - raw-in: one argument (a Buffer, at METHODS[m].raw) is the request body; the others are in the x-shim-args header
 * - raw-out: the answer (a Buffer or a byte stream) is the response body
 * - live:   the answer is an exec whose output streams as binary frames (FRAME)
 * - captured: as live, the node keeps nothing once the frames are sent
 * - progress: NDJSON progress frames, then the answer
 * - ws:     a WebSocket (execStream, sessions, VNC)
 */
export type MethodKind = 'call' | 'raw-in' | 'raw-out' | 'live' | 'captured' | 'progress' | 'ws';

/**
 * Shim methods by name, with their argument count (optional trailing arguments included) and,
 * for raw-in methods, the argument the request body fills.
 */
export const METHODS: Record<string, { kind: MethodKind; args: number; optional?: number; raw?: number }> = lookupTable({
  features: { kind: 'call', args: 0 },
  createSandbox: { kind: 'call', args: 2, optional: 1 },
  getSandbox: { kind: 'call', args: 1 },
  listSandboxes: { kind: 'call', args: 1, optional: 1 },
  listSandboxesPage: { kind: 'call', args: 2 },
  sandboxUsage: { kind: 'call', args: 1 },
  deleteSandbox: { kind: 'call', args: 1 },
  exec: { kind: 'call', args: 2 },
  execCaptured: { kind: 'captured', args: 2 },
  execLive: { kind: 'live', args: 2 },
  execStream: { kind: 'ws', args: 2 },
  supervisedReason: { kind: 'call', args: 1 },
  execSupervised: { kind: 'live', args: 3 },
  followSupervised: { kind: 'live', args: 2 },
  dropSupervised: { kind: 'call', args: 2 },
  sweepSupervised: { kind: 'call', args: 2 },
  readFile: { kind: 'raw-out', args: 3 },
  writeFile: { kind: 'raw-in', args: 4, optional: 1, raw: 2 },
  listDir: { kind: 'call', args: 2 },
  watchDir: { kind: 'ws', args: 3 },
  screenshot: { kind: 'call', args: 2, optional: 1 },
  sendInput: { kind: 'call', args: 2 },
  openVnc: { kind: 'ws', args: 1 },
  uploadTar: { kind: 'raw-in', args: 3, raw: 2 },
  downloadTar: { kind: 'raw-out', args: 2 },
  openSession: { kind: 'ws', args: 2 },
  attachSession: { kind: 'ws', args: 3 },
  listSessions: { kind: 'call', args: 1 },
  pauseSandbox: { kind: 'call', args: 1 },
  resumeSandbox: { kind: 'call', args: 1 },
  pauseSandboxes: { kind: 'call', args: 1 },
  resumeSandboxes: { kind: 'call', args: 1 },
  hibernateSandbox: { kind: 'call', args: 1 },
  extendSandbox: { kind: 'call', args: 2 },
  packSandbox: { kind: 'call', args: 3 },
  environment: { kind: 'call', args: 2, optional: 1 },
  listEnvironments: { kind: 'call', args: 1, optional: 1 },
  authorizeContent: { kind: 'call', args: 2 },
  publishEnvironment: { kind: 'call', args: 2 },
  updateNetwork: { kind: 'call', args: 2 },
  networkInfo: { kind: 'call', args: 1 },
  sandboxStats: { kind: 'call', args: 1 },
  listImages: { kind: 'call', args: 1, optional: 1 },
  importImage: { kind: 'progress', args: 1 },
  pushImage: { kind: 'progress', args: 1 },
  stageImage: { kind: 'progress', args: 1 },
  layerStates: { kind: 'call', args: 1, optional: 1 },
  removeImage: { kind: 'call', args: 1 },
  // FnCall (FnCallApi), named with their prefix
  'functions.anonymousRunCode': { kind: 'call', args: 0 },
  'functions.listPools': { kind: 'call', args: 0 },
  'functions.createPool': { kind: 'call', args: 3, optional: 1 },
  'functions.poolStats': { kind: 'call', args: 1 },
  'functions.deletePool': { kind: 'call', args: 1 },
  'functions.invoke': { kind: 'call', args: 3 },
  'functions.judge': { kind: 'call', args: 3 },
  'functions.batch': { kind: 'call', args: 4, optional: 1 },
  'functions.runCode': { kind: 'call', args: 2 },
  'functions.runJupyter': { kind: 'call', args: 2 },
  'functions.languages': { kind: 'call', args: 0 },
  'functions.ensureToolkit': { kind: 'call', args: 1 },
});

/** What GET /shim/v1/hello answers: who the node is and what it offers. */
export interface Hello {
  protocol: number;
  nodeId: string;
  functions: boolean;
  /** Optional Shim methods this node implements. */
  optional: string[];
}

export const OPTIONAL_METHODS = ['screenshot', 'sendInput', 'openVnc', 'sandboxStats', 'pushImage', 'stageImage', 'layerStates', 'removeImage'] as const;

/**
 * Exec output answers (live and captured) are binary frames: a type byte, a
 * 4-byte big-endian length, the payload. Output travels as it is, with no
 * base64 or JSON around it; the outcome is one JSON frame at the end.
 */
export const FRAME = { stdout: 1, stderr: 2, json: 3 } as const;
export const MAX_FRAME_BYTES = 4 * 1024 * 1024;
export const FRAMES_TYPE = 'application/vnd.warren.frames';

export function frame(type: number, payload: Buffer | string): Buffer {
  const body = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const head = Buffer.allocUnsafe(5);
  head[0] = type;
  head.writeUInt32BE(body.length, 1);
  return Buffer.concat([head, body]);
}

/** Splits a byte stream into frames; a frame of an unknown type or past MAX_FRAME_BYTES is an error. */
/** The payload length of the frame whose header starts `buf`, checked before any of it is kept. */
function frameLength(buf: Buffer): number {
  const type = buf[0]!;
  const len = buf.readUInt32BE(1);
  if (type !== FRAME.stdout && type !== FRAME.stderr && type !== FRAME.json) throw new WarrenError('UNAVAILABLE', `shim protocol: a frame of unknown type ${type}`);
  if (len > MAX_FRAME_BYTES) throw new WarrenError('UNAVAILABLE', `shim protocol: a frame of ${len} bytes (the bound is ${MAX_FRAME_BYTES})`);
  return len;
}

export class FrameReader {
  private parts: Buffer[] = [];
  private size = 0;
  /** Bytes the frame being read needs in all (header included), once its header is in. */
  private need = 5;
  constructor(private readonly onFrame: (type: number, payload: Buffer) => void) {}
  push(chunk: Buffer): void {
    this.parts.push(chunk);
    this.size += chunk.length;
    // Joined only when a whole frame is in: a frame read in many chunks is copied once.
    while (this.size >= this.need) {
      let buf = this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts, this.size);
      while (buf.length >= 5) {
        const len = frameLength(buf);
        if (buf.length < 5 + len) break;
        this.onFrame(buf[0]!, buf.subarray(5, 5 + len));
        buf = buf.subarray(5 + len);
      }
      this.parts = buf.length > 0 ? [buf] : [];
      this.size = buf.length;
      this.need = buf.length >= 5 ? 5 + frameLength(buf) : 5;
    }
  }
  /** Bytes of an unfinished frame (non-zero at the end: the answer was cut). */
  get pending(): number {
    return this.size;
  }
}

export function encode(value: unknown): unknown {
  if (Buffer.isBuffer(value)) return { $b: value.toString('base64') };
  if (value instanceof Uint8Array) return { $b: Buffer.from(value.buffer, value.byteOffset, value.byteLength).toString('base64') };
  if (value instanceof Set) return { $set: [...value].map(encode) };
  if (Array.isArray(value)) return value.map(encode);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) if (v !== undefined) defineKey(out, k, encode(v));
    return out;
  }
  return value;
}

const MAX_DEPTH = 64;

export function decode(value: unknown, depth = 0): unknown {
  if (depth > MAX_DEPTH) throw new WarrenError('INVALID_ARGUMENT', 'shim protocol: value nested too deeply');
  if (Array.isArray(value)) return value.map((v) => decode(v, depth + 1));
  if (value !== null && typeof value === 'object') {
    const o = value as Record<string, unknown>;
    const keys = Object.keys(o);
    if (keys.length === 1 && keys[0] === '$b') {
      if (typeof o.$b !== 'string') throw new WarrenError('INVALID_ARGUMENT', 'shim protocol: $b must be base64 text');
      return Buffer.from(o.$b, 'base64');
    }
    if (keys.length === 1 && keys[0] === '$set') {
      if (!Array.isArray(o.$set)) throw new WarrenError('INVALID_ARGUMENT', 'shim protocol: $set must be an array');
      return new Set(o.$set.map((v) => decode(v, depth + 1)));
    }
    const out: Record<string, unknown> = {};
    for (const k of keys) defineKey(out, k, decode(o[k], depth + 1));
    return out;
  }
  return value;
}

export function errorJson(err: unknown): { code: string; message: string; details?: Record<string, unknown> } {
  const e = asWarrenError(err);
  return e.details !== undefined ? { code: e.code, message: e.message, details: e.details } : { code: e.code, message: e.message };
}

/** The WarrenError an error body names; a body that is not one is the peer's fault (UNAVAILABLE). */
export function errorFrom(body: unknown, fallback: string): WarrenError {
  const e = (body as { error?: unknown } | null)?.error as { code?: unknown; message?: unknown; details?: unknown } | undefined;
  if (e && typeof e.code === 'string' && typeof e.message === 'string') {
    const details = e.details !== null && typeof e.details === 'object' && !Array.isArray(e.details) ? (e.details as Record<string, unknown>) : undefined;
    // A code this side does not know (a newer node) stays visible to whoever reads the error.
    if (!Object.hasOwn(ErrorCodes, e.code)) return new WarrenError('INTERNAL', `the node answered ${e.code.slice(0, 64)}: ${e.message}`, { ...details, nodeCode: e.code.slice(0, 64) });
    return new WarrenError(e.code as WarrenError['code'], e.message, details);
  }
  return new WarrenError('UNAVAILABLE', fallback);
}

/** The arguments of a call, checked against the method's arity. */
export function checkArgs(method: string, args: unknown): unknown[] {
  const m = METHODS[method];
  if (m === undefined) throw new WarrenError('NOT_FOUND', `shim protocol: no method ${JSON.stringify(method).slice(0, 60)}`);
  if (!Array.isArray(args)) throw new WarrenError('INVALID_ARGUMENT', `shim protocol: ${method}: args must be an array`);
  const min = m.args - (m.optional ?? 0);
  if (args.length < min || args.length > m.args) throw new WarrenError('INVALID_ARGUMENT', `shim protocol: ${method} takes ${min === m.args ? m.args : `${min}..${m.args}`} arguments, got ${args.length}`);
  return decode(args) as unknown[];
}
