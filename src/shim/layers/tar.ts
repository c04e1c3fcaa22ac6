/**
 * A small tar header scanner: ustar, old v7, GNU ('L'/'K' long names, base-256
 * numbers) and pax ('x' per-entry and 'g' global headers: path, linkpath, size,
 * uid, gid, uname, gname, mtime, SCHILY.xattr.*).
 *
 * It never extracts anything. Three drivers share one header decoder:
 *   - `scanTar(buf)`            every entry of an in-memory archive (uploads)
 *   - `readTarStream(source)`   entries and their bodies from a byte stream (image layers)
 *   - `indexTarFile(path)`      entries and data offsets of an uncompressed tar file (image archives)
 *
 * `assertTarConfined` decides whether extracting an archive could write outside
 * the extraction directory, from the headers alone.
 */
import { closeSync, openSync, readSync, fstatSync } from 'node:fs';
import { WarrenError } from '../../errors';

export type TarEntryType = 'file' | 'dir' | 'symlink' | 'hardlink' | 'char' | 'block' | 'fifo' | 'other';

export interface TarEntry {
  /** Name as recorded (pax `path` / GNU long name / ustar prefix+name applied), not normalized. */
  path: string;
  type: TarEntryType;
  /** The raw typeflag character ('0', '5', ...; '\0' for old files). */
  typeflag: string;
  mode: number;
  uid: number;
  gid: number;
  uname: string;
  gname: string;
  size: number;
  /** Seconds since the epoch. */
  mtime: number;
  /** Target of a symlink or hard link; '' otherwise. */
  linkpath: string;
  devmajor: number;
  devminor: number;
  /** Byte offset of the entry's data in the (uncompressed) archive. */
  offset: number;
  /** Extended attributes from pax SCHILY.xattr.* records. */
  xattrs?: Record<string, Buffer>;
}

const BLOCK = 512;
/** Longest name or pax record we accept (PATH_MAX is 4096; pax records may carry xattrs). */
const MAX_META_BYTES = 1 << 20;

function invalid(message: string, details?: Record<string, unknown>): WarrenError {
  return new WarrenError('INVALID_ARCHIVE', message, details);
}

function cstr(block: Buffer, start: number, len: number): string {
  const field = block.subarray(start, start + len);
  const nul = field.indexOf(0);
  return field.subarray(0, nul < 0 ? len : nul).toString('utf8');
}

function num(block: Buffer, start: number, len: number, what: string, at: number): number {
  const field = block.subarray(start, start + len);
  if (field[0]! & 0x80) {
    // GNU base-256: big-endian two's complement, first byte's top bit is the marker.
    const negative = (field[0]! & 0x40) !== 0;
    let v = BigInt(field[0]! & 0x3f) - (negative ? 0x40n : 0n);
    for (let i = 1; i < len; i++) v = (v << 8n) | BigInt(field[i]!);
    if (v > BigInt(Number.MAX_SAFE_INTEGER) || v < -BigInt(Number.MAX_SAFE_INTEGER)) throw invalid(`tar header at ${at}: ${what} out of range`);
    return Number(v);
  }
  const s = field.toString('latin1').replace(/[\0 ]+$/, '').replace(/^[ ]+/, '');
  if (s === '') return 0;
  if (!/^[0-7]+$/.test(s)) throw invalid(`tar header at ${at}: ${what} is not an octal number`);
  return parseInt(s, 8);
}

function isZeroBlock(block: Buffer): boolean {
  for (let i = 0; i < BLOCK; i++) if (block[i] !== 0) return false;
  return true;
}

function verifyChecksum(block: Buffer, at: number): void {
  const recorded = num(block, 148, 8, 'checksum', at);
  let unsigned = 0;
  let signed = 0;
  for (let i = 0; i < BLOCK; i++) {
    const b = i >= 148 && i < 156 ? 0x20 : block[i]!;
    unsigned += b;
    signed += b > 127 ? b - 256 : b;
  }
  if (recorded !== unsigned && recorded !== signed) throw invalid(`tar header at ${at}: checksum mismatch (corrupt or not a tar archive)`);
}

