/**
 * The per-node DNS responder that sandboxes with network use as their resolver.
 *
 * It answers only names of services the asking sandbox may reach: the name is resolved upstream
 * and, before the reply leaves, the answered addresses are handed to the sandbox's `bind` callback
 * (which opens them in that sandbox's eBPF allow map for the DNS TTL). Every other name is REFUSED
 * and never forwarded, so DNS cannot carry data out of a sandbox. There is no cache: every answer
 * goes through the asking sandbox's own bind.
 *
 * What an answer may open is limited three ways before bind is called: addresses the node says
 * no answer may open (special-use ranges, the node's own addresses and subnet, operator-listed
 * ranges: `refusal`) are dropped from the answer; an AAAA that embeds an IPv4 address (mapped,
 * translated, NAT64, 6to4, Teredo) never opens it; a CNAME chain through a name of another
 * service than the question's is REFUSED.
 *
 * Sandboxes share the responder fairly: every query waits in its sender's own queue, and the
 * queues are served round-robin; each sender has bounded queries in flight, upstream lookups
 * and TCP connections, and a TCP connection has deadlines no trickle of bytes can extend.
 */
import { randomInt } from 'node:crypto';
import * as dgram from 'node:dgram';
import { readFileSync } from 'node:fs';
import * as net from 'node:net';
import { WarrenError, asWarrenError } from '../../errors';
import {
  CLASSIC_UDP_PAYLOAD,
  DnsClass,
  DnsOpcode,
  DnsRcode,
  DnsType,
  buildQuery,
  buildResponse,
  canonicalAddress,
  ednsRecord,
  ednsUdpPayloadSize,
  isAddressRecord,
  isCnameRecord,
  parseHeader,
  parseMessage,
  type DnsAddressRecord,
  type DnsCnameRecord,
  type DnsHeader,
  type DnsMessage,
  type DnsQuestion,
  type DnsRecord,
} from './dns-wire';
import { normalizeAddress, specialReason, type RefusalReason } from './special-addr';

export interface DnsAnswerAddress {
  address: string;
  family: 4 | 6;
  ttl: number;
}

/** Something an answer would have opened and did not. */
export interface DnsRefusal {
  service: string;
  /** The question name. */
  name: string;
  /** The refused address; absent when a whole answer was refused (a CNAME chain). */
  address?: string;
  reason: RefusalReason;
  detail: string;
}

export interface DnsClientPolicy {
  /** Id of the sandbox asking (logged). */
  sandboxId: string;
  /** The allowed service a (lower-case, no trailing dot) query name belongs to, or undefined if not allowed. */
  serviceFor(name: string): string | undefined;
  /**
   * Every service of the catalog whose hosts match the name, enabled for this sandbox or not
   * ([] for a name in no service). A CNAME chain may pass only through names of the question's
   * own service or names of none.
   */
  servicesOf(name: string): string[];
  /** Called with the addresses of an allowed answer BEFORE the reply is sent; the reply waits for it. If it throws, answer SERVFAIL. */
  bind(service: string, name: string, addrs: DnsAnswerAddress[]): Promise<void> | void;
  /** Told about every refused address or chain (for the sandbox's denial log). */
  refused?(refusal: DnsRefusal): void;
}

export interface DnsEndpoint {
  address: string;
  port: number;
}

export interface DnsResponderOptions {
  /** Addresses to listen on (UDP and TCP, same port), e.g. [{address:'10.88.0.1', port:53}]; port 0 picks a free one. */
  listen: DnsEndpoint[];
  /** Upstream resolvers, tried in order; default: nameservers from /etc/resolv.conf. */
  upstreams?: DnsEndpoint[];
  /** Who is asking, by the query's source address; undefined = REFUSED. */
  clientFor(sourceAddress: string): DnsClientPolicy | undefined;
  /**
   * Why no answer may open an address (node addresses, subnet, operator ranges), or undefined.
   * Special-use ranges and IPv6 forms embedding IPv4 are refused whatever this says.
   */
  refusal?(address: string): RefusalReason | undefined;
  log?(line: string): void;
  /** Upstream timeout per try (default 2000 ms). */
  upstreamTimeoutMs?: number;
  /** TTLs handed to bind are clamped to [minTtl, maxTtl] (defaults 5 and 3600 s); TTLs in replies are capped at maxTtl. */
  minTtl?: number;
  maxTtl?: number;
  /** A TCP client connection with nothing in flight and no complete query for this long is closed (default 10000 ms); bytes of an unfinished query do not count. */
  tcpIdleTimeoutMs?: number;
  /** A query over TCP must be complete this long after its first byte, or the connection is closed (default 2000 ms). */
  tcpMessageTimeoutMs?: number;
  /** A TCP connection reads no more queries after this long and closes once its answers are written (default 30000 ms). */
  tcpMaxLifetimeMs?: number;
  /** Open TCP client connections over all listen addresses (default 128); when full, the sender with the most gives one up. */
  maxTcpConnections?: number;
  /** Open TCP connections per sender (default 4). */
  maxTcpConnectionsPerClient?: number;
  /** Queries being resolved upstream at once; more are answered SERVFAIL (default 1024). */
  maxConcurrentLookups?: number;
  /** Upstream lookups one sandbox may have in flight (default 32): one sandbox cannot starve the others. */
  maxLookupsPerClient?: number;
  /** Queries one sender may have queued or being answered (default 64); more UDP queries are dropped, TCP ones answered SERVFAIL. */
  maxQueriesPerClient?: number;
}

