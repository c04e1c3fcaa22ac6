/**
 * The per-node DNS responder over real UDP and TCP sockets on 127.0.0.1, with a real authoritative
 * test zone as its upstream. Clients with different policies are told apart by source address
 * (127.0.0.1 and 127.0.0.2: Linux routes all of 127/8 to lo).
 */
import { spawn } from 'node:child_process';
import * as dgram from 'node:dgram';
import { once } from 'node:events';
import * as net from 'node:net';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import test, { type ExecutionContext } from 'ava';
import { WarrenError } from '../../src/errors';
import { DnsResponder, type DnsAnswerAddress, type DnsClientPolicy, type DnsRefusal, type DnsResponderOptions } from '../../src/shim/network/dns-responder';
import { DnsClass, DnsRcode, DnsType, buildQuery, canonicalAddress, buildResponse, encodeMessage, parseMessage, type DnsMessage } from '../../src/shim/network/dns-wire';
import { startDnsZone, type DnsZone, type ZoneRecords } from '../helpers/dns-zone';
import { elapse, waitFor } from '../helpers/wait';

const LOOPBACK = '127.0.0.1';
const OTHER_LOOPBACK = '127.0.0.2';

interface Bound {
  service: string;
  name: string;
  addrs: DnsAnswerAddress[];
}

/** A policy allowing `services` (name -> service) that records its bind calls. */
function recordingPolicy(
  sandboxId: string,
  services: Record<string, string>,
  onBind?: (bound: Bound) => Promise<void> | void,
  catalog: Record<string, string> = {},
): DnsClientPolicy & { binds: Bound[]; refusals: DnsRefusal[] } {
  const binds: Bound[] = [];
  const refusals: DnsRefusal[] = [];
  return {
    sandboxId,
    binds,
    refusals,
    serviceFor: (name) => services[name],
    // `catalog` adds names of services this sandbox has not enabled
    servicesOf: (name) => [services[name] ?? catalog[name]].filter((s): s is string => s !== undefined),
    refused: (r) => void refusals.push(r),
    bind: async (service, name, addrs) => {
      const bound = { service, name, addrs };
      binds.push(bound);
      await onBind?.(bound);
    },
  };
}

interface Setup {
  zone: DnsZone;
  responder: DnsResponder;
  port: number;
  logs: string[];
}

async function setup(t: ExecutionContext, records: ZoneRecords, clients: Record<string, DnsClientPolicy>, overrides: Partial<DnsResponderOptions> = {}): Promise<Setup> {
  const zone = await startDnsZone({ records });
  const logs: string[] = [];
  const responder = new DnsResponder({
    listen: [{ address: LOOPBACK, port: 0 }],
    upstreams: [{ address: zone.address, port: zone.port }],
    clientFor: (source) => clients[source],
    log: (line) => logs.push(line),
    upstreamTimeoutMs: 500,
    ...overrides,
  });
  await responder.start();
  t.teardown(async () => {
    await responder.close();
    await zone.close();
  });
  return { zone, responder, port: responder.addresses()[0]!.port, logs };
}

/** Sends one datagram from `source` and resolves with the first reply, or undefined after `timeoutMs`. */
async function sendUdp(port: number, payload: Buffer, options: { source?: string; timeoutMs?: number } = {}): Promise<Buffer | undefined> {
  const socket = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => socket.bind({ address: options.source ?? LOOPBACK, port: 0 }, resolve));
  try {
    const reply = once(socket, 'message').then(([message]) => message as Buffer);
    socket.send(payload, port, LOOPBACK);
    const timeout = delay(options.timeoutMs ?? 3000).then(() => undefined);
    return await Promise.race([reply, timeout]);
  } finally {
    socket.close();
  }
}

async function ask(port: number, name: string, type: number, options: { source?: string; id?: number; edns?: number; timeoutMs?: number } = {}): Promise<DnsMessage> {
  const id = options.id ?? 0x5151;
  const reply = await sendUdp(port, buildQuery(id, name, type, options.edns === undefined ? {} : { ednsUdpPayloadSize: options.edns }), options);
  if (reply === undefined) throw new Error(`no reply to ${name} within the timeout`);
  return parseMessage(reply);
}

function frame(message: Buffer): Buffer {
  const prefix = Buffer.alloc(2);
  prefix.writeUInt16BE(message.length, 0);
  return Buffer.concat([prefix, message]);
}

/** Opens one TCP connection, writes `bytes` in the given chunk sizes, and reads `expected` framed replies. */
async function askTcp(port: number, bytes: Buffer, expected: number, options: { source?: string; chunkSize?: number } = {}): Promise<DnsMessage[]> {
  const socket = net.connect({ host: LOOPBACK, port, localAddress: options.source ?? LOOPBACK });
  await once(socket, 'connect');
  const replies: DnsMessage[] = [];
  let pending = Buffer.alloc(0);
  const done = new Promise<void>((resolve, reject) => {
    socket.on('error', reject);
    socket.on('close', () => reject(new Error(`connection closed after ${replies.length} of ${expected} replies`)));
    socket.on('data', (chunk) => {
      pending = Buffer.concat([pending, chunk]);
      while (pending.length >= 2 && pending.length >= 2 + pending.readUInt16BE(0)) {
        replies.push(parseMessage(pending.subarray(2, 2 + pending.readUInt16BE(0))));
        pending = pending.subarray(2 + pending.readUInt16BE(0));
      }
      if (replies.length >= expected) resolve();
    });
  });
  const chunkSize = options.chunkSize ?? bytes.length;
  for (let offset = 0; offset < bytes.length; offset += chunkSize) {
    socket.write(bytes.subarray(offset, offset + chunkSize));
    if (chunkSize < bytes.length) await delay(2);
  }
  try {
    await Promise.race([done, delay(5000).then(() => Promise.reject(new Error('TCP replies timed out')))]);
  } finally {
    socket.destroy();
  }
  return replies;
}

function addressesOf(message: DnsMessage): string[] {
  return message.answers.flatMap((record) => ('address' in record ? [record.address] : []));
}

/** A UDP upstream that runs `script` for every query it gets (to send spoofed, mismatched or failing replies). */
async function startScriptedUpstream(t: ExecutionContext, script: (query: DnsMessage, reply: (message: Buffer) => void, remote: dgram.RemoteInfo) => void): Promise<number> {
  const socket = dgram.createSocket('udp4');
  socket.on('message', (raw, remote) => script(parseMessage(raw), (message) => socket.send(message, remote.port, remote.address), remote));
  await new Promise<void>((resolve) => socket.bind({ address: LOOPBACK, port: 0 }, resolve));
  t.teardown(() => new Promise<void>((resolve) => socket.close(() => resolve())));
  return socket.address().port;
}

/** A UDP port that swallows every query: an upstream that is down. */
async function startBlackhole(t: ExecutionContext): Promise<number> {
  return startScriptedUpstream(t, () => undefined);
}

