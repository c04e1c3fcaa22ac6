/**
 * The wire protocol of the session holder (native/helper/session/warren-session.c),
 * documented in docs/session-holder.md. Pure: encoders and a streaming decoder,
 * no I/O.
 *
 * Every frame is a little-endian header { u8 type, u32 length } and `length`
 * bytes of payload.
 */
import { WarrenError } from '../../errors';

export const FrameType = {
  // client -> holder
  ATTACH: 0x01,
  INPUT: 0x02,
  RESIZE: 0x03,
  SIGNAL: 0x04,
  MARK: 0x05,
  INFO: 0x06,
  CLOSE: 0x07,
  // holder -> client
  OUTPUT: 0x81,
  LOST: 0x82,
  EXIT: 0x83,
  INFO_REPLY: 0x84,
  CLOSED: 0x85,
} as const;

export const StreamId = { stdout: 1, stderr: 2, status: 3, pty: 4 } as const;
export type StreamName = keyof typeof StreamId;
const streamNames: Record<number, StreamName> = { 1: 'stdout', 2: 'stderr', 3: 'status', 4: 'pty' };

/** SIGNAL targets. */
export const SignalTarget = {
  /** The holder's direct child (the shell, or the helper that runs it). */
  CHILD: 0,
  /** pty: the terminal's foreground process group; command: every descendant started since the last MARK. */
  FOREGROUND: 1,
  /** Every descendant of the holder, the shell included. */
  TREE: 2,
  /** Command mode: the shell (every descendant holding the session's stdin pipe; commands do not). */
  SHELL: 3,
} as const;

/** The signal that makes the shell abandon the running command (trapped by the command wrapper). */
export const ABORT_SIGNAL = 28; // SIGWINCH: ignored by default, so a stray one is harmless

export const HEADER_BYTES = 5;
/** Largest INPUT payload the holder accepts; longer input is split. */
export const MAX_INPUT_FRAME = 65536;
/** Largest frame the decoder accepts from a holder (OUTPUT is at most 64 KiB + 9, INFO at most ~17 KiB). */
export const MAX_HOLDER_FRAME = 1 << 20;

/** What a holder reports in its INFO frame. */
export interface HolderInfo {
  mode: 'command' | 'pty';
  /** The holder's pid. */
  pid: number;
  /** Its child's pid (the shell, or the helper that runs it). */
  childPid: number;
  createdAt: string;
  /** The next output offset (total output bytes so far, status bytes included). */
  outputOffset: number;
  /** Offset of the oldest byte still in the buffer. */
  oldestOffset: number;
  bufferBytes: number;
  alive: boolean;
  exitCode: number | null;
  exitSignal: number | null;
  /** Connections to the holder right now (the asking one included). */
  clients: number;
  /** Command mode: the last status lines ("<commandId> <exitCode>"), oldest first, kept outside the ring. */
  recentStatus?: string[];
  /** The --info JSON given at spawn. */
  info: Record<string, unknown>;
}

export type HolderFrame =
  | { type: 'output'; stream: StreamName; offset: number; data: Buffer }
  | { type: 'lost'; bytes: number }
  | { type: 'exit'; exitCode: number | null; signal: number | null }
  | { type: 'info'; info: HolderInfo }
  | { type: 'closed' };

function frame(type: number, payload?: Buffer): Buffer {
  const len = payload ? payload.length : 0;
  const b = Buffer.allocUnsafe(HEADER_BYTES + len);
  b[0] = type;
  b.writeUInt32LE(len, 1);
  if (payload) payload.copy(b, HEADER_BYTES);
  return b;
}

function u64(n: number, what: string): bigint {
  if (!Number.isSafeInteger(n) || n < 0) throw new WarrenError('INVALID_ARGUMENT', `${what} must be a non-negative integer, got ${n}`);
  return BigInt(n);
}

export function encodeAttach(fromOffset: number): Buffer {
  const b = Buffer.allocUnsafe(HEADER_BYTES + 8);
  b[0] = FrameType.ATTACH;
  b.writeUInt32LE(8, 1);
  b.writeBigUInt64LE(u64(fromOffset, 'fromOffset'), HEADER_BYTES);
  return b;
}

