/**
 * IP address handling for the egress maps: every address is 16 bytes, IPv4 as
 * IPv4-mapped IPv6 (::ffff:a.b.c.d), which is also what a dual-stack socket
 * hands to connect6 for an IPv4 destination.
 */
import { isIPv4, isIPv6 } from 'node:net';
import { WarrenError } from '../../errors';

export function ipv4ToMapped(ip: string): Buffer {
  if (!isIPv4(ip)) throw new WarrenError('INVALID_ARGUMENT', `not an IPv4 address: ${JSON.stringify(ip).slice(0, 60)}`);
  const b = Buffer.alloc(16);
  b[10] = 0xff;
  b[11] = 0xff;
  ip.split('.').forEach((o, i) => (b[12 + i] = Number(o)));
  return b;
}

function ipv6ToBytes(ip: string): Buffer {
  let text = ip;
  const b = Buffer.alloc(16);
  const v4 = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  let tailWords = 8;
  if (v4) {
    ipv4ToMapped(v4[1]!).copy(b, 12, 12, 16);
    text = text.slice(0, -v4[1]!.length) + '0:0';
    tailWords = 8;
  }
  const [head, tail] = text.includes('::') ? text.split('::') : [text, undefined];
  const h = head ? head.split(':') : [];
  const t = tail ? tail.split(':') : [];
  const words = tail === undefined ? h : [...h, ...Array(tailWords - h.length - t.length).fill('0'), ...t];
  if (words.length !== 8) throw new WarrenError('INVALID_ARGUMENT', `not an IPv6 address: ${JSON.stringify(ip).slice(0, 60)}`);
  words.forEach((w, i) => {
    if (v4 && i >= 6) return;
    b.writeUInt16BE(parseInt(w, 16), i * 2);
  });
  return b;
}

/** 16 bytes for an IPv4 or IPv6 literal. */
export function ipToBytes(ip: string): Buffer {
  if (isIPv4(ip)) return ipv4ToMapped(ip);
  if (isIPv6(ip)) return ipv6ToBytes(ip);
  throw new WarrenError('INVALID_ARGUMENT', `not an IP address: ${JSON.stringify(ip).slice(0, 60)}`);
}

/** A CIDR as 16 bytes (host bits cleared) and its prefix length over those 16 bytes. */
export function parseCidr(cidr: string): { bytes: Buffer; prefix: number } {
  const slash = cidr.lastIndexOf('/');
  const ip = slash < 0 ? cidr : cidr.slice(0, slash);
  const v4 = isIPv4(ip);
  const max = v4 ? 32 : 128;
  const len = slash < 0 ? max : Number(cidr.slice(slash + 1));
  if (!Number.isInteger(len) || len < 0 || len > max || !(v4 || isIPv6(ip)) || (slash >= 0 && !/^\d{1,3}$/.test(cidr.slice(slash + 1)))) {
    throw new WarrenError('INVALID_ARGUMENT', `not a CIDR: ${JSON.stringify(cidr).slice(0, 60)}`);
  }
  const prefix = v4 ? 96 + len : len;
  const bytes = ipToBytes(ip);
  for (let bit = prefix; bit < 128; bit++) bytes[bit >> 3]! &= ~(0x80 >> (bit & 7));
  return { bytes, prefix };
}

/** RFC 5952 text of 16 bytes as IPv6 (never the dotted form): the longest run of zero words becomes ::. */
export function canonicalIpv6(b: Buffer): string {
  const words: number[] = [];
  for (let i = 0; i < 16; i += 2) words.push(b.readUInt16BE(i));
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (words[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = words.map((w) => w.toString(16));
  if (best < 0) return hex.join(':');
  return `${hex.slice(0, best).join(':')}::${hex.slice(best + bestLen).join(':')}`;
}

/** Text of 16 map bytes: IPv4-mapped as a dotted quad, anything else as IPv6. */
export function bytesToIp(b: Buffer): string {
  if (b.subarray(0, 10).every((x) => x === 0) && b[10] === 0xff && b[11] === 0xff) return `${b[12]}.${b[13]}.${b[14]}.${b[15]}`;
  return canonicalIpv6(b);
}
