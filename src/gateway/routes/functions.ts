/**
 * FnCall routes: pools under /v1/functions, invoke / judge / batch, and the
 * SandboxFusion-compatible POST /run_code. See docs/fncall.md.
 *
 * 429 answers (a saturated pool queue, an account over its concurrency quota)
 * carry Retry-After in seconds.
 */
import type { Request, Response, Server } from 'hyper-express';
import { WarrenError, asWarrenError } from '../../errors';
import { type RunJupyterResponse, sandboxErrorResponse, toRunCodeResponse, validateRunCode, validateRunJupyter } from '../../shim/fncall/sandboxfusion';
import type { FnCallApi } from '../../shim/types';
import { FN_LIMITS, validateBatch, validateInvoke, validateJudge, validatePoolName } from '../../shim/fncall/wire';
import { type Account, bearerFromHeader, can, principalOf, requirePermission } from '../auth';
import { type GatewayContext, authed, open } from '../context';
import { publicError, queryOf, readJson, rejectUnknownQuery, sendEmpty, sendJson, writeError } from '../http';

/** The node's FnCall (part of the Shim contract); NOT_SUPPORTED on shims without it. */
export function fncallOf(ctx: GatewayContext): FnCallApi {
  const fn = ctx.shim.functions;
  if (fn === undefined) throw new WarrenError('NOT_SUPPORTED', 'this node has no FnCall pools');
  return fn;
}

/** Add Retry-After to 429s before the error is written by the common handler. */
async function withRetryAfter(res: Response, fn: () => Promise<void>): Promise<void> {
  try {
    await fn();
  } catch (err) {
    if (err instanceof WarrenError && err.code === 'RESOURCE_EXHAUSTED') {
      const s = Number(err.details?.retryAfterS ?? 1);
      res.header('retry-after', String(Number.isFinite(s) && s > 0 ? Math.ceil(s) : 1));
    }
    throw err;
  }
}

function requireRun(account: Account): void {
  requirePermission(account, 'sandboxes');
}

export function registerFunctionRoutes(app: Server, ctx: GatewayContext): void {
  app.get(
    '/v1/functions',
    authed(ctx, async (req, res) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, { pools: await fncallOf(ctx).listPools() });
    }),
  );

  app.post(
    '/v1/functions',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), ['wait']);
      requirePermission(account, 'buildImages');
      // A pool serves every account that may invoke it: the node checks its creator may use its content.
      // ?wait=1: answer once min containers are warm (the first start may build the judge image).
      sendJson(res, 201, await fncallOf(ctx).createPool(await readJson(req), principalOf(account), { wait: queryOf(req).get('wait') === '1' }));
    }),
  );

  app.get(
    '/v1/functions/:pool',
    authed(ctx, async (req, res) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, await fncallOf(ctx).poolStats(validatePoolName(req.path_parameters.pool)));
    }),
  );

  app.delete(
    '/v1/functions/:pool',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'buildImages');
      await fncallOf(ctx).deletePool(validatePoolName(req.path_parameters.pool));
      sendEmpty(res, 204);
    }),
  );

  app.post(
    '/v1/functions/:pool/invoke',
    authed(ctx, (req, res, account) =>
      withRetryAfter(res, async () => {
        rejectUnknownQuery(queryOf(req), []);
        requireRun(account);
        const fn = fncallOf(ctx);
        const pool = validatePoolName(req.path_parameters.pool);
        const body = validateInvoke(await readJson(req, FN_LIMITS.bodyBytes));
        sendJson(res, 200, await fn.invoke(pool, account.id, body));
      }),
    ),
  );

  app.post(
    '/v1/functions/:pool/judge',
    authed(ctx, (req, res, account) =>
      withRetryAfter(res, async () => {
        rejectUnknownQuery(queryOf(req), []);
        requireRun(account);
        const fn = fncallOf(ctx);
        const pool = validatePoolName(req.path_parameters.pool);
        const body = validateJudge(await readJson(req, FN_LIMITS.bodyBytes));
        sendJson(res, 200, await fn.judge(pool, account.id, body));
      }),
    ),
  );

  app.post(
    '/v1/functions/:pool/batch',
    authed(ctx, (req, res, account) =>
      withRetryAfter(res, async () => {
        rejectUnknownQuery(queryOf(req), []);
        requireRun(account);
        const fn = fncallOf(ctx);
        const pool = validatePoolName(req.path_parameters.pool);
        const body = validateBatch(await readJson(req, FN_LIMITS.bodyBytes));
        sendJson(res, 200, { results: await fn.batch(pool, account.id, body.invocations, body.concurrency) });
      }),
    ),
  );

  // SandboxFusion-compatible. Its clients send no token: anonymous calls are refused unless
  // the node's fncall.json sets runCodeAnonymous (they then run as the account "anonymous").
  const sandboxFusionAccount = async (req: Request, fn: FnCallApi): Promise<string> => {
    const token = bearerFromHeader(req.headers.authorization);
    if (token === undefined && (await fn.anonymousRunCode())) return 'anonymous';
    const account = await ctx.auth.require(token);
    if (!can(account, 'sandboxes')) throw new WarrenError('FORBIDDEN', `role "${account.role}" may not run code`);
    return account.id;
  };
  const sandboxFusion = <T>(run: (fn: FnCallApi, accountId: string, body: unknown) => Promise<T>, onError: (message: string) => T) =>
    open(ctx, async (req: Request, res: Response) => {
      const fn = fncallOf(ctx);
      const accountId = await sandboxFusionAccount(req, fn);
      await withRetryAfter(res, async () => {
        const body = await readJson(req, FN_LIMITS.bodyBytes);
        try {
          sendJson(res, 200, await run(fn, accountId, body));
        } catch (err) {
          const e = asWarrenError(err);
          if (e.status < 500 || e.code === 'RESOURCE_EXHAUSTED') throw e;
          sendJson(res, 200, onError(publicError(e, ctx.log).message));
        }
      });
    });

  app.post(
    '/run_code',
    sandboxFusion(
      async (fn, accountId, raw) => toRunCodeResponse(await fn.runCode(accountId, validateRunCode(raw))),
      sandboxErrorResponse,
    ),
  );

  app.post(
    '/run_jupyter',
    sandboxFusion(
      async (fn, accountId, raw) => fn.runJupyter(accountId, validateRunJupyter(raw)),
      (message): RunJupyterResponse => ({ status: 'SandboxError', message, driver: null, cells: [], executor_pod_name: null, files: {} }),
    ),
  );

  // SandboxFusion's health check.
  app.get(
    '/v1/ping',
    open(ctx, (_req: Request, res: Response) => {
      sendJson(res, 200, 'pong');
    }),
  );

  // Every language: the toolkit layer that carries it, the pools that carry it; and the
  // SandboxFusion languages this node cannot offer, with the reason.
  app.get(
    '/v1/languages',
    authed(ctx, async (req, res) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, await fncallOf(ctx).languages());
    }),
  );
  void writeError;
}
