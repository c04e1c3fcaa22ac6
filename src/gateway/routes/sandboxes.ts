/** Sandboxes: create, list, get, delete, exec, sessions; lifecycle: pause, resume, hibernate, extend, pack. */
import type { Server } from 'hyper-express';
import { WarrenError } from '../../errors';
import type { BackendName, CreateOptions, SandboxSpec } from '../../shim/types';
import { type Account, type Usage, can, checkQuota, principalOf, requirePermission } from '../auth';
import { type GatewayContext, authed, present, raceSafe, sandboxFor } from '../context';
import { queryOf, queryOne, readJson, rejectUnknownQuery, sendEmpty, sendJson } from '../http';
import { sendCapturedJson, streamLiveNdjson, wantsNdjson } from '../exec-stream';
import { idempotencyKeyOf } from '../idempotency';
import { idempotentExec } from '../idempotent-exec';
import {
  parseLabelFilter,
  validateCreateRequest,
  validateExecRequest,
  validateExtendRequest,
  validateNetworkServices,
  validateOutputEncoding,
  validatePackRequest,
  validatePlacementAsk,
} from '../../validation';

/** Sandbox creations in flight per account (counted against quotas until they are listed). */
const reservations = new WeakMap<GatewayContext, Map<string, Usage>>();

/**
 * What a create's validation needs of the node (its host name and which backends it runs), kept
 * for a second: a full features() report reads the host's capacity and tunables, which costs more
 * than a create from a prepared sandbox. Backends do not come and go within a second.
 */
interface CreateFacts {
  host: GatewayContext['host'];
  availableBackends: BackendName[];
}
const createFacts = new WeakMap<GatewayContext, { at: number; facts: Promise<CreateFacts> }>();
const CREATE_FACTS_MS = 1000;

export function factsForCreate(ctx: GatewayContext): Promise<CreateFacts> {
  const now = performance.now();
  const held = createFacts.get(ctx);
  if (held !== undefined && now - held.at < CREATE_FACTS_MS) return held.facts;
  const facts = ctx.shim.features().then((f) => ({
    host: f.host ?? ctx.host,
    availableBackends: (Object.keys(f.backends) as BackendName[]).filter((b) => f.backends[b]?.available),
  }));
  createFacts.set(ctx, { at: now, facts });
  // a failed read is not kept
  facts.catch(() => {
    if (createFacts.get(ctx)?.facts === facts) createFacts.delete(ctx);
  });
  return facts;
}

/** Live sandboxes (running, paused, hibernated, creating) of an account, plus creations in flight. */
export async function accountUsage(ctx: GatewayContext, accountId: string): Promise<Usage> {
  return withReservations(ctx, accountId, await ctx.shim.sandboxUsage(accountId));
}

function withReservations(ctx: GatewayContext, accountId: string, u: Usage): Usage {
  const r = reservations.get(ctx)?.get(accountId);
  if (r) {
    u.sandboxes += r.sandboxes;
    u.cpu += r.cpu;
    u.memoryMb += r.memoryMb;
  }
  return u;
}

export async function withQuota<T>(ctx: GatewayContext, account: Account, spec: SandboxSpec, fn: () => Promise<T>): Promise<T> {
  const quota = await ctx.auth.quota(account.id, ctx.defaultQuota);
  const live = await ctx.shim.sandboxUsage(account.id);
  // From here to the reservation nothing awaits: concurrent creates see each other's reservations.
  checkQuota(quota, withReservations(ctx, account.id, live), spec);
  let byAccount = reservations.get(ctx);
  if (!byAccount) reservations.set(ctx, (byAccount = new Map()));
  const r = byAccount.get(account.id) ?? { sandboxes: 0, cpu: 0, memoryMb: 0 };
  r.sandboxes++;
  r.cpu += spec.cpu;
  r.memoryMb += spec.memoryMb;
  byAccount.set(account.id, r);
  try {
    return await fn();
  } finally {
    r.sandboxes--;
    r.cpu -= spec.cpu;
    r.memoryMb -= spec.memoryMb;
    if (r.sandboxes === 0) byAccount.delete(account.id);
  }
}