export interface DnsResponderStats {
  /** Every message received, well-formed or not. */
  queries: number;
  refused: number;
  /** Queries resolved upstream (one per client query, however many upstreams were tried). */
  forwarded: number;
  servfail: number;
  /** Messages that could not be decoded, or were responses rather than queries. */
  malformed: number;
  /** UDP queries dropped unread because their sender had maxQueriesPerClient in flight. */
  dropped: number;
  /** Answered addresses not bound (and left out of the reply), and CNAME chains refused. */
  refusedAddresses: number;
  /** TCP connections closed by a deadline, a per-sender limit or to make room for another sender. */
  tcpClosed: number;
}

/** The payload size this responder advertises with EDNS and the most it sends over UDP. */
const EDNS_UDP_PAYLOAD = 1232;
const MAX_TCP_QUERY_BYTES = 4096;
const MAX_TCP_MESSAGE_BYTES = 0xffff;
const MAX_PIPELINED_PER_CONNECTION = 16;
const MAX_CNAME_CHAIN = 16;
/** RFC 2181 8: a TTL with the top bit set is read as zero. */
const MAX_SIGNED_TTL = 0x7fffffff;
/** Tries to find a port free for both UDP and TCP when port 0 is asked. */
const EPHEMERAL_PORT_TRIES = 16;

interface Reply {
  query: Pick<DnsHeader, 'id' | 'opcode' | 'rd'> & { questions?: DnsQuestion[] };
  rcode: number;
  answers?: DnsRecord[];
  /** The UDP payload size the query advertised with EDNS; the reply then carries an OPT record too. */
  ednsPayload?: number;
}

/** One received query waiting in its sender's queue. */
interface Job {
  message: Buffer;
  source: string;
  transport: 'udp' | 'tcp';
  done(response: Buffer | undefined): void;
}

interface TcpClient {
  socket: net.Socket;
  source: string;
  openedAt: number;
  inFlight: number;
}

/**
 * Queries answered per turn of the event loop before the sockets are read again. Fewer than libuv
 * reads per turn (32 datagrams), so the shared receive buffer drains faster than queries are
 * answered: a flooding sender's excess is then dropped at its own queue, cheaply, instead of
 * holding other senders' datagrams behind it in the kernel.
 */
const PUMP_BATCH = 8;

interface Listener {
  address: string;
  port: number;
  udp: dgram.Socket;
  tcp: net.Server;
}

/** Nameservers in a resolv.conf (port 53), in order; [] when it cannot be read. */
export function readResolvConf(path = '/etc/resolv.conf'): DnsEndpoint[] {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch {
    return [];
  }
  const upstreams: DnsEndpoint[] = [];
  for (const line of text.split('\n')) {
    const address = /^\s*nameserver\s+(\S+)/.exec(line)?.[1];
    if (address !== undefined && net.isIP(address) !== 0) upstreams.push({ address, port: 53 });
  }
  return upstreams;
}

function checkEndpoint(endpoint: DnsEndpoint, what: string): DnsEndpoint {
  if (net.isIP(endpoint.address) === 0 || !Number.isInteger(endpoint.port) || endpoint.port < 0 || endpoint.port > 0xffff) {
    throw new WarrenError('INVALID_ARGUMENT', `${what} ${JSON.stringify(endpoint)} is not an IP address and port`, { [what]: endpoint });
  }
  return { address: endpoint.address, port: endpoint.port };
}

function checkCount(value: number | undefined, fallback: number, what: string, min: number): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < min) throw new WarrenError('INVALID_ARGUMENT', `${what} must be an integer >= ${min}, not ${value}`, { [what]: value });
  return value;
}

/** Source addresses of IPv4 clients on a dual-stack socket come as ::ffff:a.b.c.d. */
function unmapIpv4(address: string): string {
  return address.startsWith('::ffff:') && net.isIPv4(address.slice(7)) ? address.slice(7) : address;
}

function sameAddress(a: string, b: string): boolean {
  const comparable = (address: string): string => {
    const plain = unmapIpv4(address.split('%')[0]!);
    return net.isIP(plain) === 0 ? plain : canonicalAddress(plain);
  };
  return comparable(a) === comparable(b);
}

function endpointText(endpoint: DnsEndpoint): string {
  return net.isIPv6(endpoint.address) ? `[${endpoint.address}]:${endpoint.port}` : `${endpoint.address}:${endpoint.port}`;
}

function typeName(type: number): string {
  return Object.entries(DnsType).find(([, value]) => value === type)?.[0] ?? `TYPE${type}`;
}

function withLengthPrefix(message: Buffer): Buffer {
  const prefix = Buffer.alloc(2);
  prefix.writeUInt16BE(message.length, 0);
  return Buffer.concat([prefix, message]);
}

/**
 * Splits a TCP byte stream into 2-byte-length-prefixed DNS messages. `push` returns false (and
 * stops) when a message announces more than `maxLength` bytes; `partial` says whether bytes of an
 * unfinished message are waiting.
 */
function lengthPrefixedReader(maxLength: number, onMessage: (message: Buffer) => void): { push(chunk: Buffer): boolean; partial(): boolean } {
  let pending: Buffer = Buffer.alloc(0);
  return {
    push(chunk) {
      pending = pending.length === 0 ? chunk : Buffer.concat([pending, chunk]);
      while (pending.length >= 2) {
        const length = pending.readUInt16BE(0);
        if (length > maxLength) return false;
        if (pending.length < 2 + length) break;
        const message = pending.subarray(2, 2 + length);
        pending = pending.subarray(2 + length);
        onMessage(message);
      }
      return true;
    },
    partial: () => pending.length > 0,
  };
}

