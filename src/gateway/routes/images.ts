/**
 * Images. `POST /v1/images` is long work: the answer is 200 with an NDJSON
 * body of progress lines ending in exactly one `done` or `error` line (see
 * ndjson.ts). Errors found before the work starts (validation, permissions)
 * are ordinary JSON error responses. The import keeps going if the client
 * disconnects.
 */
import type { Server } from 'hyper-express';
import type { ImageInfo } from '../../shim/types';
import { principalOf, requirePermission } from '../auth';
import { type GatewayContext, authed } from '../context';
import { endChunked, publicError, queryOf, readJson, rejectUnknownQuery, sendJson, writeChunk } from '../http';
import { NDJSON_CONTENT_TYPE, doneEvent, errorEvent, ndjsonLine, progressEvent } from '../ndjson';
import { validateImageRequest } from '../validation';

export function registerImageRoutes(app: Server, ctx: GatewayContext): void {
  app.get(
    '/v1/images',
    authed(ctx, (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      // Only what the account may use: unpublished environments of others are not listed.
      sendJson(res, 200, { images: ctx.shim.listImages(principalOf(account)) });
    }),
  );

  app.post(
    '/v1/images',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'buildImages');
      const body = validateImageRequest(await readJson(req));
      if (body.source.type !== 'debootstrap') requirePermission(account, 'importHostPaths');

      res.status(200);
      res.header('content-type', NDJSON_CONTENT_TYPE);
      res.header('cache-control', 'no-store');
      // Lines are written in order; a slow client only delays its own stream.
      let chain: Promise<unknown> = writeChunk(res, ndjsonLine({ type: 'progress', phase: 'start', message: `importing ${body.name}` }));
      const emit = (line: string) => {
        chain = chain.then(() => writeChunk(res, line)).catch(() => false);
      };
      let image: ImageInfo;
      try {
        image = await ctx.shim.importImage(body, (p) => emit(ndjsonLine(progressEvent(p))));
        emit(ndjsonLine(doneEvent(image)));
      } catch (err) {
        emit(ndjsonLine(errorEvent(publicError(err, ctx.log))));
      }
      await chain;
      endChunked(res);
    }),
  );
}
