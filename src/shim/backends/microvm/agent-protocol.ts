/**
 * The wire protocol between the shim and warren-agent (native/guest-agent/agent.c)
 * over the microVM's virtio-serial port. Pure: encoders and a bounded decoder.
 *
 * Every frame: u8 type, u32 channel, u32 length (little endian), payload.
 * The guest is untrusted: the decoder refuses frames longer than
 * MAX_AGENT_FRAME and never holds more than one frame's worth of bytes, and
 * every payload is checked before it is used.
 */
import { WarrenError } from '../../../errors';

export const AgentType = {
  EXEC: 1,
  STDIN: 2,
  STDIN_EOF: 3,
  KILL: 4,
  READ: 5,
  WRITE: 6,
  LIST: 7,
  MKDIRS: 8,
  KIND: 9,
  SHUTDOWN: 10,
  PING: 11,
  /** The writable layer as a tar stream on the channel's stdout (a fixed command the guest runs outside the sandbox root). */
  EXPORT: 12,
  /** A file request (READ, WRITE, LIST, KIND, MKDIRS) run with a user's filesystem identity: u32 uid, u32 gid, u8 type, then its payload. */
  AS: 13,
  /** Set the guest's clock: u64 ns since the epoch (a restored guest's clock stopped at its snapshot). */
  CLOCK: 14,
  // guest -> host
  HELLO: 0x81,
  OUT: 0x82,
  EXIT: 0x83,
  OK: 0x84,
  ERR: 0x85,
  STARTED: 0x87,
} as const;

export const AGENT_HEADER = 9;
/** Largest payload either side sends (the agent's buffer is the same size). */
export const MAX_AGENT_PAYLOAD = 256 * 1024;
/** Largest frame the host accepts from the guest. */
export const MAX_AGENT_FRAME = AGENT_HEADER + MAX_AGENT_PAYLOAD;

export interface AgentFrame {
  type: number;
  chan: number;
  payload: Buffer;
}

export function encodeFrame(type: number, chan: number, payload?: Buffer): Buffer {
  const len = payload?.length ?? 0;
  if (len > MAX_AGENT_PAYLOAD) throw new WarrenError('INTERNAL', `agent frame of ${len} bytes exceeds ${MAX_AGENT_PAYLOAD}`);
  const b = Buffer.allocUnsafe(AGENT_HEADER + len);
  b[0] = type;
  b.writeUInt32LE(chan >>> 0, 1);
  b.writeUInt32LE(len, 5);
  if (payload) payload.copy(b, AGENT_HEADER);
  return b;
}

/** NUL-separated strings (none may contain NUL). */
export function cstrings(parts: string[]): Buffer {
  for (const p of parts) if (p.includes('\0')) throw new WarrenError('INVALID_ARGUMENT', 'arguments, environment and paths must not contain NUL bytes');
  return Buffer.from(parts.map((p) => `${p}\0`).join(''), 'utf8');
}

export function encodeExec(chan: number, o: { argv: string[]; env: string[]; cwd: string; uid: number; gid: number }): Buffer {
  return encodeFrame(AgentType.EXEC, chan, cstrings([o.cwd, String(o.uid), String(o.gid), String(o.argv.length), ...o.argv, String(o.env.length), ...o.env]));
}

export function encodeRead(chan: number, path: string, maxBytes: number): Buffer {
  const p = cstrings([path]);
  const b = Buffer.alloc(8 + p.length);
  b.writeBigUInt64LE(BigInt(maxBytes), 0);
  p.copy(b, 8);
  return encodeFrame(AgentType.READ, chan, b);
}

/** First chunk (`create`) truncates and makes parent dirs; later chunks append. */
export function encodeWrite(chan: number, path: string, mode: number, create: boolean, data: Buffer): Buffer {
  const p = cstrings([path]);
  const b = Buffer.alloc(8 + p.length + data.length);
  b.writeUInt32LE(mode & 0o7777, 0);
  b.writeUInt32LE(create ? 1 : 0, 4);
  p.copy(b, 8);
  data.copy(b, 8 + p.length);
  return encodeFrame(AgentType.WRITE, chan, b);
}