/** The sandboxes a label-selector job operation applies to: own ones; admins may add ?owner=. */
function jobFilter(req: { path_query: string }, account: Account): { labels: Record<string, string>; owner?: string } {
  const q = new URLSearchParams(req.path_query);
  rejectUnknownQuery(q, ['label', 'owner']);
  const labels = parseLabelFilter(q.getAll('label'));
  if (labels === undefined) throw new WarrenError('INVALID_ARGUMENT', 'a label selector is required: ?label=key=value (repeatable)', { field: 'label' });
  const ownerParam = queryOne(q, 'owner');
  if (!can(account, 'allSandboxes')) return { labels, owner: account.id };
  return ownerParam === undefined ? { labels } : { labels, owner: ownerParam };
}

/** Largest page of GET /v1/sandboxes. */
export const MAX_PAGE = 1000;

/** ?limit=&after= of a paginated list, or null for the whole list (no limit given). */
function parsePage(limit: string | undefined, after: string | undefined): { limit: number; after?: string } | null {
  if (limit === undefined) {
    if (after !== undefined) throw new WarrenError('INVALID_ARGUMENT', '`after` needs `limit` (the page size, 1..1000)', { field: 'after' });
    return null;
  }
  if (!/^\d{1,4}$/.test(limit) || Number(limit) < 1 || Number(limit) > MAX_PAGE) throw new WarrenError('INVALID_ARGUMENT', `limit must be an integer 1..${MAX_PAGE}`, { field: 'limit' });
  if (after !== undefined && !/^[a-z0-9][a-z0-9-]{0,62}$/.test(after)) throw new WarrenError('INVALID_ARGUMENT', '`after` must be a sandbox id (the `next` of the previous page)', { field: 'after' });
  return after === undefined ? { limit: Number(limit) } : { limit: Number(limit), after };
}

