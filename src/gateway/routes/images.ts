/**
 * Images. `POST /v1/images` (import, build, or pull from a registry),
 * `POST /v1/images/push` and `POST /v1/images/stage` are long work: the answer is
 * 200 with an NDJSON body of progress lines ending in exactly one `done` or
 * `error` line (see ndjson.ts). Errors found before the work starts (validation,
 * permissions) are ordinary JSON error responses. The work keeps going if the
 * client disconnects. `GET /v1/images/layers` says which layers this node holds
 * ('local'), can mount from a registry ('lazy'), or lacks. `DELETE
 * /v1/images/:name` removes an image (409 IMAGE_IN_USE while a sandbox uses it).
 */
import type { Response, Server } from 'hyper-express';
import { WarrenError } from '../../errors';
import type { ImageInfo, ImagePushResult, ImportProgress } from '../../shim/types';
import { principalOf, requirePermission } from '../auth';
import { type GatewayContext, authed } from '../context';
import { endChunked, publicError, queryOf, readJson, rejectUnknownQuery, sendJson, writeChunk } from '../http';
import { NDJSON_CONTENT_TYPE, doneEvent, errorEvent, ndjsonLine, progressEvent, type ProgressEvent } from '../ndjson';
import { validateImageName, validateImageRequest, validatePushRequest, validateStageRequest } from '../../validation';

/** Stream progress lines of `work` and end with its result (`done`) or error. */
async function streamWork<T>(res: Response, ctx: GatewayContext, start: string, work: (onProgress: (p: ImportProgress) => void) => Promise<T>, done: (r: T) => ProgressEvent): Promise<void> {
  res.status(200);
  res.header('content-type', NDJSON_CONTENT_TYPE);
  res.header('cache-control', 'no-store');
  // Lines are written in order; a slow client only delays its own stream.
  let chain: Promise<unknown> = writeChunk(res, ndjsonLine({ type: 'progress', phase: 'start', message: start }));
  const emit = (line: string) => {
    chain = chain.then(() => writeChunk(res, line)).catch(() => false);
  };
  try {
    const r = await work((p) => emit(ndjsonLine(progressEvent(p))));
    emit(ndjsonLine(done(r)));
  } catch (err) {
    emit(ndjsonLine(errorEvent(publicError(err, ctx.log))));
  }
  await chain;
  endChunked(res);
}

export function registerImageRoutes(app: Server, ctx: GatewayContext): void {
  app.get(
    '/v1/images',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      // Only what the account may use: unpublished environments of others are not listed.
      sendJson(res, 200, { images: await ctx.shim.listImages(principalOf(account)) });
    }),
  );

  app.get(
    '/v1/images/layers',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['digests']);
      requirePermission(account, 'buildImages');
      if (!ctx.shim.layerStates) throw new WarrenError('NOT_SUPPORTED', 'this node does not report its layers');
      const raw = q.get('digests');
      const digests = raw ? raw.split(',').slice(0, 1024) : undefined;
      sendJson(res, 200, { layers: await ctx.shim.layerStates(digests) });
    }),
  );

  app.post(
    '/v1/images',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'buildImages');
      const body = validateImageRequest(await readJson(req));
      // Host paths and connections to registries the request names are the node's to allow.
      if (body.source.type !== 'debootstrap') requirePermission(account, 'importHostPaths');
      const start = body.source.type === 'registry' ? `pulling ${body.source.ref} as ${body.name}` : `importing ${body.name}`;
      await streamWork(res, ctx, start, (p) => ctx.shim.importImage(body, p), (image: ImageInfo) => doneEvent(image));
    }),
  );

  // The name is one path segment: a name with "/" in it is sent encoded (%2F).
  app.delete(
    '/v1/images/:name',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'buildImages');
      let name: string;
      try {
        name = decodeURIComponent(req.path_parameters.name ?? '');
      } catch {
        throw new WarrenError('INVALID_ARGUMENT', 'image name: not a valid percent-encoded path segment', { field: 'name' });
      }
      name = validateImageName(name);
      const remove = ctx.shim.removeImage?.bind(ctx.shim);
      if (!remove) throw new WarrenError('NOT_SUPPORTED', 'this node cannot remove images');
      sendJson(res, 200, await remove(name));
    }),
  );

  app.post(
    '/v1/images/push',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'buildImages');
      requirePermission(account, 'importHostPaths');
      const body = validatePushRequest(await readJson(req));
      const push = ctx.shim.pushImage?.bind(ctx.shim);
      if (!push) throw new WarrenError('NOT_SUPPORTED', 'this node cannot push images');
      await ctx.shim.authorizeContent(principalOf(account), { image: body.image });
      await streamWork(res, ctx, `pushing ${body.image} to ${body.ref}`, (p) => push(body, p), (r: ImagePushResult) => ({ type: 'done', push: r }));
    }),
  );

  app.post(
    '/v1/images/stage',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'buildImages');
      requirePermission(account, 'importHostPaths');
      const body = validateStageRequest(await readJson(req));
      const stage = ctx.shim.stageImage?.bind(ctx.shim);
      if (!stage) throw new WarrenError('NOT_SUPPORTED', 'this node cannot stage images');
      await ctx.shim.authorizeContent(principalOf(account), { image: body.image });
      await streamWork(res, ctx, `staging ${body.image} in ${body.repository}`, (p) => stage(body, p), (r: ImagePushResult) => ({ type: 'done', push: r }));
    }),
  );
}
