/**
 * A real cluster on loopback for tests and benchmarks: etcd members (Debian's
 * etcd-server) with their own data dirs, `warren node` processes (each with
 * its own data dir and node id) and `warren gateway` processes. Every process
 * is stopped by its pid, every sandbox deleted and every data dir removed by
 * `close()`.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import { join, resolve } from 'node:path';
import { Etcd3 } from 'etcd3';
import { WarrenClient } from '../../src/sdk';
import { ClusterCredential } from '../../src/cluster/credential';
import { removeTree } from '../../src/shim/layers/sys';
import { HostNetwork } from '../../src/shim/network/host-net';
import { busyboxRootfs } from './warren';
import { tempDir } from './tmp';
import { waitFor } from './wait';

const CLI = resolve(__dirname, '../../src/cli/main.js');

/** Why cluster tests cannot run here, or null. */
export const etcdReason: string | null = (() => {
  if (process.getuid?.() !== 0) return 'needs root';
  try {
    execFileSync('etcd', ['--version'], { stdio: 'ignore' });
    return null;
  } catch {
    return 'etcd is not installed (apt-get install etcd-server; scripts/setup.sh installs it)';
  }
})();

export async function freePort(): Promise<number> {
  return new Promise((r, j) => {
    const s = net.createServer();
    s.once('error', j);
    s.listen(0, '127.0.0.1', () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => r(p));
    });
  });
}

function exited(child: ChildProcess): boolean {
  return child.exitCode !== null || child.signalCode !== null;
}

export function stopChild(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  return new Promise((r) => {
    if (exited(child)) return r();
    child.once('exit', () => r());
    child.kill(signal);
  });
}

export interface EtcdMember {
  name: string;
  clientUrl: string;
  peerUrl: string;
  dataDir: string;
  child: ChildProcess | null;
}

export class EtcdCluster {
  readonly members: EtcdMember[] = [];
  private initialCluster = '';

  constructor(private readonly root: string) {}

  get endpoints(): string[] {
    return this.members.map((m) => m.clientUrl);
  }

  async start(n = 3): Promise<void> {
    for (let i = 0; i < n; i++) {
      const name = `e${i}`;
      this.members.push({ name, clientUrl: `http://127.0.0.1:${await freePort()}`, peerUrl: `http://127.0.0.1:${await freePort()}`, dataDir: join(this.root, name), child: null });
    }
    this.initialCluster = this.members.map((m) => `${m.name}=${m.peerUrl}`).join(',');
    for (let i = 0; i < n; i++) this.spawn(i, 'new');
    await this.waitHealthy();
  }

  private spawn(i: number, state: 'new' | 'existing'): void {
    const m = this.members[i]!;
    mkdirSync(m.dataDir, { recursive: true });
    m.child = spawn(
      'etcd',
      [
        '--name', m.name,
        '--data-dir', m.dataDir,
        '--listen-client-urls', m.clientUrl,
        '--advertise-client-urls', m.clientUrl,
        '--listen-peer-urls', m.peerUrl,
        '--initial-advertise-peer-urls', m.peerUrl,
        '--initial-cluster', this.initialCluster,
        '--initial-cluster-token', `warren-test-${process.pid}`,
        '--initial-cluster-state', state,
        '--auto-compaction-retention', '1',
        '--log-level', 'error',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    m.child.stderr!.resume();
  }

  /** A quorum read succeeds through every running member. */
  async waitHealthy(timeoutMs = 20_000): Promise<void> {
    const running = this.members.filter((m) => m.child !== null && !exited(m.child));
    for (const m of running) {
      const c = new Etcd3({ hosts: [m.clientUrl], defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + 1000 }) });
      try {
        await waitFor(
          () =>
            c
              .get('/warren/health')
              .exec()
              .then(
                () => true,
                () => false,
              ),
          timeoutMs,
          `etcd member ${m.name}`,
          200,
        );
      } finally {
        c.close();
      }
    }
  }

  /** Index of the running member that is the leader now (throws when none is). */
  async leader(): Promise<number> {
    for (let i = 0; i < this.members.length; i++) {
      const m = this.members[i]!;
      if (!m.child || exited(m.child)) continue;
      const c = new Etcd3({ hosts: [m.clientUrl], defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + 1000 }) });
      try {
        const st = await c.maintenance.status();
        if (st.leader === st.header.member_id) return i;
      } catch {
        // a member that does not answer is not the leader
      } finally {
        c.close();
      }
    }
    throw new Error('no etcd member is the leader');
  }

  async kill(i: number): Promise<void> {
    const m = this.members[i]!;
    if (m.child) await stopChild(m.child, 'SIGKILL');
    m.child = null;
  }

  restart(i: number): void {
    this.spawn(i, 'existing');
  }

  /** A signal to every running member (SIGSTOP and SIGCONT: etcd silent for a while, nothing lost). */
  signalAll(signal: NodeJS.Signals): void {
    for (const m of this.members) if (m.child && !exited(m.child)) m.child.kill(signal);
  }

  async close(): Promise<void> {
    for (let i = 0; i < this.members.length; i++) await this.kill(i);
  }
}