export function registerSandboxRoutes(app: Server, ctx: GatewayContext): void {
  app.post(
    '/v1/sandboxes',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['explain']);
      const explain = queryOne(q, 'explain');
      if (explain !== undefined && explain !== '1' && explain !== '0') throw new WarrenError('INVALID_ARGUMENT', 'explain must be 1 or 0', { field: 'explain' });
      const body = await readJson(req);
      // `placement` is a cluster's to act on (a single node is the only node); the rest is the sandbox
      const isObject = typeof body === 'object' && body !== null && !Array.isArray(body);
      const { placement, ...rest } = isObject ? (body as Record<string, unknown>) : { placement: undefined };
      const { host, availableBackends } = await factsForCreate(ctx);
      const spec = validateCreateRequest(isObject ? rest : body, { owner: account.id, host, availableBackends });
      const createOpts: CreateOptions = { placement: validatePlacementAsk(placement), explain: explain === '1' };
      // Roles: runtime accounts create only from published environments and node
      // images, builders also from their own packs, admins from anything; the
      // shim checks every reference (src/shim/access.ts).
      const principal = principalOf(account);
      await ctx.shim.authorizeContent(principal, spec);
      const info = await withQuota(ctx, account, spec, () => ctx.shim.createSandbox(spec, principal, createOpts));
      sendJson(res, 201, present(account, info));
    }),
  );

  // ---- lifecycle: jobs (label selectors) first, so "pause" is never taken for an id ----

  app.post(
    '/v1/sandboxes/pause',
    authed(ctx, async (req, res, account) => {
      const filter = jobFilter(req, account);
      sendJson(res, 200, { sandboxes: await ctx.shim.pauseSandboxes(filter) });
    }),
  );

  app.post(
    '/v1/sandboxes/resume',
    authed(ctx, async (req, res, account) => {
      const filter = jobFilter(req, account);
      sendJson(res, 200, { sandboxes: await ctx.shim.resumeSandboxes(filter) });
    }),
  );

  app.post(
    '/v1/sandboxes/:id/pause',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      sendJson(res, 200, await ctx.shim.pauseSandbox(info.id));
    }),
  );

  app.post(
    '/v1/sandboxes/:id/resume',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      sendJson(res, 200, await ctx.shim.resumeSandbox(info.id));
    }),
  );

  app.post(
    '/v1/sandboxes/:id/hibernate',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      sendJson(res, 200, await ctx.shim.hibernateSandbox(info.id));
    }),
  );

  app.post(
    '/v1/sandboxes/:id/extend',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const body = validateExtendRequest(await readJson(req));
      sendJson(res, 200, present(account, await ctx.shim.extendSandbox(info.id, body)));
    }),
  );

  app.post(
    '/v1/sandboxes/:id/pack',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      requirePermission(account, 'packEnvironments');
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const body = validatePackRequest(await readJson(req));
      if (body.publish) requirePermission(account, 'publishEnvironments');
      sendJson(res, 201, await ctx.shim.packSandbox(info.id, body, account.id));
    }),
  );

  app.get(
    '/v1/sandboxes',
    authed(ctx, async (req, res, account) => {
      const q = queryOf(req);
      rejectUnknownQuery(q, ['label', 'owner', 'limit', 'after']);
      const labels = parseLabelFilter(q.getAll('label'));
      const ownerParam = queryOne(q, 'owner');
      const page = parsePage(queryOne(q, 'limit'), queryOne(q, 'after'));
      const owner = can(account, 'allSandboxes') ? ownerParam : account.id;
      if (ownerParam !== undefined && owner !== ownerParam) {
        // Non-admins asking for another owner's sandboxes see none.
        sendJson(res, 200, { sandboxes: [] });
        return;
      }
      const filter: { owner?: string; labels?: Record<string, string> } = {};
      if (owner !== undefined) filter.owner = owner;
      if (labels !== undefined) filter.labels = labels;
      if (page !== null) {
        // A page at a time (?limit=, then ?after=<next>): cost independent of the node's size.
        const p = await ctx.shim.listSandboxesPage(filter, page);
        sendJson(res, 200, { sandboxes: p.sandboxes.map((s) => present(account, s)), ...(p.next !== undefined ? { next: p.next } : {}), ...(p.unreachable ? { unreachable: p.unreachable } : {}) });
        return;
      }
      const all = await ctx.shim.listSandboxes(filter);
      const list = all.filter((s) => can(account, 'allSandboxes') || s.owner === account.id);
      sendJson(res, 200, { sandboxes: list.map((s) => present(account, s)), ...(all.unreachable ? { unreachable: all.unreachable } : {}) });
    }),
  );

  app.get(
    '/v1/sandboxes/:id',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      sendJson(res, 200, present(account, await sandboxFor(ctx, account, req.path_parameters.id)));
    }),
  );

  app.delete(
    '/v1/sandboxes/:id',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      await raceSafe(ctx, info.id, () => ctx.shim.deleteSandbox(info.id));
      ctx.idempotency?.store.dropSandbox(info.id);
      sendEmpty(res, 204);
    }),
  );

  app.post(
    '/v1/sandboxes/:id/exec',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const body = await readJson(req);
      const execReq = validateExecRequest(body);
      const encoding = validateOutputEncoding((body as Record<string, unknown>).encoding);
      const key = idempotencyKeyOf(req.headers['idempotency-key'], (body as Record<string, unknown>).idempotencyKey);
      if (key !== undefined && ctx.idempotency !== undefined) {
        await idempotentExec(ctx, ctx.idempotency, res, account, info.id, key, execReq, encoding, wantsNdjson(req.headers.accept));
        return;
      }
      if (wantsNdjson(req.headers.accept)) {
        await streamLiveNdjson(res, await raceSafe(ctx, info.id, () => ctx.shim.execLive(info.id, execReq)), encoding, ctx.log);
        return;
      }
      const captured = await raceSafe(ctx, info.id, () => ctx.shim.execCaptured(info.id, execReq));
      try {
        await sendCapturedJson(res, captured, encoding);
      } finally {
        captured.release();
        if (captured.stdout.size + captured.stderr.size > 1024 * 1024) ctx.reclaimer?.note();
      }
    }),
  );

  // per-service egress of a running sandbox
  app.get(
    '/v1/sandboxes/:id/network',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      sendJson(res, 200, await ctx.shim.networkInfo(info.id));
    }),
  );

  app.patch(
    '/v1/sandboxes/:id/network',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      const change = validateNetworkServices(await readJson(req), 'body');
      sendJson(res, 200, await ctx.shim.updateNetwork(info.id, change));
    }),
  );

  app.get(
    '/v1/sandboxes/:id/sessions',
    authed(ctx, async (req, res, account) => {
      rejectUnknownQuery(queryOf(req), []);
      const info = await sandboxFor(ctx, account, req.path_parameters.id);
      sendJson(res, 200, { sessions: await raceSafe(ctx, info.id, () => ctx.shim.listSessions(info.id)) });
    }),
  );
}