test('allowed name: answered, bound with clamped TTLs before the reply leaves', async (t) => {
  let releaseBind!: () => void;
  const bindGate = new Promise<void>((resolve) => (releaseBind = resolve));
  const events: string[] = [];
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' }, async () => {
    events.push('bind');
    await bindGate;
  });
  const { port, responder, zone } = await setup(
    t,
    { 'api.example.com': [{ type: 'A', value: '10.1.0.1', ttl: 1 }, { type: 'A', value: '10.1.0.2', ttl: 99_999 }] },
    { [LOOPBACK]: policy },
  );
  const reply = ask(port, 'API.example.com', DnsType.A, { id: 0x1234 }).then((message) => {
    events.push('reply');
    return message;
  });
  await waitFor(() => events.includes('bind'), 5000, 'the bind to start');
  await elapse(300, 'a reply that did not wait for its bind would arrive in this window');
  t.deepEqual(events, ['bind'], 'the reply waits for bind');
  events.push('bind released');
  releaseBind();
  const message = await reply;
  t.deepEqual(events, ['bind', 'bind released', 'reply']);

  t.like(message, { id: 0x1234, qr: true, rd: true, ra: true, rcode: DnsRcode.NOERROR });
  t.deepEqual(message.questions, [{ name: 'api.example.com', type: DnsType.A, class: DnsClass.IN }]);
  t.deepEqual(addressesOf(message).sort(), ['10.1.0.1', '10.1.0.2']);
  t.deepEqual(message.answers.map((record) => record.ttl).sort((a, b) => a - b), [1, 3600], 'reply TTLs are capped at maxTtl, never raised');
  t.deepEqual(policy.binds, [
    {
      service: 'example-api',
      name: 'api.example.com',
      addrs: [
        { address: '10.1.0.1', family: 4, ttl: 5 },
        { address: '10.1.0.2', family: 4, ttl: 3600 },
      ],
    },
  ]);
  t.deepEqual(zone.queries, [{ name: 'api.example.com', type: DnsType.A, transport: 'udp' }]);
  t.like(responder.stats(), { queries: 1, forwarded: 1, refused: 0, servfail: 0 });
});

test('CNAME chain: followed from the question name; AAAA bound as family 6', async (t) => {
  const policy = recordingPolicy('sb-1', { 'www.example.com': 'web' });
  const { port } = await setup(
    t,
    {
      'www.example.com': [{ type: 'CNAME', value: 'edge.cdn.test', ttl: 60 }],
      'edge.cdn.test': [{ type: 'CNAME', value: 'lb.cdn.test.', ttl: 30 }],
      'lb.cdn.test': [
        { type: 'A', value: '10.0.0.7', ttl: 20 },
        { type: 'AAAA', value: '2001:db8:0:0::7', ttl: 40 },
      ],
    },
    { [LOOPBACK]: policy },
  );
  const a = await ask(port, 'www.example.com', DnsType.A);
  t.deepEqual(
    a.answers.map((record) => ('target' in record ? `${record.name} CNAME ${record.target}` : `${record.name} ${'address' in record ? record.address : '?'}`)),
    ['www.example.com CNAME edge.cdn.test', 'edge.cdn.test CNAME lb.cdn.test', 'lb.cdn.test 10.0.0.7'],
  );
  const aaaa = await ask(port, 'www.example.com', DnsType.AAAA);
  t.deepEqual(addressesOf(aaaa), ['2001:db8::7']);
  t.deepEqual(policy.binds, [
    { service: 'web', name: 'www.example.com', addrs: [{ address: '10.0.0.7', family: 4, ttl: 20 }] },
    { service: 'web', name: 'www.example.com', addrs: [{ address: '2001:db8::7', family: 6, ttl: 40 }] },
  ]);
});

test('NXDOMAIN from upstream passes through; nothing is bound', async (t) => {
  const policy = recordingPolicy('sb-1', { 'gone.example.com': 'gone' });
  const { port, zone } = await setup(t, {}, { [LOOPBACK]: policy });
  const message = await ask(port, 'gone.example.com', DnsType.A);
  t.is(message.rcode, DnsRcode.NXDOMAIN);
  t.deepEqual(message.answers, []);
  t.deepEqual(policy.binds, []);
  t.is(zone.queries.length, 1);
});

test('name not allowed: REFUSED and never forwarded upstream', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const { port, zone, responder, logs } = await setup(t, { 'evil.test': [{ type: 'A', value: '6.6.6.6' }], 'sub.api.example.com': [{ type: 'A', value: '6.6.6.7' }] }, { [LOOPBACK]: policy });
  for (const [name, type] of [
    ['evil.test', DnsType.A],
    ['c2VjcmV0.evil.test', DnsType.TXT],
    ['sub.api.example.com', DnsType.A],
    ['api.example.com.evil.test', DnsType.AAAA],
  ] as const) {
    const message = await ask(port, name, type);
    t.is(message.rcode, DnsRcode.REFUSED, name);
    t.deepEqual(message.answers, []);
  }
  t.deepEqual(zone.queries, [], 'the upstream never saw a refused name');
  t.deepEqual(policy.binds, []);
  t.like(responder.stats(), { queries: 4, refused: 4, forwarded: 0 });
  t.true(logs.some((line) => line.includes('refused evil.test A for sandbox sb-1')));
});

test('unknown client (no policy for its source address): REFUSED, not forwarded', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const { port, zone, responder } = await setup(t, { 'api.example.com': [{ type: 'A', value: '10.1.0.1' }] }, { [LOOPBACK]: policy });
  const message = await ask(port, 'api.example.com', DnsType.A, { source: OTHER_LOOPBACK });
  t.is(message.rcode, DnsRcode.REFUSED);
  t.deepEqual(zone.queries, []);
  t.like(responder.stats(), { refused: 1, forwarded: 0 });
});

test('two clients with different policies get different answers and their own bind calls', async (t) => {
  const first = recordingPolicy('sb-first', { 'a.test': 'service-a' });
  const second = recordingPolicy('sb-second', { 'b.test': 'service-b' });
  const { port, zone } = await setup(t, { 'a.test': [{ type: 'A', value: '10.0.0.1' }], 'b.test': [{ type: 'A', value: '10.0.0.2' }] }, { [LOOPBACK]: first, [OTHER_LOOPBACK]: second });
  const [firstA, firstB, secondA, secondB] = await Promise.all([
    ask(port, 'a.test', DnsType.A, { source: LOOPBACK }),
    ask(port, 'b.test', DnsType.A, { source: LOOPBACK }),
    ask(port, 'a.test', DnsType.A, { source: OTHER_LOOPBACK }),
    ask(port, 'b.test', DnsType.A, { source: OTHER_LOOPBACK }),
  ]);
  t.deepEqual([firstA!.rcode, firstB!.rcode, secondA!.rcode, secondB!.rcode], [DnsRcode.NOERROR, DnsRcode.REFUSED, DnsRcode.REFUSED, DnsRcode.NOERROR]);
  t.deepEqual(addressesOf(firstA!), ['10.0.0.1']);
  t.deepEqual(addressesOf(secondB!), ['10.0.0.2']);
  t.deepEqual(first.binds, [{ service: 'service-a', name: 'a.test', addrs: [{ address: '10.0.0.1', family: 4, ttl: 300 }] }]);
  t.deepEqual(second.binds, [{ service: 'service-b', name: 'b.test', addrs: [{ address: '10.0.0.2', family: 4, ttl: 300 }] }]);
  t.deepEqual(zone.queries.map((query) => query.name).sort(), ['a.test', 'b.test']);
});