function typeOf(flag: string, name: string): TarEntryType {
  switch (flag) {
    case '0':
    case '\0':
    case '7':
      return name.endsWith('/') ? 'dir' : 'file';
    case '1':
      return 'hardlink';
    case '2':
      return 'symlink';
    case '3':
      return 'char';
    case '4':
      return 'block';
    case '5':
    case 'D':
      return 'dir';
    case '6':
      return 'fifo';
    default:
      return 'other';
  }
}

/** Parse pax extended header records ("<len> <key>=<value>\n"). */
function parsePax(data: Buffer, at: number): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  let pos = 0;
  while (pos < data.length) {
    if (data[pos] === 0) break; // padding some writers leave
    const sp = data.indexOf(0x20, pos);
    if (sp < 0) throw invalid(`pax header at ${at}: malformed record`);
    const lenText = data.subarray(pos, sp).toString('latin1');
    if (!/^[0-9]+$/.test(lenText)) throw invalid(`pax header at ${at}: malformed record length`);
    const len = parseInt(lenText, 10);
    if (len <= sp - pos + 1 || pos + len > data.length || data[pos + len - 1] !== 0x0a) throw invalid(`pax header at ${at}: record length out of range`);
    const record = data.subarray(sp + 1, pos + len - 1);
    const eq = record.indexOf(0x3d);
    if (eq <= 0) throw invalid(`pax header at ${at}: record without key`);
    out.set(record.subarray(0, eq).toString('utf8'), Buffer.from(record.subarray(eq + 1)));
    pos += len;
  }
  return out;
}

type Decoded = { kind: 'end' } | { kind: 'meta'; size: number } | { kind: 'entry'; entry: TarEntry };

/**
 * Turns header blocks into entries. For a meta header ('x', 'g', 'L', 'K') the
 * driver must hand its data to `meta()` before the next header.
 */
class HeaderDecoder {
  private global = new Map<string, Buffer>();
  private pax: Map<string, Buffer> | null = null;
  private longName: string | null = null;
  private longLink: string | null = null;
  private metaFlag = '';
  private metaAt = 0;
  entries = 0;

  constructor(private readonly maxEntries: number) {}

