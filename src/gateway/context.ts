/**
 * What every route handler gets: the shim, auth, limits, and the ownership
 * rule (non-admin accounts see only their own sandboxes; anything else is
 * SANDBOX_NOT_FOUND, so ids of other accounts do not leak).
 */
import type { Request, Response } from 'hyper-express';
import { WarrenError } from '../errors';
import type { SandboxInfo, Shim } from '../shim/types';
import { type Account, type Auth, bearerFromHeader, can } from './auth';
import { type Log, sendError } from './http';
import { type HostCapacity, validateSandboxId } from './validation';

export interface GatewayContext {
  shim: Shim;
  auth: Auth;
  log: Log;
  host: HostCapacity;
  uploadLimit: number;
  version: string;
  startedAt: number;
}

export function sandboxNotFound(id: string): WarrenError {
  return new WarrenError('SANDBOX_NOT_FOUND', `sandbox "${id}" not found`, { id });
}

/** The sandbox `rawId` if `account` may see it; SANDBOX_NOT_FOUND otherwise (same answer whether it exists or not). */
export function sandboxFor(ctx: GatewayContext, account: Account, rawId: unknown): SandboxInfo {
  const id = validateSandboxId(rawId);
  let info: SandboxInfo;
  try {
    info = ctx.shim.getSandbox(id);
  } catch (err) {
    if (err instanceof WarrenError && (err.code === 'SANDBOX_NOT_FOUND' || err.code === 'NOT_FOUND')) throw sandboxNotFound(id);
    throw err;
  }
  if (info.owner !== account.id && !can(account, 'allSandboxes')) throw sandboxNotFound(id);
  return info;
}

/** The public view of a sandbox: the host pid is for admins only. */
export function present(account: Account, info: SandboxInfo): SandboxInfo {
  if (info.pid === undefined || can(account, 'allSandboxes')) return info;
  const { pid: _pid, ...rest } = info;
  return rest;
}

export type AuthedHandler = (req: Request, res: Response, account: Account) => Promise<void> | void;
export type PublicHandler = (req: Request, res: Response) => Promise<void> | void;

/** Wrap a handler: authenticate, run, and turn anything thrown into the error body. */
export function authed(ctx: GatewayContext, fn: AuthedHandler): (req: Request, res: Response) => Promise<void> {
  return async (req, res) => {
    try {
      const account = ctx.auth.require(bearerFromHeader(req.headers.authorization));
      await fn(req, res, account);
    } catch (err) {
      // An unread body must not be buffered: answer and close the connection.
      sendError(res, err, ctx.log, !req.received);
    }
  };
}

export function open(ctx: GatewayContext, fn: PublicHandler): (req: Request, res: Response) => Promise<void> {
  return async (req, res) => {
    try {
      await fn(req, res);
    } catch (err) {
      sendError(res, err, ctx.log, !req.received);
    }
  };
}