/**
 * Follows the CNAME chain from the question name through the upstream answer section and collects
 * the address records of the question's type at its end. Records for any other owner name are
 * ignored: they are not what was asked and must not be bound. A chain that loops or is longer
 * than MAX_CNAME_CHAIN is `broken` (the answer is SERVFAIL and nothing is bound).
 */
function answerChain(question: DnsQuestion, reply: DnsMessage): { cnames: DnsCnameRecord[]; addresses: DnsAddressRecord[]; broken?: string } {
  const cnames: DnsCnameRecord[] = [];
  const seen = new Set<string>([question.name]);
  let owner = question.name;
  for (;;) {
    const cname = reply.answers.find((record): record is DnsCnameRecord => isCnameRecord(record) && record.name === owner);
    if (cname === undefined) break;
    if (seen.has(cname.target)) return { cnames, addresses: [], broken: `the CNAME chain loops at ${cname.target}` };
    if (cnames.length >= MAX_CNAME_CHAIN) return { cnames, addresses: [], broken: `the CNAME chain is longer than ${MAX_CNAME_CHAIN}` };
    cnames.push(cname);
    seen.add(cname.target);
    owner = cname.target;
  }
  const addresses = reply.answers.filter(
    (record): record is DnsAddressRecord => isAddressRecord(record) && record.name === owner && record.type === question.type && record.class === DnsClass.IN,
  );
  return { cnames, addresses };
}

/** Why no answer may open an address whatever the node says: special-use, or an IPv6 form of an IPv4 address. */
function builtinRefusal(address: string): RefusalReason | undefined {
  return specialReason(address) ?? (normalizeAddress(address).embedded ? 'embedded-ipv4' : undefined);
}

function closeListener(listener: Listener): Promise<void> {
  const udpClosed = new Promise<void>((resolve) => listener.udp.close(() => resolve()));
  const tcpClosed = new Promise<void>((resolve) => listener.tcp.close(() => resolve()));
  return Promise.all([udpClosed, tcpClosed]).then(() => undefined);
}

export class DnsResponder {
  private readonly options: DnsResponderOptions;
  private readonly listen: DnsEndpoint[];
  private readonly upstreamTimeoutMs: number;
  private readonly minTtl: number;
  private readonly maxTtl: number;
  private readonly tcpIdleTimeoutMs: number;
  private readonly maxTcpConnections: number;
  private readonly maxConcurrentLookups: number;
  private readonly maxLookupsPerClient: number;
  private readonly tcpMessageTimeoutMs: number;
  private readonly tcpMaxLifetimeMs: number;
  private readonly maxTcpConnectionsPerClient: number;
  private readonly maxQueriesPerClient: number;
  private readonly lookupsByClient = new Map<string, number>();
  /** Per sender: queries waiting to be answered, and how many it has queued or being answered. */
  private readonly queues = new Map<string, { jobs: Job[]; pending: number }>();
  /** Senders with queued jobs, in round-robin order. */
  private readonly ready: string[] = [];
  private pumpScheduled: NodeJS.Immediate | undefined;
  /** Open TCP connections by sender, oldest first. */
  private readonly tcpBySource = new Map<string, TcpClient[]>();
  private upstreams: DnsEndpoint[] = [];
  private readonly listeners: Listener[] = [];
  private readonly tcpConnections = new Set<TcpClient>();
  /** Aborts of the upstream exchanges in flight; close() calls them all. */
  private readonly upstreamExchanges = new Set<() => void>();
  private lookupsInFlight = 0;
  private state: 'new' | 'starting' | 'running' | 'closed' = 'new';
  private closing: Promise<void> | undefined;
  private readonly counters: DnsResponderStats = { queries: 0, refused: 0, forwarded: 0, servfail: 0, malformed: 0, dropped: 0, refusedAddresses: 0, tcpClosed: 0 };

  constructor(options: DnsResponderOptions) {
    if (!Array.isArray(options.listen) || options.listen.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'a DNS responder needs at least one listen address');
    this.options = options;
    this.listen = options.listen.map((endpoint) => checkEndpoint(endpoint, 'listen'));
    if (options.upstreams !== undefined) this.upstreams = options.upstreams.map((endpoint) => checkEndpoint(endpoint, 'upstream'));
    this.upstreamTimeoutMs = checkCount(options.upstreamTimeoutMs, 2000, 'upstreamTimeoutMs', 1);
    this.minTtl = checkCount(options.minTtl, 5, 'minTtl', 0);
    this.maxTtl = checkCount(options.maxTtl, 3600, 'maxTtl', this.minTtl);
    this.tcpIdleTimeoutMs = checkCount(options.tcpIdleTimeoutMs, 10_000, 'tcpIdleTimeoutMs', 1);
    this.maxTcpConnections = checkCount(options.maxTcpConnections, 128, 'maxTcpConnections', 1);
    this.maxConcurrentLookups = checkCount(options.maxConcurrentLookups, 1024, 'maxConcurrentLookups', 1);
    this.maxLookupsPerClient = checkCount(options.maxLookupsPerClient, 32, 'maxLookupsPerClient', 1);
    this.tcpMessageTimeoutMs = checkCount(options.tcpMessageTimeoutMs, 2000, 'tcpMessageTimeoutMs', 1);
    this.tcpMaxLifetimeMs = checkCount(options.tcpMaxLifetimeMs, 30_000, 'tcpMaxLifetimeMs', 1);
    this.maxTcpConnectionsPerClient = checkCount(options.maxTcpConnectionsPerClient, 4, 'maxTcpConnectionsPerClient', 1);
    this.maxQueriesPerClient = checkCount(options.maxQueriesPerClient, 64, 'maxQueriesPerClient', 1);
  }