  header(block: Buffer, at: number): Decoded {
    if (isZeroBlock(block)) {
      if (this.pax !== null || this.longName !== null || this.longLink !== null) throw invalid(`tar archive ends after an extended header at ${at}`);
      return { kind: 'end' };
    }
    verifyChecksum(block, at);
    const flag = String.fromCharCode(block[156]!);
    const size = num(block, 124, 12, 'size', at);
    if (size < 0) throw invalid(`tar header at ${at}: negative size`);
    if (flag === 'x' || flag === 'g' || flag === 'L' || flag === 'K') {
      if (size > MAX_META_BYTES) throw invalid(`tar header at ${at}: extended header of ${size} bytes is too large`);
      this.metaFlag = flag;
      this.metaAt = at;
      return { kind: 'meta', size };
    }
    if (flag === 'S') throw invalid(`tar entry at ${at}: GNU sparse files are not supported`);
    if (flag === 'M') throw invalid(`tar entry at ${at}: multi-volume archives are not supported`);
    if (flag === 'V') {
      // GNU volume label: not a file; its data (if any) is skipped.
      this.metaFlag = 'V';
      this.metaAt = at;
      return { kind: 'meta', size };
    }
    if (++this.entries > this.maxEntries) throw invalid(`tar archive has more than ${this.maxEntries} entries`);

    const magic = block.subarray(257, 263).toString('latin1');
    const ustar = magic === 'ustar\0'; // POSIX; GNU writes "ustar " and uses the prefix area for other things
    let name = cstr(block, 0, 100);
    if (ustar) {
      const prefix = cstr(block, 345, 155);
      if (prefix !== '') name = `${prefix}/${name}`;
    }
    let linkpath = cstr(block, 157, 100);
    const entry: TarEntry = {
      path: name,
      type: 'other',
      typeflag: flag,
      mode: num(block, 100, 8, 'mode', at) & 0o7777,
      uid: num(block, 108, 8, 'uid', at),
      gid: num(block, 116, 8, 'gid', at),
      uname: cstr(block, 265, 32),
      gname: cstr(block, 297, 32),
      size,
      mtime: num(block, 136, 12, 'mtime', at),
      linkpath,
      devmajor: flag === '3' || flag === '4' ? num(block, 329, 8, 'devmajor', at) : 0,
      devminor: flag === '3' || flag === '4' ? num(block, 337, 8, 'devminor', at) : 0,
      offset: at + BLOCK,
    };
    const ext = new Map([...this.global, ...(this.pax ?? [])]);
    if (this.longName !== null) entry.path = this.longName;
    if (this.longLink !== null) entry.linkpath = this.longLink;
    for (const [key, value] of ext) {
      const text = () => value.toString('utf8');
      const int = () => {
        const s = text();
        if (!/^-?[0-9]+(\.[0-9]*)?$/.test(s)) throw invalid(`pax header before ${at}: ${key} is not a number`);
        return Math.trunc(Number(s));
      };
      switch (key) {
        case 'path':
          entry.path = text();
          break;
        case 'linkpath':
          entry.linkpath = text();
          break;
        case 'size':
          entry.size = int();
          break;
        case 'uid':
          entry.uid = int();
          break;
        case 'gid':
          entry.gid = int();
          break;
        case 'uname':
          entry.uname = text();
          break;
        case 'gname':
          entry.gname = text();
          break;
        case 'mtime':
          entry.mtime = int();
          break;
        default:
          if (key.startsWith('SCHILY.xattr.')) {
            entry.xattrs ??= {};
            entry.xattrs[key.slice('SCHILY.xattr.'.length)] = value;
          } else if (key.startsWith('GNU.sparse.')) {
            throw invalid(`tar entry at ${at}: GNU sparse files are not supported`);
          }
      }
    }
    linkpath = entry.linkpath;
    if (entry.size < 0 || !Number.isSafeInteger(entry.size)) throw invalid(`tar entry at ${at}: bad size`);
    if (entry.path === '') throw invalid(`tar entry at ${at}: empty name`);
    if (entry.path.includes('\0') || linkpath.includes('\0')) throw invalid(`tar entry at ${at}: NUL in name`);
    entry.type = typeOf(flag, entry.path);
    // Only regular files carry data in ustar; GNU tar writes size 0 for the rest (pax may claim otherwise: trust the flag).
    if (entry.type === 'hardlink' || entry.type === 'symlink' || entry.type === 'char' || entry.type === 'block' || entry.type === 'fifo') entry.size = 0;
    if (entry.type === 'dir' && flag !== 'D') entry.size = 0;
    this.pax = null;
    this.longName = null;
    this.longLink = null;
    return { kind: 'entry', entry };
  }

  meta(data: Buffer): void {
    const at = this.metaAt;
    switch (this.metaFlag) {
      case 'x':
        this.pax = parsePax(data, at);
        break;
      case 'g':
        for (const [k, v] of parsePax(data, at)) this.global.set(k, v);
        break;
      case 'L':
      case 'K': {
        const nul = data.indexOf(0);
        const value = data.subarray(0, nul < 0 ? data.length : nul).toString('utf8');
        if (this.metaFlag === 'L') this.longName = value;
        else this.longLink = value;
        break;
      }
    }
    this.metaFlag = '';
  }
}

const padded = (n: number) => Math.ceil(n / BLOCK) * BLOCK;

export interface ScanOptions {
  /** Refuse archives with more entries (INVALID_ARCHIVE). Default 1,000,000. */
  maxEntries?: number;
}

