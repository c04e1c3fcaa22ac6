/**
 * Exec output with bounded memory.
 *
 * - `LimitedPipe`: one output pipe of a process as a Readable that honours
 *   back-pressure (a consumer that does not take data leaves it in the pipe,
 *   and the process blocks) and stops at `limit` bytes: the read end is
 *   closed there, so a writer that goes on gets EPIPE / SIGPIPE, as with
 *   `| head -c N`, instead of running to completion with nobody reading.
 * - `OutputCapture`: the first `limit` bytes of a stream, kept in memory up
 *   to `memoryBytes` and spilled to an unlinked file past that, so that many
 *   concurrent execs at the largest `maxOutputBytes` cost the node disk, not
 *   gigabytes of memory. Read back in chunks.
 */
import { closeSync, constants, fstatSync, openSync, readSync, unlinkSync, writeSync, mkdirSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Readable } from 'node:stream';
import { WarrenError } from '../errors';
import type { CapturedOutput } from './types';

/** Bytes of each capture kept in memory before it spills to a file. */
export const CAPTURE_MEMORY_BYTES = 256 * 1024;
/** Chunk size when reading captures back (a multiple of 3, so base64 pieces concatenate). */
export const READBACK_CHUNK = 3 * 21_845;
/** After the process exited, how long an output pipe may stay silent before it is given up (a background child may hold it open). */
const IDLE_AFTER_EXIT_MS = 50;

// Linux O_TMPFILE (with O_DIRECTORY): an unnamed file that disappears with its last fd.
const O_TMPFILE = 0o20000000 | 0o200000;

let spillDir: string | null = null;

/** Where captures spill (the node's `<dataDir>/tmp`; default the system temp dir). */
export function setExecSpillDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  spillDir = dir;
}

function openSpill(): number {
  const dir = spillDir ?? tmpdir();
  try {
    return openSync(dir, O_TMPFILE | constants.O_RDWR, 0o600);
  } catch {
    // Filesystems without O_TMPFILE: a named file, unlinked at once.
    const p = join(dir, `.exec-${randomBytes(8).toString('hex')}`);
    const fd = openSync(p, constants.O_RDWR | constants.O_CREAT | constants.O_EXCL, 0o600);
    unlinkSync(p);
    return fd;
  }
}

export class OutputCapture {
  private readonly mem: Buffer[] = [];
  private memSize = 0;
  private fd = -1;
  private fileSize = 0;
  /** More than `limit` bytes were offered. */
  truncated = false;
  /** Bytes lost because the spill file could not be written (disk full). */
  spillFailed = false;

  constructor(
    readonly limit: number,
    private readonly memoryBytes = CAPTURE_MEMORY_BYTES,
  ) {}

  get size(): number {
    return this.memSize + this.fileSize;
  }

  /** Keep what fits; false once the limit is reached (stop reading). */
  push(chunk: Buffer): boolean {
    const room = this.limit - this.size;
    if (chunk.length > room) {
      if (room > 0) this.store(chunk.subarray(0, room));
      this.truncated = true;
      return false;
    }
    this.store(chunk);
    return this.size < this.limit;
  }

  /** Mark that the source produced more than it was allowed to (the pipe stopped it). */
  markTruncated(): void {
    this.truncated = true;
  }

  private store(chunk: Buffer): void {
    if (chunk.length === 0 || this.spillFailed) return;
    if (this.fd < 0 && this.memSize + chunk.length <= this.memoryBytes) {
      this.mem.push(chunk);
      this.memSize += chunk.length;
      return;
    }
    try {
      if (this.fd < 0) this.fd = openSpill();
      let off = 0;
      while (off < chunk.length) off += writeSync(this.fd, chunk, off, chunk.length - off, this.memSize + this.fileSize + off);
      this.fileSize += chunk.length;
    } catch {
      // The node's disk is full: keep what we have and say the output is truncated.
      this.spillFailed = true;
      this.truncated = true;
    }
  }

  /** The captured bytes in chunks of at most `chunkBytes` (memory first, then the spill file). */
  *chunks(chunkBytes = READBACK_CHUNK): Generator<Buffer> {
    let carry: Buffer | null = null;
    const emit = function* (b: Buffer): Generator<Buffer> {
      let buf = carry ? Buffer.concat([carry, b]) : b;
      carry = null;
      while (buf.length >= chunkBytes) {
        yield buf.subarray(0, chunkBytes);
        buf = buf.subarray(chunkBytes);
      }
      if (buf.length > 0) carry = Buffer.from(buf);
    };
    for (const m of this.mem) yield* emit(m);
    if (this.fd >= 0) {
      const buf = Buffer.allocUnsafe(chunkBytes);
      for (let pos = this.memSize; pos < this.memSize + this.fileSize; ) {
        const n = readSync(this.fd, buf, 0, Math.min(chunkBytes, this.memSize + this.fileSize - pos), pos);
        if (n <= 0) break;
        pos += n;
        yield* emit(Buffer.from(buf.subarray(0, n)));
      }
    }
    if (carry !== null) yield carry;
  }