  /** Binds UDP and TCP on every listen address; on any failure closes what it bound and rejects. */
  async start(): Promise<void> {
    if (this.state !== 'new') throw new WarrenError('INVALID_ARGUMENT', `DNS responder cannot start: it is ${this.state}`);
    this.state = 'starting';
    if (this.options.upstreams === undefined) this.upstreams = readResolvConf();
    if (this.upstreams.length === 0) {
      this.state = 'closed';
      throw new WarrenError('INVALID_ARGUMENT', 'DNS responder has no upstream resolvers: none given and /etc/resolv.conf lists no nameserver');
    }
    try {
      for (const endpoint of this.listen) {
        const listener = await this.bindListener(endpoint);
        if (this.closing !== undefined) {
          await closeListener(listener);
          throw new WarrenError('UNAVAILABLE', 'DNS responder was closed while starting');
        }
        this.listeners.push(listener);
      }
    } catch (err) {
      await this.close();
      throw err;
    }
    this.state = 'running';
    this.log(`dns: listening on ${this.addresses().map(endpointText).join(', ')}, upstreams ${this.upstreams.map(endpointText).join(', ')}`);
  }

  /** Closes every socket and fails the upstream exchanges in flight; leaves no timers behind. */
  close(): Promise<void> {
    if (this.closing !== undefined) return this.closing;
    this.state = 'closed';
    for (const abort of [...this.upstreamExchanges]) abort();
    for (const client of this.tcpConnections) client.socket.destroy();
    if (this.pumpScheduled !== undefined) clearImmediate(this.pumpScheduled);
    this.pumpScheduled = undefined;
    for (const queue of this.queues.values()) for (const job of queue.jobs) job.done(undefined);
    this.queues.clear();
    this.ready.length = 0;
    this.closing = Promise.all(this.listeners.map(closeListener)).then(() => undefined);
    return this.closing;
  }

  stats(): DnsResponderStats {
    return { ...this.counters };
  }

  /** The addresses listened on, with the actual port (UDP and TCP share it) where port 0 was asked. */
  addresses(): DnsEndpoint[] {
    return this.listeners.map(({ address, port }) => ({ address, port }));
  }

  private log(line: string): void {
    try {
      this.options.log?.(line);
    } catch {
      // A broken logger must not take DNS down with it.
    }
  }

  // -------------------------------------------------------------------------------------------
  // Listening

  private async bindListener(endpoint: DnsEndpoint): Promise<Listener> {
    const tries = endpoint.port === 0 ? EPHEMERAL_PORT_TRIES : 1;
    for (let attempt = 1; ; attempt++) {
      const udp = await this.bindUdp(endpoint);
      const port = udp.address().port;
      try {
        const tcp = await this.listenTcp({ address: endpoint.address, port });
        return { address: endpoint.address, port, udp, tcp };
      } catch (err) {
        udp.close();
        // With port 0 the kernel picked a UDP port whose TCP twin may be taken: pick again.
        if (attempt >= tries || (err as WarrenError).details?.['reason'] !== 'EADDRINUSE') throw err;
      }
    }
  }

  private bindUdp(endpoint: DnsEndpoint): Promise<dgram.Socket> {
    return new Promise((resolve, reject) => {
      const socket = dgram.createSocket(net.isIPv6(endpoint.address) ? 'udp6' : 'udp4');
      const onBindError = (err: NodeJS.ErrnoException): void => {
        try {
          socket.close();
        } catch {
          // never bound
        }
        reject(this.listenError('udp', endpoint, err));
      };
      socket.once('error', onBindError);
      socket.bind({ address: endpoint.address, port: endpoint.port, exclusive: true }, () => {
        socket.off('error', onBindError);
        socket.on('error', (err) => this.log(`dns: udp ${endpointText(endpoint)}: ${err.message}`));
        socket.on('message', (message, remote) => this.onUdpMessage(socket, message, remote));
        resolve(socket);
      });
    });
  }

  private listenTcp(endpoint: DnsEndpoint): Promise<net.Server> {
    return new Promise((resolve, reject) => {
      const server = net.createServer((connection) => this.onTcpConnection(connection));
      const onListenError = (err: NodeJS.ErrnoException): void => {
        server.close();
        reject(this.listenError('tcp', endpoint, err));
      };
      server.once('error', onListenError);
      server.listen({ host: endpoint.address, port: endpoint.port, exclusive: true }, () => {
        server.off('error', onListenError);
        server.on('error', (err) => this.log(`dns: tcp ${endpointText(endpoint)}: ${err.message}`));
        resolve(server);
      });
    });
  }

  private listenError(protocol: 'udp' | 'tcp', endpoint: DnsEndpoint, err: NodeJS.ErrnoException): WarrenError {
    return new WarrenError('UNAVAILABLE', `DNS responder cannot listen on ${protocol} ${endpointText(endpoint)}: ${err.message}`, {
      protocol,
      address: endpoint.address,
      port: endpoint.port,
      reason: err.code ?? 'unknown',
    });
  }

