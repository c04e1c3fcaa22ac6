/**
 * Files inside a sandbox. Paths are validated here (absolute, normalised, no
 * `..`, no NUL) and resolved again inside the sandbox's root by the shim.
 *
 *   GET  /v1/sandboxes/:id/files?path=P            raw bytes
 *   PUT  /v1/sandboxes/:id/files?path=P&mode=644   raw body -> {path, bytes}
 *   GET  /v1/sandboxes/:id/files/list?path=DIR     {path, entries: FileEntry[]}
 *   PUT  /v1/sandboxes/:id/files/archive?path=DIR  tar body -> {path, entries}
 *   GET  /v1/sandboxes/:id/files/archive?path=P    tar stream
 */
import type { Server } from 'hyper-express';
import { WarrenError } from '../../errors';
import { type GatewayContext, authed, raceSafe, sandboxFor } from '../context';
import { queryOf, queryOne, readBody, rejectUnknownQuery, sendJson, streamBody } from '../http';
import { parseFileMode, validateSandboxPath } from '../../validation';

function requiredPath(q: URLSearchParams): string {
  const raw = queryOne(q, 'path');
  if (raw === undefined) throw new WarrenError('INVALID_ARGUMENT', 'path: query parameter is required', { field: 'path' });
  return validateSandboxPath(raw);
}

export function registerFileRoutes(app: Server, ctx: GatewayContext): void {
  app.get(
    '/v1/sandboxes/:id/files',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['path']);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const path = requiredPath(q);
      const data = await raceSafe(ctx, info.id, () => ctx.shim.readFile(info.id, path, ctx.uploadLimit));
      if (res.completed) return;
      res.status(200);
      res.header('content-type', 'application/octet-stream');
      res.header('cache-control', 'no-store');
      res.send(data);
    }),
  );

  app.put(
    '/v1/sandboxes/:id/files',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['path', 'mode']);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const path = requiredPath(q);
      if (path === '/') throw new WarrenError('INVALID_ARGUMENT', 'path: cannot write to /', { field: 'path' });
      const mode = parseFileMode(queryOne(q, 'mode'));
      const data = await readBody(req, ctx.uploadLimit);
      await raceSafe(ctx, info.id, () => ctx.shim.writeFile(info.id, path, data, mode));
      sendJson(res, 200, { path, bytes: data.length });
    }),
  );

  app.get(
    '/v1/sandboxes/:id/files/list',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['path']);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const raw = queryOne(q, 'path');
      const path = raw === undefined ? '/' : validateSandboxPath(raw);
      sendJson(res, 200, { path, entries: await raceSafe(ctx, info.id, () => ctx.shim.listDir(info.id, path)) });
    }),
  );

  app.put(
    '/v1/sandboxes/:id/files/archive',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['path']);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const path = requiredPath(q);
      const tar = await readBody(req, ctx.uploadLimit);
      if (tar.length === 0) throw new WarrenError('INVALID_ARCHIVE', 'empty tar body');
      const result = await raceSafe(ctx, info.id, () => ctx.shim.uploadTar(info.id, path, tar));
      sendJson(res, 200, { path, entries: result.entries });
    }),
  );

  app.get(
    '/v1/sandboxes/:id/files/archive',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['path']);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const path = requiredPath(q);
      const stream = await raceSafe(ctx, info.id, () => ctx.shim.downloadTar(info.id, path));
      await streamBody(res, stream, 'application/x-tar', ctx.log);
    }),
  );
}