test('allowed name, other types (TXT, MX, ANY, CNAME): NOERROR with no records, not forwarded', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const { port, zone, responder } = await setup(t, { 'api.example.com': [{ type: 'A', value: '10.1.0.1' }] }, { [LOOPBACK]: policy });
  for (const type of [DnsType.TXT, DnsType.MX, DnsType.ANY, DnsType.CNAME, DnsType.SRV]) {
    const message = await ask(port, 'api.example.com', type);
    t.like(message, { rcode: DnsRcode.NOERROR, qr: true });
    t.deepEqual(message.answers, [], `type ${type}`);
  }
  t.deepEqual(zone.queries, []);
  t.deepEqual(policy.binds, []);
  t.like(responder.stats(), { forwarded: 0, refused: 0 });
});

test('every upstream down: SERVFAIL once each has timed out', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const upstreams = [{ address: LOOPBACK, port: await startBlackhole(t) }, { address: LOOPBACK, port: await startBlackhole(t) }];
  const { port, responder } = await setup(t, {}, { [LOOPBACK]: policy }, { upstreams, upstreamTimeoutMs: 300 });
  const started = Date.now();
  const message = await ask(port, 'api.example.com', DnsType.A, { timeoutMs: 5000 });
  const elapsed = Date.now() - started;
  t.is(message.rcode, DnsRcode.SERVFAIL);
  // not before both upstreams had their 300 ms (the client's own 5 s timeout bounds it above)
  t.true(elapsed >= 550, `SERVFAIL after ${elapsed} ms (2 upstreams x 300 ms)`);
  t.deepEqual(policy.binds, []);
  t.like(responder.stats(), { forwarded: 1, servfail: 1 });
});

test('a silent or failing upstream is skipped for the next one', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const zone = await startDnsZone({ records: { 'api.example.com': [{ type: 'A', value: '10.1.0.1' }] } });
  t.teardown(() => zone.close());
  const failing = await startScriptedUpstream(t, (query, reply) => reply(buildResponse(query, { rcode: DnsRcode.SERVFAIL })));
  const upstreams = [
    { address: LOOPBACK, port: await startBlackhole(t) },
    { address: LOOPBACK, port: failing },
    { address: zone.address, port: zone.port },
  ];
  const { port } = await setup(t, {}, { [LOOPBACK]: policy }, { upstreams, upstreamTimeoutMs: 300 });
  const message = await ask(port, 'api.example.com', DnsType.A);
  t.is(message.rcode, DnsRcode.NOERROR);
  t.deepEqual(addressesOf(message), ['10.1.0.1']);
});

test('spoofed and mismatched upstream replies are ignored; records for unrelated names are not bound', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const upstreamPort = await startScriptedUpstream(t, (query, reply) => {
    const a = (name: string, address: string) => ({ name, type: DnsType.A, class: DnsClass.IN, ttl: 60, address });
    const question = query.questions[0]!;
    reply(buildResponse({ ...query, id: (query.id + 1) & 0xffff }, { rcode: 0, answers: [a(question.name, '6.6.6.1')] }));
    reply(buildResponse({ ...query, questions: [{ ...question, name: 'other.test' }] }, { rcode: 0, answers: [a(question.name, '6.6.6.2')] }));
    reply(buildResponse({ ...query, questions: [{ ...question, type: DnsType.AAAA }] }, { rcode: 0, answers: [a(question.name, '6.6.6.3')] }));
    reply(encodeMessage({ id: query.id, qr: false, questions: query.questions, answers: [a(question.name, '6.6.6.4')] }));
    reply(Buffer.from('garbage that is not DNS'));
    reply(buildResponse(query, { rcode: 0, answers: [a('evil.test', '6.6.6.5'), a(question.name, '10.1.0.1'), a('sub.' + question.name, '6.6.6.6')] }));
  });
  const { port } = await setup(t, {}, { [LOOPBACK]: policy }, { upstreams: [{ address: LOOPBACK, port: upstreamPort }] });
  const message = await ask(port, 'api.example.com', DnsType.A);
  t.is(message.rcode, DnsRcode.NOERROR);
  t.deepEqual(addressesOf(message), ['10.1.0.1']);
  t.deepEqual(policy.binds.flatMap((bound) => bound.addrs.map((addr) => addr.address)), ['10.1.0.1']);
});

test('replies from the wrong source port are ignored (SERVFAIL when nothing else answers)', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const spoofer = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => spoofer.bind({ address: LOOPBACK, port: 0 }, resolve));
  t.teardown(() => spoofer.close());
  let spoofed = 0;
  // The real upstream stays silent; another socket answers with the right id and question.
  const upstreamPort = await startScriptedUpstream(t, (query, _reply, remote) => {
    spoofed += 1;
    spoofer.send(buildResponse(query, { rcode: 0, answers: [{ name: query.questions[0]!.name, type: DnsType.A, class: DnsClass.IN, ttl: 60, address: '6.6.6.6' }] }), remote.port, remote.address);
  });
  const { port } = await setup(t, {}, { [LOOPBACK]: policy }, { upstreams: [{ address: LOOPBACK, port: upstreamPort }], upstreamTimeoutMs: 400 });
  const message = await ask(port, 'api.example.com', DnsType.A);
  t.is(message.rcode, DnsRcode.SERVFAIL);
  t.is(spoofed, 1);
  t.deepEqual(policy.binds, []);
});

test('a policy that throws: SERVFAIL, nothing forwarded', async (t) => {
  const policy: DnsClientPolicy = {
    sandboxId: 'sb-1',
    serviceFor: () => {
      throw new Error('policy file half-written');
    },
    servicesOf: () => [],
    bind: () => undefined,
  };
  const { port, zone, logs } = await setup(t, {}, { [LOOPBACK]: policy });
  t.is((await ask(port, 'api.example.com', DnsType.A)).rcode, DnsRcode.SERVFAIL);
  t.deepEqual(zone.queries, []);
  t.true(logs.some((line) => line.includes('policy lookup failed: policy file half-written')));
});

test('bind throws: SERVFAIL, and the failure is logged', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' }, () => {
    throw new Error('bpf map full');
  });
  const { port, responder, logs } = await setup(t, { 'api.example.com': [{ type: 'A', value: '10.1.0.1' }] }, { [LOOPBACK]: policy });
  const message = await ask(port, 'api.example.com', DnsType.A);
  t.is(message.rcode, DnsRcode.SERVFAIL);
  t.deepEqual(message.answers, []);
  t.is(policy.binds.length, 1);
  t.like(responder.stats(), { servfail: 1 });
  t.true(logs.some((line) => line.includes('bind failed: bpf map full')));
});

