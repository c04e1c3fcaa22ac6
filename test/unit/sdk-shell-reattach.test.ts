/**
 * The SDK's shell after its connection breaks and the gateway never comes back (killed, moved to
 * another port): it re-attaches within its window with back-off, as one loop, then ends, and
 * tries nothing more. A connection that fails before its hello is that attempt's failure, not a
 * new break of the session to recover from in a loop of its own.
 */
import test from 'ava';
import { createServer as createHttpServer } from 'node:http';
import { type AddressInfo, createServer as createNetServer, type Server, type Socket } from 'node:net';
import { WebSocketServer } from 'ws';
import { ShellClient } from '../../src/sdk/shell';
import { elapse, waitFor } from '../helpers/wait';

function listen(server: Server | ReturnType<typeof createHttpServer>, port = 0): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, '127.0.0.1', () => resolve((server.address() as AddressInfo).port));
  });
}

/** A TCP server on `port` that counts connections and resets each one at once. */
async function resetting(port: number): Promise<{ connections: () => number; close(): Promise<void> }> {
  let n = 0;
  const sockets = new Set<Socket>();
  const server = createNetServer((sock) => {
    n++;
    sockets.add(sock);
    sock.on('error', () => undefined);
    sock.resetAndDestroy();
  });
  await listen(server, port);
  return {
    connections: () => n,
    close: () => new Promise((r) => {
      for (const s of sockets) s.destroy();
      server.close(() => r());
    }),
  };
}

for (const kind of ['reset before the hello', 'an error status'] as const) {
  test(`after a lost connection, re-attaching against ${kind} is one loop with back-off that ends with the window`, async (t) => {
    // a gateway that attaches once, then drops the connection without a close frame
    const http = createHttpServer((_req, res) => {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end('{"error":{"code":"UNAVAILABLE","message":"restarting"}}');
    });
    const wss = new WebSocketServer({ noServer: true });
    let attached = false;
    let upgrades = 0;
    http.on('upgrade', (req, sock, head) => {
      if (attached && kind === 'an error status') {
        // a plain HTTP answer where the upgrade was expected: the gateway's error status
        sock.end('HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 55\r\nconnection: close\r\n\r\n{"error":{"code":"UNAVAILABLE","message":"restarting"}}');
        upgrades++;
        return;
      }
      wss.handleUpgrade(req, sock, head, (ws) => {
        attached = true;
        ws.send(JSON.stringify({ type: 'hello', session: 's-1', mode: 'command', offset: 0, liveOffset: 0 }));
        setTimeout(() => ws.terminate(), 50);
      });
    });
    const port = await listen(http);
    const shell = await ShellClient.connect(`http://127.0.0.1:${port}/v1/sandboxes/x-1/shell`, 'token', { mode: 'command', reconnectWindowMs: 1500 });
    let server: { connections: () => number; close(): Promise<void> } | null = null;
    const closed = new Promise<number>((r) => shell.on('close', (code: number) => r(code)));
    try {
      if (kind === 'reset before the hello') {
        // the gateway is gone; something on its port resets every connection
        await waitFor(() => attached, 5000, 'the first attach', 10);
        await new Promise<void>((r) => {
          wss.close();
          http.closeAllConnections();
          http.close(() => r());
        });
        server = await resetting(port);
      }
      const count = () => (server !== null ? server.connections() : upgrades);
      t.is(await closed, 1006, 'the shell ends with the code of the break once the window has passed');
      const atClose = count();
      // back-off 50, 100, 200, 400, 800 ms within 1.5 s: a handful of tries, not one loop per failure
      t.true(atClose >= 2 && atClose <= 10, `${atClose} attempts in the window`);
      await elapse(1500, 'a loop left running would go on trying after the close');
      t.is(count(), atClose, 'nothing is tried after the shell ended');
      t.true(shell.closed);
    } finally {
      await server?.close();
      wss.close();
      http.closeAllConnections();
      await new Promise<void>((r) => http.close(() => r()));
    }
  });
}