/** Every entry of an in-memory tar archive. Throws INVALID_ARCHIVE on corrupt or truncated headers. */
export function scanTar(buf: Buffer, opts: ScanOptions = {}): TarEntry[] {
  const dec = new HeaderDecoder(opts.maxEntries ?? 1_000_000);
  const out: TarEntry[] = [];
  let pos = 0;
  if (buf.length === 0) throw invalid('empty tar archive');
  for (;;) {
    if (pos + BLOCK > buf.length) {
      // Many writers omit the end-of-archive blocks when the data ends exactly here.
      if (pos === buf.length && out.length > 0) return out;
      throw invalid(`tar archive truncated at ${pos}`);
    }
    const r = dec.header(buf.subarray(pos, pos + BLOCK), pos);
    pos += BLOCK;
    if (r.kind === 'end') return out;
    if (r.kind === 'meta') {
      if (pos + r.size > buf.length) throw invalid(`tar archive truncated in an extended header at ${pos - BLOCK}`);
      dec.meta(buf.subarray(pos, pos + r.size));
      pos += padded(r.size);
      continue;
    }
    if (pos + r.entry.size > buf.length) throw invalid(`tar archive truncated in ${JSON.stringify(r.entry.path)}`);
    out.push(r.entry);
    pos += padded(r.entry.size);
  }
}

/** Buffered exact reads over an async byte source. */
class ByteReader {
  private chunks: Buffer[] = [];
  private length = 0;
  private ended = false;
  position = 0;

  constructor(private readonly it: AsyncIterator<Buffer | Uint8Array | string>) {}

  private async fill(n: number): Promise<void> {
    while (this.length < n && !this.ended) {
      const r = await this.it.next();
      if (r.done) {
        this.ended = true;
        break;
      }
      const b = typeof r.value === 'string' ? Buffer.from(r.value) : Buffer.isBuffer(r.value) ? r.value : Buffer.from(r.value.buffer, r.value.byteOffset, r.value.byteLength);
      if (b.length === 0) continue;
      this.chunks.push(b);
      this.length += b.length;
    }
  }

  /** Exactly n bytes, or fewer at the end of the source. */
  async read(n: number): Promise<Buffer> {
    await this.fill(n);
    const take = Math.min(n, this.length);
    const out = take === this.chunks[0]?.length ? this.chunks[0] : Buffer.concat(this.chunks, this.length).subarray(0, take);
    this.consume(take);
    return out;
  }

  /** Up to n bytes as they arrive, without concatenating. */
  async *stream(n: number): AsyncGenerator<Buffer> {
    while (n > 0) {
      if (this.length === 0) await this.fill(1);
      if (this.length === 0) return;
      const head = this.chunks[0]!;
      const take = Math.min(n, head.length);
      const out = head.subarray(0, take);
      this.consume(take);
      n -= take;
      yield out;
    }
  }

  private consume(n: number): void {
    this.position += n;
    this.length -= n;
    while (n > 0) {
      const head = this.chunks[0]!;
      if (head.length <= n) {
        this.chunks.shift();
        n -= head.length;
      } else {
        this.chunks[0] = head.subarray(n);
        n = 0;
      }
    }
  }

  async skip(n: number): Promise<number> {
    let skipped = 0;
    for await (const c of this.stream(n)) skipped += c.length;
    return skipped;
  }

  /** Read and drop everything left (so that upstream hashes see every byte). */
  async drain(): Promise<void> {
    for (;;) {
      this.chunks = [];
      this.length = 0;
      const r = await this.it.next();
      if (r.done) return;
    }
  }
}

export interface StreamEntry {
  entry: TarEntry;
  /** The entry's data. Read it before asking for the next entry, or it is skipped. */
  body: AsyncIterable<Buffer>;
}

/**
 * Entries of a tar stream, one at a time, with their data. After the end of the
 * archive the rest of the source is drained (trailing zero records).
 */
