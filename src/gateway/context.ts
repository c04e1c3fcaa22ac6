/**
 * What every route handler gets: the shim, auth, limits, and the ownership
 * rule (non-admin accounts see only their own sandboxes; anything else is
 * SANDBOX_NOT_FOUND, so ids of other accounts do not leak).
 */
import { type Span, SpanKind, SpanStatusCode } from '@opentelemetry/api';
import type { Request, Response } from 'hyper-express';
import { WarrenError } from '../errors';
import type { SandboxInfo, Shim } from '../shim/types';
import { tracer } from '../telemetry';
import { type Account, type Accounts, type Quota, bearerFromHeader, can } from './auth';
import { type Log, publicError, writeError } from './http';
import type { Reclaimer } from './reclaim';
import type { IdempotencyContext } from './idempotent-exec';
import { type HostCapacity, validateSandboxId } from '../validation';

export interface GatewayContext {
  shim: Shim;
  auth: Accounts;
  log: Log;
  host: HostCapacity;
  uploadLimit: number;
  version: string;
  startedAt: number;
  /** Quota of accounts that have none of their own (undefined: unlimited). */
  defaultQuota?: Quota;
  /** Told when large buffers were freed, to give the memory back to the kernel. */
  reclaimer?: Reclaimer;
  /** Idempotency keys of exec and shell commands (docs/idempotency.md). */
  idempotency?: IdempotencyContext;
}

export function sandboxNotFound(id: string): WarrenError {
  return new WarrenError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`, { id });
}

/** The sandbox `rawId` if `account` may see it; SANDBOX_NOT_FOUND otherwise (same answer whether it exists or not). */
export async function sandboxFor(ctx: GatewayContext, account: Account, rawId: unknown): Promise<SandboxInfo> {
  const id = validateSandboxId(rawId);
  let info: SandboxInfo;
  try {
    info = await ctx.shim.getSandbox(id);
  } catch (err) {
    if (err instanceof WarrenError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'NOT_FOUND')) throw sandboxNotFound(id);
    throw err;
  }
  if (info.owner !== account.id && !can(account, 'allSandboxes')) throw sandboxNotFound(id);
  return info;
}

/**
 * Run a request on sandbox `id`; if it fails because the sandbox stopped or
 * went away under it (a DELETE, a TTL, pid 1 dying: its cgroup, pid or root
 * vanish mid-request), answer what the request raced instead of the low-level
 * failure: 404 SANDBOX_NOT_FOUND once it is gone, 409 SANDBOX_NOT_RUNNING
 * while it is being deleted or stopped. Other failures pass through.
 */
export async function raceSafe<T>(ctx: GatewayContext, id: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw (await raceError(ctx, id, err)) ?? err;
  }
}

async function raceError(ctx: GatewayContext, id: string, err: unknown): Promise<WarrenError | null> {
  if (err instanceof WarrenError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'SANDBOX_NOT_RUNNING' || err.status < 500)) return null;
  let state: string;
  try {
    state = (await ctx.shim.getSandbox(id)).state;
  } catch {
    return sandboxNotFound(id);
  }
  if (state === 'running' || state === 'paused' || state === 'hibernated') return null;
  return new WarrenError('SANDBOX_NOT_RUNNING', `sandbox ${id} is ${state}: the request raced its end`, { state });
}

/** The public view of a sandbox: the host pid is for admins only. */
export function present(account: Account, info: SandboxInfo): SandboxInfo {
  if (info.pid === undefined || can(account, 'allSandboxes')) return info;
  const { pid: _pid, ...rest } = info;
  return rest;
}

export type AuthedHandler = (req: Request, res: Response, account: Account) => Promise<void> | void;
export type PublicHandler = (req: Request, res: Response) => Promise<void> | void;

/** The route pattern a request matched (for span names; never the raw path with ids). */
function routeOf(req: Request): string {
  return (req as unknown as { route?: { pattern?: string } }).route?.pattern ?? 'unknown';
}

/**
 * Run a handler in an HTTP server span (a no-op unless telemetry is installed)
 * and turn anything thrown into the error body. An unread request body is
 * never buffered after an error: the answer closes the connection.
 */
async function traced(ctx: GatewayContext, req: Request, res: Response, fn: (span: Span) => Promise<void>): Promise<void> {
  const route = routeOf(req);
  await tracer().startActiveSpan(`${req.method} ${route}`, { kind: SpanKind.SERVER, attributes: { 'http.request.method': req.method, 'http.route': route } }, async (span) => {
    try {
      await fn(span);
    } catch (err) {
      const e = publicError(err, ctx.log);
      span.setAttribute('warren.error.code', e.code);
      if (e.status >= 500) span.setStatus({ code: SpanStatusCode.ERROR, message: e.message });
      writeError(res, e, !req.received);
    } finally {
      span.end();
    }
  });
}

/** Wrap a handler: authenticate, run, and turn anything thrown into the error body. */
export function authed(ctx: GatewayContext, fn: AuthedHandler): (req: Request, res: Response) => Promise<void> {
  return (req, res) =>
    traced(ctx, req, res, async (span) => {
      const account = await ctx.auth.require(bearerFromHeader(req.headers.authorization));
      span.setAttribute('warren.account', account.id);
      await fn(req, res, account);
    });
}

export function open(ctx: GatewayContext, fn: PublicHandler): (req: Request, res: Response) => Promise<void> {
  return (req, res) => traced(ctx, req, res, async () => fn(req, res));
}
