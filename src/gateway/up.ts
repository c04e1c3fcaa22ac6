/**
 * `warren up` in one call: open the node's database and shim, install
 * telemetry when asked, create the admin token on first start, and serve the
 * gateway. Sandboxes and shell sessions outlive `close()`; a later start
 * re-adopts them.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { openDatabase } from '../state/db';
import { WarrenError } from '../errors';
import { type NetworkConfig, type ShimNode, openShim } from '../shim/node';
import { feature } from '../features';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../security/confinement';
import { LocalShim } from '../shim/local';
import { type ShimServer, serveShim } from '../shim/remote/server';
import type { ImportProgress } from '../shim/types';
import { type Telemetry, initTelemetry } from '../telemetry';
import type { LifecycleOptions } from '../shim/lifecycle/manager';
import { raiseHostLimits } from '../shim/host-tunables';
import type { CapacityOptions } from '../shim/capacity';
import { DEFAULT_PREPARED, type PreparedOptions } from '../shim/prepared';
import { Auth, type Quota } from './auth';
import { type GatewayOptions, createGateway } from './server';
import { ClusterCredential } from '../cluster/credential';
import { type EtcdConfig, openEtcd } from '../cluster/etcd';
import { NodeAgent, admissionShim } from '../cluster/node-agent';
import type { Pool } from '../cluster/placement';

export interface StartOptions {
  dataDir: string;
  host: string;
  port: number;
  /** Also serve the node over the shim protocol (docs/shim-protocol.md) for gateways elsewhere. */
  shimListen?: { host: string; port: number; token: string };
  /** OTLP/HTTP collector base URL (traces and metrics). */
  otlpEndpoint?: string;
  /** Progress of first-start work (building the default image). */
  onProgress?: (p: ImportProgress) => void;
  /** Build the Debian "default" image when missing (default true). */
  ensureDefaultImage?: boolean;
  allowedOrigins?: string[];
  log?: (line: string) => void;
  nodeId?: string;
  /** Lifetime policies, pause (zram swap), pack_diff scrub policy (src/shim/lifecycle). */
  lifecycle?: LifecycleOptions;
  /** Registries (auth, TLS), default pull mode and lazy chunk cache bound of the node (docs/images.md). */
  layers?: Pick<import('../shim/node').ShimOptions, 'registries' | 'pullMode' | 'lazyCacheBytes'>;
  /** Quota of accounts without their own. */
  defaultQuota?: Quota;
  /** the security policy directory (default: the bundled policies/); audit log in <dataDir>/policy-audit.log. */
  policyDir?: string;
  /** sandbox networking (bridge, NAT, eBPF egress, DNS); false = loopback-only sandboxes.
   *  Default: on where the kernel and tools allow it (/v1/features: egress-bpf, sandbox-network). */
  network?: NetworkConfig | false;
  /** Serve the E2B-compatible surface on this port (0: ephemeral); absent: not served (docs/e2b.md). */
  e2bPort?: number;
  /** Back-pressure limits of shell connections. */
  shell?: GatewayOptions['shell'];
  /** Idempotency keys: window, stored output bound (docs/idempotency.md). */
  idempotency?: GatewayOptions['idempotency'];
  /** Reserves and caps of the node's host-capacity admission (default: WARREN_HOST_TASKS_MAX caps host tasks). */
  capacity?: CapacityOptions;
  /** Join a cluster as a node (`warren node`): register in etcd, run job shares, take the distributed policy. */
  cluster?: NodeClusterOptions;
  /** Creates made ahead of time for the shapes of recent creates (default: DEFAULT_PREPARED; perShape 0 turns it off). */
  prepared?: Partial<PreparedOptions>;
}

export interface NodeClusterOptions {
  etcd: EtcdConfig;
  credentialFile: string;
  pool: Pool;
  labels: Record<string, string>;
  maxSandboxes: number;
  leaseTtlS?: number;
  createWindow?: number;
  /** URL this node's API is reached at (default: the listen URL). */
  advertiseUrl?: string;
  /** URL gateways reach this node's shim protocol at (default: its listening port on the host of advertiseUrl). */
  advertiseShimUrl?: string;
  /** This node mounts layers it lacks from the registry on demand (placement may send it requests for staged layers). */
  lazyLayers?: boolean;
  /** When a lazy node pulls staged images: as they are staged (default) or at the first create that needs one. */
  pullStaged?: 'eager' | 'on-demand';
}

