/**
 * The node's end of the shim protocol: a Shim (the node's LocalShim) served
 * over HTTP and WebSocket to gateways holding the shared token
 * (docs/shim-protocol.md). The gateway is a trusted peer once authenticated;
 * still every request is checked for shape and size before it reaches the
 * node (a method table with arities, bounded bodies and frames), and every
 * stream is tied to its connection: a gateway that goes away kills its live
 * execs and detaches its sessions, and nothing it started is left behind.
 */
import { timingSafeEqual } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { WebSocketServer, type WebSocket, createWebSocketStream } from 'ws';
import { WarrenError, asWarrenError } from '../../errors';
import { InputNumbering, ackBatcher, validateSeq, validateWriter } from '../sessions/input-numbering';
import type { DirWatch, ExecStream, LiveExec, SessionAttachment, Shim } from '../types';
import { FRAME, FRAMES_TYPE, type Hello, MAX_FRAME_BYTES, MAX_JSON_BYTES, frame, METHODS, OPTIONAL_METHODS, SHIM_BASE, SHIM_PROTOCOL_VERSION, checkArgs, decode, encode, errorJson } from './wire';

export interface ShimServerOptions {
  shim: Shim;
  /** The shared secret gateways present as `Authorization: Bearer <token>`. */
  token: string;
  host: string;
  /** 0 picks an ephemeral port. */
  port: number;
  /** Largest raw request body (writeFile, uploadTar); default 1 GiB. */
  maxRawBytes?: number;
  log?: (line: string) => void;
}

export interface ShimServer {
  url: string;
  port: number;
  close(): Promise<void>;
}

/** Bytes queued on a WebSocket above which a stream stops reading until the peer catches up. */
const WS_HIGH_WATER = 1024 * 1024;
const WS_MAX_PAYLOAD = 8 * 1024 * 1024;


type Fn = (...args: unknown[]) => Promise<unknown>;

