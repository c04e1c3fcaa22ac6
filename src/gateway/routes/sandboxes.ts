/** Sandboxes: create, list, get, delete, exec, sessions. */
import type { Server } from 'hyper-express';
import type { BackendName } from '../../shim/types';
import { can } from '../auth';
import { type GatewayContext, authed, present, sandboxFor } from '../context';
import { queryOf, queryOne, readJson, rejectUnknownQuery, sendEmpty, sendJson } from '../http';
import { parseLabelFilter, validateCreateRequest, validateExecRequest } from '../validation';

export function registerSandboxRoutes(app: Server, ctx: GatewayContext): void {
  app.post(
    '/v1/sandboxes',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const body = await readJson(req);
      const backends = ctx.shim.features().backends;
      const availableBackends = (Object.keys(backends) as BackendName[]).filter((b) => backends[b]?.available);
      const spec = validateCreateRequest(body, { owner: account.id, host: ctx.host, availableBackends });
      const info = await ctx.shim.createSandbox(spec);
      sendJson(res, 201, present(account, info));
    }),
  );

  app.get(
    '/v1/sandboxes',
    authed(ctx, (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['label', 'owner']);
      const labels = parseLabelFilter(q.getAll('label'));
      const ownerParam = queryOne(q, 'owner');
      const owner = can(account, 'allSandboxes') ? ownerParam : account.id;
      if (ownerParam !== undefined && owner !== ownerParam) {
        // Non-admins asking for another owner's sandboxes see none.
        sendJson(res, 200, { sandboxes: [] });
        return;
      }
      const filter: { owner?: string; labels?: Record<string, string> } = {};
      if (owner !== undefined) filter.owner = owner;
      if (labels !== undefined) filter.labels = labels;
      const list = ctx.shim.listSandboxes(filter).filter((s) => can(account, 'allSandboxes') || s.owner === account.id);
      sendJson(res, 200, { sandboxes: list.map((s) => present(account, s)) });
    }),
  );

  app.get(
    '/v1/sandboxes/:id',
    authed(ctx, (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, present(account, sandboxFor(ctx, account, req.path_parameters.id)));
    }),
  );

  app.delete(
    '/v1/sandboxes/:id',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = sandboxFor(ctx, account, req.path_parameters.id);
      await ctx.shim.deleteSandbox(info.id);
      sendEmpty(res, 204);
    }),
  );

  app.post(
    '/v1/sandboxes/:id/exec',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = sandboxFor(ctx, account, req.path_parameters.id);
      const execReq = validateExecRequest(await readJson(req));
      const result = await ctx.shim.exec(info.id, execReq);
      sendJson(res, 200, result);
    }),
  );

  app.get(
    '/v1/sandboxes/:id/sessions',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = sandboxFor(ctx, account, req.path_parameters.id);
      sendJson(res, 200, { sessions: await ctx.shim.listSessions(info.id) });
    }),
  );
}
