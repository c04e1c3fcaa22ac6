import test from 'ava';
import { WarrenError } from '../../src/errors';
import {
  DnsClass,
  DnsRcode,
  DnsType,
  buildQuery,
  buildResponse,
  canonicalAddress,
  ednsUdpPayloadSize,
  encodeMessage,
  normalizeName,
  parseHeader,
  parseMessage,
  type DnsRecord,
} from '../../src/shim/network/dns-wire';

function errorCode(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return err instanceof WarrenError ? err.code : `not a WarrenError: ${String(err)}`;
  }
  return 'no error';
}

/** A message from hex pieces (spaces ignored), for hand-made wire layouts. */
function hex(...pieces: string[]): Buffer {
  return Buffer.from(pieces.join('').replace(/\s+/g, ''), 'hex');
}

function header(id: number, flags: number, qd: number, an: number, ns = 0, ar = 0): string {
  return [id, flags, qd, an, ns, ar].map((value) => value.toString(16).padStart(4, '0')).join('');
}

/** Deterministic PRNG (mulberry32) so a fuzz failure can be replayed from its seed. */
function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 2 ** 32;
  };
}

test('query round trip: id, RD, question lower-cased without trailing dot', (t) => {
  const message = parseMessage(buildQuery(0xbeef, 'API.Example.COM.', DnsType.AAAA));
  t.is(message.id, 0xbeef);
  t.false(message.qr);
  t.true(message.rd);
  t.is(message.opcode, 0);
  t.deepEqual(message.questions, [{ name: 'api.example.com', type: DnsType.AAAA, class: DnsClass.IN }]);
  t.deepEqual([message.answers, message.authorities, message.additionals], [[], [], []]);
  t.false(parseMessage(buildQuery(1, 'x', DnsType.A, { recursionDesired: false })).rd);
});

test('message round trip: every header flag, all sections, A/AAAA/CNAME decoded, other types raw', (t) => {
  const answers: DnsRecord[] = [
    { name: 'www.example.com', type: DnsType.CNAME, class: DnsClass.IN, ttl: 60, target: 'edge.cdn.net' },
    { name: 'edge.cdn.net', type: DnsType.A, class: DnsClass.IN, ttl: 30, address: '192.0.2.1' },
    { name: 'edge.cdn.net', type: DnsType.AAAA, class: DnsClass.IN, ttl: 0xffffffff, address: '2001:db8::1' },
    { name: 'edge.cdn.net', type: DnsType.TXT, class: DnsClass.IN, ttl: 5, rdata: Buffer.from('\x05hello') },
  ];
  const authorities: DnsRecord[] = [{ name: 'cdn.net', type: DnsType.NS, class: DnsClass.IN, ttl: 1, rdata: hex('026e73 00') }];
  const wire = encodeMessage({ id: 7, qr: true, opcode: 2, aa: true, tc: true, rd: true, ra: true, rcode: DnsRcode.NXDOMAIN, questions: [{ name: 'www.example.com', type: DnsType.A, class: DnsClass.IN }], answers, authorities, additionals: [] });
  const message = parseMessage(wire);
  t.like(message, { id: 7, qr: true, opcode: 2, aa: true, tc: true, rd: true, ra: true, rcode: DnsRcode.NXDOMAIN });
  t.deepEqual(message.answers, answers);
  t.deepEqual(message.authorities, authorities);
  t.deepEqual(parseHeader(wire), { id: 7, qr: true, opcode: 2, aa: true, tc: true, rd: true, ra: true, rcode: 3, questionCount: 1, answerCount: 4, authorityCount: 1, additionalCount: 0 });
  t.deepEqual(encodeMessage(message), wire);
});