export interface NodeProc {
  id: string;
  dataDir: string;
  url: string;
  child: ChildProcess;
  adminToken: string;
  args: string[];
  log: string[];
  network?: NodeNetwork;
}

export interface GatewayProc {
  url: string;
  child: ChildProcess;
  args: string[];
  log: string[];
}

function startProcess(args: string[], pattern: RegExp, log: string[], what: string, timeoutMs = 60_000): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((res, rej) => {
    let out = '';
    const timer = setTimeout(() => rej(new Error(`${what} did not start: ${out.slice(-4000)}`)), timeoutMs);
    const onData = (c: Buffer) => {
      out += c.toString();
      log.push(c.toString());
      if (log.length > 2000) log.splice(0, log.length - 2000);
      const m = pattern.exec(out);
      if (m) {
        clearTimeout(timer);
        res({ child, url: m[1]! });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code, sig) => {
      clearTimeout(timer);
      rej(new Error(`${what} exited (${code ?? sig}): ${out.slice(-4000)}`));
    });
  });
}

export interface NodeOptions {
  pool?: 'onprem' | 'overflow';
  labels?: Record<string, string>;
  maxSandboxes?: number;
  leaseTtlS?: number;
  createWindow?: number;
  /** Sandbox networking on the node's own bridge (else the node runs with --no-network). */
  network?: NodeNetwork;
  /** The node mounts layers it lacks from a registry on demand (--lazy-layers): it pulls what is staged for the overflow pool. */
  lazyLayers?: boolean;
  /** With lazyLayers: when staged images are pulled (`--pull-staged`). */
  pullStaged?: 'eager' | 'on-demand';
}

export interface NodeNetwork {
  bridge: string;
  subnet: string;
  nftTable: string;
  /** The DNS upstream of the node's DNS responder (HOST:PORT). */
  dnsUpstream: string;
}

export class ClusterFixture {
  readonly root = tempDir('warren-cluster-');
  readonly etcd = new EtcdCluster(join(this.root, 'etcd'));
  readonly credentialFile = join(this.root, 'cluster.credential');
  readonly adminTokenFile = join(this.root, 'admin.token');
  readonly nodes: NodeProc[] = [];
  readonly gateways: GatewayProc[] = [];
  credential!: ClusterCredential;
  adminToken = '';

  async startEtcd(n = 3): Promise<void> {
    this.credential = ClusterCredential.generate(this.credentialFile);
    // one busybox tree for every node: the same image digest everywhere
    await busyboxRootfs();
    await this.etcd.start(n);
  }

  node(id: string): NodeProc {
    const n = this.nodes.find((x) => x.id === id);
    if (!n) throw new Error(`no node ${id} in the fixture`);
    return n;
  }

  nodeArgs(id: string, dataDir: string, o: NodeOptions): string[] {
    const args = ['node', '--etcd', this.etcd.endpoints.join(','), '--cluster-credential', this.credentialFile, '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-default-image', '--node-id', id];
    const nw = o.network;
    if (nw) args.push('--bridge', nw.bridge, '--subnet', nw.subnet, '--nft-table', nw.nftTable, '--dns-upstream', nw.dnsUpstream, '--netns-warm', '0');
    else args.push('--no-network');
    args.push('--pool', o.pool ?? 'onprem', '--max-sandboxes', String(o.maxSandboxes ?? 1000), '--lease-ttl', String(o.leaseTtlS ?? 5));
    if (o.createWindow !== undefined) args.push('--create-window', String(o.createWindow));
    for (const [k, v] of Object.entries(o.labels ?? {})) args.push('--node-label', `${k}=${v}`);
    if (o.lazyLayers) args.push('--lazy-layers');
    if (o.pullStaged !== undefined) args.push('--pull-staged', o.pullStaged);
    return args;
  }

  /** Start a node (and import busybox into it on its first start). */
  async startNode(id: string, o: NodeOptions = {}): Promise<NodeProc> {
    const dataDir = join(this.root, `node-${id}`);
    const args = this.nodeArgs(id, dataDir, o);
    const log: string[] = [];
    const { child, url } = await startProcess(args, /listening on (http:\/\/[\d.:]+)/, log, `node ${id}`);
    const adminToken = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    const node: NodeProc = { id, dataDir, url, child, adminToken, args, log, ...(o.network ? { network: o.network } : {}) };
    const c = new WarrenClient({ url, token: adminToken });
    try {
      if (!(await c.images.list()).some((i) => i.name === 'busybox')) await c.images.import('busybox', await busyboxRootfs());
    } finally {
      await c.close();
    }
    this.nodes.push(node);
    return node;
  }

