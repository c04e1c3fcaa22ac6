/**
 * Environments made by pack_diff, their publication, and account quotas.
 *
 * - `GET /v1/environments`: builders and admins see all; runtime accounts see
 *   the published ones only.
 * - `POST /v1/environments/:name/publish` | `/unpublish`: builders (their own)
 *   and admins. Runtime accounts may create sandboxes only from published
 *   environments.
 * - `GET|PUT /v1/accounts/:id/quota`: admins (and `GET` of one's own quota).
 */
import type { Server } from 'hyper-express';
import { WarrenError } from '../../errors';
import type { EnvironmentInfo } from '../../shim/types';
import { type Account, can, principalOf, requirePermission } from '../auth';
import { type GatewayContext, authed } from '../context';
import { queryOf, readJson, rejectUnknownQuery, sendJson } from '../http';
import { validateImageRef, validateQuotaRequest } from '../../validation';
import { accountUsage } from './sandboxes';

async function ownEnvironment(ctx: GatewayContext, account: Account, rawName: unknown): Promise<EnvironmentInfo> {
  requirePermission(account, 'publishEnvironments');
  const name = validateImageRef(rawName, 'name');
  const env = await ctx.shim.environment(name, principalOf(account));
  if (env === null) throw new WarrenError('IMAGE_NOT_FOUND', `no environment ${JSON.stringify(name)}`, { ref: name });
  if (env.owner !== account.id && !can(account, 'allSandboxes')) {
    throw new WarrenError('FORBIDDEN', `environment ${JSON.stringify(env.name)} belongs to another account`, { image: env.name });
  }
  return env;
}

export function registerEnvironmentRoutes(app: Server, ctx: GatewayContext): void {
  app.get(
    '/v1/environments',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, { environments: await ctx.shim.listEnvironments(principalOf(account)) });
    }),
  );

  for (const [action, published] of [
    ['publish', true],
    ['unpublish', false],
  ] as const) {
    app.post(
      `/v1/environments/:name/${action}`,
      authed(ctx, async (req, res, account) => {
        rejectUnknownQuery(queryOf(req), []);
        const env = await ownEnvironment(ctx, account, decodeURIComponent(req.path_parameters.name ?? ''));
        sendJson(res, 200, await ctx.shim.publishEnvironment(env.name, published));
      }),
    );
  }

  app.get(
    '/v1/accounts/:id/quota',
    authed(ctx, async (req, res, account) => {
      const id = req.path_parameters.id;
      if (id !== account.id && id !== 'me') requirePermission(account, 'quotas');
      const target = id === 'me' ? account.id : String(id);
      sendJson(res, 200, { account: target, quota: await ctx.auth.quota(target, ctx.defaultQuota), usage: await accountUsage(ctx, target) });
    }),
  );

  app.put(
    '/v1/accounts/:id/quota',
    authed(ctx, async (req, res, account) => {
      requirePermission(account, 'quotas');
      const body = validateQuotaRequest(await readJson(req));
      const target = String(req.path_parameters.id);
      sendJson(res, 200, { account: target, quota: await ctx.auth.setQuota(target, body, ctx.defaultQuota) });
    }),
  );
}