test('addresses come out canonical; AAAA accepts every IPv6 text form', (t) => {
  const forms: Array<[string, string]> = [
    ['2001:0DB8:0000:0000:0000:0000:0000:0001', '2001:db8::1'],
    ['::', '::'],
    ['::1', '::1'],
    ['1::', '1::'],
    ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'],
    ['2001:db8:0:1:1:1:1:1', '2001:db8:0:1:1:1:1:1'],
    ['::ffff:192.0.2.33', '::ffff:c000:221'],
    ['fe80:0:0:0:0:0:0:0', 'fe80::'],
  ];
  for (const [input, canonical] of forms) {
    const wire = encodeMessage({ id: 1, answers: [{ name: 'a', type: DnsType.AAAA, class: DnsClass.IN, ttl: 1, address: input }] });
    t.is((parseMessage(wire).answers[0] as { address: string }).address, canonical, input);
    t.is(canonicalAddress(input), canonical);
  }
  t.is(canonicalAddress('10.0.0.1'), '10.0.0.1');
  t.is(errorCode(() => canonicalAddress('example.com')), 'INVALID_ARGUMENT');
  t.is(errorCode(() => canonicalAddress('fe80::1%eth0')), 'INVALID_ARGUMENT');
});

test('names: escapes keep a dotted label distinct from two labels; case and trailing dot normalize', (t) => {
  t.is(normalizeName('WWW.Example.com.'), 'www.example.com');
  t.is(normalizeName('.'), '');
  t.is(normalizeName(''), '');
  t.is(normalizeName('a\\.b.c'), 'a\\.b.c');
  t.is(normalizeName('\\065\\000.x'), 'a\\000.x');
  const dotted = parseMessage(hex(header(1, 0, 1, 0), '03 612e62 01 63 00 0001 0001')).questions[0]!;
  t.is(dotted.name, 'a\\.b.c');
  t.not(dotted.name, 'a.b.c');
  t.deepEqual(parseMessage(buildQuery(1, dotted.name, DnsType.A)).questions[0], dotted);
  for (const bad of ['a..b', '..', '.a', 'caf\u00e9.com', 'a b.com', 'x\\', 'x\\256']) t.is(errorCode(() => buildQuery(1, bad, DnsType.A)), 'INVALID_ARGUMENT', bad);
});

test('compression pointers are followed, into questions and into other records', (t) => {
  const wire = hex(
    header(0x1234, 0x8180, 1, 2),
    '03777777 076578616d706c65 03636f6d 00 0001 0001', // 12: www.example.com A IN
    'c00c 0005 0001 0000003c 0007 0465646765 c010', // 33: www.example.com CNAME edge.(example.com at 16)
    'c02d 0001 0001 0000001e 0004 c0000201', // 52: (edge.example.com at 45) A 192.0.2.1
  );
  const message = parseMessage(wire);
  t.deepEqual(message.answers, [
    { name: 'www.example.com', type: DnsType.CNAME, class: DnsClass.IN, ttl: 60, target: 'edge.example.com' },
    { name: 'edge.example.com', type: DnsType.A, class: DnsClass.IN, ttl: 30, address: '192.0.2.1' },
  ]);
});

test('compression pointer loops and forward pointers are rejected', (t) => {
  const selfLoop = hex(header(1, 0, 1, 0), 'c00c 0001 0001');
  const labelThenSelf = hex(header(1, 0, 1, 0), '0161 c00e 0001 0001');
  const backToStart = hex(header(1, 0, 1, 0), '0161 c00c 0001 0001');
  // The question name points forward at the answer's name (20), which points back at it: a two-step loop.
  const twoStep = hex(header(1, 0x8000, 1, 1), '0162 c014 0001 0001', 'c00c 0001 0001 00000001 0004 01020304');
  const forward = hex(header(1, 0, 1, 0), 'c010 0001 0001 0161 00');
  for (const [label, wire] of Object.entries({ selfLoop, labelThenSelf, backToStart, twoStep, forward })) {
    const err = t.throws(() => parseMessage(wire), undefined, label);
    t.true(err instanceof WarrenError && err.code === 'INVALID_ARGUMENT', label);
  }
});