/** Bytes AS adds in front of the file request it carries. */
export const AS_OVERHEAD = 9;

/** Wrap the file request `frame` so the guest runs it as uid/gid (fsuid/fsgid, no supplementary groups). */
export function encodeAs(chan: number, uid: number, gid: number, frame: Buffer): Buffer {
  const b = Buffer.alloc(AS_OVERHEAD + frame.length - AGENT_HEADER);
  b.writeUInt32LE(uid >>> 0, 0);
  b.writeUInt32LE(gid >>> 0, 4);
  b[8] = frame[0]!;
  frame.copy(b, AS_OVERHEAD, AGENT_HEADER);
  return encodeFrame(AgentType.AS, chan, b);
}

export function encodeMkdirs(chan: number, path: string, mode: number): Buffer {
  const p = cstrings([path]);
  const b = Buffer.alloc(4 + p.length);
  b.writeUInt32LE(mode & 0o7777, 0);
  p.copy(b, 4);
  return encodeFrame(AgentType.MKDIRS, chan, b);
}

/**
 * Cuts the agent's byte stream into frames. Throws (the caller then drops the
 * connection and fails the sandbox) on a frame longer than the limit.
 */
export class AgentDecoder {
  private pending: Buffer | null = null;

  constructor(private readonly maxPayload = MAX_AGENT_PAYLOAD) {}

  get buffered(): number {
    return this.pending?.length ?? 0;
  }

  push(chunk: Buffer, out: AgentFrame[] = []): AgentFrame[] {
    let buf = this.pending ? Buffer.concat([this.pending, chunk]) : chunk;
    this.pending = null;
    let off = 0;
    while (buf.length - off >= AGENT_HEADER) {
      const len = buf.readUInt32LE(off + 5);
      if (len > this.maxPayload) throw new WarrenError('INTERNAL', `guest agent sent a ${len}-byte frame (limit ${this.maxPayload})`);
      if (buf.length - off < AGENT_HEADER + len) break;
      out.push({ type: buf[off]!, chan: buf.readUInt32LE(off + 1), payload: buf.subarray(off + AGENT_HEADER, off + AGENT_HEADER + len) });
      off += AGENT_HEADER + len;
    }
    if (off < buf.length) this.pending = Buffer.from(buf.subarray(off));
    buf = Buffer.alloc(0);
    return out;
  }
}

const ERRNO: Record<number, [import('../../../errors').ErrorCode, string]> = {
  // as a container's files API answers them (the native walk's classes)
  1: ['FORBIDDEN', 'operation not permitted'],
  2: ['FILE_NOT_FOUND', 'no such file or directory'],
  13: ['FORBIDDEN', 'permission denied'],
  17: ['ALREADY_EXISTS', 'file exists'],
  18: ['PATH_ESCAPE', 'path leaves the sandbox root'],
  20: ['FILE_NOT_FOUND', 'not a directory'],
  21: ['INVALID_ARGUMENT', 'is a directory'],
  22: ['INVALID_ARGUMENT', 'invalid argument'],
  27: ['PAYLOAD_TOO_LARGE', 'file too large'],
  28: ['DISK_FULL', 'no space left on the sandbox disk'],
  36: ['INVALID_ARGUMENT', 'file name too long'],
  40: ['PATH_ESCAPE', 'too many levels of symbolic links'],
};

/** An ERR frame as a WarrenError (the message text from the guest is cut and only quoted). */
export function agentError(payload: Buffer, what: string): WarrenError {
  const errno = payload.length >= 4 ? payload.readUInt32LE(0) : 0;
  const detail = payload.subarray(4, 4 + 200).toString('utf8').replace(/[^\x20-\x7e]/g, '?');
  const [code, text] = ERRNO[errno] ?? ['INTERNAL', `errno ${errno}`];
  return new WarrenError(code, `${what}: ${text} (${detail})`, { errno }, errno);
}

export function encodeClock(chan: number, epochNs: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(epochNs, 0);
  return encodeFrame(AgentType.CLOCK, chan, b);
}
