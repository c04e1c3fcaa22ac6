/**
 * Screenshots: QEMU's screendump writes a binary PPM (P6, 8-bit RGB); this
 * turns it into a PNG, optionally scaled down (box filter), with node's zlib
 * only. Every PPM is checked before use (QEMU runs on behalf of an untrusted
 * guest, and a bad file must not grow this process).
 */
import { deflateSync } from 'node:zlib';
import { WarrenError } from '../../../errors';

export interface Rgb {
  width: number;
  height: number;
  /** width * height * 3 bytes, rows top to bottom. */
  data: Buffer;
}

/** Largest screen accepted (QEMU's std VGA tops out well below). */
const MAX_PIXELS = 8192 * 8192;

export function parsePpm(buf: Buffer): Rgb {
  // header: "P6" whitespace width whitespace height whitespace maxval one-whitespace data
  let off = 0;
  const token = (): string => {
    while (off < buf.length) {
      const c = buf[off]!;
      if (c === 0x23) while (off < buf.length && buf[off] !== 0x0a) off++;
      else if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) off++;
      else break;
    }
    const start = off;
    while (off < buf.length && off - start < 16 && ![0x20, 0x0a, 0x0d, 0x09].includes(buf[off]!)) off++;
    return buf.subarray(start, off).toString('latin1');
  };
  if (token() !== 'P6') throw new WarrenError('INTERNAL', 'screendump is not a binary PPM');
  const width = Number(token());
  const height = Number(token());
  const maxval = Number(token());
  off++;
  if (!Number.isInteger(width) || !Number.isInteger(height) || width < 1 || height < 1 || width * height > MAX_PIXELS || maxval !== 255) {
    throw new WarrenError('INTERNAL', `screendump has an unexpected header (${width}x${height}, maxval ${maxval})`);
  }
  const need = width * height * 3;
  if (buf.length - off < need) throw new WarrenError('INTERNAL', 'screendump is truncated');
  return { width, height, data: buf.subarray(off, off + need) };
}

/** Scale down to `width` x `height` by averaging the source pixels each target pixel covers. */
export function scaleDown(src: Rgb, width: number, height: number): Rgb {
  if (width === src.width && height === src.height) return src;
  if (width > src.width || height > src.height || width < 1 || height < 1) throw new WarrenError('INVALID_ARGUMENT', `scaled size ${width}x${height} must be within the screen's ${src.width}x${src.height}`);
  const out = Buffer.alloc(width * height * 3);
  for (let y = 0; y < height; y++) {
    const y0 = Math.floor((y * src.height) / height);
    const y1 = Math.max(y0 + 1, Math.floor(((y + 1) * src.height) / height));
    for (let x = 0; x < width; x++) {
      const x0 = Math.floor((x * src.width) / width);
      const x1 = Math.max(x0 + 1, Math.floor(((x + 1) * src.width) / width));
      let r = 0;
      let g = 0;
      let b = 0;
      for (let sy = y0; sy < y1; sy++) {
        let i = (sy * src.width + x0) * 3;
        for (let sx = x0; sx < x1; sx++, i += 3) {
          r += src.data[i]!;
          g += src.data[i + 1]!;
          b += src.data[i + 2]!;
        }
      }
      const n = (y1 - y0) * (x1 - x0);
      const o = (y * width + x) * 3;
      out[o] = Math.round(r / n);
      out[o + 1] = Math.round(g / n);
      out[o + 2] = Math.round(b / n);
    }
  }
  return { width, height, data: out };
}

const CRC_TABLE = (() => {
  const t = new Int32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c;
  }
  return t;
})();

function crc32(parts: Buffer[]): number {
  let c = -1;
  for (const p of parts) for (let i = 0; i < p.length; i++) c = CRC_TABLE[(c ^ p[i]!) & 0xff]! ^ (c >>> 8);
  return (c ^ -1) >>> 0;
}

function chunk(type: string, data: Buffer): Buffer {
  const len = Buffer.alloc(4);
  len.writeUInt32BE(data.length);
  const t = Buffer.from(type, 'latin1');
  const crc = Buffer.alloc(4);
  crc.writeUInt32BE(crc32([t, data]));
  return Buffer.concat([len, t, data, crc]);
}

/** 8-bit RGB PNG; every row uses the Up filter (screens repeat vertically, so it packs well). */
export function encodePng(img: Rgb, level = 6): Buffer {
  const stride = img.width * 3;
  const raw = Buffer.alloc((stride + 1) * img.height);
  for (let y = 0; y < img.height; y++) {
    const o = y * (stride + 1);
    const row = img.data.subarray(y * stride, (y + 1) * stride);
    if (y === 0) {
      raw[o] = 0;
      row.copy(raw, o + 1);
      continue;
    }
    raw[o] = 2;
    const prev = img.data.subarray((y - 1) * stride, y * stride);
    for (let i = 0; i < stride; i++) raw[o + 1 + i] = (row[i]! - prev[i]!) & 0xff;
  }
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(img.width, 0);
  ihdr.writeUInt32BE(img.height, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type: RGB
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw, { level })), chunk('IEND', Buffer.alloc(0))]);
}

/** Width and height of a PNG (its IHDR), or null when `buf` is not one. */
export function pngSize(buf: Buffer): { width: number; height: number } | null {
  if (buf.length < 33 || buf.readUInt32BE(0) !== 0x89504e47 || buf.subarray(12, 16).toString('latin1') !== 'IHDR') return null;
  return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20) };
}