test('malformed packets get FORMERR/NOTIMP or nothing, and the responder keeps answering', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const { port, responder } = await setup(t, { 'api.example.com': [{ type: 'A', value: '10.1.0.1' }] }, { [LOOPBACK]: policy });
  const quiet = { timeoutMs: 300 };
  t.is(await sendUdp(port, Buffer.alloc(0), quiet), undefined, 'empty datagram');
  t.is(await sendUdp(port, Buffer.from('hello'), quiet), undefined, 'shorter than a header');
  const response = buildResponse(parseMessage(buildQuery(9, 'api.example.com', DnsType.A)), { rcode: 0 });
  t.is(await sendUdp(port, response, quiet), undefined, 'a response is not answered (no reflection loops)');

  const truncated = buildQuery(0x4444, 'api.example.com', DnsType.A).subarray(0, 20);
  t.like(parseMessage((await sendUdp(port, truncated))!), { id: 0x4444, qr: true, rcode: DnsRcode.FORMERR });
  const pointerLoop = Buffer.from('77770100000100000000000' + '0c00c00010001', 'hex');
  t.like(parseMessage((await sendUdp(port, pointerLoop))!), { id: 0x7777, rcode: DnsRcode.FORMERR });
  const twoQuestions = encodeMessage({ id: 0x5555, rd: true, questions: [{ name: 'api.example.com', type: 1, class: 1 }, { name: 'x.test', type: 1, class: 1 }] });
  t.like(parseMessage((await sendUdp(port, twoQuestions))!), { id: 0x5555, rcode: DnsRcode.FORMERR });
  const status = encodeMessage({ id: 0x6666, opcode: 2, questions: [{ name: 'api.example.com', type: 1, class: 1 }] });
  t.like(parseMessage((await sendUdp(port, status))!), { id: 0x6666, rcode: DnsRcode.NOTIMP });
  const chaos = encodeMessage({ id: 0x6767, questions: [{ name: 'api.example.com', type: DnsType.TXT, class: 3 }] });
  t.like(parseMessage((await sendUdp(port, chaos))!), { id: 0x6767, rcode: DnsRcode.REFUSED });

  const noise = dgram.createSocket('udp4');
  for (let i = 0; i < 300; i++) {
    const garbage = Buffer.alloc(Math.floor(Math.random() * 600));
    for (let j = 0; j < garbage.length; j++) garbage[j] = Math.floor(Math.random() * 256);
    if (garbage.length > 2) garbage[2] = garbage[2]! & 0x7f; // mostly queries, so they reach the parser
    noise.send(garbage, port, LOOPBACK);
  }
  await elapse(200, 'the responder parses the garbage while it arrives');
  noise.close();

  const good = await ask(port, 'api.example.com', DnsType.A);
  t.deepEqual(addressesOf(good), ['10.1.0.1']);
  const stats = responder.stats();
  // Loopback may drop some of the burst (socket buffer); every datagram that arrived was counted.
  t.true(stats.queries > 9, `queries ${stats.queries}`);
  t.true(stats.malformed >= 4, `malformed ${stats.malformed}`);
});

test('TCP: one query, pipelined queries in one write, and a query split into single bytes', async (t) => {
  const policy = recordingPolicy('sb-1', { 'a.test': 'svc', 'b.test': 'svc' });
  const { port } = await setup(t, { 'a.test': [{ type: 'A', value: '10.0.0.1' }], 'b.test': [{ type: 'A', value: '10.0.0.2' }] }, { [LOOPBACK]: policy });
  const [single] = await askTcp(port, frame(buildQuery(1, 'a.test', DnsType.A)), 1);
  t.like(single, { id: 1, rcode: DnsRcode.NOERROR });
  t.deepEqual(addressesOf(single!), ['10.0.0.1']);

  const pipelined = await askTcp(port, Buffer.concat([frame(buildQuery(2, 'a.test', DnsType.A)), frame(buildQuery(3, 'b.test', DnsType.A)), frame(buildQuery(4, 'evil.test', DnsType.A))]), 3);
  const byId = new Map(pipelined.map((message) => [message.id, message]));
  t.deepEqual(addressesOf(byId.get(2)!), ['10.0.0.1']);
  t.deepEqual(addressesOf(byId.get(3)!), ['10.0.0.2']);
  t.is(byId.get(4)!.rcode, DnsRcode.REFUSED);

  const [split] = await askTcp(port, frame(buildQuery(5, 'b.test', DnsType.A)), 1, { chunkSize: 1 });
  t.deepEqual(addressesOf(split!), ['10.0.0.2']);
});

test('large answers: TC over UDP, full over TCP and within the EDNS size; upstream retried over TCP', async (t) => {
  const policy = recordingPolicy('sb-1', { 'big.test': 'big', 'medium.test': 'medium' });
  const range = (count: number) => Array.from({ length: count }, (_, i) => ({ type: 'A' as const, value: `10.0.${Math.floor(i / 250)}.${(i % 250) + 1}` }));
  const { port, zone } = await setup(t, { 'big.test': range(100), 'medium.test': range(30) }, { [LOOPBACK]: policy });

  const overUdp = await ask(port, 'big.test', DnsType.A);
  t.like(overUdp, { tc: true, rcode: DnsRcode.NOERROR });
  t.deepEqual(overUdp.answers, []);
  const [overTcp] = await askTcp(port, frame(buildQuery(8, 'big.test', DnsType.A)), 1);
  t.like(overTcp, { tc: false });
  t.is(addressesOf(overTcp!).length, 100);
  t.deepEqual(
    zone.queries.filter((query) => query.name === 'big.test').map((query) => query.transport),
    ['udp', 'tcp', 'udp', 'tcp'],
    'the truncated upstream reply was retried over TCP',
  );
  t.deepEqual(policy.binds.map((bound) => bound.addrs.length), [100, 100], 'bound even when the client must retry over TCP');

  const classic = await ask(port, 'medium.test', DnsType.A);
  t.true(classic.tc, '30 A records do not fit in 512 bytes');
  const withEdns = await ask(port, 'medium.test', DnsType.A, { edns: 4096 });
  t.false(withEdns.tc);
  t.is(addressesOf(withEdns).length, 30);
  t.is(withEdns.additionals.filter((record) => record.type === DnsType.OPT).length, 1, 'EDNS queries get an OPT record back');
});