  private onUdpMessage(socket: dgram.Socket, message: Buffer, remote: dgram.RemoteInfo): void {
    const source = unmapIpv4(remote.address);
    const accepted = this.enqueue({
      message,
      source,
      transport: 'udp',
      done: (response) => {
        if (response === undefined || this.state === 'closed') return;
        socket.send(response, remote.port, remote.address, (err) => {
          if (err) this.log(`dns: reply to ${remote.address}:${remote.port}: ${err.message}`);
        });
      },
    });
    if (!accepted) this.counters.dropped += 1; // the sender retries; answering a flood would double it
  }

  // -------------------------------------------------------------------------------------------
  // Fair queueing: each sender's queries wait in its own queue; queues are served round-robin.

  /** Queue a query for its sender; false when the sender already has maxQueriesPerClient in flight. */
  private enqueue(job: Job): boolean {
    if (this.state === 'closed') return false;
    let queue = this.queues.get(job.source);
    if (queue === undefined) {
      queue = { jobs: [], pending: 0 };
      this.queues.set(job.source, queue);
    }
    if (queue.pending >= this.maxQueriesPerClient) return false;
    queue.pending += 1;
    queue.jobs.push(job);
    if (queue.jobs.length === 1) this.ready.push(job.source);
    this.schedulePump();
    return true;
  }

  private schedulePump(): void {
    if (this.pumpScheduled === undefined && this.ready.length > 0) this.pumpScheduled = setImmediate(() => this.pump());
  }

  private pump(): void {
    this.pumpScheduled = undefined;
    for (let served = 0; served < PUMP_BATCH && this.ready.length > 0 && this.state !== 'closed'; served++) {
      const source = this.ready.shift()!;
      const queue = this.queues.get(source)!;
      const job = queue.jobs.shift()!;
      if (queue.jobs.length > 0) this.ready.push(source);
      void this.respond(job.message, job.source, job.transport).then((response) => {
        queue.pending -= 1;
        if (queue.pending === 0 && queue.jobs.length === 0 && this.queues.get(source) === queue) this.queues.delete(source);
        job.done(response);
      });
    }
    // the rest after the sockets have been read again: new senders join the rotation
    this.schedulePump();
  }

  // -------------------------------------------------------------------------------------------
  // TCP clients

  private onTcpConnection(connection: net.Socket): void {
    if (this.state === 'closed') {
      connection.destroy();
      return;
    }
    const source = unmapIpv4(connection.remoteAddress ?? '');
    connection.on('error', (err) => this.log(`dns: tcp client ${source}: ${err.message}`));
    const mine = this.tcpBySource.get(source) ?? [];
    if (mine.length >= this.maxTcpConnectionsPerClient) {
      this.counters.tcpClosed += 1;
      this.log(`dns: tcp client ${source} already has ${mine.length} connections; closing the new one`);
      connection.destroy();
      return;
    }
    if (this.tcpConnections.size >= this.maxTcpConnections && !this.evictFor(source, mine.length)) {
      this.counters.tcpClosed += 1;
      this.log(`dns: ${this.tcpConnections.size} tcp connections open; closing the new one from ${source}`);
      connection.destroy();
      return;
    }
    const client: TcpClient = { socket: connection, source, openedAt: Date.now(), inFlight: 0 };
    this.tcpConnections.add(client);
    mine.push(client);
    this.tcpBySource.set(source, mine);

    // One timer for three deadlines: idle (no complete query and nothing owed), an unfinished
    // query (from its first byte), and the connection's lifetime. Bytes alone never re-arm it.
    let lastActivity = client.openedAt;
    let partialSince: number | undefined;
    let draining = false;
    let timer: NodeJS.Timeout | undefined;
    const closeFor = (why: string): void => {
      this.counters.tcpClosed += 1;
      this.log(`dns: tcp client ${source}: ${why}; closing`);
      connection.destroy();
    };
    const check = (): void => {
      timer = undefined;
      if (connection.destroyed) return;
      const now = Date.now();
      if (partialSince !== undefined && now - partialSince >= this.tcpMessageTimeoutMs) return closeFor(`a query unfinished after ${this.tcpMessageTimeoutMs} ms`);
      if (!draining && now - client.openedAt >= this.tcpMaxLifetimeMs) {
        draining = true; // no more queries; close once what is owed is written
        connection.pause();
      }
      if (draining && client.inFlight === 0) {
        this.counters.tcpClosed += 1;
        return void connection.end(() => connection.destroy());
      }
      if (client.inFlight === 0 && partialSince === undefined && now - lastActivity >= this.tcpIdleTimeoutMs) {
        this.counters.tcpClosed += 1;
        return void connection.destroy();
      }
      arm();
    };
    const arm = (): void => {
      if (timer !== undefined) clearTimeout(timer);
      const now = Date.now();
      let at = draining ? Infinity : client.openedAt + this.tcpMaxLifetimeMs;
      if (partialSince !== undefined) at = Math.min(at, partialSince + this.tcpMessageTimeoutMs);
      if (client.inFlight === 0 && partialSince === undefined) at = Math.min(at, lastActivity + this.tcpIdleTimeoutMs);
      if (at === Infinity) return; // draining with answers owed: their writes call check()
      timer = setTimeout(check, Math.max(0, at - now));
    };
    connection.on('close', () => {
      if (timer !== undefined) clearTimeout(timer);
      this.tcpConnections.delete(client);
      const list = this.tcpBySource.get(source);
      const at = list?.indexOf(client) ?? -1;
      if (list && at >= 0) list.splice(at, 1);
      if (list?.length === 0) this.tcpBySource.delete(source);
    });
    const read = lengthPrefixedReader(MAX_TCP_QUERY_BYTES, (message) => {
      lastActivity = Date.now();
      client.inFlight += 1;
      if (client.inFlight >= MAX_PIPELINED_PER_CONNECTION) connection.pause();
      const answer = (response: Buffer | undefined): void => {
        client.inFlight -= 1;
        if (connection.destroyed) return;
        if (!draining) connection.resume();
        if (response !== undefined) connection.write(withLengthPrefix(response));
        // a client that does not read its answers is not buffered for without bound
        if (connection.writableLength > 2 * MAX_TCP_MESSAGE_BYTES) return closeFor('answers are not being read');
        lastActivity = Date.now();
        check();
      };
      const copy = Buffer.from(message);
      if (!this.enqueue({ message: copy, source, transport: 'tcp', done: answer })) answer(this.overloaded(copy));
    });
    connection.on('data', (chunk) => {
      if (draining) return;
      if (!read.push(chunk)) {
        this.log(`dns: tcp client ${source} sent a message over ${MAX_TCP_QUERY_BYTES} bytes; closing`);
        connection.destroy();
        return;
      }
      const partial = read.partial();
      if (partial && partialSince === undefined) partialSince = Date.now();
      if (!partial) partialSince = undefined;
      arm();
    });
    arm();
  }

