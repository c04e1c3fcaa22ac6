/**
 * The gateway's end of the shim protocol: RemoteShim implements the Shim
 * contract by calling a node's shim server (server.ts) over HTTP and
 * WebSocket (docs/shim-protocol.md). Everything the node answers is checked
 * before it is believed: error bodies become WarrenErrors with their stable
 * codes, anything else that is not the protocol is UNAVAILABLE naming the
 * node, and no answer is read past its bound.
 */
import { randomBytes } from 'node:crypto';
import { Duplex, PassThrough, type Readable, Writable } from 'node:stream';
import { Agent, request } from 'undici';
import WebSocket from 'ws';
import { WarrenError } from '../../errors';
import { bufferOutput } from '../exec-output';
import type { Principal } from '../access';
import type {
  CapturedExec,
  CommandResult,
  ContentRefs,
  DirEvent,
  DirWatch,
  ExecOutcome,
  ExecRequest,
  ExecStream,
  FnCallApi,
  ImageRemoval,
  ImportImageRequest,
  ImportProgress,
  LiveExec,
  OpenSessionOptions,
  SandboxFilter,
  SessionAttachment,
  SessionInfo,
  SessionOutput,
  Shim,
} from '../types';
import { UnackedInput } from '../sessions/input-numbering';
import { FRAME, FrameReader, type Hello, MAX_JSON_BYTES, OPTIONAL_METHODS, SHIM_BASE, SHIM_PROTOCOL_VERSION, decode, encode, errorFrom } from './wire';

export interface RemoteShimOptions {
  url: string;
  token: string;
  /** Connections kept to the node (default 64). */
  connections?: number;
  /** How long the node may take to answer hello (default 10 s): a host that accepts and never answers fails the connect. */
  helloTimeoutMs?: number;
}

type Args = unknown[];

export class RemoteShim implements Shim {
  readonly nodeId: string;
  readonly functions?: FnCallApi;
  private readonly agent: Agent;
  private readonly base: string;
  private readonly auth: string;
  private readonly sockets = new Set<WebSocket>();
  private closed = false;

  private constructor(
    opts: RemoteShimOptions,
    hello: Hello,
    agent: Agent,
  ) {
    this.base = opts.url.replace(/\/+$/, '');
    this.auth = `Bearer ${opts.token}`;
    this.agent = agent;
    this.nodeId = hello.nodeId;
    if (hello.functions) this.functions = new RemoteFnCall(this);
    // What the node does not offer is absent here too, as on the node's own contract: callers
    // test for the method (`shim.layerStates?`) and answer NOT_SUPPORTED without a round trip.
    const offered = new Set(hello.optional);
    for (const m of OPTIONAL_METHODS) if (!offered.has(m)) Object.defineProperty(this, m, { value: undefined });
  }

  /** Connect to the node at `url` and learn who it is (GET /shim/v1/hello). */
  static async connect(opts: RemoteShimOptions): Promise<RemoteShim> {
    const agent = new Agent({ connections: opts.connections ?? 64, keepAliveTimeout: 30_000 });
    try {
      const timeout = opts.helloTimeoutMs ?? 10_000;
      const res = await request(`${opts.url.replace(/\/+$/, '')}${SHIM_BASE}/hello`, { dispatcher: agent, headers: { authorization: `Bearer ${opts.token}` }, headersTimeout: timeout, bodyTimeout: timeout });
      const body = await readJson(res.body, 64 * 1024, opts.url);
      if (res.statusCode !== 200) throw errorFrom(body, `node ${opts.url} answered ${res.statusCode} to hello`);
      const h = body as Partial<Hello>;
      if (h.protocol !== SHIM_PROTOCOL_VERSION || typeof h.nodeId !== 'string') throw new WarrenError('UNAVAILABLE', `node ${opts.url} speaks shim protocol ${String(h.protocol)}, this gateway ${SHIM_PROTOCOL_VERSION}`);
      return new RemoteShim(opts, { protocol: h.protocol, nodeId: h.nodeId, functions: h.functions === true, optional: Array.isArray(h.optional) ? h.optional : [] }, agent);
    } catch (err) {
      await agent.close().catch(() => undefined);
      if (err instanceof WarrenError) throw err;
      throw new WarrenError('UNAVAILABLE', `node ${opts.url} is unreachable: ${(err as Error).message}`);
    }
  }

  private fail(err: unknown): never {
    if (err instanceof WarrenError) throw err;
    throw new WarrenError('UNAVAILABLE', `node ${this.nodeId}: ${(err as Error).message}`);
  }

  private async post(method: string, body: Buffer | string, headers: Record<string, string> = {}, signal?: AbortSignal) {
    try {
      const res = await request(`${this.base}${SHIM_BASE}/call/${method}`, {
        method: 'POST',
        dispatcher: this.agent,
        headers: { authorization: this.auth, 'content-type': typeof body === 'string' ? 'application/json' : 'application/octet-stream', ...headers },
        body,
        ...(signal ? { signal } : {}),
      });
      if (res.statusCode !== 200 && res.statusCode !== 204) throw errorFrom(await readJson(res.body, MAX_JSON_BYTES, this.nodeId), `node ${this.nodeId} answered ${res.statusCode} to ${method}`);
      return res;
    } catch (err) {
      this.fail(err);
    }
  }

  /** One JSON request, one JSON answer. */
  async call<T>(method: string, args: Args): Promise<T> {
    const res = await this.post(method, JSON.stringify({ args: encode(trimUndefined(args)) }));
    const body = (await readJson(res.body, MAX_JSON_BYTES, this.nodeId)) as { result?: unknown };
    return decode(body.result) as T;
  }

