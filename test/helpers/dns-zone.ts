/**
 * A small authoritative DNS server for tests: answers A, AAAA and CNAME from an in-memory zone over
 * UDP and TCP (same port), NXDOMAIN for unknown names, and logs every question it receives, which
 * is how tests prove that a name was (or was never) forwarded to it.
 */
import * as dgram from 'node:dgram';
import * as net from 'node:net';
import {
  CLASSIC_UDP_PAYLOAD,
  DnsClass,
  DnsRcode,
  DnsType,
  buildResponse,
  ednsUdpPayloadSize,
  normalizeName,
  parseMessage,
  type DnsMessage,
  type DnsRecord,
} from '../../src/shim/network/dns-wire';

export interface ZoneRecord {
  type: 'A' | 'AAAA' | 'CNAME';
  value: string;
  /** Seconds; default 300. */
  ttl?: number;
}
export type ZoneRecords = Record<string, ZoneRecord[]>;

export interface ZoneQuery {
  name: string;
  type: number;
  transport: 'udp' | 'tcp';
}

export interface DnsZone {
  address: string;
  port: number;
  queries: ZoneQuery[];
  setRecords(records: ZoneRecords): void;
  close(): Promise<void>;
}

function normalizeZone(records: ZoneRecords): Map<string, ZoneRecord[]> {
  return new Map(Object.entries(records).map(([name, list]) => [normalizeName(name), list]));
}

function toRecord(name: string, record: ZoneRecord): DnsRecord {
  const ttl = record.ttl ?? 300;
  if (record.type === 'CNAME') return { name, type: DnsType.CNAME, class: DnsClass.IN, ttl, target: normalizeName(record.value) };
  return { name, type: record.type === 'A' ? DnsType.A : DnsType.AAAA, class: DnsClass.IN, ttl, address: record.value };
}

function answer(zone: Map<string, ZoneRecord[]>, query: DnsMessage): { rcode: number; answers: DnsRecord[] } {
  const question = query.questions[0]!;
  const answers: DnsRecord[] = [];
  let owner = question.name;
  for (let hops = 0; hops < 40; hops++) {
    const records = zone.get(owner);
    if (records === undefined) return { rcode: DnsRcode.NXDOMAIN, answers };
    const cname = records.find((record) => record.type === 'CNAME');
    if (cname !== undefined && question.type !== DnsType.CNAME) {
      answers.push(toRecord(owner, cname));
      owner = normalizeName(cname.value);
      continue;
    }
    const wanted = records.filter((record) => toRecord(owner, record).type === question.type);
    answers.push(...wanted.map((record) => toRecord(owner, record)));
    return { rcode: DnsRcode.NOERROR, answers };
  }
  return { rcode: DnsRcode.SERVFAIL, answers: [] };
}

export async function startDnsZone(options: { address?: string; port?: number; records: ZoneRecords }): Promise<DnsZone> {
  const address = options.address ?? '127.0.0.1';
  let zone = normalizeZone(options.records);
  const queries: ZoneQuery[] = [];

  const respond = (raw: Buffer, transport: 'udp' | 'tcp'): Buffer | undefined => {
    let query: DnsMessage;
    try {
      query = parseMessage(raw);
    } catch {
      return undefined;
    }
    if (query.qr || query.questions.length !== 1) return undefined;
    const question = query.questions[0]!;
    queries.push({ name: question.name, type: question.type, transport });
    const { rcode, answers } = answer(zone, query);
    const response = buildResponse(query, { rcode, answers, authoritative: true, recursionAvailable: false });
    const limit = transport === 'tcp' ? 0xffff : Math.max(ednsUdpPayloadSize(query) ?? 0, CLASSIC_UDP_PAYLOAD);
    return response.length <= limit ? response : buildResponse(query, { rcode, truncated: true, authoritative: true, recursionAvailable: false });
  };

  const udp = dgram.createSocket(net.isIPv6(address) ? 'udp6' : 'udp4');
  udp.on('message', (raw, remote) => {
    const response = respond(raw, 'udp');
    if (response !== undefined) udp.send(response, remote.port, remote.address);
  });
  await new Promise<void>((resolve, reject) => {
    udp.once('error', reject);
    udp.bind({ address, port: options.port ?? 0 }, () => {
      udp.off('error', reject);
      resolve();
    });
  });
  const port = udp.address().port;

  const connections = new Set<net.Socket>();
  const tcp = net.createServer((connection) => {
    connections.add(connection);
    connection.on('close', () => connections.delete(connection));
    connection.on('error', () => connection.destroy());
    let pending: Buffer = Buffer.alloc(0);
    connection.on('data', (chunk) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 2 && pending.length >= 2 + pending.readUInt16BE(0)) {
        const raw = pending.subarray(2, 2 + pending.readUInt16BE(0));
        pending = pending.subarray(2 + raw.length);
        const response = respond(raw, 'tcp');
        if (response === undefined) continue;
        const prefix = Buffer.alloc(2);
        prefix.writeUInt16BE(response.length, 0);
        connection.write(Buffer.concat([prefix, response]));
      }
    });
  });
  // TCP is best effort on the port UDP got: tests that need it fail loudly if it is taken.
  await new Promise<void>((resolve) => {
    tcp.once('error', () => resolve());
    tcp.listen({ host: address, port }, () => resolve());
  });

  return {
    address,
    port,
    queries,
    setRecords(records) {
      zone = normalizeZone(records);
    },
    async close() {
      for (const connection of connections) connection.destroy();
      await Promise.all([new Promise<void>((resolve) => udp.close(() => resolve())), new Promise<void>((resolve) => tcp.close(() => resolve()))]);
    },
  };
}
