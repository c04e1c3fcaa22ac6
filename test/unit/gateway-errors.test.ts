import test from 'ava';
import { ErrorCodes, WarrenError, type ErrorCode } from '../../src/errors';
import { errorBody, publicError, sendError, tooLarge } from '../../src/gateway/http';
import { codeForStatus, errorFromBody } from '../../src/sdk/shell';

/** Just enough of hyper-express's Response for sendError. */
function fakeResponse() {
  const r = {
    completed: false,
    statusCode: 0,
    headers: {} as Record<string, string>,
    body: '',
    closed: false,
    status(code: number) {
      r.statusCode = code;
      return r;
    },
    header(name: string, value: string) {
      r.headers[name] = value;
      return r;
    },
    send(body: string, close?: boolean) {
      r.body = body;
      r.closed = Boolean(close);
      r.completed = true;
      return r;
    },
  };
  return r;
}

test('every error body is {error:{code,message}} with the code status', (t) => {
  for (const code of Object.keys(ErrorCodes) as ErrorCode[]) {
    const res = fakeResponse();
    sendError(res as never, new WarrenError(code, `m-${code}`), () => undefined);
    t.is(res.statusCode, ErrorCodes[code]);
    t.is(res.headers['content-type'], 'application/json; charset=utf-8');
    const body = JSON.parse(res.body);
    t.deepEqual(Object.keys(body), ['error']);
    t.is(body.error.code, code);
    t.is(body.error.message, `m-${code}`);
  }
});

test('details travel with the error', (t) => {
  const body = JSON.parse(errorBody(new WarrenError('LIMIT_OUT_OF_RANGE', 'x', { field: 'cpu', min: 0.01, max: 64 })));
  t.deepEqual(body, { error: { code: 'LIMIT_OUT_OF_RANGE', message: 'x', details: { field: 'cpu', min: 0.01, max: 64 } } });
});

test('unknown errors become 500 INTERNAL without the message or stack', (t) => {
  const logged: string[] = [];
  const res = fakeResponse();
  const secret = new Error('password=hunter2 at /srv/secret/path');
  sendError(res as never, secret, (l) => logged.push(l));
  t.is(res.statusCode, 500);
  const body = JSON.parse(res.body);
  t.is(body.error.code, 'INTERNAL');
  t.notRegex(res.body, /hunter2|secret|at \//);
  t.regex(body.error.message, /^internal error \(ref [0-9a-f]{12}\)$/);
  // the operator gets the details, under the same reference
  const ref = /ref ([0-9a-f]+)/.exec(body.error.message)![1]!;
  t.true(logged.some((l) => l.includes(ref) && l.includes('hunter2') && l.includes('Error:')));
});

test('non-Error throwables are handled too', (t) => {
  for (const thrown of ['a string', 42, null, undefined, { weird: true }]) {
    const e = publicError(thrown, () => undefined);
    t.is(e.code, 'INTERNAL');
    t.is(e.status, 500);
  }
});

test('sendError can close the connection (unread bodies) and never answers twice', (t) => {
  const res = fakeResponse();
  sendError(res as never, tooLarge(10, 5), () => undefined, true);
  t.is(res.statusCode, 413);
  t.true(res.closed);
  t.is(res.headers.connection, 'close');
  t.is(JSON.parse(res.body).error.code, 'PAYLOAD_TOO_LARGE');
  sendError(res as never, new WarrenError('INTERNAL', 'again'), () => undefined);
  t.is(res.statusCode, 413);
});

test('the SDK rebuilds WarrenErrors from error bodies', (t) => {
  const e = errorFromBody(404, '{"error":{"code":"SANDBOX_NOT_FOUND","message":"sandbox \\"x\\" not found","details":{"id":"x"}}}');
  t.true(e instanceof WarrenError);
  t.is(e.code, 'SANDBOX_NOT_FOUND');
  t.is(e.status, 404);
  t.is(e.message, 'sandbox "x" not found');
  t.deepEqual(e.details, { id: 'x' });
  // non-JSON and unknown codes fall back on the status
  t.is(errorFromBody(413, '').code, 'PAYLOAD_TOO_LARGE');
  t.is(errorFromBody(502, '<html>bad gateway</html>').code, 'INTERNAL');
  t.is(errorFromBody(400, '{"error":{"code":"NOT_A_CODE","message":"x"}}').code, 'INVALID_ARGUMENT');
  for (const [status, code] of [[401, 'UNAUTHENTICATED'], [403, 'FORBIDDEN'], [429, 'RESOURCE_EXHAUSTED'], [501, 'NOT_SUPPORTED'], [503, 'UNAVAILABLE'], [504, 'TIMEOUT']] as const) {
    t.is(codeForStatus(status), code);
  }
});

test('a code that is not one of ours (a prototype name, a typo) is INTERNAL with a numeric status', (t) => {
  for (const code of ['constructor', 'toString', '__proto__', 'hasOwnProperty', 'NOPE', '']) {
    const e = new WarrenError(code as never, 'm');
    t.is(e.code, 'INTERNAL', code);
    t.is(e.status, 500, code);
  }
});