  private async rawIn<T>(method: string, args: Args, data: Buffer): Promise<T> {
    const header = Buffer.from(JSON.stringify(encode(trimUndefined(args)))).toString('base64url');
    const res = await this.post(method, data, { 'x-shim-args': header });
    return decode(((await readJson(res.body, MAX_JSON_BYTES, this.nodeId)) as { result?: unknown }).result) as T;
  }

  /**
   * Call `method` and feed its streamed answer to `push` chunk by chunk, until its end. What
   * `push` throws (a bound, a bad frame) ends the answer; a broken connection is UNAVAILABLE.
   */
  private async streamed(method: string, args: Args, push: (chunk: Buffer) => void): Promise<void> {
    const res = await this.post(method, JSON.stringify({ args: encode(trimUndefined(args)) }));
    try {
      for await (const c of res.body) push(c as Buffer);
    } catch (err) {
      res.body.destroy();
      if (err instanceof WarrenError) throw err;
      throw new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the ${method} answer broke: ${(err as Error).message}`);
    }
  }

  /** NDJSON frames of `method`'s answer, until its end (or the node's error). */
  private ndjson(method: string, args: Args, onFrame: (f: Record<string, unknown>) => void): Promise<void> {
    const lines = new LineReader(MAX_JSON_BYTES, (line) => onFrame(frameOf(line, this.nodeId, method)));
    return this.streamed(method, args, (c) => lines.push(c));
  }

  private async liveExec(method: string, args: Args): Promise<LiveExec | null> {
    const abort = new AbortController();
    const started = Date.now();
    const res = await this.post(method, JSON.stringify({ args: encode(trimUndefined(args)) }), {}, abort.signal);
    // 204: a supervised run with nothing left to follow
    if (res.statusCode === 204) {
      res.body.resume();
      return null;
    }
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let settle!: { ok: (o: ExecOutcome) => void; err: (e: unknown) => void };
    const done = new Promise<ExecOutcome>((ok, err) => (settle = { ok, err }));
    done.catch(() => undefined);
    let ended = false;
    let killed = false;
    const finish = (err: unknown, outcome?: ExecOutcome) => {
      if (ended) return;
      ended = true;
      stdout.end();
      stderr.end();
      // Killing drops the connection, and the node kills the process when it sees that.
      if (killed) settle.ok({ exitCode: null, signal: 9, status: 'killed', durationMs: Date.now() - started, truncated: false });
      else if (err !== null) settle.err(err);
      else settle.ok(outcome!);
    };
    const push = (to: PassThrough, data: Buffer) => {
      if (!to.write(data)) {
        res.body.pause();
        to.once('drain', () => res.body.resume());
      }
    };
    const lines = new FrameReader((type, payload) => {
      if (type === FRAME.stdout) return push(stdout, Buffer.from(payload));
      if (type === FRAME.stderr) return push(stderr, Buffer.from(payload));
      const f = frameOf(payload.toString('utf8'), this.nodeId, method);
      if ('done' in f) finish(null, f.done as ExecOutcome);
      else if ('error' in f) finish(errorFrom(f, `node ${this.nodeId}: ${method} failed`));
    });
    res.body.on('data', (c: Buffer) => {
      try {
        lines.push(c);
      } catch (err) {
        res.body.destroy(err as Error);
      }
    });
    res.body.once('end', () => finish(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the ${method} stream ended without its outcome`)));
    res.body.once('error', (e) => finish(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the ${method} stream broke: ${e.message}`)));
    return {
      stdout,
      stderr,
      done,
      kill: () => {
        if (ended) return;
        killed = true;
        abort.abort();
      },
    };
  }

  private openWs(method: string, args: Args): WsChannel {
    const q = Buffer.from(JSON.stringify(encode(trimUndefined(args)))).toString('base64url');
    const ws = new WebSocket(`${this.base.replace(/^http/, 'ws')}${SHIM_BASE}/ws/${method}?args=${q}`, { headers: { authorization: this.auth }, perMessageDeflate: false, maxPayload: 16 * 1024 * 1024 });
    this.sockets.add(ws);
    ws.once('close', () => this.sockets.delete(ws));
    return new WsChannel(ws);
  }

  /** The first JSON frame of a stream: `started`/`info`, or the node's error. Later frames wait in the channel. */
  private firstFrame(ch: WsChannel, what: string): Promise<Record<string, unknown>> {
    const ws = ch.ws;
    return new Promise((resolve, reject) => {
      const onMessage = (data: Buffer, isBinary: boolean) => {
        cleanup();
        const f = isBinary ? null : parseFrame(data);
        if (f === null) {
          ws.terminate();
          return reject(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: bad first frame of ${what}`));
        }
        if ('error' in f) return reject(errorFrom(f, `node ${this.nodeId}: ${what} failed`));
        resolve(f);
      };
      const onError = (err: Error) => {
        cleanup();
        reject(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: ${what}: ${err.message}`));
      };
      const onClose = () => {
        cleanup();
        reject(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: ${what} closed before it started`));
      };
      const onUnexpected = (_req: unknown, res: import('node:http').IncomingMessage) => {
        cleanup();
        res.resume();
        reject(new WarrenError(res.statusCode === 401 ? 'UNAUTHENTICATED' : 'UNAVAILABLE', `node ${this.nodeId}: ${what} refused (${res.statusCode})`));
      };
      const cleanup = () => {
        ch.onMessage(null);
        ws.off('error', onError);
        ws.off('close', onClose);
        ws.off('unexpected-response', onUnexpected);
      };
      ch.onMessage(onMessage);
      ws.once('error', onError);
      ws.once('close', onClose);
      ws.once('unexpected-response', onUnexpected);
    });
  }

  // ---------------------------------------------------------------- contract
  features() {
    return this.call<Awaited<ReturnType<Shim['features']>>>('features', []);
  }
  createSandbox(spec: Parameters<Shim['createSandbox']>[0], principal?: Principal) {
    return this.call<Awaited<ReturnType<Shim['createSandbox']>>>('createSandbox', [spec, principal]);
  }
  getSandbox(id: string) {
    return this.call<Awaited<ReturnType<Shim['getSandbox']>>>('getSandbox', [id]);
  }
  listSandboxes(filter?: SandboxFilter) {
    return this.call<Awaited<ReturnType<Shim['listSandboxes']>>>('listSandboxes', [filter]);
  }
  listSandboxesPage(filter: SandboxFilter, page: { limit: number; after?: string }) {
    return this.call<Awaited<ReturnType<Shim['listSandboxesPage']>>>('listSandboxesPage', [filter, page]);
  }
  sandboxUsage(owner: string) {
    return this.call<Awaited<ReturnType<Shim['sandboxUsage']>>>('sandboxUsage', [owner]);
  }
  async deleteSandbox(id: string) {
    await this.call('deleteSandbox', [id]);
  }
  exec(id: string, req: ExecRequest) {
    return this.call<Awaited<ReturnType<Shim['exec']>>>('exec', [id, req]);
  }
  async execCaptured(id: string, req: ExecRequest): Promise<CapturedExec> {
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    // The node keeps at most maxOutputBytes per stream: more is not an answer to believe.
    const bound = req.maxOutputBytes ?? 64 * 1024 * 1024;
    const size = [0, 0];
    let done: (ExecOutcome & { stdoutTruncated?: boolean; stderrTruncated?: boolean }) | null = null;
    let failure: WarrenError | null = null;
    const frames = new FrameReader((type, payload) => {
      if (type === FRAME.json) {
        const f = frameOf(payload.toString('utf8'), this.nodeId, 'execCaptured');
        if ('done' in f) done = f.done as typeof done;
        else if ('error' in f) failure = errorFrom(f, `node ${this.nodeId}: exec failed`);
        return;
      }
      const i = type === FRAME.stdout ? 0 : 1;
      size[i]! += payload.length;
      if (size[i]! > bound) throw new WarrenError('UNAVAILABLE', `node ${this.nodeId}: more exec output than its bound of ${bound} bytes`);
      (i === 0 ? out : err).push(Buffer.from(payload));
    });
    await this.streamed('execCaptured', [id, req], (c) => frames.push(c));
    if (failure) throw failure;
    if (done === null) throw new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the exec answer ended without its outcome`);
    const { stdoutTruncated, stderrTruncated, ...outcome } = done as ExecOutcome & { stdoutTruncated?: boolean; stderrTruncated?: boolean };
    return { ...outcome, stdout: bufferOutput(Buffer.concat(out), stdoutTruncated === true), stderr: bufferOutput(Buffer.concat(err), stderrTruncated === true), release: () => undefined };
  }
  async execLive(id: string, req: ExecRequest): Promise<LiveExec> {
    return (await this.liveExec('execLive', [id, req]))!;
  }
  async execStream(id: string, req: Parameters<Shim['execStream']>[1]): Promise<ExecStream> {
    const ch = this.openWs('execStream', [id, req]);
    const ws = ch.ws;
    await this.firstFrame(ch, 'execStream');
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    let exitedOk!: (v: { exitCode: number | null; signal: number | null }) => void;
    let exitedErr!: (e: unknown) => void;
    const exited = new Promise<{ exitCode: number | null; signal: number | null }>((ok, e) => ((exitedOk = ok), (exitedErr = e)));
    exited.catch(() => undefined);
    let settled = false;
    const end = (err: unknown, st?: { exitCode: number | null; signal: number | null }) => {
      if (settled) return;
      settled = true;
      stdout.end();
      stderr.end();
      if (err === null) exitedOk(st!);
      else exitedErr(err);
    };
    ch.onMessage((data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        const to = data[0] === 1 ? stdout : data[0] === 2 ? stderr : null;
        if (to === null) return ws.terminate();
        if (!to.write(data.subarray(1))) {
          ws.pause();
          to.once('drain', () => ws.resume());
        }
        return;
      }
      const f = parseFrame(data);
      if (f !== null && 'exited' in f) end(null, f.exited as { exitCode: number | null; signal: number | null });
      else if (f !== null && 'error' in f) end(errorFrom(f, `node ${this.nodeId}: exec stream failed`));
    });
    ws.once('close', () => end(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the exec stream closed before the process exited`)));
    ws.on('error', () => undefined);
    const stdin = new Writable({
      write(chunk: Buffer, _enc, cb) {
        if (ws.readyState !== ws.OPEN) return cb();
        ws.send(Buffer.concat([Buffer.of(0), chunk]), (e) => cb(e ?? null));
      },
      final(cb) {
        if (ws.readyState === ws.OPEN) ws.send(JSON.stringify({ eof: true }));
        cb();
      },
    });
    stdin.on('error', () => undefined);
    return {
      stdin,
      stdout,
      stderr,
      exited,
      kill(signal?: number) {
        if (ws.readyState === ws.OPEN) ws.send(JSON.stringify({ kill: signal ?? true }));
      },
    };
  }
  supervisedReason(id: string) {
    return this.call<string | null>('supervisedReason', [id]);
  }
  async execSupervised(id: string, req: ExecRequest, runId: string): Promise<LiveExec> {
    return (await this.liveExec('execSupervised', [id, req, runId]))!;
  }
  followSupervised(id: string, runId: string) {
    return this.liveExec('followSupervised', [id, runId]);
  }
  async dropSupervised(id: string, runId: string) {
    await this.call('dropSupervised', [id, runId]);
  }
  sweepSupervised(id: string, keep: ReadonlySet<string>) {
    return this.call<number>('sweepSupervised', [id, keep]);
  }
  async readFile(id: string, path: string, maxBytes: number): Promise<Buffer> {
    const res = await this.post('readFile', JSON.stringify({ args: [id, path, maxBytes] }));
    return readAll(res.body, maxBytes, this.nodeId);
  }
  async writeFile(id: string, path: string, data: Buffer, mode?: number) {
    await this.rawIn('writeFile', [id, path, null, mode], data);
  }
  listDir(id: string, path: string) {
    return this.call<Awaited<ReturnType<Shim['listDir']>>>('listDir', [id, path]);
  }
  async watchDir(id: string, path: string, opts: { recursive: boolean }): Promise<DirWatch> {
    const ch = this.openWs('watchDir', [id, path, opts]);
    await this.firstFrame(ch, 'watchDir');
    const listeners: Array<(e: DirEvent) => void> = [];
    const queued: DirEvent[] = [];
    ch.onMessage((data: Buffer, isBinary: boolean) => {
      const f = isBinary ? null : parseFrame(data);
      const e = f?.ev as Partial<DirEvent> | undefined;
      if (!e || typeof e.name !== 'string' || (e.type !== 'create' && e.type !== 'write' && e.type !== 'remove')) return ch.ws.terminate();
      const ev: DirEvent = { name: e.name, type: e.type };
      if (listeners.length === 0) {
        if (queued.length < 4096) queued.push(ev);
      } else for (const l of listeners) l(ev);
    });
    ch.ws.on('error', () => undefined);
    return {
      onEvent(listener) {
        listeners.push(listener);
        for (const e of queued.splice(0)) listener(e);
      },
      close: () => ch.ws.close(1000),
    };
  }
  screenshot?(id: string, opts?: { width?: number }) {
    return this.call<{ png: Buffer; width: number; height: number }>('screenshot', [id, opts]);
  }
  sendInput?(id: string, actions: unknown) {
    return this.call<{ actions: number; events: number }>('sendInput', [id, actions]);
  }
  async openVnc?(id: string): Promise<Duplex> {
    const ch = this.openWs('openVnc', [id]);
    await this.firstFrame(ch, 'openVnc');
    return wsDuplex(ch);
  }
  uploadTar(id: string, dir: string, tar: Buffer) {
    return this.rawIn<{ entries: number }>('uploadTar', [id, dir, null], tar);
  }
  async downloadTar(id: string, path: string): Promise<Readable> {
    const res = await this.post('downloadTar', JSON.stringify({ args: [id, path] }));
    return res.body;
  }
  async openSession(id: string, opts: OpenSessionOptions): Promise<SessionAttachment> {
    return this.session('openSession', [id, opts]);
  }
  attachSession(id: string, sessionId: string, fromOffset: number): Promise<SessionAttachment> {
    return this.session('attachSession', [id, sessionId, fromOffset]);
  }
  private async session(method: string, args: Args): Promise<SessionAttachment> {
    const open = async (m: string, a: Args) => {
      if (this.closed) throw new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the gateway's connection to the node is closed`, { closed: true });
      const ch = this.openWs(m, a);
      const first = await this.firstFrame(ch, m);
      return { ch, info: first.info as SessionInfo };
    };
    const { ch, info } = await open(method, args);
    // An attachment replays from the offset asked; a new session's output starts at 0.
    const from = method === 'attachSession' && typeof args[2] === 'number' ? args[2] : 0;
    return new RemoteSession(ch, info, this.nodeId, from, (fromOffset) => open('attachSession', [info.sandboxId, info.id, fromOffset]).then((r) => r.ch));
  }
  listSessions(id: string) {
    return this.call<SessionInfo[]>('listSessions', [id]);
  }
  pauseSandbox(id: string) {
    return this.call<Awaited<ReturnType<Shim['pauseSandbox']>>>('pauseSandbox', [id]);
  }
  resumeSandbox(id: string) {
    return this.call<Awaited<ReturnType<Shim['resumeSandbox']>>>('resumeSandbox', [id]);
  }
  pauseSandboxes(filter: Parameters<Shim['pauseSandboxes']>[0]) {
    return this.call<Awaited<ReturnType<Shim['pauseSandboxes']>>>('pauseSandboxes', [filter]);
  }
  resumeSandboxes(filter: Parameters<Shim['resumeSandboxes']>[0]) {
    return this.call<Awaited<ReturnType<Shim['resumeSandboxes']>>>('resumeSandboxes', [filter]);
  }
  hibernateSandbox(id: string) {
    return this.call<Awaited<ReturnType<Shim['hibernateSandbox']>>>('hibernateSandbox', [id]);
  }
  extendSandbox(id: string, req: { seconds?: number; ttlSeconds?: number }) {
    return this.call<Awaited<ReturnType<Shim['extendSandbox']>>>('extendSandbox', [id, req]);
  }
  packSandbox(id: string, req: Parameters<Shim['packSandbox']>[1], owner: string) {
    return this.call<Awaited<ReturnType<Shim['packSandbox']>>>('packSandbox', [id, req, owner]);
  }
  environment(ref: string, principal?: Principal) {
    return this.call<Awaited<ReturnType<Shim['environment']>>>('environment', [ref, principal]);
  }
  listEnvironments(principal?: Principal) {
    return this.call<Awaited<ReturnType<Shim['listEnvironments']>>>('listEnvironments', [principal]);
  }
  async authorizeContent(principal: Principal, refs: ContentRefs) {
    await this.call('authorizeContent', [principal, refs]);
  }
  publishEnvironment(name: string, published: boolean) {
    return this.call<Awaited<ReturnType<Shim['publishEnvironment']>>>('publishEnvironment', [name, published]);
  }
  updateNetwork(id: string, change: Record<string, boolean>) {
    return this.call<Awaited<ReturnType<Shim['updateNetwork']>>>('updateNetwork', [id, change]);
  }
  networkInfo(id: string) {
    return this.call<Awaited<ReturnType<Shim['networkInfo']>>>('networkInfo', [id]);
  }
  sandboxStats?(id: string) {
    return this.call<Awaited<ReturnType<NonNullable<Shim['sandboxStats']>>>>('sandboxStats', [id]);
  }
  listImages(principal?: Principal) {
    return this.call<Awaited<ReturnType<Shim['listImages']>>>('listImages', [principal]);
  }
  private async progress<T>(method: string, args: Args, onProgress?: (p: ImportProgress) => void): Promise<T> {
    let result: unknown;
    let have = false;
    let failure: WarrenError | null = null;
    await this.ndjson(method, args, (f) => {
      if ('progress' in f) onProgress?.(f.progress as ImportProgress);
      else if ('done' in f) {
        result = decode(f.done);
        have = true;
      } else if ('error' in f) failure = errorFrom(f, `node ${this.nodeId}: ${method} failed`);
    });
    if (failure) throw failure;
    if (!have) throw new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the ${method} answer ended without its result`);
    return result as T;
  }
  importImage(req: ImportImageRequest, onProgress?: (p: ImportProgress) => void) {
    return this.progress<Awaited<ReturnType<Shim['importImage']>>>('importImage', [req], onProgress);
  }
  pushImage?(req: { image: string; ref: string }, onProgress?: (p: ImportProgress) => void) {
    return this.progress<Awaited<ReturnType<NonNullable<Shim['pushImage']>>>>('pushImage', [req], onProgress);
  }
  stageImage?(req: { image: string; repository: string }, onProgress?: (p: ImportProgress) => void) {
    return this.progress<Awaited<ReturnType<NonNullable<Shim['stageImage']>>>>('stageImage', [req], onProgress);
  }
  removeImage?(name: string) {
    return this.call<ImageRemoval>('removeImage', [name]);
  }
  layerStates?(digests?: string[]) {
    return this.call<Awaited<ReturnType<NonNullable<Shim['layerStates']>>>>('layerStates', [digests]);
  }
  /**
   * Cuts every stream connection to the node (exec streams, sessions, watches, VNC) as a network
   * failure would, without a close frame; the shim stays usable. Sessions attach again by
   * themselves, the other streams end. For failure drills and tests; returns how many were cut.
   */
  cutStreams(): number {
    const n = this.sockets.size;
    for (const ws of this.sockets) ws.terminate();
    return n;
  }

  /**
   * Drops this gateway's connections to the node, streams included (the node then kills their
   * execs and detaches their sessions); the node itself goes on.
   */
  async close() {
    this.closed = true;
    for (const ws of this.sockets) ws.terminate();
    await this.agent.destroy();
  }
}

class RemoteFnCall implements FnCallApi {
  constructor(private readonly shim: RemoteShim) {}
  private c<T>(name: string, args: Args): Promise<T> {
    return this.shim.call<T>(`functions.${name}`, args);
  }
  anonymousRunCode() {
    return this.c<boolean>('anonymousRunCode', []);
  }
  listPools() {
    return this.c<Awaited<ReturnType<FnCallApi['listPools']>>>('listPools', []);
  }
  createPool(body: unknown, principal: Principal, opts?: { wait?: boolean }) {
    return this.c<Awaited<ReturnType<FnCallApi['createPool']>>>('createPool', [body, principal, opts]);
  }
  poolStats(name: string) {
    return this.c<Awaited<ReturnType<FnCallApi['poolStats']>>>('poolStats', [name]);
  }
  async deletePool(name: string) {
    await this.c('deletePool', [name]);
  }
  invoke(pool: string, account: string, req: Parameters<FnCallApi['invoke']>[2]) {
    return this.c<Awaited<ReturnType<FnCallApi['invoke']>>>('invoke', [pool, account, req]);
  }
  judge(pool: string, account: string, req: Parameters<FnCallApi['judge']>[2]) {
    return this.c<Awaited<ReturnType<FnCallApi['judge']>>>('judge', [pool, account, req]);
  }
  batch(pool: string, account: string, reqs: Parameters<FnCallApi['batch']>[2], concurrency?: number) {
    return this.c<Awaited<ReturnType<FnCallApi['batch']>>>('batch', [pool, account, reqs, concurrency]);
  }
  runCode(account: string, req: Parameters<FnCallApi['runCode']>[1]) {
    return this.c<Awaited<ReturnType<FnCallApi['runCode']>>>('runCode', [account, req]);
  }
  runJupyter(account: string, req: Parameters<FnCallApi['runJupyter']>[1]) {
    return this.c<Awaited<ReturnType<FnCallApi['runJupyter']>>>('runJupyter', [account, req]);
  }
  languages() {
    return this.c<Awaited<ReturnType<FnCallApi['languages']>>>('languages', []);
  }
  async ensureToolkit(name: string) {
    await this.c('ensureToolkit', [name]);
  }
}

/** How long a session attachment tries to reach its node again after its connection broke. */
const RECONNECT_WINDOW_MS = 10_000;
/**
 * Input frames (writes, resizes, signals, aborts) the node has not acknowledged yet, and other
 * frames asked for while the connection is made again: what is kept for the node, at most.
 */
const OUTBOX_MAX_BYTES = 1024 * 1024;

interface PendingAsk {
  ok: (v: unknown) => void;
  err: (e: unknown) => void;
  /** A run: sent again after a lost connection (as a resume when it may have reached the node). */
  run?: { commandId: string; command: string; timeoutMs?: number; sent: boolean };
}

/**
 * A session attachment whose session lives on the node; this end keeps the
 * listener semantics of ShellSession. The session outlives this connection:
 * when the connection breaks without a detach, an exit or a close, it is made
 * again (for up to RECONNECT_WINDOW_MS) from the last offset passed on, so
 * the listeners see neither a gap nor a repeat; a run in flight is sent again
 * as a resume, which the shell runs only if the first one never reached it.
 * Input reaches the session exactly once: each input frame is numbered under
 * this attachment's writer name and kept until the node acknowledges it, so
 * what a broken connection may or may not have carried is sent again and the
 * node drops what it already applied. An attachment that cannot be made
 * again tells its onDisconnect listeners.
 */
class RemoteSession implements SessionAttachment {
  private outL: Array<(o: SessionOutput) => void> = [];
  private doneL: Array<(r: CommandResult) => void> = [];
  private exitL: Array<(s: { exitCode: number | null; signal: number | null }) => void> = [];
  private lostL: Array<(bytes: number, next: number) => void> = [];
  private discL: Array<(reason: string) => void> = [];
  private queuedOut: SessionOutput[] = [];
  private queuedDone: CommandResult[] = [];
  private exitStatus: { exitCode: number | null; signal: number | null } | null = null;
  private rid = 0;
  private readonly pending = new Map<number, PendingAsk>();
  private ws!: WebSocket;
  /** End of the output passed on to the listeners: a new connection replays from here. */
  private seen: number;
  /** detach() or close() was called: the connection's end is ours. */
  private ending = false;
  /** The connection broke and is being made again: frames wait in the outbox. */
  private outbox: string[] | null = null;
  private outboxBytes = 0;
  /** pauseOutput() is in force (sent again on a new connection). */
  private paused = false;
  private broken: string | null = null;
  /** This attachment's name for its input at the node, which applies each numbered frame once. */
  private readonly writer = randomBytes(9).toString('base64url');
  /** Input frames sent (or waiting to be) that the node has not acknowledged. */
  private readonly unacked = new UnackedInput(OUTBOX_MAX_BYTES);

  constructor(
    ch: WsChannel,
    readonly info: SessionInfo,
    private readonly nodeId: string,
    from: number,
    private readonly reopen: (fromOffset: number) => Promise<WsChannel>,
  ) {
    this.seen = from;
    this.bind(ch);
  }

  private bind(ch: WsChannel): void {
    const ws = (this.ws = ch.ws);
    // first on every connection: the numbered input after it is this writer's
    ws.send(JSON.stringify({ op: 'writer', w: this.writer }));
    ch.onMessage((data: Buffer, isBinary: boolean) => {
      const f = isBinary ? null : parseFrame(data);
      if (f === null) return ws.terminate();
      if ('out' in f) {
        const o = f.out as { stream?: unknown; offset?: unknown; d?: unknown };
        if ((o.stream !== 'stdout' && o.stream !== 'stderr' && o.stream !== 'pty') || typeof o.offset !== 'number' || typeof o.d !== 'string') return ws.terminate();
        let data = Buffer.from(o.d, 'base64');
        let offset = o.offset;
        // a new connection's replay may begin before what was passed on already
        if (offset + data.length <= this.seen && data.length > 0) return;
        if (offset < this.seen) {
          data = data.subarray(this.seen - offset);
          offset = this.seen;
        }
        this.seen = offset + data.length;
        const out: SessionOutput = { stream: o.stream, offset, data };
        if (this.outL.length === 0) this.queuedOut.push(out);
        else for (const l of this.outL) l(out);
      } else if ('done' in f) {
        const r = f.done as CommandResult;
        if (this.doneL.length === 0) this.queuedDone.push(r);
        else for (const l of this.doneL) l(r);
      } else if ('exit' in f) {
        this.exitStatus = f.exit as { exitCode: number | null; signal: number | null };
        for (const l of this.exitL) l(this.exitStatus);
      } else if ('ack' in f) {
        this.unacked.ack(Number(f.ack));
      } else if ('lost' in f) {
        const lost = f.lost as { bytes: number; next: number };
        if (typeof lost.next === 'number' && lost.next > this.seen) this.seen = lost.next;
        for (const l of this.lostL) l(lost.bytes, lost.next);
      } else if ('rid' in f) {
        const p = this.pending.get(Number(f.rid));
        if (p === undefined) return;
        this.pending.delete(Number(f.rid));
        if ('error' in f) p.err(errorFrom(f, `node ${this.nodeId}: session request failed`));
        else p.ok(decode(f.result));
      }
    });
    ws.on('error', () => undefined);
    ws.once('close', () => this.onClose(ws));
  }

  private onClose(ws: WebSocket): void {
    if (ws !== this.ws) return;
    if (this.ending || this.exitStatus !== null) return this.failPending(`node ${this.nodeId}: the session connection closed`);
    // Lost. Runs are sent again on the new connection; any other answer is gone with this one.
    for (const [rid, p] of this.pending) {
      if (p.run) continue;
      this.pending.delete(rid);
      p.err(new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the session connection was lost before the answer came`));
    }
    this.outbox = [];
    this.outboxBytes = 0;
    void this.reconnect();
  }

  private async reconnect(): Promise<void> {
    const deadline = Date.now() + RECONNECT_WINDOW_MS;
    let delay = 25;
    let why = 'the connection to the node broke';
    while (!this.ending) {
      try {
        const ch = await this.reopen(this.seen);
        if (this.ending) {
          ch.ws.close(1000);
          return;
        }
        this.bind(ch);
        const queued = this.outbox ?? [];
        this.outbox = null;
        this.outboxBytes = 0;
        if (this.paused) this.send({ op: 'pause' });
        // in the order they were first asked for: runs that may have reached the node went before
        // anything of the outbox, runs asked for during the outage after it
        const runs = [...this.pending].filter(([, p]) => p.run !== undefined);
        for (const [rid] of runs) this.pending.delete(rid);
        for (const [, p] of runs) if (p.run!.sent) this.sendRun(p);
        // every input frame not acknowledged: the node skips those it applied before the break
        for (const text of this.unacked.texts()) this.ws.send(text);
        for (const text of queued) this.ws.send(text);
        for (const [, p] of runs) if (!p.run!.sent) this.sendRun(p);
        return;
      } catch (err) {
        const e = err instanceof WarrenError ? err : new WarrenError('UNAVAILABLE', String(err));
        why = e.message;
        // gone for good: the session ended, the sandbox went, or this gateway let go of the node
        if (e.code === 'SESSION_NOT_FOUND' || e.code === 'SANDBOX_NOT_FOUND' || (e.details as { closed?: unknown } | undefined)?.closed === true) break;
        if (Date.now() + delay > deadline) break;
        await new Promise((r) => setTimeout(r, delay));
        delay = Math.min(delay * 2, 1000);
      }
    }
    if (this.ending) return this.failPending(`node ${this.nodeId}: the session was detached`);
    this.broken = `node ${this.nodeId}: the session connection was lost and could not be made again (${why})`;
    this.outbox = null;
    this.unacked.clear();
    this.failPending(this.broken);
    for (const l of this.discL) l(this.broken);
  }

  private failPending(message: string): void {
    const all = [...this.pending.values()];
    this.pending.clear();
    for (const p of all) p.err(new WarrenError('UNAVAILABLE', message));
  }

  private send(frame: Record<string, unknown>): void {
    const text = JSON.stringify(frame);
    if (this.outbox !== null) {
      // a frame that does not fit is dropped, as it would be on a connection that broke mid-send
      if (this.outboxBytes + text.length <= OUTBOX_MAX_BYTES) {
        this.outbox.push(text);
        this.outboxBytes += text.length;
      }
      return;
    }
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(text);
  }

  /**
   * An input frame: numbered and kept until the node acknowledges it. Sent now if the connection
   * is open; otherwise it goes out when the connection is made again, as the ones sent but not
   * acknowledged do. Past OUTBOX_MAX_BYTES of unacknowledged input (a node that has stopped
   * answering) a frame is dropped, as it would be on a connection that broke mid-send.
   */
  private sendInput(frame: Record<string, unknown>): void {
    if (this.broken !== null || this.ending) return;
    const text = this.unacked.add(frame);
    if (text !== null && this.outbox === null && this.ws.readyState === this.ws.OPEN) this.ws.send(text);
  }

  private sendRun(p: PendingAsk): void {
    const r = p.run!;
    const rid = ++this.rid;
    this.pending.set(rid, p);
    const resume = r.sent;
    r.sent = true;
    this.ws.send(JSON.stringify({ op: 'run', rid, commandId: r.commandId, command: r.command, ...(r.timeoutMs !== undefined ? { timeoutMs: r.timeoutMs } : {}), ...(resume ? { resume: true } : {}) }));
  }

  /** Why nothing more can be asked of the node, or null (a connection being made again still takes asks). */
  private unusable(): WarrenError | null {
    if (this.broken !== null) return new WarrenError('UNAVAILABLE', this.broken);
    if (this.outbox === null && this.ws.readyState !== this.ws.OPEN) return new WarrenError('UNAVAILABLE', `node ${this.nodeId}: the session connection is closed`);
    return null;
  }

  private ask<T>(frame: Record<string, unknown>): Promise<T> {
    const no = this.unusable();
    if (no !== null) return Promise.reject(no);
    const rid = ++this.rid;
    return new Promise<T>((ok, err) => {
      this.pending.set(rid, { ok: ok as (v: unknown) => void, err });
      this.send({ ...frame, rid });
    });
  }

  onOutput(listener: (out: SessionOutput) => void): void {
    this.outL.push(listener);
    const q = this.queuedOut;
    this.queuedOut = [];
    for (const o of q) listener(o);
  }
  onCommandDone(listener: (res: CommandResult) => void): void {
    this.doneL.push(listener);
    const q = this.queuedDone;
    this.queuedDone = [];
    for (const r of q) listener(r);
  }
  onExit(listener: (status: { exitCode: number | null; signal: number | null }) => void): void {
    this.exitL.push(listener);
    const st = this.exitStatus;
    if (st) queueMicrotask(() => listener(st));
  }
  onLost(listener: (bytes: number, nextOffset: number) => void): void {
    this.lostL.push(listener);
  }
  onDisconnect(listener: (reason: string) => void): void {
    this.discL.push(listener);
    const why = this.broken;
    if (why !== null) queueMicrotask(() => listener(why));
  }
  run(commandId: string, command: string, timeoutMs?: number, resume = false): Promise<CommandResult> {
    const no = this.unusable();
    if (no !== null) return Promise.reject(no);
    return new Promise<CommandResult>((ok, err) => {
      const p: PendingAsk = { ok: ok as (v: unknown) => void, err, run: { commandId, command, timeoutMs, sent: resume } };
      // while the connection is made again, the run waits and goes out on the new one
      if (this.outbox !== null) this.pending.set(++this.rid, p);
      else this.sendRun(p);
    });
  }
  write(data: Buffer | string): void {
    this.sendInput({ op: 'write', d: Buffer.from(data).toString('base64') });
  }
  resize(cols: number, rows: number): void {
    this.sendInput({ op: 'resize', cols, rows });
  }
  signal(signal: number): void {
    this.sendInput({ op: 'signal', signal });
  }
  detach(): void {
    this.ending = true;
    this.ws.close(1000);
  }
  async close(): Promise<void> {
    // the session is ending: a connection lost now is not made again
    this.ending = true;
    try {
      await this.ask({ op: 'close' });
    } finally {
      this.ws.close(1000);
    }
  }
  pauseOutput(): void {
    this.paused = true;
    this.send({ op: 'pause' });
  }
  resumeOutput(): void {
    this.paused = false;
    this.send({ op: 'resume' });
  }
  abortCommand(): void {
    this.sendInput({ op: 'abort' });
  }
  recentStatus(commandId: string, after: number): Promise<{ exitCode: number; endOffset: number } | null> {
    return this.ask({ op: 'recentStatus', commandId, after });
  }
}