test('TCP: idle connections are closed, but not while an answer is owed; oversized frames close the connection', async (t) => {
  const policy = recordingPolicy('sb-1', { 'slow.test': 'slow' });
  const slowUpstream = await startScriptedUpstream(t, (query, reply) => {
    const answers = [{ name: query.questions[0]!.name, type: DnsType.A, class: DnsClass.IN, ttl: 60, address: '10.0.0.9' }];
    setTimeout(() => reply(buildResponse(query, { rcode: 0, answers })), 600);
  });
  const { port } = await setup(t, {}, { [LOOPBACK]: policy }, { tcpIdleTimeoutMs: 200, upstreamTimeoutMs: 2000, upstreams: [{ address: LOOPBACK, port: slowUpstream }] });
  const slow = net.connect({ host: LOOPBACK, port });
  await once(slow, 'connect');
  slow.write(frame(buildQuery(11, 'slow.test', DnsType.A)));
  const [data] = (await once(slow, 'data')) as [Buffer];
  t.deepEqual(addressesOf(parseMessage(data.subarray(2))), ['10.0.0.9'], 'answered although the idle timeout passed while resolving');
  const answeredAt = Date.now();
  await Promise.race([once(slow, 'close'), delay(3000).then(() => Promise.reject(new Error('connection left open after its answer')))]);
  t.true(Date.now() - answeredAt >= 150, 'closed one idle period after the answer');

  const idle = net.connect({ host: LOOPBACK, port });
  await once(idle, 'connect');
  const started = Date.now();
  await Promise.race([once(idle, 'close'), delay(3000).then(() => Promise.reject(new Error('idle connection was not closed')))]);
  t.true(Date.now() - started >= 150);

  const greedy = net.connect({ host: LOOPBACK, port });
  greedy.on('error', () => undefined);
  await once(greedy, 'connect');
  greedy.write(Buffer.from([0xff, 0xff, 0, 0, 0]));
  await Promise.race([once(greedy, 'close'), delay(3000).then(() => Promise.reject(new Error('oversized frame did not close the connection')))]);
  t.true(greedy.destroyed);
});

test('start: listens on several addresses, and rejects with UNAVAILABLE when a port is taken', async (t) => {
  const policy = recordingPolicy('sb-1', {});
  const { responder, port } = await setup(t, {}, { [LOOPBACK]: policy }, { listen: [{ address: LOOPBACK, port: 0 }, { address: OTHER_LOOPBACK, port: 0 }] });
  const addresses = responder.addresses();
  t.deepEqual(addresses.map((entry) => entry.address), [LOOPBACK, OTHER_LOOPBACK]);
  t.true(addresses.every((entry) => entry.port > 0));
  t.is(addresses[0]!.port, port);

  const clash = new DnsResponder({ listen: [{ address: LOOPBACK, port }], upstreams: [{ address: LOOPBACK, port: 53 }], clientFor: () => undefined });
  const err = await t.throwsAsync(clash.start());
  t.true(err instanceof WarrenError && err.code === 'UNAVAILABLE', String(err));
  t.regex(err!.message, new RegExp(`cannot listen on udp 127\\.0\\.0\\.1:${port}`));
  await clash.close();

  t.throws(() => new DnsResponder({ listen: [{ address: 'localhost', port: 53 }], clientFor: () => undefined }), { instanceOf: WarrenError as never });
  t.throws(() => new DnsResponder({ listen: [{ address: LOOPBACK, port: 0 }], clientFor: () => undefined, minTtl: 10, maxTtl: 5 }), { message: /maxTtl/ });
});

test('close(): pending upstream queries are failed and no handle is left (the process exits by itself)', async (t) => {
  const script = `
    const dgram = require('node:dgram');
    const net = require('node:net');
    const { DnsResponder } = require(${JSON.stringify(join(__dirname, '..', '..', 'src', 'shim', 'network', 'dns-responder.js'))});
    const { buildQuery } = require(${JSON.stringify(join(__dirname, '..', '..', 'src', 'shim', 'network', 'dns-wire.js'))});
    (async () => {
      const blackhole = dgram.createSocket('udp4');
      await new Promise((resolve) => blackhole.bind({ address: '127.0.0.1', port: 0 }, resolve));
      const policy = { sandboxId: 'sb', serviceFor: () => 'svc', bind: () => undefined };
      const responder = new DnsResponder({
        listen: [{ address: '127.0.0.1', port: 0 }],
        upstreams: [{ address: '127.0.0.1', port: blackhole.address().port }],
        clientFor: () => policy,
        upstreamTimeoutMs: 60000,
        tcpIdleTimeoutMs: 60000,
      });
      await responder.start();
      const { port } = responder.addresses()[0];
      const client = dgram.createSocket('udp4');
      client.send(buildQuery(1, 'pending.test', 1), port, '127.0.0.1');
      const tcp = net.connect({ host: '127.0.0.1', port });
      tcp.on('error', () => undefined);
      await new Promise((resolve) => tcp.on('connect', resolve));
      const query = buildQuery(2, 'pending-tcp.test', 1);
      tcp.write(Buffer.concat([Buffer.from([0, query.length]), query]));
      while (responder.stats().forwarded < 2) await new Promise((resolve) => setTimeout(resolve, 10));
      const before = responder.stats();
      await responder.close();
      await responder.close();
      client.close();
      blackhole.close();
      await new Promise((resolve) => (tcp.destroyed ? resolve() : tcp.on('close', resolve)));
      process.stdout.write(JSON.stringify({ before, after: responder.stats(), tcpClosedByServer: true }));
    })().catch((err) => { console.error(err); process.exitCode = 1; });
  `;
  const child = spawn(process.execPath, ['-e', script], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk) => (stdout += chunk));
  child.stderr.on('data', (chunk) => (stderr += chunk));
  const started = Date.now();
  const exitCode = await Promise.race([once(child, 'exit').then(([code]) => code as number | null), delay(15_000).then(() => 'still running')]);
  if (exitCode === 'still running') child.kill('SIGKILL');
  t.is(exitCode, 0, `child: ${stderr}`);
  t.true(Date.now() - started < 10_000, 'exited long before the 60 s upstream timeout');
  const report = JSON.parse(stdout) as { before: { queries: number; forwarded: number }; after: { queries: number; servfail: number } };
  t.like(report.before, { queries: 2, forwarded: 2 });
  t.is(report.after.queries, 2);
});

test('one sandbox cannot hold more than its share of upstream lookups; others still get theirs', async (t) => {
  const greedy = recordingPolicy('sb-greedy', { 'api.example.com': 'example-api' });
  const other = recordingPolicy('sb-other', { 'api.example.com': 'example-api' });
  const { port, logs, responder } = await setup(t, {}, { [LOOPBACK]: greedy, '127.0.0.2': other }, {
    upstreams: [{ address: LOOPBACK, port: await startBlackhole(t) }],
    upstreamTimeoutMs: 800,
    maxLookupsPerClient: 2,
  });
  const pending = [ask(port, 'api.example.com', DnsType.A, { timeoutMs: 3000 }), ask(port, 'api.example.com', DnsType.AAAA, { timeoutMs: 3000 })];
  await waitFor(() => responder.stats().forwarded >= 2, 5000, 'both lookups to be in flight upstream');
  const started = performance.now();
  const third = await ask(port, 'api.example.com', DnsType.A, { timeoutMs: 3000 });
  t.is(third.rcode, DnsRcode.SERVFAIL);
  t.true(performance.now() - started < 300, 'refused at once, not after the upstream timeout');
  t.true(logs.some((l) => l.includes('sb-greedy: it already has 2 lookups in flight')));
  const fromOther = ask(port, 'api.example.com', DnsType.A, { source: '127.0.0.2', timeoutMs: 3000 });
  t.false(logs.some((l) => l.includes('sb-other: it already has')), 'the other sandbox is forwarded');
  for (const m of await Promise.all([...pending, fromOther])) t.is(m.rcode, DnsRcode.SERVFAIL, 'the blackhole never answers');
});

