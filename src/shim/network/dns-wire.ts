/**
 * DNS message codec (RFC 1035), just what the per-node DNS responder needs: header, questions and
 * resource records, with A, AAAA and CNAME data decoded and every other type kept as raw rdata.
 *
 * Decoding is defensive: every malformed input (short buffers, labels or names over the limits,
 * compression pointers that loop or point forward, rdata of the wrong size) throws
 * WarrenError('INVALID_ARGUMENT'), never a RangeError. Names come out lower case without a trailing
 * dot; label bytes that are not printable ASCII, '.' and '\' are escaped as in master files
 * (`\.`, `\\`, `\DDD`), so a label that contains a dot can never pass for two labels. Encoding
 * writes no compression pointers.
 */
import { isIPv4, isIPv6 } from 'node:net';
import { WarrenError } from '../../errors';

export const DnsType = { A: 1, NS: 2, CNAME: 5, SOA: 6, PTR: 12, MX: 15, TXT: 16, AAAA: 28, SRV: 33, OPT: 41, ANY: 255 } as const;
export const DnsClass = { IN: 1, ANY: 255 } as const;
export const DnsRcode = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4, REFUSED: 5 } as const;
export const DnsOpcode = { QUERY: 0 } as const;

export const DNS_HEADER_SIZE = 12;
export const MAX_LABEL_LENGTH = 63;
/** Of a name on the wire: length bytes, labels and the final zero. */
export const MAX_NAME_WIRE_LENGTH = 255;
/** The most a DNS message over UDP may carry without EDNS (RFC 1035 4.2.1). */
export const CLASSIC_UDP_PAYLOAD = 512;

export interface DnsHeader {
  id: number;
  /** Set in responses. */
  qr: boolean;
  opcode: number;
  aa: boolean;
  /** Truncated. */
  tc: boolean;
  /** Recursion desired. */
  rd: boolean;
  /** Recursion available. */
  ra: boolean;
  rcode: number;
}

export interface DnsSectionCounts {
  questionCount: number;
  answerCount: number;
  authorityCount: number;
  additionalCount: number;
}

export interface DnsQuestion {
  name: string;
  type: number;
  class: number;
}

interface DnsRecordBase {
  name: string;
  class: number;
  /** Unsigned 32-bit as on the wire (for OPT it holds the extended rcode and flags). */
  ttl: number;
}
/** A (type 1) or AAAA (type 28) of class IN; `address` in canonical text form. */
export interface DnsAddressRecord extends DnsRecordBase {
  type: typeof DnsType.A | typeof DnsType.AAAA;
  address: string;
}
export interface DnsCnameRecord extends DnsRecordBase {
  type: typeof DnsType.CNAME;
  target: string;
}
/**
 * Any other record, rdata as received. Names inside it (MX, NS, SOA, ...) may be compression
 * pointers into the message it came from, so it is only safe to re-encode types without names.
 */
export interface DnsRawRecord extends DnsRecordBase {
  type: number;
  rdata: Buffer;
}
export type DnsRecord = DnsAddressRecord | DnsCnameRecord | DnsRawRecord;

export interface DnsMessage extends DnsHeader {
  questions: DnsQuestion[];
  answers: DnsRecord[];
  authorities: DnsRecord[];
  additionals: DnsRecord[];
}

/** What encodeMessage needs: flags default to false/0, sections to empty. */
export type DnsMessageInit = { id: number } & Partial<Omit<DnsMessage, 'id'>>;

export function isAddressRecord(record: DnsRecord): record is DnsAddressRecord {
  return 'address' in record;
}

export function isCnameRecord(record: DnsRecord): record is DnsCnameRecord {
  return 'target' in record;
}

function malformed(what: string, offset: number): WarrenError {
  return new WarrenError('INVALID_ARGUMENT', `malformed DNS message: ${what} (at byte ${offset})`, { offset });
}

function invalid(what: string, details?: Record<string, unknown>): WarrenError {
  return new WarrenError('INVALID_ARGUMENT', `cannot encode DNS message: ${what}`, details);
}

