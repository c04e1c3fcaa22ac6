/**
 * The Shim contract a test gateway talks to its node through. In-process
 * (LocalShim) by default; with WARREN_TEST_SHIM=remote the node is served
 * over the shim protocol on loopback and the gateway holds a RemoteShim, so
 * the same gateway tests pass over both bindings (test/integration/remote).
 * With WARREN_TEST_SHIM=cluster the gateway holds a ClusterShim of one node,
 * reached as a cluster gateway reaches its nodes: through the shim protocol
 * with the node's token derived from a cluster credential, every id routed by
 * its prefix and every create placed (test/integration/cluster-bound). The
 * node's record is read live from the node, where etcd would bring it about
 * a second late.
 */
import { randomBytes } from 'node:crypto';
import { type NodeDirectory, ClusterShim } from '../../src/cluster/cluster-shim';
import { ClusterCredential } from '../../src/cluster/credential';
import type { NodeRecord } from '../../src/cluster/placement';
import { LocalShim } from '../../src/shim/local';
import type { ShimNode } from '../../src/shim/node';
import { RemoteShim } from '../../src/shim/remote/client';
import { serveShim } from '../../src/shim/remote/server';
import type { Shim } from '../../src/shim/types';

export interface BoundShim {
  shim: Shim;
  /** Stops serving the node (remote); the node itself stays open. */
  close(): Promise<void>;
  /** Cuts the gateway's stream connections to the node as a network failure would; null in process (there are none). */
  cutStreams: (() => Promise<number>) | null;
}

let remoteCount = 0;
let clusterCount = 0;

/** How many gateways of this test process were bound through the shim protocol. */
export function remoteBindings(): number {
  return remoteCount;
}

/** How many gateways of this test process were bound through a ClusterShim. */
export function clusterBindings(): number {
  return clusterCount;
}

export async function bindShim(node: ShimNode, mode = process.env.WARREN_TEST_SHIM): Promise<BoundShim> {
  const local = new LocalShim(node);
  if (mode === 'cluster') return bindCluster(node, local);
  if (mode !== 'remote') return { shim: local, close: async () => undefined, cutStreams: null };
  remoteCount++;
  const token = randomBytes(24).toString('hex');
  const server = await serveShim({ shim: local, token, host: '127.0.0.1', port: 0 });
  let shim: RemoteShim;
  try {
    shim = await RemoteShim.connect({ url: server.url, token });
  } catch (err) {
    await server.close();
    throw err;
  }
  return {
    shim,
    async close() {
      await shim.close();
      await server.close();
    },
    cutStreams: async () => shim.cutStreams(),
  };
}

async function bindCluster(node: ShimNode, local: LocalShim): Promise<BoundShim> {
  clusterCount++;
  const credential = ClusterCredential.fromSecret(randomBytes(32).toString('hex'));
  const server = await serveShim({ shim: local, token: credential.shimToken(node.nodeId), host: '127.0.0.1', port: 0 });
  const record = (): NodeRecord => {
    const features = node.features();
    const accounts: Record<string, number> = {};
    const resources: Record<string, { cpu: number; memoryMb: number }> = {};
    for (const s of node.listSandboxes()) {
      if (s.state === 'stopped' || s.state === 'failed') continue;
      accounts[s.owner] = (accounts[s.owner] ?? 0) + 1;
      const r = (resources[s.owner] ??= { cpu: 0, memoryMb: 0 });
      r.cpu += s.limits.cpu;
      r.memoryMb += s.limits.memoryMb;
    }
    return {
      id: node.nodeId,
      url: server.url,
      shim: server.url,
      pool: 'onprem',
      labels: {},
      epoch: 1,
      capacity: { sandboxes: 100_000, cpus: features.host?.cpus ?? 1, memoryMb: features.host?.memoryMb ?? 1024 },
      used: { sandboxes: node.listSandboxes().length, creating: 0, memoryAvailableMb: 0, load1: 0 },
      backends: (Object.keys(features.backends) as (keyof typeof features.backends)[]).filter((b) => features.backends[b]?.available),
      images: node.listImages().map((i) => ({ name: i.name, digest: i.digest, kind: i.kind, layers: i.layers })),
      // as the node agent counts them: every layer of every image the node lists
      layers: [...new Set(node.listImages().flatMap((i) => (i.layers.length > 0 ? i.layers : [i.digest])))],
      lazy: false,
      accounts,
      resources,
      fenced: false,
      at: Date.now(),
    };
  };
  const nodes = {
    get: (id: string) => (id === node.nodeId ? record() : undefined),
    has: (id: string) => id === node.nodeId,
    get size() {
      return 1;
    },
    *values() {
      yield record();
    },
  } as unknown as ReadonlyMap<string, NodeRecord>;
  const directory: NodeDirectory = {
    nodes,
    lost: new Map(),
    staged: new Set(),
    live: () => [record()],
    readNode: async () => undefined,
    notePlaced: () => undefined,
    uncountedCreates: () => [],
    uncountedUsage: () => ({ sandboxes: 0, cpu: 0, memoryMb: 0 }),
  };
  const accountsNow = (owner: string) => {
    const rec = record();
    return { sandboxes: rec.accounts[owner] ?? 0, cpu: rec.resources?.[owner]?.cpu ?? 0, memoryMb: rec.resources?.[owner]?.memoryMb ?? 0 };
  };
  const shim = new ClusterShim({ name: node.nodeId, members: directory, credential, usageOf: (owner) => accountsNow(owner), log: () => undefined });
  return {
    shim,
    async close() {
      await shim.close();
      await server.close();
    },
    cutStreams: async () => (await shim.node(record())).cutStreams(),
  };
}
