/**
 * Clients that misbehave on purpose, and the memory of the process they hit:
 * a WebSocket client that completes the handshake and then never reads, an
 * HTTP client that sends a request and never reads the answer, and the
 * resident set size of a process from /proc.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import net from 'node:net';

/** Resident set size of `pid` in bytes (VmRSS). */
export function rssBytes(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  if (!m) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

export interface StuckSocket {
  sock: net.Socket;
  /** The status line and headers the server answered with. */
  head: string;
  destroy(): void;
}

/** A TCP connection to the loopback port. A socket that never reads keeps the kernel's initial receive window (about 128 KiB). */
function connectTo(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host: '127.0.0.1', port });
    sock.once('error', reject);
    sock.once('connect', () => {
      sock.removeListener('error', reject);
      sock.on('error', () => undefined);
      resolve(sock);
    });
  });
}

/** Read until the end of the HTTP head, then stop reading for good. */
function readHeadThenStall(sock: net.Socket, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let buf = '';
    const timer = setTimeout(() => reject(new Error(`no answer head within ${timeoutMs} ms: ${JSON.stringify(buf.slice(0, 200))}`)), timeoutMs);
    const onData = (c: Buffer) => {
      buf += c.toString('latin1');
      const end = buf.indexOf('\r\n\r\n');
      if (end < 0) return;
      clearTimeout(timer);
      sock.removeListener('data', onData);
      sock.pause();
      resolve(buf.slice(0, end));
    };
    sock.on('data', onData);
  });
}

/** A WebSocket upgrade to `path` that, once answered, never reads another byte. */
export async function stuckWebSocket(port: number, path: string, token: string, timeoutMs = 10_000): Promise<StuckSocket> {
  const sock = await connectTo(port);
  const key = randomBytes(16).toString('base64');
  sock.write(
    `GET ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n` +
      `Sec-WebSocket-Key: ${key}\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer ${token}\r\n\r\n`,
  );
  const head = await readHeadThenStall(sock, timeoutMs);
  return { sock, head, destroy: () => sock.destroy() };
}

/** An HTTP request whose answer is never read past its head. */
export async function stuckHttp(port: number, method: string, path: string, token: string, body: string, timeoutMs = 30_000): Promise<StuckSocket> {
  const sock = await connectTo(port);
  sock.write(
    `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAuthorization: Bearer ${token}\r\n` +
      `Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
  const head = await readHeadThenStall(sock, timeoutMs);
  return { sock, head, destroy: () => sock.destroy() };
}

/** Sample `fn` every `everyMs` until `untilMs` has passed; the largest value seen. */
export async function peakOver(fn: () => number, untilMs: number, everyMs = 100): Promise<number> {
  const end = Date.now() + untilMs;
  let peak = fn();
  while (Date.now() < end) {
    await new Promise((r) => setTimeout(r, everyMs));
    peak = Math.max(peak, fn());
  }
  return peak;
}

/** Poll `fn` until it returns true or `timeoutMs` passes; the last value of `describe` goes into the error. */
export async function pollUntil(fn: () => boolean | Promise<boolean>, timeoutMs: number, describe: () => string, everyMs = 100): Promise<void> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`condition not met within ${timeoutMs} ms: ${describe()}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
