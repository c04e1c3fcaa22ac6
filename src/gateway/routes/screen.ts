/**
 * Computer use (vm backend), at the hypervisor level:
 *
 *   GET  /v1/sandboxes/:id/screen[?width=W]   image/png (scaled down to W pixels wide, aspect kept)
 *   POST /v1/sandboxes/:id/input              {"actions": [...]} -> {actions, events}
 *   WS   /v1/sandboxes/:id/vnc                RFB (VNC) over WebSocket, binary messages both ways
 *
 * The VNC server has no password: the WebSocket upgrade is where the token,
 * the sandbox's owner and the browser's origin are checked (as for shells).
 * Sandboxes of other backends answer NOT_SUPPORTED.
 */
import type { Request, Response, Server, Websocket } from 'hyper-express';
import type { Duplex } from 'node:stream';
import { WarrenError } from '../../errors';
import { bearerFromHeader, bearerFromSubprotocols } from '../auth';
import { type GatewayContext, authed, raceSafe, sandboxFor } from '../context';
import { queryOf, queryOne, readJson, rejectUnknownQuery, sendError, sendJson } from '../http';
import { sameOrigin } from '../ws-shell';

/** Input requests are small: 256 actions with 4096 characters of text fit well below this. */
export const INPUT_BODY_LIMIT = 256 * 1024;
/** Bytes from the VNC server waiting for a slow viewer before the VNC connection pauses. */
const VNC_HIGH_WATER = 4 * 1024 * 1024;
/**
 * The most a viewer's socket may queue. uWS gets no limit of its own: past it, uWS drops frames
 * without a word (a VNC stream with a hole in it is garbage) and the close frame too. Reading the
 * VNC server stops at the high-water mark, so only what one read brought can go past it.
 */
const VNC_QUEUE_CAP = 2 * VNC_HIGH_WATER;

function need<K extends 'screenshot' | 'sendInput' | 'openVnc'>(ctx: GatewayContext, k: K): NonNullable<GatewayContext['shim'][K]> {
  const fn = ctx.shim[k];
  if (fn === undefined) throw new WarrenError('NOT_SUPPORTED', 'this node has no computer-use support');
  return fn.bind(ctx.shim) as NonNullable<GatewayContext['shim'][K]>;
}

export function parseScreenWidth(raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined;
  if (!/^\d{1,5}$/.test(raw) || Number(raw) < 16 || Number(raw) > 8192) throw new WarrenError('INVALID_ARGUMENT', 'width: an integer from 16 to 8192 (pixels; the screenshot is scaled down to it)', { field: 'width' });
  return Number(raw);
}

interface VncContext {
  sock: Duplex;
}

export function registerScreenRoutes(app: Server, ctx: GatewayContext, opts: { allowedOrigins: readonly string[] }): { closeAll(): void } {
  app.get(
    '/v1/sandboxes/:id/screen',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['width']);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const width = parseScreenWidth(queryOne(q, 'width'));
      const shot = await raceSafe(ctx, info.id, () => need(ctx, 'screenshot')(info.id, width === undefined ? {} : { width }));
      if (res.completed) return;
      res.status(200);
      res.header('content-type', 'image/png');
      res.header('cache-control', 'no-store');
      res.header('x-screen-width', String(shot.width));
      res.header('x-screen-height', String(shot.height));
      res.send(shot.png);
    }),
  );

  app.post(
    '/v1/sandboxes/:id/input',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const body = await readJson(req, INPUT_BODY_LIMIT);
      if (body === null || typeof body !== 'object' || Array.isArray(body)) throw new WarrenError('INVALID_ARGUMENT', 'the body is {"actions": [...]}');
      for (const k of Object.keys(body)) if (k !== 'actions') throw new WarrenError('UNKNOWN_FIELD', `unknown field ${JSON.stringify(k)}`, { field: k });
      const out = await raceSafe(ctx, info.id, () => need(ctx, 'sendInput')(info.id, (body as { actions?: unknown }).actions));
      sendJson(res, 200, out);
    }),
  );

  const allowed = new Set(opts.allowedOrigins);
  const open = new Set<Websocket>();
  app.upgrade('/v1/sandboxes/:id/vnc', async (req: Request, res: Response) => {
    try {
      const origin = req.headers.origin;
      if (origin !== undefined && !allowed.has(origin) && !sameOrigin(origin, req.headers.host)) {
        throw new WarrenError('ORIGIN_REFUSED', `origin ${JSON.stringify(origin)} may not open the live view (not in allowedOrigins)`);
      }
      const proto = bearerFromSubprotocols(req.headers['sec-websocket-protocol']);
      const account = await ctx.auth.require(bearerFromHeader(req.headers.authorization) ?? proto.token);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const sock = await raceSafe(ctx, info.id, () => need(ctx, 'openVnc')(info.id));
      if (res.completed) {
        sock.destroy();
        return;
      }
      // noVNC offers "binary"; select it when offered, never echo a token
      const offered = (req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim());
      if (offered.includes('binary')) req.headers['sec-websocket-protocol'] = 'binary';
      else delete req.headers['sec-websocket-protocol'];
      const context: VncContext = { sock };
      res.upgrade(context);
    } catch (err) {
      sendError(res, err, ctx.log);
    }
  });
  app.ws('/v1/sandboxes/:id/vnc', { message_type: 'ArrayBuffer', idle_timeout: 300, max_backpressure: 0, max_payload_length: 1024 * 1024 }, (ws: Websocket<unknown>) => {
    const sock = (ws.context as unknown as VncContext | undefined)?.sock;
    if (sock === undefined) {
      ws.close(4500, 'no VNC connection');
      return;
    }
    open.add(ws);
    let closed = false;
    const end = (code = 1000, reason = 'live view ended') => {
      if (closed) return;
      closed = true;
      open.delete(ws);
      sock.destroy();
      try {
        ws.close(code, reason);
      } catch {
        /* already closed */
      }
    };
    sock.on('data', (d: Buffer) => {
      if (closed) return;
      if (ws.buffered + d.length > VNC_QUEUE_CAP) return end(4429, 'the viewer does not keep up with the screen');
      ws.send(d, true);
      if (ws.buffered > VNC_HIGH_WATER) sock.pause();
    });
    ws.on('drain', () => {
      if (ws.buffered <= VNC_HIGH_WATER / 4) sock.resume();
    });
    sock.on('close', () => end());
    sock.on('error', () => end());
    ws.on('message', (msg: ArrayBuffer) => {
      if (!closed) sock.write(Buffer.from(msg));
    });
    ws.on('close', () => {
      closed = true;
      open.delete(ws);
      sock.destroy();
    });
  });
  return {
    closeAll() {
      for (const ws of [...open]) ws.close(1001, 'gateway shutting down');
    },
  };
}
