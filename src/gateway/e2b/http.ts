/**
 * The E2B surface's own HTTP listener (node:http) and a small router.
 *
 * Why not the gateway's uWebSockets port: E2B's SDK sends header names with
 * underscores (`lang_version`, `package_version`, `sdk_runtime`) on every
 * control-plane call, and uWS drops such requests without an answer. So the
 * whole E2B surface (both planes, routed by path and the `E2b-Sandbox-Id`
 * header) listens on one port of its own, next to the native API.
 *
 * Req/Res keep the small part of the hyper-express API the handlers use.
 */
import { type IncomingMessage, type Server as HttpServer, type ServerResponse, createServer } from 'node:http';

export class Req {
  readonly method: string;
  readonly path: string;
  readonly path_query: string;
  readonly headers: Record<string, string | undefined>;
  path_parameters: Record<string, string> = {};

  constructor(readonly raw: IncomingMessage) {
    this.method = raw.method ?? 'GET';
    const url = raw.url ?? '/';
    const q = url.indexOf('?');
    this.path = q === -1 ? url : url.slice(0, q);
    this.path_query = q === -1 ? '' : url.slice(q + 1);
    const h: Record<string, string | undefined> = {};
    for (const [k, v] of Object.entries(raw.headers)) h[k] = Array.isArray(v) ? v.join(', ') : v;
    this.headers = h;
  }

  /** Whether the body has been read to its end (or there was none). */
  get received(): boolean {
    return this.raw.readableEnded || (this.raw.headers['content-length'] === undefined && this.raw.headers['transfer-encoding'] === undefined);
  }
}

export class Res {
  constructor(readonly raw: ServerResponse) {}

  get completed(): boolean {
    return this.raw.writableEnded || this.raw.destroyed;
  }

  status(code: number): this {
    if (!this.raw.headersSent) this.raw.statusCode = code;
    return this;
  }

  header(name: string, value: string): this {
    if (!this.raw.headersSent) this.raw.setHeader(name, value);
    return this;
  }

  /** The whole body; `close` closes the connection after it (used when a request body was not read). */
  send(body?: string | Buffer, close = false): void {
    if (this.completed) return;
    if (close && !this.raw.headersSent) this.raw.setHeader('connection', 'close');
    this.raw.end(body ?? '');
    // Node would otherwise read and discard the rest of an unread body to keep the connection.
    if (close) this.raw.once('finish', () => this.raw.socket?.destroy());
  }

  /** Send the status and headers now (a streamed answer whose first chunk may take a while). */
  flushHeaders(): void {
    if (!this.raw.headersSent) this.raw.flushHeaders();
  }

  /** A chunk of a streamed body; false when the client is behind (wait for 'drain'). */
  write(chunk: string | Buffer): boolean {
    if (this.completed) return false;
    return this.raw.write(chunk);
  }

  end(chunk?: string | Buffer): void {
    if (this.completed) return;
    this.raw.end(chunk ?? '');
  }

  /** Abort the response (the client sees a truncated transfer). */
  close(): void {
    this.raw.destroy();
  }

  on(event: 'close' | 'drain', fn: () => void): this {
    this.raw.on(event, fn);
    return this;
  }

  once(event: 'close' | 'drain', fn: () => void): this {
    this.raw.once(event, fn);
    return this;
  }
}

export type Handler = (req: Req, res: Res) => Promise<void> | void;

interface Route {
  method: string;
  re: RegExp;
  keys: string[];
  fn: Handler;
}

export class Router {
  private readonly routes: Route[] = [];
  private fallback: Handler = (_req, res) => res.status(404).send('not found');

  private add(method: string, pattern: string, fn: Handler): void {
    const keys: string[] = [];
    let src = '';
    for (const part of pattern.split('/').slice(1)) {
      if (part.startsWith(':')) {
        keys.push(part.slice(1));
        src += '/([^/]+)';
      } else if (part === '*') {
        src += '(?:/.*)?';
      } else src += `/${part.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`;
    }
    this.routes.push({ method, re: new RegExp(`^${src}$`), keys, fn });
  }

  get(p: string, fn: Handler): void {
    this.add('GET', p, fn);
  }
  post(p: string, fn: Handler): void {
    this.add('POST', p, fn);
  }
  put(p: string, fn: Handler): void {
    this.add('PUT', p, fn);
  }
  delete(p: string, fn: Handler): void {
    this.add('DELETE', p, fn);
  }
  any(p: string, fn: Handler): void {
    this.add('*', p, fn);
  }
  notFound(fn: Handler): void {
    this.fallback = fn;
  }

  handle(req: Req, res: Res): Promise<void> | void {
    for (const r of this.routes) {
      if (r.method !== '*' && r.method !== req.method) continue;
      const m = r.re.exec(req.path);
      if (m === null) continue;
      const params: Record<string, string> = {};
      try {
        r.keys.forEach((k, i) => (params[k] = decodeURIComponent(m[i + 1]!)));
      } catch {
        continue;
      }
      req.path_parameters = params;
      return r.fn(req, res);
    }
    return this.fallback(req, res);
  }
}

/** Listen with a router; errors escaping a handler become a bare 500 (handlers answer their own errors). */
export async function listen(router: Router, host: string, port: number, log: (line: string) => void): Promise<{ server: HttpServer; port: number }> {
  // A request (headers and body) must arrive within 10 minutes: a trickling upload cannot hold a connection for ever.
  const server = createServer({ keepAliveTimeout: 60_000, requestTimeout: 600_000, headersTimeout: 60_000 }, (rawReq, rawRes) => {
    const req = new Req(rawReq);
    const res = new Res(rawRes);
    Promise.resolve()
      .then(() => router.handle(req, res))
      .catch((err) => {
        log(`e2b: unhandled error on ${req.method} ${req.path}: ${(err as Error).stack ?? String(err)}`);
        if (!res.completed) res.status(500).send(JSON.stringify({ code: 500, message: 'internal error' }), true);
      });
  });
  server.on('clientError', (_err, socket) => socket.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const addr = server.address();
  return { server, port: typeof addr === 'object' && addr !== null ? addr.port : port };
}
