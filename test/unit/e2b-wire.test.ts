/** The E2B surface's wire codecs: Connect envelopes, multipart, metadata queries, network mapping, find output, user entries, kernel events as interpreter messages. */
import test from 'ava';
import { mapNetwork, parseMetadataQuery } from '../../src/gateway/e2b/control';
import { addUserEntries, parseFindOutput, resolvePath } from '../../src/gateway/e2b/envd';
import { e2bMessage } from '../../src/gateway/e2b/interpreter';
import {
  E2bError,
  FLAG_END_STREAM,
  connectCodeForStatus,
  decodeEnvelopes,
  decodeRequestMessage,
  encodeEnvelope,
  endEnvelope,
  messageEnvelope,
  multipartBoundary,
  parseConnectTimeout,
  parseMultipart,
  userFromBasicAuth,
} from '../../src/gateway/e2b/wire';

test('envelopes: flag byte, big-endian length, JSON; end-of-stream with and without error', (t) => {
  const m = messageEnvelope({ event: { start: { pid: 7 } } });
  t.is(m[0], 0);
  t.is(m.readUInt32BE(1), m.length - 5);
  t.deepEqual(JSON.parse(m.subarray(5).toString()), { event: { start: { pid: 7 } } });
  const end = endEnvelope();
  t.is(end[0], FLAG_END_STREAM);
  t.is(end.subarray(5).toString(), '{}');
  const err = endEnvelope(new E2bError(504, 'too slow', 'deadline_exceeded'));
  t.deepEqual(JSON.parse(err.subarray(5).toString()), { error: { code: 'deadline_exceeded', message: 'too slow' } });
  const both = decodeEnvelopes(Buffer.concat([m, end]));
  t.is(both.length, 2);
  t.is(both[1]!.flags, FLAG_END_STREAM);
});

test('envelopes: truncation, compression and oversize are refused', (t) => {
  const m = messageEnvelope({ a: 1 });
  t.throws(() => decodeEnvelopes(m.subarray(0, 3)), { message: /truncated/ });
  t.throws(() => decodeEnvelopes(m.subarray(0, m.length - 1)), { message: /truncated/ });
  t.throws(() => decodeEnvelopes(encodeEnvelope(1, '{}')), { message: /compressed/ });
  const huge = Buffer.alloc(5);
  huge.writeUInt32BE(0xffffffff, 1);
  t.throws(() => decodeEnvelopes(huge), { message: /exceeds/ });
});

test('request messages: unary JSON, one envelope for streams, objects only', (t) => {
  t.deepEqual(decodeRequestMessage(Buffer.from('{"path":"/x"}'), false), { path: '/x' });
  t.deepEqual(decodeRequestMessage(Buffer.alloc(0), false), {});
  t.deepEqual(decodeRequestMessage(messageEnvelope({ process: { cmd: 'ls' } }), true), { process: { cmd: 'ls' } });
  t.throws(() => decodeRequestMessage(Buffer.concat([messageEnvelope({}), messageEnvelope({})]), true), { message: /exactly one/ });
  t.throws(() => decodeRequestMessage(Buffer.from('[1]'), false), { message: /object/ });
  t.throws(() => decodeRequestMessage(Buffer.from('{'), false), { message: /JSON/ });
});

test('status and Connect codes; Connect-Timeout-Ms; Basic auth user', (t) => {
  t.is(connectCodeForStatus(404), 'not_found');
  t.is(connectCodeForStatus(401), 'unauthenticated');
  t.is(connectCodeForStatus(502), 'unavailable');
  t.is(parseConnectTimeout('60000'), 60000);
  t.is(parseConnectTimeout('0'), undefined);
  t.is(parseConnectTimeout('1e9'), undefined);
  t.is(parseConnectTimeout(undefined), undefined);
  t.is(userFromBasicAuth(`Basic ${Buffer.from('root:').toString('base64')}`), 'root');
  t.is(userFromBasicAuth(`Basic ${Buffer.from(':').toString('base64')}`), undefined);
  t.is(userFromBasicAuth('Bearer x'), undefined);
});

test('multipart: several parts with filenames, quoted boundaries, hostile and truncated bodies', (t) => {
  const b = 'XyZ';
  t.is(multipartBoundary(`multipart/form-data; boundary=${b}`), b);
  t.is(multipartBoundary('multipart/form-data; boundary="a b"'), 'a b');
  t.is(multipartBoundary('application/json'), undefined);
  const body = Buffer.from(
    `--${b}\r\nContent-Disposition: form-data; name="file"; filename="a/one.txt"\r\nContent-Type: application/octet-stream\r\n\r\nONE\r\n` +
      `--${b}\r\nContent-Disposition: form-data; name="file"; filename="/abs/two%22q.bin"\r\n\r\n\x00\x01\r\n\r\n` +
      `--${b}--\r\n`,
    'latin1',
  );
  const parts = parseMultipart(body, b);
  t.is(parts.length, 2);
  t.is(parts[0]!.filename, 'a/one.txt');
  t.is(parts[0]!.data.toString(), 'ONE');
  t.is(parts[1]!.filename, '/abs/two"q.bin');
  t.deepEqual([...parts[1]!.data], [0, 1, 13, 10]);
  t.throws(() => parseMultipart(Buffer.from(`--${b}\r\nContent-Disposition: form-data; name="file"\r\n\r\nno end`), b), { message: /truncated/ });
  t.throws(() => parseMultipart(Buffer.from('nothing'), b), { message: /boundary/ });
  t.throws(() => parseMultipart(Buffer.from(`--${b}\r\n${'x'.repeat(9000)}\r\n\r\n`), b), { message: /headers/ });
});