export interface Warren {
  url: string;
  /** Base URL of the E2B surface when served (E2B_SANDBOX_URL; E2B_API_URL is this + /e2b). */
  e2bUrl?: string;
  /** The admin token on the first start (print it once); null on later starts. */
  adminToken: string | null;
  /** Base URL of the shim protocol, when served. */
  shimUrl?: string;
  close(): Promise<void>;
}

export async function startWarren(opts: StartOptions): Promise<Warren> {
  mkdirSync(opts.dataDir, { recursive: true, mode: 0o700 });
  const db = openDatabase(join(opts.dataDir, 'warren.db'));
  let shim: ShimNode | null = null;
  let telemetry: Telemetry | null = null;
  try {
    // Create the admin token before the (possibly long) default image build, so
    // the operator gets it even if the build fails.
    const adminToken = new Auth(db).ensureAdminToken(opts.dataDir);
    // the policy in force; an invalid policy directory stops the start (nothing to fall back to yet)
    // A cluster node keeps its own copy of the policy directory: the policy distributed through etcd is written there.
    const credential = opts.cluster ? ClusterCredential.readFile(opts.cluster.credentialFile) : null;
    const policyDir = opts.policyDir ?? (opts.cluster ? NodeAgent.policyDir(opts.dataDir) : BUNDLED_POLICY_DIR);
    usePolicyStore(new PolicyStore(policyDir, join(opts.dataDir, 'policy-audit.log')));
    const shimOpts: Parameters<typeof openShim>[0] = {
      dataDir: opts.dataDir,
      db,
      onProgress: opts.onProgress,
      ensureDefaultImage: opts.ensureDefaultImage ?? true,
    };
    if (opts.nodeId !== undefined) shimOpts.nodeId = opts.nodeId;
    if (opts.lifecycle !== undefined) shimOpts.lifecycle = opts.lifecycle;
    if (opts.layers !== undefined) Object.assign(shimOpts, opts.layers);
    if (opts.log !== undefined) shimOpts.log = opts.log;
    shimOpts.prepared = { ...DEFAULT_PREPARED, ...opts.prepared };
    // kernel.pid_max and the namespace counts are raised for thousands of sandboxes; what cannot
    // be raised (RLIMIT_NOFILE's hard limit without CAP_SYS_RESOURCE) is said here and in /v1/features.
    for (const t of raiseHostLimits()) {
      if (t.status === 'raised') opts.log?.(`warren: raised ${t.name} to ${t.value}`);
      else if (t.status === 'short') opts.log?.(`warren: ${t.name} is ${t.value ?? '?'} (wanted ${t.wanted}): ${t.reason}`);
    }
    const capacity: CapacityOptions = { ...opts.capacity };
    const tasksMax = Number(process.env.WARREN_HOST_TASKS_MAX);
    if (capacity.tasksMax === undefined && Number.isInteger(tasksMax) && tasksMax > 0) capacity.tasksMax = tasksMax;
    shimOpts.capacity = capacity;
    if (opts.network !== false) {
      const missing = (['egress-bpf', 'sandbox-network'] as const).map((f) => [f, feature(f)] as const).filter(([, st]) => !st.supported);
      if (missing.length === 0) shimOpts.network = opts.network ?? {};
      else opts.log?.(`warren: sandbox networking is off (${missing.map(([f, st]) => `${f}: ${st.reason}`).join('; ')}); sandboxes are loopback-only`);
    }
    shim = await openShim(shimOpts);
    if (opts.otlpEndpoint) telemetry = initTelemetry({ otlpEndpoint: opts.otlpEndpoint, nodeId: shim.nodeId });
    let agent: NodeAgent | null = null;
    const served = opts.cluster
      ? admissionShim(new LocalShim(shim), async (spec) => {
          if (agent === null) throw new WarrenError('NODE_FENCED', 'this node has not registered in its cluster yet');
          const done = await agent.admitOne(spec);
          try {
            await agent.ensureStaged(spec);
          } catch (err) {
            done(false);
            throw err;
          }
          return done;
        })
      : new LocalShim(shim);
    const gatewayOpts: Parameters<typeof createGateway>[0] = { shim: served, db, dataDir: opts.dataDir, host: opts.host, port: opts.port };
    if (opts.allowedOrigins !== undefined) gatewayOpts.allowedOrigins = opts.allowedOrigins;
    if (opts.log !== undefined) gatewayOpts.log = opts.log;
    if (opts.defaultQuota !== undefined) gatewayOpts.defaultQuota = opts.defaultQuota;
    if (opts.e2bPort !== undefined) gatewayOpts.e2bPort = opts.e2bPort;
    if (opts.shell !== undefined) gatewayOpts.shell = opts.shell;
    if (opts.idempotency !== undefined) gatewayOpts.idempotency = opts.idempotency;
    const gateway = await createGateway(gatewayOpts);
    let shimServer: ShimServer | null = null;
    // A cluster node always serves the shim protocol: it is how gateways reach it. Its token is
    // derived from the cluster credential, so the gateways need nothing but the credential.
    const shimListen = credential ? { host: opts.shimListen?.host ?? opts.host, port: opts.shimListen?.port ?? 0, token: credential.shimToken(shim.nodeId) } : opts.shimListen;
    if (shimListen) {
      try {
        shimServer = await serveShim({ shim: served, token: shimListen.token, host: shimListen.host, port: shimListen.port, ...(opts.log ? { log: opts.log } : {}) });
      } catch (err) {
        await gateway.close();
        throw err;
      }
    }
    const openShimRef = shim;
    const etcd = opts.cluster && credential ? openEtcd(opts.cluster.etcd) : null;
    if (opts.cluster && credential && etcd) {
      const c = opts.cluster;
      const agentOpts: ConstructorParameters<typeof NodeAgent>[0] = { etcd, credential, shim, url: c.advertiseUrl ?? gateway.url, shimUrl: advertisedShimUrl(shimServer!.url, c), dataDir: opts.dataDir, pool: c.pool, labels: c.labels, maxSandboxes: c.maxSandboxes };
      if (c.leaseTtlS !== undefined) agentOpts.leaseTtlS = c.leaseTtlS;
      if (c.createWindow !== undefined) agentOpts.createWindow = c.createWindow;
      if (c.lazyLayers) agentOpts.lazyLayers = () => true;
      if (c.pullStaged !== undefined) agentOpts.pullStaged = c.pullStaged;
      if (opts.log !== undefined) agentOpts.log = opts.log;
      agent = new NodeAgent(agentOpts);
      try {
        await agent.start();
      } catch (err) {
        await agent.close().catch(() => undefined);
        etcd.close();
        await shimServer?.close();
        await gateway.close();
        throw err;
      }
    }
    let closing: Promise<void> | null = null;
    return {
      url: gateway.url,
      ...(gateway.e2bUrl !== undefined ? { e2bUrl: gateway.e2bUrl } : {}),
      adminToken,
      ...(shimServer ? { shimUrl: shimServer.url } : {}),
      close() {
        closing ??= (async () => {
          await agent?.close();
          etcd?.close();
          await shimServer?.close();
          await gateway.close();
          await openShimRef.close();
          if (telemetry) await telemetry.shutdown().catch(() => undefined);
          db.close();
        })();
        return closing;
      },
    };
  } catch (err) {
    if (shim) await shim.close().catch(() => undefined);
    if (telemetry) await telemetry.shutdown().catch(() => undefined);
    db.close();
    throw err;
  }
}

/** The shim protocol's URL as gateways reach it: its own advertised URL, else the listening one on the advertised host. */
function advertisedShimUrl(listening: string, c: NodeClusterOptions): string {
  if (c.advertiseShimUrl !== undefined) return c.advertiseShimUrl;
  if (c.advertiseUrl === undefined) return listening;
  const u = new URL(listening);
  u.hostname = new URL(c.advertiseUrl).hostname;
  return u.toString().replace(/\/$/, '');
}