test('special-use answers are never bound nor sent; each refusal is reported with its reason', async (t) => {
  const policy = recordingPolicy('sb-1', { 'api.example.com': 'example-api' });
  const refusal = (address: string) => (address === '10.9.0.1' ? ('node' as const) : address.startsWith('10.8.') ? ('sandbox-subnet' as const) : undefined);
  const bad = ['169.254.169.254', '127.0.0.1', '0.0.0.0', '224.0.0.1', '255.255.255.255', '169.254.1.1', '100.100.100.200', '10.9.0.1', '10.8.0.7'];
  const { port, responder } = await setup(t, { 'api.example.com': [...bad, '10.1.0.1'].map((value) => ({ type: 'A' as const, value })) }, { [LOOPBACK]: policy }, { refusal });
  const message = await ask(port, 'api.example.com', DnsType.A, { edns: 4096 });
  t.is(message.rcode, DnsRcode.NOERROR);
  t.deepEqual(addressesOf(message), ['10.1.0.1'], 'refused addresses are left out of the reply');
  t.deepEqual(policy.binds.flatMap((b) => b.addrs.map((a) => a.address)), ['10.1.0.1']);
  t.deepEqual(
    Object.fromEntries(policy.refusals.map((r) => [r.address, r.reason])),
    { '169.254.169.254': 'metadata', '127.0.0.1': 'loopback', '0.0.0.0': 'unspecified', '224.0.0.1': 'multicast', '255.255.255.255': 'broadcast', '169.254.1.1': 'link-local', '100.100.100.200': 'metadata', '10.9.0.1': 'node', '10.8.0.7': 'sandbox-subnet' },
  );
  t.like(responder.stats(), { refusedAddresses: bad.length });

  // only refused addresses: an empty answer, and bind is not called at all
  const onlyBad = recordingPolicy('sb-2', { 'meta.example.com': 'example-api' });
  const second = await setup(t, { 'meta.example.com': [{ type: 'A', value: '169.254.169.254' }] }, { [LOOPBACK]: onlyBad });
  const empty = await ask(second.port, 'meta.example.com', DnsType.A);
  t.like(empty, { rcode: DnsRcode.NOERROR });
  t.deepEqual(empty.answers, []);
  t.deepEqual(onlyBad.binds, []);
});

test('AAAA answers never open an IPv4 address: mapped, translated, compatible, NAT64, 6to4, Teredo', async (t) => {
  const policy = recordingPolicy('sb-1', { 'dual.example.com': 'dual' });
  const forms = ['::ffff:10.1.0.9', '::ffff:0:10.1.0.9', '::10.1.0.9', '64:ff9b::10.1.0.9', '64:ff9b:1::a01:9', '2002:a01:9::1', '2001:0:4136:e378:8000:63bf:f5fe:fff6', '::ffff:169.254.169.254', 'fe80::1', 'ff02::1', '::1', '::'];
  const { port } = await setup(
    t,
    { 'dual.example.com': [{ type: 'A', value: '10.1.0.1' }, ...[...forms, '2001:db8::5'].map((value) => ({ type: 'AAAA' as const, value }))] },
    { [LOOPBACK]: policy },
  );
  const aaaa = await ask(port, 'dual.example.com', DnsType.AAAA, { edns: 4096 });
  t.deepEqual(addressesOf(aaaa), ['2001:db8::5']);
  const a = await ask(port, 'dual.example.com', DnsType.A);
  t.deepEqual(addressesOf(a), ['10.1.0.1']);
  t.deepEqual(policy.binds.flatMap((b) => b.addrs.map((x) => `${x.family} ${x.address}`)), ['6 2001:db8::5', '4 10.1.0.1'], 'the A answer alone opens 10.1.0.1; 10.1.0.9 never');
  const reasons = Object.fromEntries(policy.refusals.map((r) => [r.address, r.reason]));
  for (const form of forms.slice(0, 7)) t.is(reasons[canonicalAddress(form)], 'embedded-ipv4', form);
  t.like(reasons, { [canonicalAddress('::ffff:169.254.169.254')]: 'metadata', 'fe80::1': 'link-local', 'ff02::1': 'multicast', '::1': 'loopback', '::': 'unspecified' });
  t.true(policy.refusals.some((r) => r.detail.includes('nat64 IPv4 10.1.0.9')), JSON.stringify(policy.refusals.map((r) => r.detail)));
});