test('every truncation of a valid response throws INVALID_ARGUMENT', (t) => {
  const wire = encodeMessage({
    id: 9,
    qr: true,
    questions: [{ name: 'www.example.com', type: DnsType.A, class: DnsClass.IN }],
    answers: [
      { name: 'www.example.com', type: DnsType.CNAME, class: DnsClass.IN, ttl: 1, target: 'x.example.net' },
      { name: 'x.example.net', type: DnsType.A, class: DnsClass.IN, ttl: 1, address: '10.0.0.1' },
    ],
    additionals: [{ name: '', type: DnsType.OPT, class: 1232, ttl: 0, rdata: Buffer.alloc(0) }],
  });
  for (let length = 0; length < wire.length; length++) t.is(errorCode(() => parseMessage(wire.subarray(0, length))), 'INVALID_ARGUMENT', `length ${length}`);
  t.is(errorCode(() => parseMessage(wire)), 'no error');
  t.is(ednsUdpPayloadSize(parseMessage(wire)), 1232);
  t.is(ednsUdpPayloadSize(parseMessage(buildQuery(1, 'a', DnsType.A))), undefined);
});

test('labels over 63 bytes are rejected when encoding and decoding', (t) => {
  t.is(errorCode(() => buildQuery(1, `${'a'.repeat(63)}.com`, DnsType.A)), 'no error');
  t.is(errorCode(() => buildQuery(1, `${'a'.repeat(64)}.com`, DnsType.A)), 'INVALID_ARGUMENT');
  // 0x40 and 0x80 length bytes are the obsolete extended label types, not 64-byte labels.
  t.is(errorCode(() => parseMessage(hex(header(1, 0, 1, 0), '40', '61'.repeat(64), '00 0001 0001'))), 'INVALID_ARGUMENT');
  t.is(errorCode(() => parseMessage(hex(header(1, 0, 1, 0), '80', '61'.repeat(64), '00 0001 0001'))), 'INVALID_ARGUMENT');
});

test('names over 255 bytes on the wire are rejected, also when built from pointers', (t) => {
  const longest = ['a'.repeat(63), 'b'.repeat(63), 'c'.repeat(63), 'd'.repeat(61)].join('.'); // 255 bytes on the wire
  t.is(parseMessage(buildQuery(1, longest, DnsType.A)).questions[0]!.name, longest);
  t.is(errorCode(() => buildQuery(1, `e${longest.slice(1)}x`, DnsType.A)), 'INVALID_ARGUMENT');
  t.is(errorCode(() => buildQuery(1, `x.${longest}`, DnsType.A)), 'INVALID_ARGUMENT');
  // A second question: one label in front of a pointer to the 255-byte name.
  const first = buildQuery(1, longest, DnsType.A);
  const overlong = Buffer.concat([first, hex('0178 c00c 0001 0001')]);
  overlong.writeUInt16BE(2, 4);
  t.is(errorCode(() => parseMessage(overlong)), 'INVALID_ARGUMENT');
});

test('rdata that does not match its type is rejected', (t) => {
  const record = (type: string, rdata: string): Buffer => hex(header(1, 0x8000, 0, 1), '00', type, '0001 00000001', (rdata.length / 2).toString(16).padStart(4, '0'), rdata);
  t.is(errorCode(() => parseMessage(record('0001', '010203'))), 'INVALID_ARGUMENT');
  t.is(errorCode(() => parseMessage(record('001c', '01020304'))), 'INVALID_ARGUMENT');
  t.is(errorCode(() => parseMessage(record('0005', '0161 00 ff'))), 'INVALID_ARGUMENT'); // CNAME with a trailing byte
  t.is(errorCode(() => parseMessage(record('0005', '0561'))), 'INVALID_ARGUMENT'); // CNAME name runs past its rdata
  t.is((parseMessage(record('0001', '0a000001')).answers[0] as { address: string }).address, '10.0.0.1');
  t.deepEqual((parseMessage(record('0010', '026869')).answers[0] as { rdata: Buffer }).rdata, hex('026869'));
});