test('paths: relative against home, ".." and NUL refused', (t) => {
  t.is(resolvePath('a/b', 'user'), '/home/user/a/b');
  t.is(resolvePath('', 'user'), '/home/user');
  t.is(resolvePath('x', 'root'), '/root/x');
  t.is(resolvePath('//tmp/./y/', 'user'), '/tmp/y');
  t.throws(() => resolvePath('../etc', 'user'), { message: /\.\./ });
  t.throws(() => resolvePath('/a/../../b', 'user'), { message: /\.\./ });
  t.throws(() => resolvePath('a\0b', 'user'), { message: /NUL/ });
});

test('metadata query: the SDK percent-encodes keys and values once more', (t) => {
  // What Sandbox.list({query: {metadata: {"a b": "c&d", k: "v=1"}}}) puts in ?metadata= (after one decode).
  const pairs = new URLSearchParams({ [encodeURIComponent('a b')]: encodeURIComponent('c&d'), k: encodeURIComponent('v=1') }).toString();
  t.deepEqual(parseMetadataQuery(pairs), { 'a b': 'c&d', k: 'v=1' });
  t.deepEqual(parseMetadataQuery(null), {});
  t.deepEqual(parseMetadataQuery('__proto__=x'), JSON.parse('{"__proto__":"x"}'));
});

test('network: services and their hosts map onto the catalog; what Warren cannot do is refused', (t) => {
  const services = { pypi: { hosts: ['pypi.org', 'files.pythonhosted.org'] }, hf: { hosts: ['*.hf.co'] }, npm: { hosts: ['registry.npmjs.org'] } };
  t.is(mapNetwork(undefined, undefined, services), undefined);
  t.deepEqual(mapNetwork(false, undefined, services), {});
  t.deepEqual(mapNetwork(undefined, { allowOut: ['pypi', 'cdn.hf.co'], denyOut: ['0.0.0.0/0'] }, services), { pypi: true, hf: true });
  t.deepEqual(mapNetwork(true, { denyOut: ['registry.npmjs.org'] }, services), { npm: false });
  t.throws(() => mapNetwork(undefined, { allowOut: ['0.0.0.0/0'] }, services), { message: /CIDR/ });
  t.throws(() => mapNetwork(undefined, { allowOut: ['example.com'] }, services), { message: /neither a service/ });
  t.throws(() => mapNetwork(undefined, { allowOut: ['pypi'], denyOut: ['pypi'] }, services), { message: /both/ });
  t.throws(() => mapNetwork(undefined, { egressProxy: { address: 'x:1' } }, services), { message: /egressProxy/ });
  t.throws(() => mapNetwork('yes', undefined, services), { message: /true or false/ });
});

test('find -printf output becomes envd entries', (t) => {
  const rec = (f: string[]) => f.join('\0') + '\0';
  const out = rec(['f', '12', '644', '-rw-r--r--', 'user', 'user', '1700000000.5', '', '/home/user/a.txt']) + rec(['l', '4', '777', 'lrwxrwxrwx', 'root', 'root', '1700000001', '/etc', '/home/user/ln']) + rec(['s', '0', '755', 'srwxr-xr-x', 'root', 'root', '1', '', '/run/x.sock']);
  const e = parseFindOutput(out);
  t.is(e.length, 3);
  t.deepEqual(e[0], { name: 'a.txt', type: 'FILE_TYPE_FILE', path: '/home/user/a.txt', size: '12', mode: 0o644, permissions: '-rw-r--r--', owner: 'user', group: 'user', modifiedTime: '2023-11-14T22:13:20.500Z' });
  t.is(e[1]!.type, 'FILE_TYPE_SYMLINK');
  t.is(e[1]!.symlinkTarget, '/etc');
  t.is(e[2]!.type, 'FILE_TYPE_UNSPECIFIED');
  t.deepEqual(parseFindOutput(''), []);
});

test('the user account: first free id from 1000, nothing when present', (t) => {
  const r = addUserEntries('root:x:0:0::/root:/bin/bash\nbob:x:1000:1000::/home/bob:/bin/sh\n', 'root:x:0:\nbob:x:1000:\n');
  t.truthy(r);
  t.is(r!.uid, 1001);
  t.true(r!.passwd.endsWith('user:x:1001:1001::/home/user:/bin/bash\n'));
  t.true(r!.group.endsWith('user:x:1001:\n'));
  t.is(addUserEntries('user:x:1000:1000::/home/user:/bin/bash', ''), null);
  t.is(addUserEntries('root:x:0:0::/root:/bin/sh', '')!.passwd, 'root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/bash\n');
});

test('kernel events become the interpreter SDK messages: streams, results with MIME fields, errors', (t) => {
  t.deepEqual(e2bMessage({ type: 'stream', name: 'stderr', text: 'w\n' }), { type: 'stderr', text: 'w\n' });
  t.deepEqual(e2bMessage({ type: 'execute_result', data: { 'text/plain': '1', 'text/html': '<b>1</b>' }, execution_count: 3 }), { type: 'result', is_main_result: true, text: '1', html: '<b>1</b>' });
  t.deepEqual(e2bMessage({ type: 'display_data', data: { 'text/plain': '<Figure>', 'image/png': 'iVBOR', 'application/vnd.custom+json': { a: 1 } } }), {
    type: 'result',
    is_main_result: false,
    text: '<Figure>',
    png: 'iVBOR',
    'application/vnd.custom+json': { a: 1 },
  });
  t.deepEqual(e2bMessage({ type: 'error', ename: 'ValueError', evalue: 'bad', traceback: ['a', 'b'] }), { type: 'error', name: 'ValueError', value: 'bad', traceback: 'a\nb' });
});