  /**
   * Make room for a connection from `source` (which has `has` open) by closing one of the sender
   * with the most connections, if it has more; its oldest connection with nothing owed goes first.
   */
  private evictFor(source: string, has: number): boolean {
    let victim: string | undefined;
    let most = has + 1;
    for (const [other, list] of this.tcpBySource) {
      if (other !== source && list.length > most) {
        victim = other;
        most = list.length;
      }
    }
    if (victim === undefined) return false;
    const list = this.tcpBySource.get(victim)!;
    const client = list.find((c) => c.inFlight === 0) ?? list[0]!;
    this.counters.tcpClosed += 1;
    this.log(`dns: tcp client ${victim} holds ${list.length} connections; closing one for ${source}`);
    client.socket.destroy();
    // 'close' is emitted later: take it out of the counts now
    this.tcpConnections.delete(client);
    list.splice(list.indexOf(client), 1);
    return true;
  }

  /** SERVFAIL for a query that could not even be queued (its sender has too many in flight). */
  private overloaded(raw: Buffer): Buffer | undefined {
    this.counters.queries += 1;
    this.counters.servfail += 1;
    try {
      return buildResponse(parseHeader(raw), { rcode: DnsRcode.SERVFAIL });
    } catch {
      this.counters.malformed += 1;
      return undefined;
    }
  }

  // -------------------------------------------------------------------------------------------
  // Answering

  /** The encoded reply to one received message, or undefined to send nothing. Never rejects. */
  private async respond(message: Buffer, source: string, transport: 'udp' | 'tcp'): Promise<Buffer | undefined> {
    this.counters.queries += 1;
    let reply: Reply | undefined;
    try {
      reply = await this.decide(message, source);
    } catch (err) {
      this.log(`dns: internal error answering ${source}: ${asWarrenError(err).message}`);
      return undefined;
    }
    if (reply === undefined) return undefined;
    if (reply.rcode === DnsRcode.REFUSED) this.counters.refused += 1;
    if (reply.rcode === DnsRcode.SERVFAIL) this.counters.servfail += 1;
    return this.encodeReply(reply, transport);
  }

  private encodeReply(reply: Reply, transport: 'udp' | 'tcp'): Buffer {
    const additionals = reply.ednsPayload === undefined ? [] : [ednsRecord(EDNS_UDP_PAYLOAD)];
    const full = buildResponse(reply.query, { rcode: reply.rcode, answers: reply.answers ?? [], additionals });
    const udpLimit = Math.min(Math.max(reply.ednsPayload ?? 0, CLASSIC_UDP_PAYLOAD), EDNS_UDP_PAYLOAD);
    if (full.length <= (transport === 'tcp' ? MAX_TCP_MESSAGE_BYTES : udpLimit)) return full;
    return buildResponse(reply.query, { rcode: reply.rcode, truncated: true, additionals });
  }