export async function serveShim(opts: ShimServerOptions): Promise<ShimServer> {
  const log = opts.log ?? (() => undefined);
  const want = Buffer.from(opts.token);
  if (want.length < 16) throw new WarrenError('INVALID_ARGUMENT', 'the shim protocol token must be at least 16 bytes');
  const maxRaw = opts.maxRawBytes ?? 1024 * 1024 * 1024;
  const shim = opts.shim;
  const authorized = (header: string | undefined): boolean => {
    const m = /^Bearer (.+)$/.exec(header ?? '');
    if (m === null) return false;
    const got = Buffer.from(m[1]!);
    return got.length === want.length && timingSafeEqual(got, want);
  };
  const target = (method: string): Fn => {
    const [obj, name]: [object | undefined, string] = method.startsWith('functions.') ? [shim.functions, method.slice('functions.'.length)] : [shim, method];
    if (obj === undefined) throw new WarrenError('NOT_SUPPORTED', 'this node has no FnCall pools');
    const f = (obj as Record<string, unknown>)[name];
    if (typeof f !== 'function') throw new WarrenError('NOT_SUPPORTED', `this node does not offer ${method}`);
    return (f as Fn).bind(obj);
  };
  const hello: Hello = {
    protocol: SHIM_PROTOCOL_VERSION,
    nodeId: shim.nodeId,
    functions: shim.functions !== undefined,
    optional: OPTIONAL_METHODS.filter((m) => typeof (shim as unknown as Record<string, unknown>)[m] === 'function'),
  };
  const streams = new Set<{ destroy(): void }>();

  const server = http.createServer((req, res) => {
    void handle(req, res).catch((err) => {
      if (!res.headersSent) sendJson(res, asWarrenError(err).status, { error: errorJson(err) });
      else res.destroy();
    });
  });
  server.keepAliveTimeout = 60_000;

  async function handle(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    if (!authorized(req.headers.authorization)) {
      drain(req);
      return sendJson(res, 401, { error: { code: 'UNAUTHENTICATED', message: 'the shim protocol needs the cluster token' } });
    }
    const url = new URL(req.url ?? '/', 'http://node');
    if (req.method === 'GET' && url.pathname === `${SHIM_BASE}/hello`) return sendJson(res, 200, hello);
    const m = /^\/shim\/v1\/call\/([A-Za-z.]{1,64})$/.exec(url.pathname);
    if (req.method !== 'POST' || m === null) {
      drain(req);
      return sendJson(res, 404, { error: { code: 'NOT_FOUND', message: `no shim protocol route ${req.method} ${url.pathname.slice(0, 100)}` } });
    }
    const method = m[1]!;
    const spec = METHODS[method];
    if (spec === undefined || spec.kind === 'ws') {
      drain(req);
      throw new WarrenError('NOT_FOUND', `shim protocol: no HTTP method ${JSON.stringify(method).slice(0, 60)}`);
    }
    let args: unknown[];
    if (spec.kind === 'raw-in') {
      const header = req.headers['x-shim-args'];
      if (typeof header !== 'string') throw new WarrenError('INVALID_ARGUMENT', 'shim protocol: raw calls carry their arguments in x-shim-args');
      args = checkArgs(method, parseJson(Buffer.from(header, 'base64url')));
      args[spec.raw!] = await readBody(req, maxRaw);
    } else {
      args = checkArgs(method, (parseJson(await readBody(req, MAX_JSON_BYTES)) as { args?: unknown } | null)?.args);
    }
    const fn = target(method);
    switch (spec.kind) {
      case 'call':
      case 'raw-in':
        return sendJson(res, 200, { result: encode(hostFree(await fn(...args))) });
      case 'raw-out': {
        const out = (await fn(...args)) as Buffer | Readable;
        res.writeHead(200, { 'content-type': 'application/octet-stream', ...(Buffer.isBuffer(out) ? { 'content-length': out.length } : {}) });
        if (Buffer.isBuffer(out)) return void res.end(out);
        if (res.destroyed) return void out.destroy();
        res.on('close', () => out.destroy());
        out.on('error', () => res.destroy());
        out.pipe(res);
        return;
      }
      case 'live':
        return streamLive(res, (await fn(...args)) as LiveExec | null);
      case 'captured': {
        const c = (await fn(...args)) as import('../types').CapturedExec;
        try {
          res.writeHead(200, { 'content-type': FRAMES_TYPE });
          for (const [type, out] of [
            [FRAME.stdout, c.stdout],
            [FRAME.stderr, c.stderr],
          ] as const) {
            for (const chunk of out.chunks(3 * 64 * 1024)) {
              if (res.destroyed) return;
              if (!res.write(frame(type, chunk))) await drained(res);
            }
          }
          const { stdout, stderr, release, ...outcome } = c;
          void release;
          res.end(frame(FRAME.json, JSON.stringify({ done: { ...outcome, stdoutTruncated: stdout.truncated, stderrTruncated: stderr.truncated } })));
        } finally {
          c.release();
        }
        return;
      }
      case 'progress': {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.flushHeaders();
        try {
          const result = await fn(...args, (p: unknown) => res.write(`${JSON.stringify({ progress: p })}\n`));
          res.end(`${JSON.stringify({ done: encode(result) })}\n`);
        } catch (err) {
          res.end(`${JSON.stringify({ error: errorJson(err) })}\n`);
        }
        return;
      }
    }
  }

  function streamLive(res: http.ServerResponse, live: LiveExec | null): void {
    if (live === null) {
      res.writeHead(204);
      return void res.end();
    }
    // The gateway went away while the node was starting it.
    if (res.destroyed) return live.kill();
    res.writeHead(200, { 'content-type': FRAMES_TYPE });
    // The gateway learns the exec started from the headers: send them before any output.
    res.flushHeaders();
    let finished = false;
    res.on('close', () => {
      if (!finished) live.kill();
    });
    const send = (f: Buffer) => {
      if (!res.write(f)) {
        live.stdout.pause();
        live.stderr.pause();
        res.once('drain', () => {
          live.stdout.resume();
          live.stderr.resume();
        });
      }
    };
    const out = (type: number) => (c: Buffer) => {
      for (let i = 0; i < c.length; i += MAX_FRAME_BYTES) send(frame(type, c.subarray(i, i + MAX_FRAME_BYTES)));
    };
    live.stdout.on('data', out(FRAME.stdout));
    live.stderr.on('data', out(FRAME.stderr));
    void Promise.all([ended(live.stdout), ended(live.stderr), live.done]).then(
      ([, , outcome]) => {
        finished = true;
        res.end(frame(FRAME.json, JSON.stringify({ done: outcome })));
      },
      (err) => {
        finished = true;
        res.end(frame(FRAME.json, JSON.stringify({ error: errorJson(err) })));
      },
    );
  }

  // ------------------------------------------------------------ WebSockets
  /** Per writer of a session (`sandbox/session/writer`), the last input frame applied. */
  const inputSeqs = new InputNumbering();
  const wss = new WebSocketServer({ noServer: true, maxPayload: WS_MAX_PAYLOAD, perMessageDeflate: false });
  server.on('upgrade', (req, socket, head) => {
    const url = new URL(req.url ?? '/', 'http://node');
    const m = /^\/shim\/v1\/ws\/([A-Za-z]{1,32})$/.exec(url.pathname);
    const refuse = (status: number, message: string) => {
      socket.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\ncontent-type: text/plain\r\nconnection: close\r\n\r\n${message}\n`);
    };
    if (!authorized(req.headers.authorization)) return refuse(401, 'the shim protocol needs the cluster token');
    if (m === null || METHODS[m[1]!]?.kind !== 'ws') return refuse(404, 'no such shim stream');
    let args: unknown[];
    try {
      args = checkArgs(m[1]!, parseJson(Buffer.from(url.searchParams.get('args') ?? '', 'base64url')));
    } catch (err) {
      return refuse(400, asWarrenError(err).message);
    }
    const method = m[1]!;
    wss.handleUpgrade(req, socket, head, (ws) => {
      const entry = { destroy: () => ws.terminate() };
      streams.add(entry);
      ws.once('close', () => streams.delete(entry));
      const fail = (err: unknown) => {
        sendWs(ws, { error: errorJson(err) });
        ws.close(1000);
      };
      let started: Promise<void>;
      if (method === 'execStream') started = target(method)(...args).then((s) => wsExecStream(ws, s as ExecStream));
      else if (method === 'watchDir') started = target(method)(...args).then((w) => wsWatch(ws, w as DirWatch));
      else if (method === 'openVnc') started = target(method)(...args).then((s) => wsVnc(ws, s as Duplex));
      else started = target(method)(...args).then((s) => wsSession(ws, s as SessionAttachment));
      started.catch(fail);
    });
  });

  function sendWs(ws: WebSocket, frame: unknown): void {
    if (ws.readyState === ws.OPEN) ws.send(JSON.stringify(frame));
  }

  /** Binary frames tagged by their first byte: 0 stdin (gateway to node), 1 stdout, 2 stderr. */
  function wsExecStream(ws: WebSocket, s: ExecStream): void {
    // The gateway may have gone while the node was starting it.
    if (ws.readyState !== ws.OPEN) return s.kill();
    let exited = false;
    sendWs(ws, { started: {} });
    const out = (tag: number, from: Readable) => {
      from.on('data', (c: Buffer) => {
        if (ws.readyState !== ws.OPEN) return;
        ws.send(Buffer.concat([Buffer.of(tag), c]));
        if (ws.bufferedAmount > WS_HIGH_WATER) {
          from.pause();
          waitBuffered(ws, () => from.resume());
        }
      });
    };
    out(1, s.stdout);
    out(2, s.stderr);
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        if (data.length < 1 || data[0] !== 0) return ws.close(1008, 'stdin frames start with 0');
        if (!s.stdin.write(data.subarray(1))) {
          ws.pause();
          s.stdin.once('drain', () => ws.resume());
        }
        return;
      }
      const msg = parseFrame(data);
      if (msg === null) return ws.close(1008, 'bad frame');
      if (msg.eof === true) s.stdin.end();
      else if (typeof msg.kill === 'number' && Number.isInteger(msg.kill) && msg.kill > 0 && msg.kill < 65) s.kill(msg.kill);
      else if (msg.kill === true) s.kill();
    });
    s.stdin.on('error', () => undefined);
    void Promise.all([ended(s.stdout), ended(s.stderr), s.exited]).then(
      ([, , st]) => {
        exited = true;
        sendWs(ws, { exited: st });
        ws.close(1000);
      },
      (err) => {
        exited = true;
        sendWs(ws, { error: errorJson(err) });
        ws.close(1000);
      },
    );
    ws.once('close', () => {
      if (!exited) s.kill();
    });
  }

  function wsWatch(ws: WebSocket, w: DirWatch): void {
    if (ws.readyState !== ws.OPEN) return w.close();
    sendWs(ws, { started: true });
    w.onEvent((e) => {
      // a watcher whose gateway cannot keep up loses its watch, not the node's memory
      if (ws.bufferedAmount > WS_HIGH_WATER) return ws.terminate();
      sendWs(ws, { ev: e });
    });
    ws.on('message', () => ws.close(1008, 'a watch takes no frames'));
    ws.once('close', () => w.close());
  }

  function wsVnc(ws: WebSocket, sock: Duplex): void {
    if (ws.readyState !== ws.OPEN) return void sock.destroy();
    sendWs(ws, { started: true });
    const wsStream = createWebSocketStream(ws);
    wsStream.on('error', () => sock.destroy());
    sock.on('error', () => ws.terminate());
    sock.pipe(wsStream).pipe(sock);
    ws.once('close', () => sock.destroy());
  }

  function wsSession(ws: WebSocket, att: SessionAttachment): void {
    if (ws.readyState !== ws.OPEN) return att.detach();
    let paused = false;
    // Numbered input (input-numbering.ts): applied once per writer across its connections.
    let writerKey: string | null = null;
    const ack = ackBatcher((seq) => sendWs(ws, { ack: seq }));
    /** Whether an input frame is new (to apply) or one this writer's earlier connection applied. */
    const fresh = (msg: Record<string, unknown>): boolean => {
      if (msg.seq === undefined) return true;
      const seq = validateSeq(msg.seq);
      ack(seq);
      return writerKey === null || inputSeqs.take(writerKey, seq);
    };
    sendWs(ws, { info: att.info });
    att.onOutput((o) => {
      sendWs(ws, { out: { stream: o.stream, offset: o.offset, d: o.data.toString('base64') } });
      if (!paused && ws.bufferedAmount > WS_HIGH_WATER && att.pauseOutput && att.resumeOutput) {
        paused = true;
        att.pauseOutput();
        waitBuffered(ws, () => {
          paused = false;
          att.resumeOutput?.();
        });
      }
    });
    att.onCommandDone((r) => sendWs(ws, { done: r }));
    att.onExit((st) => sendWs(ws, { exit: st }));
    att.onLost?.((bytes, next) => sendWs(ws, { lost: { bytes, next } }));
    const reply = (rid: unknown, p: Promise<unknown>) => {
      p.then(
        (result) => sendWs(ws, { rid, result: encode(result) }),
        (err) => sendWs(ws, { rid, error: errorJson(err) }),
      );
    };
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      const msg = isBinary ? null : parseFrame(data);
      if (msg === null) return ws.close(1008, 'bad frame');
      try {
        switch (msg.op) {
          case 'run':
            if (typeof msg.commandId !== 'string' || typeof msg.command !== 'string') throw new WarrenError('INVALID_ARGUMENT', 'run: commandId and command are strings');
            reply(msg.rid, att.run(msg.commandId, msg.command, typeof msg.timeoutMs === 'number' ? msg.timeoutMs : undefined, msg.resume === true));
            break;
          case 'writer':
            writerKey = `${att.info.sandboxId}/${att.info.id}/${validateWriter(msg.w, 'w')}`;
            break;
          case 'write':
            if (typeof msg.d !== 'string') throw new WarrenError('INVALID_ARGUMENT', 'write: d is base64 text');
            if (fresh(msg)) att.write(Buffer.from(msg.d, 'base64'));
            break;
          case 'resize':
            if (fresh(msg)) att.resize(Number(msg.cols), Number(msg.rows));
            break;
          case 'signal':
            if (fresh(msg)) att.signal(Number(msg.signal));
            break;
          case 'pause':
            att.pauseOutput?.();
            break;
          case 'resume':
            att.resumeOutput?.();
            break;
          case 'abort':
            if (fresh(msg)) att.abortCommand?.();
            break;
          case 'recentStatus':
            if (typeof msg.commandId !== 'string' || typeof msg.after !== 'number') throw new WarrenError('INVALID_ARGUMENT', 'recentStatus: commandId and after');
            reply(msg.rid, att.recentStatus ? att.recentStatus(msg.commandId, msg.after) : Promise.resolve(null));
            break;
          case 'close':
            reply(msg.rid, att.close());
            break;
          default:
            throw new WarrenError('INVALID_ARGUMENT', `unknown session op ${JSON.stringify(String(msg.op)).slice(0, 40)}`);
        }
      } catch (err) {
        if (msg.rid !== undefined) sendWs(ws, { rid: msg.rid, error: errorJson(err) });
        else log(`shim protocol: session frame refused: ${asWarrenError(err).message}`);
      }
    });
    ws.once('close', (code: number) => {
      // a writer that left on purpose (1000) does not come back: forget its numbering
      if (code === 1000 && writerKey !== null) inputSeqs.forget(writerKey);
      att.detach();
    });
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(opts.port, opts.host, () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  const host = opts.host.includes(':') ? `[${opts.host}]` : opts.host === '0.0.0.0' ? '127.0.0.1' : opts.host;
  return {
    url: `http://${host}:${port}`,
    port,
    async close() {
      for (const s of streams) s.destroy();
      wss.close();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/**
 * What crosses machines names no host process: a sandbox's host pid (SandboxInfo.pid, for a
 * node's own admins in process) is left out of answers, alone or in lists and pages.
 */
function hostFree(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(hostFree);
  if (v === null || typeof v !== 'object' || Buffer.isBuffer(v)) return v;
  const o = v as Record<string, unknown>;
  if (Array.isArray(o.sandboxes)) return { ...o, sandboxes: o.sandboxes.map(hostFree) };
  if ('pid' in o && typeof o.id === 'string' && typeof o.node === 'string' && typeof o.state === 'string') {
    const { pid: _pid, ...rest } = o;
    return rest;
  }
  return v;
}

function sendJson(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function drain(req: http.IncomingMessage): void {
  req.resume();
}

function drained(res: http.ServerResponse): Promise<void> {
  return new Promise((r) => {
    res.once('drain', r);
    res.once('close', r);
  });
}

/** Run `fn` once the socket's queue is below the high-water mark again (or it closed). */
function waitBuffered(ws: WebSocket, fn: () => void): void {
  const t = setInterval(() => {
    if (ws.readyState !== ws.OPEN || ws.bufferedAmount <= WS_HIGH_WATER / 2) {
      clearInterval(t);
      fn();
    }
  }, 5);
}

function readBody(req: http.IncomingMessage, limit: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limit) {
    req.resume();
    return Promise.reject(new WarrenError('PAYLOAD_TOO_LARGE', `shim protocol: body of ${declared} bytes is over ${limit}`));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > limit) {
        req.destroy();
        reject(new WarrenError('PAYLOAD_TOO_LARGE', `shim protocol: body over ${limit} bytes`));
        return;
      }
      chunks.push(c);
    });
    req.once('end', () => resolve(Buffer.concat(chunks, size)));
    req.once('error', reject);
  });
}

function parseJson(buf: Buffer): unknown {
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch {
    throw new WarrenError('INVALID_ARGUMENT', 'shim protocol: the body is not JSON');
  }
}

function parseFrame(data: Buffer): (Record<string, unknown> & { op?: unknown; rid?: unknown }) | null {
  try {
    const v = decode(JSON.parse(data.toString('utf8')));
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/** Resolves once `r` has ended or been destroyed (at once if it already has). */
function ended(r: Readable): Promise<void> {
  return new Promise<void>((ok) => (r.readableEnded || r.destroyed ? ok() : (r.once('end', ok), r.once('close', ok))));
}