/** INPUT frames for `data`, split at MAX_INPUT_FRAME, concatenated into one buffer. */
export function encodeInput(data: Buffer | string): Buffer {
  const buf = typeof data === 'string' ? Buffer.from(data, 'utf8') : data;
  if (buf.length <= MAX_INPUT_FRAME) {
    const b = Buffer.allocUnsafe(HEADER_BYTES + buf.length);
    b[0] = FrameType.INPUT;
    b.writeUInt32LE(buf.length, 1);
    buf.copy(b, HEADER_BYTES);
    return b;
  }
  const parts: Buffer[] = [];
  for (let i = 0; i < buf.length; i += MAX_INPUT_FRAME) parts.push(frame(FrameType.INPUT, buf.subarray(i, i + MAX_INPUT_FRAME)));
  return Buffer.concat(parts);
}

export function encodeResize(cols: number, rows: number): Buffer {
  for (const [k, v] of [['cols', cols], ['rows', rows]] as const) {
    if (!Number.isInteger(v) || v < 1 || v > 65535) throw new WarrenError('INVALID_ARGUMENT', `${k} must be an integer in 1..65535, got ${v}`);
  }
  const p = Buffer.allocUnsafe(4);
  p.writeUInt16LE(cols, 0);
  p.writeUInt16LE(rows, 2);
  return frame(FrameType.RESIZE, p);
}

export function encodeSignal(signo: number, target: number): Buffer {
  if (!Number.isInteger(signo) || signo < 1 || signo > 64) throw new WarrenError('INVALID_ARGUMENT', `signal must be an integer in 1..64, got ${signo}`);
  if (target !== 0 && target !== 1 && target !== 2 && target !== 3) throw new WarrenError('INVALID_ARGUMENT', `bad signal target ${target}`);
  return frame(FrameType.SIGNAL, Buffer.from([signo, target]));
}

const MARK = frame(FrameType.MARK);
const INFO = frame(FrameType.INFO);
const CLOSE = frame(FrameType.CLOSE);
export function encodeMark(): Buffer { return MARK; }
export function encodeInfo(): Buffer { return INFO; }
export function encodeClose(): Buffer { return CLOSE; }

/** A raw frame, as cut from the byte stream. */
export interface RawFrame {
  type: number;
  payload: Buffer;
}

/**
 * Cuts a byte stream into frames; chunks may split frames anywhere. Payloads
 * of frames that arrived whole in one chunk are views into that chunk (no copy).
 */
export class FrameDecoder {
  private pending: Buffer | null = null;

  constructor(private readonly maxFrame = MAX_HOLDER_FRAME) {}

  /** Bytes held back waiting for the rest of a frame. */
  get buffered(): number {
    return this.pending ? this.pending.length : 0;
  }

  push(chunk: Buffer, out: RawFrame[] = []): RawFrame[] {
    let buf = chunk;
    if (this.pending) {
      buf = Buffer.concat([this.pending, chunk]);
      this.pending = null;
    }
    let off = 0;
    while (buf.length - off >= HEADER_BYTES) {
      const len = buf.readUInt32LE(off + 1);
      if (len > this.maxFrame) throw new WarrenError('INTERNAL', `session holder sent a ${len}-byte frame (limit ${this.maxFrame})`);
      if (buf.length - off < HEADER_BYTES + len) break;
      out.push({ type: buf[off]!, payload: buf.subarray(off + HEADER_BYTES, off + HEADER_BYTES + len) });
      off += HEADER_BYTES + len;
    }
    if (off < buf.length) this.pending = Buffer.from(buf.subarray(off)); // copy: do not pin a large chunk
    return out;
  }
}

/** Interpret a frame sent by a holder. */
export function parseHolderFrame(f: RawFrame): HolderFrame {
  const p = f.payload;
  switch (f.type) {
    case FrameType.OUTPUT: {
      if (p.length < 9) break;
      const stream = streamNames[p[0]!];
      if (!stream) break;
      return { type: 'output', stream, offset: Number(p.readBigUInt64LE(1)), data: p.subarray(9) };
    }
    case FrameType.LOST:
      if (p.length !== 8) break;
      return { type: 'lost', bytes: Number(p.readBigUInt64LE(0)) };
    case FrameType.EXIT: {
      if (p.length !== 8) break;
      const code = p.readInt32LE(0);
      const sig = p.readInt32LE(4);
      return { type: 'exit', exitCode: sig ? null : code, signal: sig ? sig : null };
    }
    case FrameType.INFO_REPLY:
      try {
        return { type: 'info', info: JSON.parse(p.toString('utf8')) as HolderInfo };
      } catch {
        break;
      }
    case FrameType.CLOSED:
      return { type: 'closed' };
  }
  throw new WarrenError('INTERNAL', `malformed frame from session holder (type 0x${f.type.toString(16)}, ${p.length} bytes)`);
}