// ---------------------------------------------------------------------------------------------
// Names

function isAsciiUpper(byte: number): boolean {
  return byte >= 0x41 && byte <= 0x5a;
}

function labelToText(buf: Buffer, start: number, length: number): string {
  let text = '';
  for (let i = start; i < start + length; i++) {
    const byte = buf[i]!;
    if (byte === 0x2e || byte === 0x5c) text += `\\${String.fromCharCode(byte)}`;
    else if (byte < 0x21 || byte > 0x7e) text += `\\${byte.toString().padStart(3, '0')}`;
    else text += String.fromCharCode(isAsciiUpper(byte) ? byte + 0x20 : byte);
  }
  return text;
}

/**
 * Reads the name at `start`. `end` is where the name ends in place (after its first compression
 * pointer or its final zero), which is where the caller continues.
 */
function readName(buf: Buffer, start: number): { name: string; end: number } {
  const labels: string[] = [];
  let offset = start;
  let end = -1;
  // Every pointer must go below everything read so far for this name: that is what honest
  // encoders produce (they point at names written earlier) and it rules out loops.
  let lowestOffsetRead = start;
  let wireLength = 1;
  for (;;) {
    if (offset >= buf.length) throw malformed('name runs past the end of the message', offset);
    const length = buf[offset]!;
    if (length === 0) {
      if (end < 0) end = offset + 1;
      break;
    }
    const labelKind = length & 0xc0;
    if (labelKind === 0xc0) {
      if (offset + 1 >= buf.length) throw malformed('compression pointer runs past the end of the message', offset);
      const target = ((length & 0x3f) << 8) | buf[offset + 1]!;
      if (target >= lowestOffsetRead) throw malformed(`compression pointer to ${target} does not point backwards`, offset);
      if (end < 0) end = offset + 2;
      lowestOffsetRead = target;
      offset = target;
      continue;
    }
    if (labelKind !== 0) throw malformed(`label length byte 0x${length.toString(16)} (labels are at most ${MAX_LABEL_LENGTH} bytes)`, offset);
    if (offset + 1 + length > buf.length) throw malformed('label runs past the end of the message', offset);
    wireLength += 1 + length;
    if (wireLength > MAX_NAME_WIRE_LENGTH) throw malformed(`name longer than ${MAX_NAME_WIRE_LENGTH} bytes`, start);
    labels.push(labelToText(buf, offset + 1, length));
    offset += 1 + length;
  }
  return { name: labels.join('.'), end };
}

/** Splits a text name (master-file escapes allowed, trailing dot optional) into lower-cased wire labels. */
function nameToLabels(name: string): Buffer[] {
  if (name === '' || name === '.') return [];
  const labels: Buffer[] = [];
  let label: number[] = [];
  let wireLength = 1;
  const closeLabel = (): void => {
    if (label.length === 0) throw invalid(`empty label in name ${JSON.stringify(name)}`, { name });
    if (label.length > MAX_LABEL_LENGTH) throw invalid(`label longer than ${MAX_LABEL_LENGTH} bytes in name ${JSON.stringify(name)}`, { name });
    wireLength += 1 + label.length;
    if (wireLength > MAX_NAME_WIRE_LENGTH) throw invalid(`name longer than ${MAX_NAME_WIRE_LENGTH} bytes`, { name });
    labels.push(Buffer.from(label));
    label = [];
  };
  for (let i = 0; i < name.length; ) {
    const code = name.charCodeAt(i);
    if (code === 0x2e) {
      closeLabel();
      i += 1;
    } else if (code === 0x5c) {
      const digits = /^[0-9]{3}/.exec(name.slice(i + 1, i + 4));
      if (digits !== null) {
        const value = Number(digits[0]);
        if (value > 255) throw invalid(`escape \\${digits[0]} is not a byte`, { name });
        label.push(value);
        i += 4;
      } else {
        const next = name.charCodeAt(i + 1);
        if (!(next >= 0x21 && next <= 0x7e)) throw invalid(`bad escape in name ${JSON.stringify(name)}`, { name });
        label.push(isAsciiUpper(next) ? next + 0x20 : next);
        i += 2;
      }
    } else {
      if (code < 0x21 || code > 0x7e) throw invalid(`name ${JSON.stringify(name)} is not printable ASCII (use punycode or \\DDD escapes)`, { name });
      label.push(isAsciiUpper(code) ? code + 0x20 : code);
      i += 1;
    }
  }
  // A final unescaped dot has already closed the last label.
  if (label.length > 0 || labels.length === 0) closeLabel();
  return labels;
}