  private async decide(raw: Buffer, source: string): Promise<Reply | undefined> {
    let header: DnsHeader;
    try {
      header = parseHeader(raw);
    } catch {
      this.counters.malformed += 1;
      return undefined; // not even an id to answer to
    }
    if (header.qr) {
      // Answering responses invites reflection loops between two servers.
      this.counters.malformed += 1;
      return undefined;
    }
    if (header.opcode !== DnsOpcode.QUERY) return { query: header, rcode: DnsRcode.NOTIMP };
    let query: DnsMessage;
    try {
      query = parseMessage(raw);
    } catch (err) {
      this.counters.malformed += 1;
      this.log(`dns: FORMERR to ${source}: ${asWarrenError(err).message}`);
      return { query: header, rcode: DnsRcode.FORMERR };
    }
    const optRecordCount = query.additionals.filter((record) => record.type === DnsType.OPT).length;
    if (query.questions.length !== 1 || optRecordCount > 1) return { query: { ...header, questions: query.questions.slice(0, 1) }, rcode: DnsRcode.FORMERR };
    const question = query.questions[0]!;
    const ednsPayload = ednsUdpPayloadSize(query);
    const reply = (rcode: number, answers: DnsRecord[] = []): Reply => ({ query, rcode, answers, ...(ednsPayload === undefined ? {} : { ednsPayload }) });
    const what = `${question.name} ${typeName(question.type)}`;

    let client: DnsClientPolicy | undefined;
    let service: string | undefined;
    try {
      client = this.options.clientFor(source);
      service = client !== undefined && question.class === DnsClass.IN ? client.serviceFor(question.name) : undefined;
    } catch (err) {
      this.log(`dns: SERVFAIL ${what} from ${source}: policy lookup failed: ${asWarrenError(err).message}`);
      return reply(DnsRcode.SERVFAIL);
    }
    if (client === undefined) {
      this.log(`dns: refused ${what} from unknown client ${source}`);
      return reply(DnsRcode.REFUSED);
    }
    if (service === undefined) {
      this.log(`dns: refused ${what} for sandbox ${client.sandboxId}`);
      return reply(DnsRcode.REFUSED);
    }
    if (question.type !== DnsType.A && question.type !== DnsType.AAAA) return reply(DnsRcode.NOERROR);

    if (this.lookupsInFlight >= this.maxConcurrentLookups) {
      this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: ${this.lookupsInFlight} lookups already in flight`);
      return reply(DnsRcode.SERVFAIL);
    }
    const mine = this.lookupsByClient.get(client.sandboxId) ?? 0;
    if (mine >= this.maxLookupsPerClient) {
      this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: it already has ${mine} lookups in flight`);
      return reply(DnsRcode.SERVFAIL);
    }
    this.counters.forwarded += 1;
    this.lookupsInFlight += 1;
    this.lookupsByClient.set(client.sandboxId, mine + 1);
    let upstreamReply: DnsMessage;
    try {
      upstreamReply = await this.resolveUpstream(question);
    } catch (err) {
      this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: ${asWarrenError(err).message}`);
      return reply(DnsRcode.SERVFAIL);
    } finally {
      this.lookupsInFlight -= 1;
      const left = (this.lookupsByClient.get(client.sandboxId) ?? 1) - 1;
      if (left > 0) this.lookupsByClient.set(client.sandboxId, left);
      else this.lookupsByClient.delete(client.sandboxId);
    }

    const { cnames, addresses, broken } = answerChain(question, upstreamReply);
    if (broken !== undefined) {
      this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: ${broken}`);
      return reply(DnsRcode.SERVFAIL);
    }
    // A chain may pass only through names of the question's own service and names of none: a
    // name of another service (denied, or enabled with other ports) is that service's to open.
    for (const cname of cnames) {
      let owners: string[];
      try {
        owners = client.servicesOf(cname.target);
      } catch (err) {
        this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: policy lookup failed: ${asWarrenError(err).message}`);
        return reply(DnsRcode.SERVFAIL);
      }
      if (owners.length > 0 && !owners.includes(service)) {
        const detail = `CNAME ${cname.name} -> ${cname.target}, a name of ${owners.join(', ')}, not of ${service}`;
        this.refuse(client, { service, name: question.name, reason: 'cname', detail });
        return reply(DnsRcode.REFUSED);
      }
    }
    const kept: DnsAddressRecord[] = [];
    const bound: DnsAnswerAddress[] = [];
    for (const record of addresses) {
      let reason: RefusalReason | undefined;
      try {
        reason = builtinRefusal(record.address) ?? this.options.refusal?.(record.address);
      } catch (err) {
        this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: address check failed: ${asWarrenError(err).message}`);
        return reply(DnsRcode.SERVFAIL);
      }
      if (reason !== undefined) {
        const embedded = normalizeAddress(record.address).embedded;
        const detail = embedded ? `${record.address} is ${embedded.form} IPv4 ${embedded.ipv4}` : `${record.address} is ${reason}`;
        this.refuse(client, { service, name: question.name, address: record.address, reason, detail });
        continue;
      }
      kept.push(record);
      bound.push({
        address: record.address,
        family: record.type === DnsType.A ? 4 : 6,
        ttl: Math.min(Math.max(this.replyTtl(record.ttl), this.minTtl), this.maxTtl),
      });
    }
    if (bound.length > 0) {
      try {
        await client.bind(service, question.name, bound);
      } catch (err) {
        this.log(`dns: SERVFAIL ${what} for sandbox ${client.sandboxId}: bind failed: ${asWarrenError(err).message}`);
        return reply(DnsRcode.SERVFAIL);
      }
    }
    const refusedNote = kept.length < addresses.length ? `, ${addresses.length - kept.length} refused` : '';
    this.log(`dns: ${what} for sandbox ${client.sandboxId} (service ${service}): rcode ${upstreamReply.rcode}, ${bound.length} address(es) bound${refusedNote}`);
    // A client must not cache an address longer than bind allowed it: cap reply TTLs at maxTtl.
    // Refused addresses are left out: the sandbox is not sent somewhere it cannot go.
    const answers = [...cnames, ...kept].map((record) => ({ ...record, ttl: Math.min(this.replyTtl(record.ttl), this.maxTtl) }));
    return reply(upstreamReply.rcode, answers);
  }

  private refuse(client: DnsClientPolicy, refusal: DnsRefusal): void {
    this.counters.refusedAddresses += 1;
    this.log(`dns: refused to open for sandbox ${client.sandboxId} (${refusal.name}, service ${refusal.service}): ${refusal.detail}`);
    try {
      client.refused?.(refusal);
    } catch (err) {
      this.log(`dns: reporting a refusal for ${client.sandboxId} failed: ${asWarrenError(err).message}`);
    }
  }

  private replyTtl(ttl: number): number {
    return ttl > MAX_SIGNED_TTL ? 0 : ttl;
  }

  // -------------------------------------------------------------------------------------------
  // Upstream

  private async resolveUpstream(question: DnsQuestion): Promise<DnsMessage> {
    const failures: string[] = [];
    for (const upstream of this.upstreams) {
      if (this.state === 'closed') break;
      try {
        let answer = await this.exchange(upstream, question, 'udp');
        if (answer.tc) answer = await this.exchange(upstream, question, 'tcp');
        if (answer.rcode === DnsRcode.NOERROR || answer.rcode === DnsRcode.NXDOMAIN) return answer;
        failures.push(`${endpointText(upstream)} answered rcode ${answer.rcode}`);
      } catch (err) {
        failures.push(`${endpointText(upstream)}: ${asWarrenError(err).message}`);
      }
    }
    throw new WarrenError('UNAVAILABLE', `no upstream resolved ${question.name}: ${failures.join('; ') || 'responder closed'}`);
  }

  /**
   * One query to one upstream, with a fresh random id (and, over UDP, a fresh socket and so a
   * random source port). Replies from elsewhere, with another id or another question are ignored.
   */
  private exchange(upstream: DnsEndpoint, question: DnsQuestion, transport: 'udp' | 'tcp'): Promise<DnsMessage> {
    const id = randomInt(0x10000);
    const query = buildQuery(id, question.name, question.type, { ednsUdpPayloadSize: EDNS_UDP_PAYLOAD });
    const accept = (message: Buffer): DnsMessage | undefined => {
      let answer: DnsMessage;
      try {
        answer = parseMessage(message);
      } catch (err) {
        this.log(`dns: ignored malformed reply from ${endpointText(upstream)}: ${asWarrenError(err).message}`);
        return undefined;
      }
      const echoed = answer.questions[0];
      const matches =
        answer.qr &&
        answer.id === id &&
        answer.questions.length === 1 &&
        echoed!.name === question.name &&
        echoed!.type === question.type &&
        echoed!.class === question.class;
      if (!matches) this.log(`dns: ignored mismatched reply from ${endpointText(upstream)} for ${question.name}`);
      return matches ? answer : undefined;
    };
    const what = `${transport} query to ${endpointText(upstream)}`;
    return this.withDeadline<DnsMessage>(what, (finish) => (transport === 'udp' ? this.exchangeUdp(upstream, query, accept, finish) : this.exchangeTcp(upstream, query, accept, finish)));
  }

  private exchangeUdp(upstream: DnsEndpoint, query: Buffer, accept: (message: Buffer) => DnsMessage | undefined, finish: (err: Error | null, answer?: DnsMessage) => void): () => void {
    const socket = dgram.createSocket(net.isIPv6(upstream.address) ? 'udp6' : 'udp4');
    socket.on('error', (err) => finish(err));
    socket.on('message', (message, remote) => {
      if (remote.port !== upstream.port || !sameAddress(remote.address, upstream.address)) return;
      const answer = accept(message);
      if (answer !== undefined) finish(null, answer);
    });
    socket.send(query, upstream.port, upstream.address, (err) => {
      if (err) finish(err);
    });
    return () => {
      try {
        socket.close();
      } catch {
        // already closed after an error
      }
    };
  }

  private exchangeTcp(upstream: DnsEndpoint, query: Buffer, accept: (message: Buffer) => DnsMessage | undefined, finish: (err: Error | null, answer?: DnsMessage) => void): () => void {
    const socket = net.connect({ host: upstream.address, port: upstream.port });
    const read = lengthPrefixedReader(MAX_TCP_MESSAGE_BYTES, (message) => {
      const answer = accept(message);
      if (answer !== undefined) finish(null, answer);
    });
    socket.on('data', (chunk) => read.push(chunk));
    socket.on('error', (err) => finish(err));
    socket.on('close', () => finish(new Error('connection closed without an answer')));
    socket.write(withLengthPrefix(query));
    return () => socket.destroy();
  }

  /**
   * Runs `start` (which returns its cleanup) until it calls `finish`, the upstream timeout passes,
   * or close() aborts it; settles once and always cleans up.
   */
  private withDeadline<T>(what: string, start: (finish: (err: Error | null, value?: T) => void) => () => void): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      let settled = false;
      let cleanup: (() => void) | undefined;
      const finish = (err: Error | null, value?: T): void => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        this.upstreamExchanges.delete(abort);
        cleanup?.();
        if (err !== null) reject(err);
        else resolve(value as T);
      };
      const abort = (): void => finish(new WarrenError('UNAVAILABLE', `${what} abandoned: DNS responder closed`));
      const timer = setTimeout(() => finish(new WarrenError('TIMEOUT', `${what} timed out after ${this.upstreamTimeoutMs} ms`)), this.upstreamTimeoutMs);
      this.upstreamExchanges.add(abort);
      try {
        cleanup = start(finish);
      } catch (err) {
        finish(err instanceof Error ? err : new Error(String(err)));
      }
      if (settled) cleanup?.();
    });
  }
}