export async function* readTarStream(source: AsyncIterable<Buffer | Uint8Array | string>, opts: ScanOptions = {}): AsyncGenerator<StreamEntry> {
  const it = source[Symbol.asyncIterator]();
  const reader = new ByteReader(it);
  const dec = new HeaderDecoder(opts.maxEntries ?? 10_000_000);
  let sawEntry = false;
  try {
    for (;;) {
      const at = reader.position;
      const block = await reader.read(BLOCK);
      if (block.length === 0 && sawEntry) return; // no end-of-archive blocks
      if (block.length < BLOCK) throw invalid(block.length === 0 ? 'empty tar archive' : `tar archive truncated at ${at}`);
      const r = dec.header(block, at);
      if (r.kind === 'end') {
        await reader.drain();
        return;
      }
      if (r.kind === 'meta') {
        const data = await reader.read(r.size);
        if (data.length < r.size) throw invalid(`tar archive truncated in an extended header at ${at}`);
        dec.meta(data);
        const pad = padded(r.size) - r.size;
        if ((await reader.skip(pad)) < pad) throw invalid(`tar archive truncated at ${reader.position}`);
        continue;
      }
      sawEntry = true;
      const { entry } = r;
      let left = entry.size;
      const body = (async function* () {
        for await (const chunk of reader.stream(left)) {
          left -= chunk.length;
          yield chunk;
        }
      })();
      yield { entry, body };
      if (left > 0 && (await reader.skip(left)) < left) throw invalid(`tar archive truncated in ${JSON.stringify(entry.path)}`);
      left = 0;
      const pad = padded(entry.size) - entry.size;
      if ((await reader.skip(pad)) < pad && entry.size > 0) throw invalid(`tar archive truncated after ${JSON.stringify(entry.path)}`);
    }
  } finally {
    await it.return?.();
  }
}

/**
 * Entries of an uncompressed tar file with the offsets of their data, reading
 * only the headers (data is skipped by seeking).
 */
export function indexTarFile(path: string, opts: ScanOptions = {}): TarEntry[] {
  const fd = openSync(path, 'r');
  try {
    const size = fstatSync(fd).size;
    const dec = new HeaderDecoder(opts.maxEntries ?? 1_000_000);
    const out: TarEntry[] = [];
    const block = Buffer.alloc(BLOCK);
    let pos = 0;
    for (;;) {
      if (pos + BLOCK > size) {
        if (pos === size && out.length > 0) return out;
        throw invalid(size === 0 ? 'empty tar archive' : `tar archive truncated at ${pos}`);
      }
      readSync(fd, block, 0, BLOCK, pos);
      const r = dec.header(block, pos);
      pos += BLOCK;
      if (r.kind === 'end') return out;
      if (r.kind === 'meta') {
        if (pos + r.size > size) throw invalid(`tar archive truncated in an extended header at ${pos - BLOCK}`);
        const data = Buffer.alloc(r.size);
        readSync(fd, data, 0, r.size, pos);
        dec.meta(data);
        pos += padded(r.size);
        continue;
      }
      if (pos + r.entry.size > size) throw invalid(`tar archive truncated in ${JSON.stringify(r.entry.path)}`);
      out.push(r.entry);
      pos += padded(r.entry.size);
    }
  } finally {
    closeSync(fd);
  }
}

// ---------------------------------------------------------------------------
// Confinement

function escape(entry: string, why: string): WarrenError {
  return new WarrenError('ARCHIVE_ESCAPE', `archive entry ${JSON.stringify(entry)} ${why}`, { entry });
}

/**
 * The components of an entry name relative to the extraction directory.
 * Throws ARCHIVE_ESCAPE for absolute names and any `..` component. A name that
 * is the directory itself ("." or "./") gives [].
 */
export function entryComponents(name: string, what = name): string[] {
  if (name.startsWith('/')) throw escape(what, 'is an absolute path');
  const parts = name.split('/').filter((c) => c !== '' && c !== '.');
  if (parts.includes('..')) throw escape(what, 'has a ".." component');
  return parts;
}

