/**
 * The SDK's retries of keyed execs, against a real HTTP server that breaks the
 * first connections (reset before an answer, or mid-answer): with an
 * idempotency key the exec is sent again with the same key until it is
 * answered; without one it is never sent twice. A retried execStream gives its
 * listeners every byte once.
 */
import test from 'ava';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { WarrenClient } from '../../src/sdk';
import { WarrenError } from '../../src/errors';

interface Seen {
  key: string | undefined;
  accept: string | undefined;
}

async function server(handle: (n: number, req: IncomingMessage, res: ServerResponse) => void): Promise<{ url: string; seen: Seen[]; close(): Promise<void> }> {
  const seen: Seen[] = [];
  const srv = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      seen.push({ key: req.headers['idempotency-key'] as string | undefined, accept: req.headers.accept });
      handle(seen.length, req, res);
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise<void>((r) => {
        srv.closeAllConnections();
        srv.close(() => r());
      }),
  };
}

const RESULT = { exitCode: 0, signal: null, status: 'ok', durationMs: 1, truncated: false, stdout: 'once\n', stderr: '' };

test('a keyed exec is sent again after a reset and after an answer that broke off', async (t) => {
  const s = await server((n, _req, res) => {
    if (n === 1) {
      res.socket?.resetAndDestroy();
      return;
    }
    const body = JSON.stringify(RESULT);
    if (n === 2) {
      // Half of the answer, then the connection is gone.
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
      res.write(body.slice(0, 10));
      setTimeout(() => res.socket?.destroy(), 20);
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', 'idempotency-replayed': 'true' });
    res.end(body);
  });
  const client = new WarrenClient({ url: s.url, token: 'wrn_x' });
  try {
    const r = await client.sandbox('sb-1').exec('echo once', { idempotencyKey: 'k-1', retryForMs: 10_000 });
    t.is(r.stdout, 'once\n');
    t.deepEqual(
      s.seen.map((x) => x.key),
      ['k-1', 'k-1', 'k-1'],
    );
  } finally {
    await client.close();
    await s.close();
  }
});

test('without a key an exec is never sent twice', async (t) => {
  const s = await server((_n, _req, res) => res.socket?.resetAndDestroy());
  const client = new WarrenClient({ url: s.url, token: 'wrn_x' });
  try {
    const err = await t.throwsAsync(client.sandbox('sb-1').exec('echo once'), { instanceOf: WarrenError });
    t.is(err?.code, 'UNAVAILABLE');
    t.is(s.seen.length, 1);
    t.is(s.seen[0]!.key, undefined);
  } finally {
    await client.close();
    await s.close();
  }
});

test('retries stop at retryForMs and at answers that are not about the connection', async (t) => {
  const s = await server((n, req, res) => {
    if (n < 3 || req.headers['idempotency-key'] === 'k-3') {
      res.socket?.resetAndDestroy();
      return;
    }
    res.writeHead(422, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ error: { code: 'IDEMPOTENCY_KEY_REUSED', message: 'other body' } }));
  });
  const client = new WarrenClient({ url: s.url, token: 'wrn_x' });
  try {
    const err = await t.throwsAsync(client.sandbox('sb-1').exec('x', { idempotencyKey: 'k-2' }), { instanceOf: WarrenError });
    t.is(err?.code, 'IDEMPOTENCY_KEY_REUSED');
    t.is(s.seen.length, 3);
    const none = await t.throwsAsync(client.sandbox('sb-1').exec('x', { idempotencyKey: 'k-3', retryForMs: 0 }), { instanceOf: WarrenError });
    t.is(none?.code, 'UNAVAILABLE');
    t.is(s.seen.filter((x) => x.key === 'k-3').length, 1, 'retryForMs: 0 sends once');
  } finally {
    await client.close();
    await s.close();
  }
});

test('a retried execStream replays from the start; listeners get each byte once', async (t) => {
  const s = await server((n, _req, res) => {
    res.writeHead(200, { 'content-type': 'application/x-ndjson' });
    if (n === 1) {
      res.write(`${JSON.stringify({ type: 'stdout', data: 'hello ' })}\n`);
      setTimeout(() => res.socket?.destroy(), 50);
      return;
    }
    res.write(`${JSON.stringify({ type: 'stdout', data: 'hello world\n' })}\n`);
    res.write(`${JSON.stringify({ type: 'stderr', data: 'warn\n' })}\n`);
    res.end(`${JSON.stringify({ type: 'exit', exitCode: 0, signal: null, status: 'ok', durationMs: 1, truncated: false })}\n`);
  });
  const client = new WarrenClient({ url: s.url, token: 'wrn_x' });
  try {
    const out: string[] = [];
    const err: string[] = [];
    const end = await client.sandbox('sb-1').execStream('x', {
      idempotencyKey: 'k-4',
      onStdout: (c) => out.push(c.toString()),
      onStderr: (c) => err.push(c.toString()),
    });
    t.is(end.exitCode, 0);
    t.deepEqual(out, ['hello ', 'world\n']);
    t.deepEqual(err, ['warn\n']);
    t.deepEqual(
      s.seen.map((x) => [x.key, x.accept]),
      [
        ['k-4', 'application/x-ndjson'],
        ['k-4', 'application/x-ndjson'],
      ],
    );
  } finally {
    await client.close();
    await s.close();
  }
});