function encodeName(name: string): Buffer {
  const labels = nameToLabels(name);
  const parts: Buffer[] = [];
  for (const label of labels) parts.push(Buffer.from([label.length]), label);
  parts.push(Buffer.from([0]));
  return Buffer.concat(parts);
}

/** The canonical form of a name: lower case, escapes as decoding writes them, no trailing dot. */
export function normalizeName(name: string): string {
  const wire = encodeName(name);
  return readName(wire, 0).name;
}

// ---------------------------------------------------------------------------------------------
// Addresses

function ipv6ToBytes(text: string): Buffer {
  let hex = text;
  if (hex.includes('.')) {
    const lastColon = hex.lastIndexOf(':');
    const octets = hex.slice(lastColon + 1).split('.').map(Number);
    hex = `${hex.slice(0, lastColon + 1)}${((octets[0]! << 8) | octets[1]!).toString(16)}:${((octets[2]! << 8) | octets[3]!).toString(16)}`;
  }
  const groupsOf = (part: string): number[] => (part === '' ? [] : part.split(':').map((group) => parseInt(group, 16)));
  const [left = '', right = ''] = hex.split('::');
  const head = groupsOf(left);
  const tail = groupsOf(right);
  const groups = hex.includes('::') ? [...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail] : head;
  const bytes = Buffer.alloc(16);
  groups.forEach((group, i) => bytes.writeUInt16BE(group, i * 2));
  return bytes;
}

/** RFC 5952 text: lower-case hex, no leading zeros, the first longest run of 2+ zero groups as `::`. */
function formatIpv6(bytes: Buffer, offset: number): string {
  const groups: number[] = [];
  for (let i = 0; i < 8; i++) groups.push(bytes.readUInt16BE(offset + i * 2));
  let bestStart = -1;
  let bestLength = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLength) {
      bestStart = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = (part: number[]): string => part.map((group) => group.toString(16)).join(':');
  if (bestStart < 0) return hex(groups);
  return `${hex(groups.slice(0, bestStart))}::${hex(groups.slice(bestStart + bestLength))}`;
}

/** An IP address in canonical text form (IPv6 per RFC 5952); throws INVALID_ARGUMENT for anything else. */
export function canonicalAddress(address: string): string {
  if (isIPv4(address)) return address.split('.').map(Number).join('.');
  if (isIPv6(address) && !address.includes('%')) return formatIpv6(ipv6ToBytes(address), 0);
  throw new WarrenError('INVALID_ARGUMENT', `not an IP address: ${JSON.stringify(address)}`, { address });
}

// ---------------------------------------------------------------------------------------------
// Decoding

export function parseHeader(buf: Buffer): DnsHeader & DnsSectionCounts {
  if (buf.length < DNS_HEADER_SIZE) throw malformed(`message of ${buf.length} bytes is shorter than a header`, 0);
  const flags = buf.readUInt16BE(2);
  return {
    id: buf.readUInt16BE(0),
    qr: (flags & 0x8000) !== 0,
    opcode: (flags >> 11) & 0x0f,
    aa: (flags & 0x0400) !== 0,
    tc: (flags & 0x0200) !== 0,
    rd: (flags & 0x0100) !== 0,
    ra: (flags & 0x0080) !== 0,
    rcode: flags & 0x0f,
    questionCount: buf.readUInt16BE(4),
    answerCount: buf.readUInt16BE(6),
    authorityCount: buf.readUInt16BE(8),
    additionalCount: buf.readUInt16BE(10),
  };
}