/**
 * One WebSocket's messages in order, to one handler at a time: several frames
 * can arrive in one read, so the frames after a stream's first one wait here
 * until the stream's own handler takes them.
 */
class WsChannel {
  private handler: ((data: Buffer, isBinary: boolean) => void) | null = null;
  private backlog: Array<[Buffer, boolean]> = [];

  constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (this.handler !== null) this.handler(data, isBinary);
      else this.backlog.push([data, isBinary]);
    });
  }

  onMessage(handler: ((data: Buffer, isBinary: boolean) => void) | null): void {
    this.handler = handler;
    while (this.handler !== null && this.backlog.length > 0) {
      const [data, isBinary] = this.backlog.shift()!;
      this.handler(data, isBinary);
    }
  }
}

/** A byte stream over a channel's binary messages (VNC). */
function wsDuplex(ch: WsChannel): Duplex {
  const ws = ch.ws;
  const d = new Duplex({
    write(chunk: Buffer, _enc, cb) {
      if (ws.readyState !== ws.OPEN) return cb(new Error('the VNC connection is closed'));
      ws.send(chunk, (e) => cb(e ?? null));
    },
    final(cb) {
      ws.close(1000);
      cb();
    },
    read() {
      ws.resume();
    },
    destroy(err, cb) {
      ws.terminate();
      cb(err);
    },
  });
  ch.onMessage((data: Buffer, isBinary: boolean) => {
    if (!isBinary) return;
    if (!d.push(data)) ws.pause();
  });
  ws.once('close', () => d.push(null));
  ws.on('error', (e) => d.destroy(e));
  return d;
}

