/**
 * the security policy over HTTP (admin only).
 *
 *   GET  /v1/policy        the policy in force: directory, file digests, since when, enforcer
 *   POST /v1/policy/apply  re-read the policy directory and swap it in atomically; 400
 *                          POLICY_INVALID (file:line in the message and details.issues) and
 *                          the last good policy stays in force when anything is wrong
 */
import type { Server } from 'hyper-express';
import { requirePermission } from '../auth';
import { type GatewayContext, authed } from '../context';
import { queryOf, rejectUnknownQuery, sendJson } from '../http';
import { activeEnforcer } from '../../features';
import { policyStore, unconfinedAllowed } from '../../security/confinement';

export function registerPolicyRoutes(app: Server, ctx: GatewayContext): void {
  app.get(
    '/v1/policy',
    authed(ctx, (req, res, account) => {
      requirePermission(account, 'policy');
      rejectUnknownQuery(queryOf(req), []);
      const s = policyStore();
      sendJson(res, 200, {
        dir: s.dir,
        since: s.since,
        digests: s.current.digests,
        profiles: Object.keys(s.current.profiles),
        defaultProfile: s.current.accounts.defaultProfile,
        allowUnconfined: unconfinedAllowed(),
        enforcer: activeEnforcer().description,
      });
    }),
  );

  app.post(
    '/v1/policy/apply',
    authed(ctx, (req, res, account) => {
      requirePermission(account, 'policy');
      rejectUnknownQuery(queryOf(req), []);
      const r = policyStore().apply();
      sendJson(res, 200, { applied: true, changes: r.changes, digests: r.digests });
    }),
  );
}
