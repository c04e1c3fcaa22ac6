/**
 * Building EROFS images reproducibly.
 *
 * mkfs.erofs (erofs-utils 1.5) is run with a fixed timestamp for every inode
 * (`-T`) and a fixed UUID, so the same tree (same names, contents, modes,
 * owners, xattrs) always gives the same bytes. The UUID is then replaced by one
 * derived from the image's own hash and the superblock checksum is redone, so
 * every distinct layer also has a distinct, reproducible filesystem UUID
 * (overlayfs compares the UUIDs of lower layers for index/xino).
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, createReadStream, openSync, readSync, writeSync, fsyncSync } from 'node:fs';
import { WarrenError } from '../../errors';

/** 2020-01-01T00:00:00Z: files dated before 1980 break zip-based tools (Python wheels), so not 0. */
export const LAYER_EPOCH = 1577836800;
const BUILD_UUID = '5741a2e4-0000-4000-8000-000000000000';

export const EROFS_MAGIC = 0xe0f5e1e2;
const SB_OFFSET = 1024;
const SB_CHKSUM = 0x1;

export type ErofsCompression = 'none' | 'lz4' | 'lz4hc';

export interface MkfsOptions {
  compression?: ErofsCompression;
  epoch?: number;
  /** Called with mkfs.erofs's stderr lines. */
  log?: (line: string) => void;
  signal?: AbortSignal;
  /**
   * Uncompressed files in 4 KiB chunks: a chunk that is a hole (or all zeros) takes
   * no space in the image, so sparse files stay small ('none' only; compressed
   * images store zeros in a few bytes anyway).
   */
  chunked?: boolean;
}

/** The mkfs.erofs arguments that decide the bytes of the image (part of the Debian cache key). */
export function mkfsArgs(opts: MkfsOptions = {}): string[] {
  const args = ['--quiet', `-T${opts.epoch ?? LAYER_EPOCH}`, `-U${BUILD_UUID}`];
  const z = opts.compression ?? 'lz4hc';
  if (z !== 'none') args.push(`-z${z}`);
  else if (opts.chunked) args.push('--chunksize=4096');
  return args;
}

let crcTable: Uint32Array | null = null;
export function crc32c(crc: number, buf: Uint8Array): number {
  if (crcTable === null) {
    crcTable = new Uint32Array(256);
    for (let i = 0; i < 256; i++) {
      let c = i;
      for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
      crcTable[i] = c >>> 0;
    }
  }
  for (let i = 0; i < buf.length; i++) crc = crcTable[(crc ^ buf[i]!) & 0xff]! ^ (crc >>> 8);
  return crc >>> 0;
}

export async function sha256File(path: string): Promise<string> {
  const h = createHash('sha256');
  for await (const chunk of createReadStream(path, { highWaterMark: 1 << 20 })) h.update(chunk as Buffer);
  return h.digest('hex');
}

/** Throws INVALID_ARCHIVE unless `path` starts with an EROFS superblock. */
export function assertErofsImage(path: string): void {
  const fd = openSync(path, 'r');
  try {
    const sb = Buffer.alloc(16);
    const n = readSync(fd, sb, 0, 16, SB_OFFSET);
    if (n < 16 || sb.readUInt32LE(0) !== EROFS_MAGIC) throw new WarrenError('INVALID_ARCHIVE', `${path} is not an EROFS image`);
  } finally {
    closeSync(fd);
  }
}

/**
 * Give the image a UUID derived from its content (`seed`, a hex hash) and redo
 * the superblock checksum. Returns false (image untouched) when the checksum
 * mkfs wrote cannot be reproduced, i.e. an unknown superblock layout.
 */
export function setContentUuid(path: string, seed: string): boolean {
  const fd = openSync(path, 'r+');
  try {
    const head = Buffer.alloc(SB_OFFSET + 128);
    if (readSync(fd, head, 0, head.length, 0) < head.length) return false;
    const sb0 = head.subarray(SB_OFFSET);
    if (sb0.readUInt32LE(0) !== EROFS_MAGIC) return false;
    const blkszbits = sb0[12]!;
    if (blkszbits < 9 || blkszbits > 16) return false;
    const len = Math.max(128, (1 << blkszbits) - SB_OFFSET);
    const sb = Buffer.alloc(len);
    if (readSync(fd, sb, 0, len, SB_OFFSET) < len) return false;
    const hasChecksum = (sb.readUInt32LE(8) & SB_CHKSUM) !== 0;
    const csum = (b: Buffer) => {
      const c = Buffer.from(b);
      c.writeUInt32LE(0, 4);
      return crc32c(0xffffffff, c);
    };
    if (hasChecksum && csum(sb) !== sb.readUInt32LE(4)) return false;
    const uuid = Buffer.from(seed.slice(0, 32), 'hex');
    uuid[6] = (uuid[6]! & 0x0f) | 0x80; // RFC 9562 version 8 (custom)
    uuid[8] = (uuid[8]! & 0x3f) | 0x80; // variant 10
    uuid.copy(sb, 48);
    if (hasChecksum) sb.writeUInt32LE(csum(sb), 4);
    writeSync(fd, sb, 0, len, SB_OFFSET);
    fsyncSync(fd);
    return true;
  } finally {
    closeSync(fd);
  }
}

function run(cmd: string, args: string[], opts: { log?: (line: string) => void; signal?: AbortSignal }): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], signal: opts.signal });
    let tail = '';
    const onData = (d: Buffer) => {
      const text = d.toString();
      tail = (tail + text).slice(-4000);
      if (opts.log) for (const line of text.split('\n')) if (line.trim() !== '') opts.log(line);
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('error', (err) => reject(new WarrenError('IMAGE_BUILD_FAILED', `${cmd}: ${err.message}`)));
    child.on('close', (code, signal) => {
      if (code === 0) resolve();
      else reject(new WarrenError('IMAGE_BUILD_FAILED', `${cmd} failed (${signal ?? `exit ${code}`}): ${tail.trim().split('\n').slice(-5).join(' | ')}`));
    });
  });
}

/**
 * Pack `dir` into a reproducible EROFS image at `out`; returns the image's
 * sha256 (hex) after the content UUID has been set.
 */
export async function mkfsErofs(out: string, dir: string, opts: MkfsOptions = {}): Promise<string> {
  await run('mkfs.erofs', [...mkfsArgs(opts), out, dir], opts);
  const first = await sha256File(out);
  if (!setContentUuid(out, first)) {
    opts.log?.('mkfs.erofs superblock layout not recognised; keeping the fixed UUID');
    return first;
  }
  return sha256File(out);
}
