/**
 * `warren gateway --node URL`: the whole gateway API (REST, shells, E2B,
 * FnCall, the dashboard) for one node reached over the shim protocol. The
 * gateway keeps its own accounts, tokens and idempotency keys in its data
 * directory; everything about sandboxes is the node's. A gateway restart
 * loses nothing: sessions live in their holders on the node, supervised execs
 * in their supervisors, and the new gateway re-attaches and follows them.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { RemoteShim } from '../shim/remote/client';
import { openDatabase } from '../state/db';
import { Auth, type Quota } from './auth';
import { createGateway } from './server';

export interface RemoteGatewayOptions {
  nodeUrl: string;
  token: string;
  dataDir: string;
  host: string;
  port: number;
  e2bPort?: number;
  defaultQuota?: Quota;
  log?: (line: string) => void;
}

export interface RemoteGateway {
  url: string;
  e2bUrl?: string;
  nodeId: string;
  /** The admin token on the first start (print it once); null on later starts. */
  adminToken: string | null;
  close(): Promise<void>;
}

export async function startRemoteGateway(opts: RemoteGatewayOptions): Promise<RemoteGateway> {
  mkdirSync(opts.dataDir, { recursive: true, mode: 0o700 });
  const db = openDatabase(join(opts.dataDir, 'gateway.db'));
  let shim: RemoteShim | null = null;
  try {
    const adminToken = new Auth(db).ensureAdminToken(opts.dataDir);
    shim = await RemoteShim.connect({ url: opts.nodeUrl, token: opts.token });
    const gwOpts: Parameters<typeof createGateway>[0] = { shim, db, dataDir: opts.dataDir, host: opts.host, port: opts.port };
    // Creates are checked against the node's machine, not this one.
    const nodeHost = (await shim.features()).host;
    if (nodeHost !== undefined) gwOpts.nodeHost = nodeHost;
    if (opts.e2bPort !== undefined) gwOpts.e2bPort = opts.e2bPort;
    if (opts.defaultQuota !== undefined) gwOpts.defaultQuota = opts.defaultQuota;
    if (opts.log !== undefined) gwOpts.log = opts.log;
    const gateway = await createGateway(gwOpts);
    const remote = shim;
    let closing: Promise<void> | null = null;
    return {
      url: gateway.url,
      ...(gateway.e2bUrl !== undefined ? { e2bUrl: gateway.e2bUrl } : {}),
      nodeId: remote.nodeId,
      adminToken,
      close() {
        closing ??= (async () => {
          await gateway.close();
          await remote.close();
          db.close();
        })();
        return closing;
      },
    };
  } catch (err) {
    await shim?.close().catch(() => undefined);
    db.close();
    throw err;
  }
}
