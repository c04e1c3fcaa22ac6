/**
 * Fixture for the gateway, SDK and CLI integration tests: a REAL node (the
 * lead's ShimNode with a busybox image, via test/helpers/warren.ts), a real
 * gateway on an ephemeral port, an admin token, and helpers to make more
 * accounts. Everything is destroyed afterwards; sandboxes still alive are
 * named in the test log.
 *
 * These tests need root and a working container backend (native helper,
 * overlayfs, EROFS, namespaces); they skip with the reason otherwise.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import type { ExecutionContext } from 'ava';
import { containerBackendStatus } from '../../src/features';
import { Auth, type Role } from '../../src/gateway/auth';
import { type Gateway, createGateway } from '../../src/gateway/server';
import { WarrenClient } from '../../src/sdk';
import type { ShimNode } from '../../src/shim/node';
import type { Shim } from '../../src/shim/types';
import { type BoundShim, bindShim } from '../helpers/shim-binding';
import { openDatabase } from '../../src/state/db';
import { openTestShim, rootSkipReason } from '../helpers/warren';

export interface GatewayFixture {
  gateway: Gateway;
  url: string;
  adminToken: string;
  admin: WarrenClient;
  shim: ShimNode;
  dataDir: string;
  /** Cuts the gateway's stream connections to its node as a network failure would; null when the gateway holds the node in process. */
  cutNodeStreams: (() => Promise<number>) | null;
  /** A fresh account with its own client. */
  account(role?: Role): { id: string; token: string; client: WarrenClient };
}

export interface FixtureOptions {
  uploadLimitBytes?: number;
  allowedOrigins?: string[];
  shell?: Parameters<typeof createGateway>[0]['shell'];
  /** Also receives every line the gateway logs (to check that user errors make no noise). */
  onLog?: (line: string) => void;
  /** What the gateway is given in place of the bound shim (to model a node's timing). */
  wrapShim?: (shim: Shim) => Shim;
}

let cachedSkip: string | null | undefined;

/** Why the integration tests cannot run here, or null. */
export function integrationSkipReason(): string | null {
  if (cachedSkip !== undefined) return cachedSkip;
  cachedSkip = rootSkipReason();
  if (cachedSkip === null) {
    try {
      const status = containerBackendStatus();
      if (!status.available) cachedSkip = `container backend unavailable: ${status.reason}`;
    } catch (err) {
      cachedSkip = `container backend unavailable: ${(err as Error).message}`;
    }
  }
  return cachedSkip;
}

export async function withGateway(t: ExecutionContext, fn: (f: GatewayFixture) => Promise<void>, opts: FixtureOptions = {}): Promise<void> {
  const { shim, dataDir } = await openTestShim();
  // The shim opened its own connection; WAL lets the gateway share the file.
  const db = openDatabase(join(dataDir, 'warren.db'));
  const auth = new Auth(db);
  const adminToken = auth.ensureAdminToken(dataDir)!;
  const clients: WarrenClient[] = [];
  let gateway: Gateway | null = null;
  let bound: BoundShim | null = null;
  try {
    bound = await bindShim(shim);
    const log = (l: string) => {
      t.log(`[gateway] ${l}`);
      opts.onLog?.(l);
    };
    const gwOpts: Parameters<typeof createGateway>[0] = { shim: opts.wrapShim ? opts.wrapShim(bound.shim) : bound.shim, db, dataDir, host: '127.0.0.1', port: 0, log };
    if (opts.uploadLimitBytes !== undefined) gwOpts.uploadLimitBytes = opts.uploadLimitBytes;
    if (opts.allowedOrigins !== undefined) gwOpts.allowedOrigins = opts.allowedOrigins;
    if (opts.shell !== undefined) gwOpts.shell = opts.shell;
    gateway = await createGateway(gwOpts);
    const url = gateway.url;
    const admin = new WarrenClient({ url, token: adminToken });
    clients.push(admin);
    await fn({
      gateway,
      url,
      adminToken,
      admin,
      shim,
      dataDir,
      cutNodeStreams: bound.cutStreams,
      account(role: Role = 'runtime') {
        const { account, token } = auth.createAccount(`t-${role}-${clients.length}`, role);
        const client = new WarrenClient({ url, token });
        clients.push(client);
        return { id: account.id, token, client };
      },
    });
  } finally {
    const alive = shim.listSandboxes();
    if (alive.length > 0) t.log(`cleaning up sandboxes: ${alive.map((s) => s.id).join(', ')}`);
    for (const s of alive) await shim.deleteSandbox(s.id).catch((e) => t.log(`delete ${s.id}: ${e}`));
    for (const c of clients) await c.close().catch(() => undefined);
    if (gateway) await gateway.close();
    await bound?.close();
    await shim.close();
    (shim as { layers?: { unmountUnused?: () => void } }).layers?.unmountUnused?.();
    db.close();
    await rm(dataDir, { recursive: true, force: true });
  }
}

/** Raw HTTP through undici's global fetch-free request, for cases the SDK does not produce. */
export async function rawRequest(
  url: string,
  opts: { method?: string; path: string; token?: string | undefined; headers?: Record<string, string>; body?: Buffer | string },
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; text: string; json: any }> {
  const { request } = await import('undici');
  const headers: Record<string, string> = { ...opts.headers };
  if (opts.token !== undefined) headers.authorization = `Bearer ${opts.token}`;
  const res = await request(url + opts.path, { method: (opts.method ?? 'GET') as 'GET', headers, body: opts.body });
  const text = await res.body.text();
  let json: any;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.statusCode, headers: res.headers, text, json };
}