/** Encode holder->client frames (for tests and fakes). */
export const encodeHolderFrame = {
  output(stream: StreamName, offset: number, data: Buffer): Buffer {
    const p = Buffer.allocUnsafe(9 + data.length);
    p[0] = StreamId[stream];
    p.writeBigUInt64LE(u64(offset, 'offset'), 1);
    data.copy(p, 9);
    return frame(FrameType.OUTPUT, p);
  },
  lost(bytes: number): Buffer {
    const p = Buffer.allocUnsafe(8);
    p.writeBigUInt64LE(u64(bytes, 'bytes'), 0);
    return frame(FrameType.LOST, p);
  },
  exit(code: number, signal: number): Buffer {
    const p = Buffer.allocUnsafe(8);
    p.writeInt32LE(code, 0);
    p.writeInt32LE(signal, 4);
    return frame(FrameType.EXIT, p);
  },
  info(info: HolderInfo): Buffer {
    return frame(FrameType.INFO_REPLY, Buffer.from(JSON.stringify(info)));
  },
  closed(): Buffer {
    return frame(FrameType.CLOSED);
  },
};

const COMMAND_ID = /^[A-Za-z0-9_-]{1,64}$/;

export function validateCommandId(id: unknown): asserts id is string {
  if (typeof id !== 'string' || !COMMAND_ID.test(id)) {
    throw new WarrenError('INVALID_ARGUMENT', 'command id must be 1-64 characters of [A-Za-z0-9_-]', { commandId: String(id).slice(0, 80) });
  }
}

/** Single-quote for POSIX shells: the text stays one literal word. */
export function shellQuote(text: string): string {
  return "'" + text.replace(/'/g, "'\\''") + "'";
}

/**
 * The line written to the shell's stdin for one command:
 *
 *   command trap 'command break 999999 2>/dev/null' WINCH; __warren_cmd=<id>;
 *   for _ in 1; do command eval '<command>'; done </dev/null 3>&-;
 *   __warren_rc=$?; command printf '<id> %d\n' "$__warren_rc" >&3
 *
 * The command runs in the current shell (cwd, env, functions, `declare`d
 * variables and jobs persist), with stdin from /dev/null and fd 3 closed (so
 * it cannot forge a status line); then the shell writes "<id> <exit code>\n"
 * to fd 3. The one-pass loop is what a timeout breaks out of: SIGWINCH
 * (ABORT_SIGNAL) sent to the shell runs the trap, which leaves every loop, so
 * the rest of the command is skipped, even a builtin-only loop. `command`
 * keeps user functions named eval/printf/trap/break out of the way (and,
 * unlike bash's `builtin`, works in dash and busybox ash too).
 *
 * The shell remembers the id and status of the last command it started
 * (`__warren_cmd`, `__warren_rc`). A `resume` line is sent again after a
 * connection was lost with the command in flight, when nobody can tell
 * whether the first line reached the shell: it runs the command only if the
 * shell's last command is not this id, and otherwise repeats that command's
 * status line. The shell reads its lines one at a time, so a resume line that
 * arrives while the first is still running is read after it has ended: the
 * command runs exactly once either way.
 */
export function commandWrapper(commandId: string, command: string, resume = false): string {
  validateCommandId(commandId);
  if (typeof command !== 'string') throw new WarrenError('INVALID_ARGUMENT', 'command must be a string');
  if (command.includes('\0')) throw new WarrenError('INVALID_ARGUMENT', 'command must not contain NUL bytes');
  const run =
    `command trap 'command break 999999 2>/dev/null' WINCH; __warren_cmd=${commandId}; for _ in 1; do command eval ${shellQuote(command)}; done </dev/null 3>&-; ` +
    `__warren_rc=$?; command printf '${commandId} %d\\n' "$__warren_rc" >&3`;
  if (!resume) return `${run}\n`;
  return `if command [ "\${__warren_cmd-}" = ${commandId} ]; then command printf '${commandId} %d\\n' "\${__warren_rc-0}" >&3; else ${run}; fi\n`;
}

/** Parse one status line ("<id> <code>"); null when it is not one. */
export function parseStatusLine(line: string): { commandId: string; exitCode: number } | null {
  const m = /^([A-Za-z0-9_-]{1,64}) (\d{1,3})$/.exec(line);
  if (!m) return null;
  return { commandId: m[1]!, exitCode: Number(m[2]) };
}