test('CNAME chains: through unknown names and the own service bound; through another service, a loop or over 16 names refused', async (t) => {
  // pypi's names, npm's names (npm: enabled for one sandbox, denied for the other), and CDN names in no service
  const services = { 'pypi.test': 'pypi', 'files.pypi.test': 'pypi', 'via-cdn.pypi.test': 'pypi', 'to-npm.pypi.test': 'pypi', 'to-other.pypi.test': 'pypi', 'deep.pypi.test': 'pypi', 'loop.pypi.test': 'pypi', 'long.pypi.test': 'pypi', 'max.pypi.test': 'pypi', 'late.pypi.test': 'pypi' };
  const catalog = { 'registry.npm.test': 'npm', 'other.test': 'other' };
  const pypiOnly = recordingPolicy('sb-pypi', services, undefined, catalog);
  const both = recordingPolicy('sb-both', { ...services, 'registry.npm.test': 'npm' }, undefined, catalog);
  const chain = (prefix: string, n: number, end: string) =>
    Object.fromEntries(Array.from({ length: n }, (_, i) => [`${prefix}${i}.cdn.test`, [{ type: 'CNAME' as const, value: i + 1 < n ? `${prefix}${i + 1}.cdn.test` : end }]]));
  const records: ZoneRecords = {
    'pypi.test': [{ type: 'A', value: '10.2.0.1' }],
    'files.pypi.test': [{ type: 'CNAME', value: 'pypi.test' }],
    'via-cdn.pypi.test': [{ type: 'CNAME', value: 'edge.cdn.test' }],
    'edge.cdn.test': [{ type: 'A', value: '10.2.0.2' }],
    'registry.npm.test': [{ type: 'A', value: '10.3.0.1' }],
    'to-npm.pypi.test': [{ type: 'CNAME', value: 'registry.npm.test' }],
    'to-other.pypi.test': [{ type: 'CNAME', value: 'x.cdn.test' }],
    'x.cdn.test': [{ type: 'CNAME', value: 'other.test' }],
    'other.test': [{ type: 'A', value: '10.4.0.1' }],
    'deep.pypi.test': [{ type: 'CNAME', value: 'edge2.cdn.test' }],
    'edge2.cdn.test': [{ type: 'CNAME', value: 'files.pypi.test' }],
    'loop.pypi.test': [{ type: 'CNAME', value: 'l1.cdn.test' }],
    'l1.cdn.test': [{ type: 'CNAME', value: 'l2.cdn.test' }],
    'l2.cdn.test': [{ type: 'CNAME', value: 'l1.cdn.test' }],
    'long.pypi.test': [{ type: 'CNAME', value: 'a0.cdn.test' }],
    ...chain('a', 16, 'pypi.test'), // 17 CNAMEs in all
    'max.pypi.test': [{ type: 'CNAME', value: 'b0.cdn.test' }],
    ...chain('b', 15, 'pypi.test'), // 16: the longest accepted
    'late.pypi.test': [{ type: 'CNAME', value: 'c0.cdn.test' }],
    ...chain('c', 6, 'registry.npm.test'), // another service's name at the end of a long chain
  };
  const { port } = await setup(t, records, { [LOOPBACK]: pypiOnly, [OTHER_LOOPBACK]: both });
  const outcome = async (name: string, source = LOOPBACK) => {
    const m = await ask(port, name, DnsType.A, { source, edns: 4096 });
    return `${m.rcode === DnsRcode.NOERROR ? 'NOERROR' : m.rcode === DnsRcode.REFUSED ? 'REFUSED' : m.rcode === DnsRcode.SERVFAIL ? 'SERVFAIL' : m.rcode} ${addressesOf(m).join(',')}`.trim();
  };
  t.is(await outcome('files.pypi.test'), 'NOERROR 10.2.0.1', 'within the service');
  t.is(await outcome('via-cdn.pypi.test'), 'NOERROR 10.2.0.2', 'through a name of no service');
  t.is(await outcome('deep.pypi.test'), 'NOERROR 10.2.0.1', 'own -> unknown -> own');
  t.is(await outcome('to-npm.pypi.test'), 'REFUSED', 'into a denied service');
  t.is(await outcome('to-npm.pypi.test', OTHER_LOOPBACK), 'REFUSED', 'into another enabled service (its own ports, not pypi\'s)');
  t.is(await outcome('registry.npm.test', OTHER_LOOPBACK), 'NOERROR 10.3.0.1', 'asked by its own name it is bound for npm');
  t.is(await outcome('to-other.pypi.test'), 'REFUSED', 'through an unknown name into another service');
  t.is(await outcome('late.pypi.test'), 'REFUSED', 'another service at the end of a long chain');
  t.is(await outcome('loop.pypi.test'), 'SERVFAIL', 'a loop');
  t.is(await outcome('long.pypi.test'), 'SERVFAIL', '17 CNAMEs');
  t.is(await outcome('max.pypi.test'), 'NOERROR 10.2.0.1', '16 CNAMEs');
  t.deepEqual(pypiOnly.binds.map((b) => `${b.service} ${b.name} ${b.addrs.map((a) => a.address).join(',')}`), [
    'pypi files.pypi.test 10.2.0.1',
    'pypi via-cdn.pypi.test 10.2.0.2',
    'pypi deep.pypi.test 10.2.0.1',
    'pypi max.pypi.test 10.2.0.1',
  ]);
  t.deepEqual(both.binds.map((b) => `${b.service} ${b.name}`), ['npm registry.npm.test'], '10.3.0.1 was never bound for pypi');
  t.true(pypiOnly.refusals.every((r) => r.reason === 'cname' && r.address === undefined));
  t.regex(pypiOnly.refusals[0]!.detail, /registry\.npm\.test, a name of npm, not of pypi/);
});

/** Resolves when the socket closes; rejects after `ms`. */
/**
 * Resolves with how long until the server ended the connection. A reset is an end too: the
 * server destroying a socket with unread bytes in it (a trickle's next byte) sends RST, which
 * the client sees as ECONNRESET before 'close' (events.once would reject on that 'error').
 */
function closedWithin(socket: net.Socket, ms: number, what: string): Promise<number> {
  const started = Date.now();
  if (socket.destroyed) return Promise.resolve(0);
  const closed = new Promise<number>((resolve) => socket.once('close', () => resolve(Date.now() - started)));
  return Promise.race([closed, delay(ms).then(() => Promise.reject(new Error(`${what}: still open after ${ms} ms`)))]);
}

async function connectFrom(port: number, source: string): Promise<net.Socket> {
  const socket = net.connect({ host: LOOPBACK, port, localAddress: source });
  socket.on('error', () => undefined);
  await once(socket, 'connect');
  return socket;
}

test.serial('TCP: a byte trickle cannot hold a connection, and a busy one ends at its lifetime', async (t) => {
  const hostile = recordingPolicy('sb-hostile', { 'a.test': 'svc' });
  const victim = recordingPolicy('sb-victim', { 'a.test': 'svc' });
  const { port, responder, logs } = await setup(t, { 'a.test': [{ type: 'A', value: '10.0.0.1' }] }, { [LOOPBACK]: victim, [OTHER_LOOPBACK]: hostile }, {
    tcpMessageTimeoutMs: 300,
    tcpIdleTimeoutMs: 5000,
    tcpMaxLifetimeMs: 1500,
    maxTcpConnectionsPerClient: 3,
    maxTcpConnections: 5,
  });
  const query = frame(buildQuery(7, 'a.test', DnsType.A));

  // one byte every 100 ms: each would have reset an idle timer; the unfinished query's deadline holds
  const trickle = await connectFrom(port, OTHER_LOOPBACK);
  let next = 0;
  const dripper = setInterval(() => trickle.destroyed || trickle.write(query.subarray(next, ++next)), 100);
  try {
    const took = await closedWithin(trickle, 10_000, 'trickle');
    // closed by the unfinished query's deadline, not by the connection's lifetime (1.5 s) or idle timer
    t.true(took >= 250, `closed after ${took} ms`);
    t.true(logs.some((l) => l.includes(`${OTHER_LOOPBACK}: a query unfinished after 300 ms`)), logs.join('\n'));
  } finally {
    clearInterval(dripper);
  }

  // complete queries keep coming, but the connection ends at its lifetime, its answers written
  const busy = await connectFrom(port, OTHER_LOOPBACK);
  let answers = 0;
  let pending = Buffer.alloc(0);
  busy.on('data', (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 2 && pending.length >= 2 + pending.readUInt16BE(0)) {
      answers += 1;
      pending = pending.subarray(2 + pending.readUInt16BE(0));
    }
  });
  const asker = setInterval(() => busy.destroyed || busy.write(query), 150);
  try {
    const took = await closedWithin(busy, 10_000, 'busy connection');
    // a query every 150 ms keeps it from being idle: only the lifetime ends it
    t.true(took >= 1300, `closed after ${took} ms`);
    t.true(answers >= 5, `${answers} answers before it closed`);
  } finally {
    clearInterval(asker);
  }
  t.true(responder.stats().tcpClosed >= 2, JSON.stringify(responder.stats()));
});