test('encoding rejects values that do not fit the wire', (t) => {
  const a = (address: string, ttl = 1): DnsRecord => ({ name: 'a', type: DnsType.A, class: DnsClass.IN, ttl, address });
  t.is(errorCode(() => encodeMessage({ id: 1, answers: [a('2001:db8::1')] })), 'INVALID_ARGUMENT');
  t.is(errorCode(() => encodeMessage({ id: 1, answers: [a('10.0.0.256')] })), 'INVALID_ARGUMENT');
  t.is(errorCode(() => encodeMessage({ id: 1, answers: [a('10.0.0.1', -1)] })), 'INVALID_ARGUMENT');
  t.is(errorCode(() => encodeMessage({ id: 1, answers: [a('10.0.0.1', 2 ** 32)] })), 'INVALID_ARGUMENT');
  t.is(errorCode(() => encodeMessage({ id: 0x10000 })), 'INVALID_ARGUMENT');
  t.is(errorCode(() => encodeMessage({ id: 1, rcode: 16 })), 'INVALID_ARGUMENT');
  t.is(errorCode(() => encodeMessage({ id: 1, answers: [{ name: 'a', type: DnsType.AAAA, class: DnsClass.IN, ttl: 1, address: '10.0.0.1' }] })), 'INVALID_ARGUMENT');
});

test('buildResponse answers the query: its id, opcode, RD and question, with QR and RA', (t) => {
  const query = parseMessage(buildQuery(4242, 'svc.example.com', DnsType.A));
  const response = parseMessage(buildResponse(query, { rcode: DnsRcode.NOERROR, answers: [{ name: 'svc.example.com', type: DnsType.A, class: DnsClass.IN, ttl: 9, address: '10.9.9.9' }] }));
  t.like(response, { id: 4242, qr: true, rd: true, ra: true, aa: false, tc: false, rcode: 0 });
  t.deepEqual(response.questions, query.questions);
  t.is(response.answers.length, 1);
  const truncated = parseMessage(buildResponse(query, { rcode: DnsRcode.REFUSED, truncated: true, recursionAvailable: false }));
  t.like(truncated, { tc: true, ra: false, rcode: DnsRcode.REFUSED });
  t.deepEqual(parseMessage(buildResponse({ id: 5 }, { rcode: DnsRcode.FORMERR })).questions, []);
});

test('fuzz: random and mutated buffers never throw anything but WarrenError INVALID_ARGUMENT', (t) => {
  const seed = Date.now() >>> 0;
  t.log(`seed ${seed}`);
  const random = prng(seed);
  const valid = encodeMessage({
    id: 3,
    qr: true,
    questions: [{ name: 'www.example.com', type: DnsType.A, class: DnsClass.IN }],
    answers: [
      { name: 'www.example.com', type: DnsType.CNAME, class: DnsClass.IN, ttl: 1, target: 'x.example.com' },
      { name: 'x.example.com', type: DnsType.AAAA, class: DnsClass.IN, ttl: 1, address: '2001:db8::7' },
    ],
  });
  // The same answer with compression, so mutations hit pointers too.
  const compressed = hex(header(0x1234, 0x8180, 1, 2), '03777777 076578616d706c65 03636f6d 00 0001 0001', 'c00c 0005 0001 0000003c 0007 0465646765 c010', 'c02d 0001 0001 0000001e 0004 c0000201');
  let parsed = 0;
  const failures: string[] = [];
  const attempt = (buf: Buffer): void => {
    try {
      parseMessage(buf);
      parsed += 1;
    } catch (err) {
      if (!(err instanceof WarrenError) || err.code !== 'INVALID_ARGUMENT') failures.push(`${buf.toString('hex')}: ${String(err)}`);
    }
  };
  for (let i = 0; i < 20_000; i++) {
    const length = Math.floor(random() * 300);
    const buf = Buffer.alloc(length);
    for (let j = 0; j < length; j++) buf[j] = Math.floor(random() * 256);
    // Plausible headers get further into the parser than pure noise.
    if (length >= 12 && random() < 0.5) for (let j = 4; j < 12; j++) buf[j] = j % 2 === 0 ? 0 : Math.floor(random() * 4);
    attempt(buf);
  }
  for (const base of [valid, compressed]) {
    for (let i = 0; i < 20_000; i++) {
      const buf = Buffer.from(base);
      const flips = 1 + Math.floor(random() * 4);
      for (let j = 0; j < flips; j++) buf[Math.floor(random() * buf.length)] = Math.floor(random() * 256);
      attempt(random() < 0.2 ? buf.subarray(0, Math.floor(random() * buf.length)) : buf);
    }
  }
  t.deepEqual(failures.slice(0, 5), []);
  t.true(parsed > 0, 'some mutations still parse');
});