  /** Start a node again on its data dir (after a kill). */
  async restartNode(node: NodeProc): Promise<void> {
    const { child, url } = await startProcess(node.args, /listening on (http:\/\/[\d.:]+)/, node.log, `node ${node.id}`);
    node.child = child;
    node.url = url;
  }

  async startGateway(): Promise<GatewayProc> {
    const dataDir = join(this.root, `gateway-${this.gateways.length}`);
    const args = ['gateway', '--etcd', this.etcd.endpoints.join(','), '--cluster-credential', this.credentialFile, '--listen', `127.0.0.1:${await freePort()}`, '--admin-token-file', this.adminTokenFile, '--data-dir', dataDir];
    const log: string[] = [];
    const { child, url } = await startProcess(args, /gateway is listening on (http:\/\/[\d.:]+)/, log, 'gateway');
    this.adminToken = readFileSync(this.adminTokenFile, 'utf8').trim();
    const gw: GatewayProc = { url, child, args, log };
    this.gateways.push(gw);
    return gw;
  }

  async restartGateway(gw: GatewayProc): Promise<void> {
    const { child, url } = await startProcess(gw.args, /gateway is listening on (http:\/\/[\d.:]+)/, gw.log, 'gateway');
    gw.child = child;
    gw.url = url;
  }

  client(gw: GatewayProc = this.gateways[0]!, token = this.adminToken): WarrenClient {
    return new WarrenClient({ url: gw.url, token, connections: 8 });
  }

  /** Wait until every gateway sees these nodes registered and reporting the busybox image. */
  async waitNodes(ids: string[], timeoutMs = 20_000): Promise<void> {
    for (const gw of this.gateways) await this.waitNodesOn(gw, ids, timeoutMs);
  }

  private async waitNodesOn(gw: GatewayProc, ids: string[], timeoutMs: number): Promise<void> {
    const c = this.client(gw);
    try {
      await waitFor(
        async () => {
          const r = await c.requestJson<{ nodes: { id: string; fenced: boolean; images: string[] }[] }>('GET', '/v1/cluster/nodes').catch(() => ({ nodes: [] }));
          return ids.every((id) => r.nodes.some((n) => n.id === id && !n.fenced && n.images.includes('busybox')));
        },
        timeoutMs,
        `nodes ${ids.join(', ')} registered`,
        100,
      );
    } finally {
      await c.close();
    }
  }

  /**
   * Wait until every gateway places on these nodes as on empty ones: their records show no
   * sandboxes, and were written after what earlier tests created through the gateway (a record
   * older than a create does not count it, and the gateway keeps counting it as pending).
   */
  async waitIdle(ids: string[], timeoutMs = 60_000): Promise<void> {
    for (const gw of this.gateways) {
      const c = this.client(gw);
      try {
        await waitFor(
          async () => {
            const r = await c.requestJson<{ nodes: { id: string; used: { sandboxes: number; creating: number }; pending: number }[] }>('GET', '/v1/cluster/nodes').catch(() => ({ nodes: [] }));
            return ids.every((id) => r.nodes.some((n) => n.id === id && n.used.sandboxes === 0 && n.used.creating === 0 && n.pending === 0));
          },
          timeoutMs,
          `nodes ${ids.join(', ')} idle as ${gw.url} sees them`,
          100,
        );
      } finally {
        await c.close();
      }
    }
  }

  /** Delete every sandbox on every running node (through the node itself), stop everything, remove the data. */
  async close(): Promise<void> {
    for (const gw of this.gateways) await stopChild(gw.child);
    for (const n of this.nodes) {
      // a node a test killed is started again, so that it removes what it left on the host
      if (exited(n.child)) await this.restartNode(n).catch(() => undefined);
      if (exited(n.child)) continue;
      const c = new WarrenClient({ url: n.url, token: n.adminToken, connections: 8 });
      try {
        const all = await c.listSandboxes();
        let i = 0;
        await Promise.all(
          Array.from({ length: 8 }, async () => {
            while (i < all.length) await c.deleteSandbox(all[i++]!.id).catch(() => undefined);
          }),
        );
      } catch {
        /* the node is gone: its next start reconciles */
      } finally {
        await c.close();
      }
      await stopChild(n.child);
    }
    await this.etcd.close();
    // a node keeps its bridge, nft table and pinned programs across restarts (enforcement holds
    // without it): the fixture removes them, as an operator taking the node out would
    for (const n of this.nodes) {
      if (!n.network) continue;
      await new HostNetwork({ bridge: n.network.bridge, subnet: n.network.subnet, nftTable: n.network.nftTable }).teardown().catch(() => undefined);
      rmSync(join('/sys/fs/bpf/warren', n.id), { recursive: true, force: true });
    }
    // unmounts the layers the nodes left mounted, then deletes the data dirs
    removeTree(this.root);
  }
}