/** Trailing undefined arguments are left out: the wire has no undefined, and arities allow it. */
function trimUndefined(args: Args): Args {
  let n = args.length;
  while (n > 0 && args[n - 1] === undefined) n--;
  return args.slice(0, n).map((a) => (a === undefined ? null : a));
}

function frameOf(line: string, node: string, method: string): Record<string, unknown> {
  let f: unknown;
  try {
    f = JSON.parse(line);
  } catch {
    throw new WarrenError('UNAVAILABLE', `node ${node}: a ${method} frame is not JSON`);
  }
  if (f === null || typeof f !== 'object' || Array.isArray(f)) throw new WarrenError('UNAVAILABLE', `node ${node}: a ${method} frame is not an object`);
  return f as Record<string, unknown>;
}

function parseFrame(data: Buffer): Record<string, unknown> | null {
  try {
    const v = JSON.parse(data.toString('utf8'));
    return v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

async function readAll(body: Readable, limit: number, node: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of body) {
    size += (c as Buffer).length;
    if (size > limit) {
      body.destroy();
      throw new WarrenError('UNAVAILABLE', `node ${node}: an answer over its bound of ${limit} bytes`);
    }
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks, size);
}

async function readJson(body: Readable, limit: number, node: string): Promise<unknown> {
  const text = (await readAll(body, limit, node)).toString('utf8');
  try {
    return JSON.parse(text);
  } catch {
    throw new WarrenError('UNAVAILABLE', `node ${node}: the answer is not JSON`);
  }
}

/** Splits NDJSON into lines, each bounded. */
class LineReader {
  private parts: Buffer[] = [];
  private size = 0;
  constructor(
    private readonly limit: number,
    private readonly onLine: (line: string) => void,
  ) {}
  push(chunk: Buffer): void {
    let start = 0;
    for (let nl = chunk.indexOf(10); nl !== -1; nl = chunk.indexOf(10, start)) {
      this.parts.push(chunk.subarray(start, nl));
      const line = Buffer.concat(this.parts).toString('utf8');
      this.parts = [];
      this.size = 0;
      start = nl + 1;
      if (line.length > 0) this.onLine(line);
    }
    if (start < chunk.length) {
      this.size += chunk.length - start;
      if (this.size > this.limit) throw new WarrenError('UNAVAILABLE', `an NDJSON line over ${this.limit} bytes`);
      this.parts.push(chunk.subarray(start));
    }
  }
}