export interface ConfineOptions extends ScanOptions {
  /**
   * How symlink targets are judged.
   *  - 'confined' (default): the extraction directory is a plain directory on the
   *    host; a symlink whose target is absolute or resolves (through the
   *    archive's other symlinks) outside it escapes.
   *  - 'in-root': the extraction directory is a root filesystem and symlinks are
   *    resolved inside it (chroot semantics, image layers); any target is fine,
   *    only entry names and hard-link targets are checked.
   */
  symlinks?: 'confined' | 'in-root';
}

type Resolved = { ok: true; parts: string[] } | { ok: false };

/** Resolve `rest` from `start` (resolved components) following the archive's symlinks; ok:false when it leaves the root. */
function resolveConfined(start: string[], rest: string[], links: Map<string, string>, followLast: boolean): Resolved {
  const stack = [...start];
  const queue = [...rest];
  let hops = 0;
  while (queue.length > 0) {
    const c = queue.shift()!;
    if (c === '' || c === '.') continue;
    if (c === '..') {
      if (stack.length === 0) return { ok: false };
      stack.pop();
      continue;
    }
    stack.push(c);
    if (queue.length === 0 && !followLast) break;
    const target = links.get(stack.join('/'));
    if (target === undefined) continue;
    if (++hops > 40) return { ok: true, parts: stack }; // a loop: the kernel refuses it (ELOOP), nothing escapes
    if (target.startsWith('/')) return { ok: false };
    stack.pop();
    queue.unshift(...target.split('/'));
  }
  return { ok: true, parts: stack };
}

/**
 * Throws ARCHIVE_ESCAPE (naming the entry) if extracting `buf` could create or
 * modify anything outside the extraction directory: absolute names, `..`
 * components, hard links to outside, and (in 'confined' mode) symlinks whose
 * target leaves the directory, directly or through other symlinks of the
 * archive. Throws INVALID_ARCHIVE for corrupt headers. Returns the entries.
 */
export function assertTarConfined(buf: Buffer, opts: ConfineOptions = {}): TarEntry[] {
  const entries = scanTar(buf, opts);
  checkConfined(entries, opts.symlinks ?? 'confined');
  return entries;
}

/** The checks of `assertTarConfined` over already scanned entries. */
export function checkConfined(entries: TarEntry[], symlinks: 'confined' | 'in-root' = 'confined'): void {
  const links = new Map<string, string>();
  for (const e of entries) {
    const parts = entryComponents(e.path);
    if (parts.length === 0 && e.type !== 'dir') throw escape(e.path, 'names the extraction directory itself');
    if (e.type === 'hardlink') {
      if (e.linkpath === '') throw invalid(`hard link ${JSON.stringify(e.path)} has no target`);
      const target = entryComponents(e.linkpath, e.path);
      if (target.length === 0) throw escape(e.path, 'is a hard link to the extraction directory');
    }
    if (e.type === 'symlink') links.set(parts.join('/'), e.linkpath);
    else links.delete(parts.join('/'));
  }
  if (symlinks === 'in-root') return;
  for (const e of entries) {
    const parts = entryComponents(e.path);
    // Where the entry lands: its parent resolved through the archive's symlinks.
    const parent = resolveConfined([], parts.slice(0, -1), links, true);
    if (!parent.ok) throw escape(e.path, 'is written through a symlink that leaves the extraction directory');
    if (e.type === 'symlink') {
      if (e.linkpath.startsWith('/')) throw escape(e.path, `is a symlink to an absolute path (${e.linkpath})`);
      const target = resolveConfined(parent.parts, e.linkpath.split('/'), links, true);
      if (!target.ok) throw escape(e.path, `is a symlink whose target (${e.linkpath}) leaves the extraction directory`);
    }
    if (e.type === 'hardlink') {
      const target = entryComponents(e.linkpath, e.path);
      const r = resolveConfined([], target, links, false);
      if (!r.ok) throw escape(e.path, `is a hard link through a symlink that leaves the extraction directory`);
    }
  }
}