function needBytes(buf: Buffer, offset: number, count: number, what: string): void {
  if (offset + count > buf.length) throw malformed(`${what} runs past the end of the message`, offset);
}

function readRecord(buf: Buffer, start: number): { record: DnsRecord; end: number } {
  const { name, end: nameEnd } = readName(buf, start);
  needBytes(buf, nameEnd, 10, 'record header');
  const type = buf.readUInt16BE(nameEnd);
  const klass = buf.readUInt16BE(nameEnd + 2);
  const ttl = buf.readUInt32BE(nameEnd + 4);
  const rdataLength = buf.readUInt16BE(nameEnd + 8);
  const rdataStart = nameEnd + 10;
  const end = rdataStart + rdataLength;
  needBytes(buf, rdataStart, rdataLength, 'record data');
  const base = { name, class: klass, ttl };
  if (klass === DnsClass.IN && type === DnsType.A) {
    if (rdataLength !== 4) throw malformed(`A record with ${rdataLength} bytes of data`, rdataStart);
    return { record: { ...base, type, address: [...buf.subarray(rdataStart, end)].join('.') }, end };
  }
  if (klass === DnsClass.IN && type === DnsType.AAAA) {
    if (rdataLength !== 16) throw malformed(`AAAA record with ${rdataLength} bytes of data`, rdataStart);
    return { record: { ...base, type, address: formatIpv6(buf, rdataStart) }, end };
  }
  if (type === DnsType.CNAME) {
    const target = readName(buf, rdataStart);
    if (target.end !== end) throw malformed('CNAME data length does not match its name', rdataStart);
    return { record: { ...base, type, target: target.name }, end };
  }
  return { record: { ...base, type, rdata: Buffer.from(buf.subarray(rdataStart, end)) }, end };
}

/** Decodes a whole message; bytes after the last record are ignored. */
export function parseMessage(buf: Buffer): DnsMessage {
  const header = parseHeader(buf);
  let offset = DNS_HEADER_SIZE;
  const questions: DnsQuestion[] = [];
  for (let i = 0; i < header.questionCount; i++) {
    const { name, end } = readName(buf, offset);
    needBytes(buf, end, 4, 'question');
    questions.push({ name, type: buf.readUInt16BE(end), class: buf.readUInt16BE(end + 2) });
    offset = end + 4;
  }
  const readSection = (count: number): DnsRecord[] => {
    const records: DnsRecord[] = [];
    for (let i = 0; i < count; i++) {
      const { record, end } = readRecord(buf, offset);
      records.push(record);
      offset = end;
    }
    return records;
  };
  const answers = readSection(header.answerCount);
  const authorities = readSection(header.authorityCount);
  const additionals = readSection(header.additionalCount);
  const { id, qr, opcode, aa, tc, rd, ra, rcode } = header;
  return { id, qr, opcode, aa, tc, rd, ra, rcode, questions, answers, authorities, additionals };
}

/** The UDP payload size the sender advertises with EDNS (RFC 6891), or undefined without an OPT record. */
export function ednsUdpPayloadSize(message: DnsMessage): number | undefined {
  const opt = message.additionals.find((record) => record.type === DnsType.OPT);
  return opt === undefined ? undefined : opt.class;
}

// ---------------------------------------------------------------------------------------------
// Encoding

function checkUint(value: number, bits: 4 | 16 | 32, what: string): number {
  if (!Number.isInteger(value) || value < 0 || value >= 2 ** bits) throw invalid(`${what} ${value} is not an unsigned ${bits}-bit integer`, { [what]: value });
  return value;
}

function encodeRdata(record: DnsRecord): Buffer {
  if (isAddressRecord(record)) {
    if (record.type === DnsType.A && isIPv4(record.address)) return Buffer.from(record.address.split('.').map(Number));
    if (record.type === DnsType.AAAA && isIPv6(record.address) && !record.address.includes('%')) return ipv6ToBytes(record.address);
    throw invalid(`${JSON.stringify(record.address)} is not an address for a type ${record.type} record`, { address: record.address });
  }
  if (isCnameRecord(record)) return encodeName(record.target);
  return record.rdata;
}

