/**
 * The SDK against a server that resets a kept-alive connection as a request arrives on it
 * (what a server closing an idle connection looks like to a client that writes at that moment):
 * requests whose repetition changes nothing are sent again on a new connection, POSTs are not.
 */
import test from 'ava';
import { createServer, type Server, type Socket } from 'node:net';
import { WarrenClient, SERVER_IDLE_CLOSE_MS } from '../../src/sdk';
import { WarrenError } from '../../src/errors';

interface ResettingServer {
  url: string;
  /** Requests that reached the server, by request line. */
  seen: string[];
  close(): Promise<void>;
}

/** The first request on every connection is answered; the second one is met with a reset. */
async function resettingServer(): Promise<ResettingServer> {
  const seen: string[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((sock) => {
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    let served = 0;
    let buf = '';
    sock.on('data', (d) => {
      buf += d.toString('latin1');
      let end;
      while ((end = buf.indexOf('\r\n\r\n')) >= 0) {
        const head = buf.slice(0, end);
        const len = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
        if (buf.length < end + 4 + len) return;
        buf = buf.slice(end + 4 + len);
        seen.push(head.split('\r\n')[0]!);
        if (served++ === 0) {
          const body = '{"ok":true}';
          sock.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n${body}`);
        } else {
          sock.resetAndDestroy();
          return;
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const port = (server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    close: () =>
      new Promise((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => r());
      }),
  };
}

test('a GET or DELETE whose kept-alive connection is reset is sent once more, on a new connection', async (t) => {
  const srv = await resettingServer();
  const client = new WarrenClient({ url: srv.url, token: 't', connections: 1 });
  t.teardown(async () => {
    await client.close();
    await srv.close();
  });
  t.deepEqual(await client.requestJson('GET', '/v1/a'), { ok: true });
  // The pool's one connection is reused and reset; the retry opens a new one.
  t.deepEqual(await client.requestJson('GET', '/v1/b'), { ok: true });
  t.deepEqual(await client.requestJson('DELETE', '/v1/c'), { ok: true });
  t.deepEqual(srv.seen, ['GET /v1/a HTTP/1.1', 'GET /v1/b HTTP/1.1', 'GET /v1/b HTTP/1.1', 'DELETE /v1/c HTTP/1.1', 'DELETE /v1/c HTTP/1.1']);
});

test('a POST whose connection is reset is not repeated: the caller gets UNAVAILABLE', async (t) => {
  const srv = await resettingServer();
  const client = new WarrenClient({ url: srv.url, token: 't', connections: 1 });
  t.teardown(async () => {
    await client.close();
    await srv.close();
  });
  t.deepEqual(await client.requestJson('POST', '/v1/a', { json: {} }), { ok: true });
  const err = await t.throwsAsync(client.requestJson('POST', '/v1/exec', { json: { cmd: 'date >> runs' } }), { instanceOf: WarrenError });
  t.is(err.code, 'UNAVAILABLE');
  t.deepEqual(srv.seen, ['POST /v1/a HTTP/1.1', 'POST /v1/exec HTTP/1.1']);
});

test('the SDK drops idle connections before the gateway closes them', (t) => {
  const client = new WarrenClient({ url: 'http://127.0.0.1:9', token: 't' });
  t.teardown(() => client.close());
  // Read the pool's option back through undici's symbol so the assertion follows the real setting.
  const pool = (client as unknown as { pool: object }).pool;
  const sym = Object.getOwnPropertySymbols(pool).find((s) => s.description === 'options');
  const options = (sym ? (pool as Record<symbol, { keepAliveTimeout?: number; keepAliveMaxTimeout?: number }>)[sym] : undefined) ?? {};
  t.true(typeof options.keepAliveTimeout === 'number' && options.keepAliveTimeout <= SERVER_IDLE_CLOSE_MS / 2, `keepAliveTimeout ${options.keepAliveTimeout}`);
  t.true(typeof options.keepAliveMaxTimeout === 'number' && options.keepAliveMaxTimeout < SERVER_IDLE_CLOSE_MS, `keepAliveMaxTimeout ${options.keepAliveMaxTimeout}`);
});