test.serial('TCP: per-sender and node-wide connection limits; the sender holding the most gives one up', async (t) => {
  const hostile = recordingPolicy('sb-hostile', { 'a.test': 'svc' });
  const victim = recordingPolicy('sb-victim', { 'a.test': 'svc' });
  // long deadlines: only the limits may close a connection here, however slow the machine is
  const { port, responder, logs } = await setup(t, { 'a.test': [{ type: 'A', value: '10.0.0.1' }] }, { [LOOPBACK]: victim, [OTHER_LOOPBACK]: hostile }, {
    tcpIdleTimeoutMs: 120_000,
    tcpMaxLifetimeMs: 120_000,
    maxTcpConnectionsPerClient: 3,
    maxTcpConnections: 5,
  });

  // per sender: the fourth connection is closed at once, the first three stay
  const mine = await Promise.all([1, 2, 3].map(() => connectFrom(port, OTHER_LOOPBACK)));
  const fourth = await connectFrom(port, OTHER_LOOPBACK);
  await closedWithin(fourth, 10_000, 'fourth connection of one sender');
  t.true(mine.every((s) => !s.destroyed));

  // node-wide: 5 slots, the hostile holds 3 and an unknown sender 2; the victim still gets in,
  // because the sender with the most gives one up
  const unknown = await Promise.all([1, 2].map(() => connectFrom(port, '127.0.0.3')));
  const [answer] = await askTcp(port, frame(buildQuery(8, 'a.test', DnsType.A)), 1, { source: LOOPBACK }).catch((err) => {
    t.log(logs.join('\n'));
    throw err;
  });
  t.deepEqual(addressesOf(answer!), ['10.0.0.1']);
  // the server closed it when the victim came; the client learns of that a moment later
  await waitFor(() => mine.some((s) => s.destroyed), 10_000, 'the hostile sender to lose a connection');
  t.is(mine.filter((s) => s.destroyed).length, 1, 'one of the hostile sender\'s connections was closed');
  t.true(unknown.every((s) => !s.destroyed));
  for (const s of [...mine, ...unknown]) s.destroy();
  t.is(responder.stats().tcpClosed, 2, JSON.stringify(responder.stats()));
});

/** A hostile sender in its own process: a UDP flood and TCP connections that trickle or pipeline, reopened when closed. */
const HOSTILE_SCRIPT = `
const dgram = require('node:dgram');
const net = require('node:net');
const { buildQuery } = require(process.env.DNS_WIRE);
const port = Number(process.env.DNS_PORT), source = process.env.DNS_SOURCE;
const udp = dgram.createSocket('udp4');
udp.bind({ address: source, port: 0 }, () => {
  let n = 0;
  const flood = () => {
    for (let i = 0; i < 100; i++) {
      const name = (n++ % 3 === 0) ? 'slow' + n + '.test' : 'refused' + n + '.evil.test';
      udp.send(buildQuery(n & 0xffff, name, 1), port, '127.0.0.1');
    }
    setImmediate(flood);
  };
  flood();
});
const frame = (m) => Buffer.concat([Buffer.from([m.length >> 8, m.length & 255]), m]);
const open = (kind) => {
  const s = net.connect({ host: '127.0.0.1', port, localAddress: source });
  s.on('error', () => undefined);
  s.on('close', () => setTimeout(() => open(kind), 250));
  s.on('data', () => undefined);
  s.on('connect', () => {
    if (kind === 'loris') {
      const q = frame(buildQuery(1, 'slow-loris.test', 1));
      let i = 0;
      const t = setInterval(() => (s.destroyed ? clearInterval(t) : s.write(q.subarray(i++ % q.length, i % q.length || 1))), 50);
    } else {
      const burst = () => { if (!s.destroyed) { for (let i = 0; i < 32; i++) s.write(frame(buildQuery(i, 'slow-tcp' + i + '.test', 1))); setTimeout(burst, 100); } };
      burst();
    }
  });
};
// more slow-loris connections than the whole node has slots for
for (let i = 0; i < 150; i++) open('loris');
for (let i = 0; i < 4; i++) open('pipelined');
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
process.stdout.write('flooding\\n');
`;

test.serial('a hostile sender flooding UDP and TCP (slow-loris, pipelined) does not slow another sender\'s lookups', async (t) => {
  const victim = recordingPolicy('sb-victim', { 'victim.test': 'svc' });
  // the hostile sender's names all belong to its services, and its "slow" ones take 1.5 s upstream
  const hostile: DnsClientPolicy = { sandboxId: 'sb-hostile', serviceFor: (name) => (name.startsWith('slow') ? 'svc' : undefined), servicesOf: () => ['svc'], bind: () => undefined };
  const upstreamPort = await startScriptedUpstream(t, (query, reply) => {
    const name = query.questions[0]!.name;
    const answer = () => {
      try {
        reply(buildResponse(query, { rcode: 0, answers: [{ name, type: DnsType.A, class: DnsClass.IN, ttl: 60, address: '10.0.0.5' }] }));
      } catch {
        // the test is over and the upstream socket closed
      }
    };
    if (name.startsWith('slow')) setTimeout(answer, 1500).unref();
    else answer();
  });
  const { port, responder } = await setup(t, {}, { [LOOPBACK]: victim, [OTHER_LOOPBACK]: hostile }, { upstreams: [{ address: LOOPBACK, port: upstreamPort }], upstreamTimeoutMs: 3000 });
  const atStart = responder.stats();
  const child = spawn(process.execPath, ['-e', HOSTILE_SCRIPT], {
    stdio: ['pipe', 'pipe', 'inherit'],
    env: { ...process.env, DNS_WIRE: join(__dirname, '..', '..', 'src', 'shim', 'network', 'dns-wire.js'), DNS_PORT: String(port), DNS_SOURCE: OTHER_LOOPBACK },
  });
  t.teardown(() => {
    child.stdin.end();
    child.kill('SIGKILL');
  });
  await once(child.stdout, 'data');
  await waitFor(() => responder.stats().queries > 300 && responder.stats().tcpClosed > 0, 15_000, 'the flood (UDP and TCP) to reach the responder');
  const before = responder.stats();
  const latencies: number[] = [];
  for (let i = 0; i < 40; i++) {
    const started = performance.now();
    // a resolver's retry: a datagram the kernel dropped under the flood is asked again after 500 ms
    let m: DnsMessage | undefined;
    for (let attempt = 0; attempt < 5 && m === undefined; attempt++) m = await ask(port, 'victim.test', DnsType.A, { id: i, timeoutMs: 800 }).catch(() => undefined);
    latencies.push(performance.now() - started);
    t.is(m?.rcode, DnsRcode.NOERROR, `lookup ${i}`);
  }
  const [overTcp] = await askTcp(port, frame(buildQuery(99, 'victim.test', DnsType.A)), 1);
  t.deepEqual(addressesOf(overTcp!), ['10.0.0.5'], 'and over TCP, while the hostile sender holds every connection it may');
  const after = responder.stats();
  latencies.sort((a, b) => a - b);
  t.log(`victim lookups under the flood: p50 ${latencies[20]!.toFixed(1)} ms, max ${latencies[39]!.toFixed(1)} ms; hostile: ${after.queries - before.queries} queries answered, ${after.dropped - before.dropped} dropped, ${after.tcpClosed - before.tcpClosed} TCP connections closed`);
  // over the whole flood: the victim's 40 lookups can take only a few ms, too short a window to count on a drop in
  t.true(after.dropped > atStart.dropped, 'the flood was large enough to be shed');
  t.true(latencies[39]! < 5000, `slowest victim lookup ${latencies[39]!.toFixed(0)} ms (bound: a resolver's first retry is after 5 s; the bench has the figures)`);
});