function encodeRecord(record: DnsRecord): Buffer {
  const rdata = encodeRdata(record);
  if (rdata.length > 0xffff) throw invalid(`record data of ${rdata.length} bytes`);
  const fixed = Buffer.alloc(10);
  fixed.writeUInt16BE(checkUint(record.type, 16, 'type'), 0);
  fixed.writeUInt16BE(checkUint(record.class, 16, 'class'), 2);
  fixed.writeUInt32BE(checkUint(record.ttl, 32, 'ttl'), 4);
  fixed.writeUInt16BE(rdata.length, 8);
  return Buffer.concat([encodeName(record.name), fixed, rdata]);
}

export function encodeMessage(message: DnsMessageInit): Buffer {
  const questions = message.questions ?? [];
  const sections = [questions, message.answers ?? [], message.authorities ?? [], message.additionals ?? []];
  const header = Buffer.alloc(DNS_HEADER_SIZE);
  header.writeUInt16BE(checkUint(message.id, 16, 'id'), 0);
  const flags =
    (message.qr ? 0x8000 : 0) |
    (checkUint(message.opcode ?? 0, 4, 'opcode') << 11) |
    (message.aa ? 0x0400 : 0) |
    (message.tc ? 0x0200 : 0) |
    (message.rd ? 0x0100 : 0) |
    (message.ra ? 0x0080 : 0) |
    checkUint(message.rcode ?? 0, 4, 'rcode');
  header.writeUInt16BE(flags, 2);
  sections.forEach((section, i) => header.writeUInt16BE(checkUint(section.length, 16, 'section count'), 4 + i * 2));
  const parts: Buffer[] = [header];
  for (const question of questions) {
    const fixed = Buffer.alloc(4);
    fixed.writeUInt16BE(checkUint(question.type, 16, 'type'), 0);
    fixed.writeUInt16BE(checkUint(question.class, 16, 'class'), 2);
    parts.push(encodeName(question.name), fixed);
  }
  for (const section of sections.slice(1) as DnsRecord[][]) for (const record of section) parts.push(encodeRecord(record));
  return Buffer.concat(parts);
}

/** An OPT pseudo-record advertising `udpPayloadSize` (EDNS version 0, no options). */
export function ednsRecord(udpPayloadSize: number): DnsRawRecord {
  return { name: '', type: DnsType.OPT, class: udpPayloadSize, ttl: 0, rdata: Buffer.alloc(0) };
}

export function buildQuery(id: number, name: string, qtype: number, options: { recursionDesired?: boolean; ednsUdpPayloadSize?: number } = {}): Buffer {
  return encodeMessage({
    id,
    rd: options.recursionDesired ?? true,
    questions: [{ name, type: qtype, class: DnsClass.IN }],
    additionals: options.ednsUdpPayloadSize === undefined ? [] : [ednsRecord(options.ednsUdpPayloadSize)],
  });
}

export interface DnsResponseOptions {
  rcode: number;
  answers?: DnsRecord[];
  authorities?: DnsRecord[];
  additionals?: DnsRecord[];
  truncated?: boolean;
  authoritative?: boolean;
  /** Default true. */
  recursionAvailable?: boolean;
}

/** A response to `query`: its id, opcode, RD bit and questions, with QR set. */
export function buildResponse(query: Pick<DnsHeader, 'id'> & Partial<Pick<DnsMessage, 'opcode' | 'rd' | 'questions'>>, options: DnsResponseOptions): Buffer {
  return encodeMessage({
    id: query.id,
    qr: true,
    opcode: query.opcode ?? DnsOpcode.QUERY,
    aa: options.authoritative ?? false,
    tc: options.truncated ?? false,
    rd: query.rd ?? false,
    ra: options.recursionAvailable ?? true,
    rcode: options.rcode,
    questions: query.questions ?? [],
    answers: options.answers ?? [],
    authorities: options.authorities ?? [],
    additionals: options.additionals ?? [],
  });
}
