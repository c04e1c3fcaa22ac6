/** `GET /v1/health` (no auth), `GET /v1/features`, accounts (admin). */
import type { Server } from 'hyper-express';
import { requirePermission } from '../auth';
import { type GatewayContext, authed, open } from '../context';
import { queryOf, readJson, rejectUnknownQuery, sendJson } from '../http';
import { validateAccountRequest } from '../../validation';

/** `health`: what the deployment adds to the answer (a cluster gateway: whether etcd answers). */
export function registerSystemRoutes(app: Server, ctx: GatewayContext, health?: () => Promise<Record<string, unknown>>): void {
  app.get(
    '/v1/health',
    open(ctx, async (_req, res) => {
      sendJson(res, 200, {
        status: 'ok',
        node: ctx.shim.nodeId,
        version: ctx.version,
        uptimeS: Math.floor((Date.now() - ctx.startedAt) / 1000),
        ...(health ? await health() : {}),
      });
    }),
  );

  app.get(
    '/v1/features',
    authed(ctx, async (req, res) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, await ctx.shim.features());
    }),
  );

  app.post(
    '/v1/accounts',
    authed(ctx, async (req, res, account) => {
      requirePermission(account, 'accounts');
      const body = validateAccountRequest(await readJson(req));
      const created = await ctx.auth.createAccount(body.name, body.role);
      sendJson(res, 201, { ...created.account, token: created.token });
    }),
  );

  app.get(
    '/v1/accounts',
    authed(ctx, async (_req, res, account) => {
      requirePermission(account, 'accounts');
      sendJson(res, 200, { accounts: await ctx.auth.listAccounts() });
    }),
  );

  app.get(
    '/v1/accounts/me',
    authed(ctx, (_req, res, account) => {
      sendJson(res, 200, account);
    }),
  );
}