  /** Everything at once (for small outputs and internal callers). */
  bytes(): Buffer {
    if (this.fd < 0) return Buffer.concat(this.mem, this.memSize);
    return Buffer.concat([...this.chunks()], this.size);
  }

  text(): string {
    return this.bytes().toString('utf8');
  }

  /** Close the spill file (its space goes with it). Idempotent. */
  release(): void {
    if (this.fd >= 0) {
      try {
        closeSync(this.fd);
      } catch {
        /* already closed */
      }
      this.fd = -1;
    }
    this.mem.length = 0;
  }

  /** Spill file size on disk (for tests). */
  get spilledBytes(): number {
    return this.fd >= 0 ? fstatSync(this.fd).size : 0;
  }
}

/**
 * One output pipe of a process (a raw fd this object owns) as a Readable of
 * at most `limit` bytes. Reading from the pipe follows the consumer; at the
 * limit the pipe is closed. After `processExited()`, a pipe that stays silent
 * while the consumer is ready (a background child holds it open) is ended.
 */
export class LimitedPipe extends Readable {
  private readonly sock: Socket;
  private taken = 0;
  private exited = false;
  private idle: NodeJS.Timeout | null = null;
  private finished = false;
  private lastData = 0;
  /** The limit cut the stream (more output was on its way, or could have been). */
  truncated = false;

  constructor(fd: number, readonly limit: number) {
    super({ highWaterMark: 64 * 1024 });
    this.sock = new Socket({ fd, readable: true, writable: false });
    this.sock.pause();
    this.sock.on('data', (chunk: Buffer) => this.onData(chunk));
    this.sock.on('end', () => this.end());
    this.sock.on('error', () => this.end());
    this.sock.on('close', () => this.end());
  }

  private onData(chunk: Buffer): void {
    if (this.finished) return;
    this.lastData = Date.now();
    const room = this.limit - this.taken;
    if (chunk.length > room) {
      // Past the limit: keep what fits and close the pipe, which stops a writer that goes on.
      if (room > 0) this.push(chunk.subarray(0, room));
      this.taken = this.limit;
      this.truncated = true;
      this.end();
      return;
    }
    this.taken += chunk.length;
    if (!this.push(chunk)) this.sock.pause();
    this.armIdle();
  }

  override _read(): void {
    if (this.finished) return;
    this.sock.resume();
    this.armIdle();
  }

  /** The process has exited: from now on a silent pipe is given up. */
  processExited(): void {
    this.exited = true;
    this.armIdle();
  }

  private armIdle(): void {
    if (!this.exited || this.finished) return;
    if (this.idle !== null) clearTimeout(this.idle);
    // Only a pipe that is being read (not one held back by its consumer) can be idle.
    if (this.sock.isPaused()) {
      this.idle = null;
      return;
    }
    this.idle = setTimeout(() => {
      // A busy loop may run this timer before reading a pipe that has data:
      // give up only if a poll phase (which reads it) brings nothing either.
      const at = this.lastData;
      setImmediate(() => {
        if (this.lastData === at && !this.sock.isPaused()) this.end();
        else this.armIdle();
      });
    }, IDLE_AFTER_EXIT_MS);
  }

  private end(): void {
    if (this.finished) return;
    this.finished = true;
    if (this.idle !== null) clearTimeout(this.idle);
    this.idle = null;
    this.sock.destroy();
    this.push(null);
  }

  override _destroy(err: Error | null, cb: (error?: Error | null) => void): void {
    this.finished = true;
    if (this.idle !== null) clearTimeout(this.idle);
    this.sock.destroy();
    cb(err);
  }
}

/** Drain a LimitedPipe into a capture; resolves when the pipe has ended. */
export function captureInto(pipe: Readable & { truncated?: boolean }, capture: OutputCapture): Promise<void> {
  return new Promise((resolve) => {
    // The pipe enforces the limit (and stops the writer); the capture only stores.
    pipe.on('data', (chunk: Buffer) => void capture.push(chunk));
    const done = () => {
      if (pipe.truncated) capture.markTruncated();
      resolve();
    };
    pipe.once('end', done);
    pipe.once('close', done);
    pipe.once('error', done);
  });
}

/** Output already in memory, as a CapturedOutput (chunks a multiple of 3 bytes, but the last). */
export function bufferOutput(buf: Buffer, truncated: boolean): CapturedOutput {
  return {
    size: buf.length,
    truncated,
    *chunks(chunkBytes = READBACK_CHUNK) {
      const step = Math.max(3, chunkBytes - (chunkBytes % 3));
      for (let i = 0; i < buf.length; i += step) yield buf.subarray(i, i + step);
    },
    bytes: () => buf,
  };
}

export function invalidEncoding(value: unknown): WarrenError {
  return new WarrenError('INVALID_ARGUMENT', `encoding: must be "utf8" or "base64" (got ${JSON.stringify(value)})`, { field: 'encoding' });
}
