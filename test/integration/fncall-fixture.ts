/**
 * Fixture for the FnCall integration tests: a real node (ShimNode with the
 * busybox image from test/helpers/warren.ts), a real gateway on an ephemeral
 * port, an admin client, and pools on the "judge" image (built once per node
 * and then taken from the node cache in /var/cache/warren, like CI does).
 * Everything is destroyed in close(); pool containers are counted by the leak
 * check in fncall-pool.test.ts.
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { Auth } from '../../src/gateway/auth';
import { type Gateway, createGateway } from '../../src/gateway/server';
import { WarrenClient } from '../../src/sdk';
import type { PoolOptions } from '../../src/sdk/functions';
import type { ShimNode } from '../../src/shim/node';
import { bindShim } from '../helpers/shim-binding';
import { openDatabase } from '../../src/state/db';
import { openTestShim } from '../helpers/warren';

export { integrationSkipReason, rawRequest } from './gateway-fixture';

export interface FnFixture {
  shim: ShimNode;
  gateway: Gateway;
  url: string;
  adminToken: string;
  admin: WarrenClient;
  dataDir: string;
  auth: Auth;
  logs: string[];
  /** Create a pool and wait until min containers are warm. */
  pool(spec: PoolOptions): Promise<void>;
  close(): Promise<void>;
}

export async function openFnFixture(): Promise<FnFixture> {
  const { shim, dataDir } = await openTestShim();
  const logs: string[] = [];
  (shim.functions as unknown as { opts: { log: (l: string) => void } }).opts.log = (l) => logs.push(l);
  const db = openDatabase(join(dataDir, 'warren.db'));
  const auth = new Auth(db);
  const adminToken = auth.ensureAdminToken(dataDir)!;
  const bound = await bindShim(shim);
  const gateway = await createGateway({ shim: bound.shim, db, dataDir, host: '127.0.0.1', port: 0, log: (l) => logs.push(`[gateway] ${l}`) });
  const admin = new WarrenClient({ url: gateway.url, token: adminToken, connections: 128 });
  return {
    shim,
    gateway,
    url: gateway.url,
    adminToken,
    admin,
    dataDir,
    auth,
    logs,
    async pool(spec) {
      await admin.functions.create(spec, { wait: true });
    },
    async close() {
      await admin.close().catch(() => undefined);
      await gateway.close();
      await bound.close();
      await shim.close();
      shim.layers.unmountUnused();
      db.close();
      await rm(dataDir, { recursive: true, force: true });
    },
  };
}
