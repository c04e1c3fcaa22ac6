/**
 * ClusterShim without a real node: routing by id prefix, lost and unknown
 * nodes, pages merged across nodes in id order, and nodes that misbehave (one
 * that accepts connections and never answers, one that claims another node's
 * identity). The nodes here are small HTTP servers speaking the shim
 * protocol's hello and call routes with canned answers; the real node end is
 * covered by the cluster-bound and cluster integration tests.
 */
import http from 'node:http';
import net from 'node:net';
import test from 'ava';
import { ClusterShim, type NodeDirectory } from '../../src/cluster/cluster-shim';
import { ClusterCredential } from '../../src/cluster/credential';
import type { NodeRecord } from '../../src/cluster/placement';
import { WarrenError } from '../../src/errors';
import type { SandboxInfo } from '../../src/shim/types';
import { SHIM_BASE, SHIM_PROTOCOL_VERSION, encode } from '../../src/shim/remote/wire';

const credential = ClusterCredential.fromSecret('c'.repeat(40));

function record(id: string, shim: string, epoch = 1): NodeRecord {
  return {
    id,
    url: shim,
    shim,
    pool: 'onprem',
    labels: {},
    epoch,
    capacity: { sandboxes: 100, cpus: 2, memoryMb: 4096 },
    used: { sandboxes: 0, creating: 0, memoryAvailableMb: 4096, load1: 0 },
    backends: ['container'],
    images: [{ name: 'busybox', digest: 'sha256:bb', kind: 'base', layers: ['sha256:bb'] }],
    layers: ['sha256:bb'],
    lazy: false,
    accounts: {},
    fenced: false,
    at: Date.now(),
  };
}

function directory(nodes: NodeRecord[], lost: Record<string, number[]> = {}, readNode: (id: string) => NodeRecord | undefined = () => undefined): NodeDirectory & { reads: string[] } {
  const reads: string[] = [];
  return {
    reads,
    nodes: new Map(nodes.map((n) => [n.id, n])),
    lost: new Map(Object.entries(lost).map(([n, e]) => [n, new Set(e)])),
    staged: new Set(),
    live: () => nodes,
    readNode: async (id) => {
      reads.push(id);
      return readNode(id);
    },
    notePlaced: () => undefined,
    uncountedCreates: () => [],
    uncountedUsage: () => ({ sandboxes: 0, cpu: 0, memoryMb: 0 }),
  };
}

function shimOf(members: NodeDirectory, fanOutTimeoutMs = 300): ClusterShim {
  return new ClusterShim({ members, credential, usageOf: () => ({ sandboxes: 0, cpu: 0, memoryMb: 0 }), fanOutTimeoutMs, log: () => undefined });
}

function info(id: string): SandboxInfo {
  return { id, backend: 'container', image: 'busybox', layers: [], state: 'running', node: id.split('-')[0]!, createdAt: new Date().toISOString(), owner: 'acct-1', limits: { cpu: 1, memoryMb: 64, pids: 64, diskMb: null }, priority: 'normal', labels: {} };
}

/** A node speaking the shim protocol: hello as `nodeId` (with its own token), and `calls` answered from the table. */
async function fakeNode(nodeId: string, calls: Record<string, (args: unknown[]) => unknown>, claims = nodeId): Promise<{ url: string; seen: string[]; close(): Promise<void> }> {
  const seen: string[] = [];
  const token = `Bearer ${credential.shimToken(nodeId)}`;
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const send = (status: number, body: unknown) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      if (req.headers.authorization !== token) return send(401, { error: { code: 'UNAUTHENTICATED', message: 'wrong token' } });
      if (req.url === `${SHIM_BASE}/hello`) return send(200, { protocol: SHIM_PROTOCOL_VERSION, nodeId: claims, functions: false, optional: [] });
      const method = req.url?.slice(`${SHIM_BASE}/call/`.length) ?? '';
      seen.push(method);
      const fn = calls[method];
      if (!fn) return send(404, { error: { code: 'NOT_FOUND', message: `no ${method}` } });
      const args = (JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}') as { args?: unknown[] }).args ?? [];
      try {
        send(200, { result: encode(fn(args)) });
      } catch (err) {
        const e = err as WarrenError;
        send(e.status ?? 500, { error: { code: e.code, message: e.message } });
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    seen,
    close: () => new Promise<void>((r) => server.close(() => r())),
  };
}

/** Accepts connections and never answers: a stopped or partitioned node. */
async function blackHole(): Promise<{ url: string; close(): void }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => {
    sockets.add(s);
    s.on('error', () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`,
    close() {
      for (const s of sockets) s.destroy();
      server.close();
    },
  };
}

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    return err instanceof WarrenError ? err.code : String(err);
  }
}

test('ids are routed by their prefix: unknown and malformed ids are not found, a lost node answers SANDBOX_LOST', async (t) => {
  const a = await fakeNode('a', { getSandbox: ([id]) => info(String(id)) });
  const members = directory([record('a', a.url)], { gone: [1] });
  const shim = shimOf(members);
  try {
    t.is((await shim.getSandbox('a-0123456789abcdef')).id, 'a-0123456789abcdef');
    t.is(await codeOf(shim.getSandbox('zz-0123456789abcdef')), 'SANDBOX_NOT_FOUND');
    t.deepEqual(members.reads, ['zz'], 'a node this copy does not know is read once before the answer');
    t.is(await codeOf(shim.getSandbox('../etc-0123456789abcdef')), 'SANDBOX_NOT_FOUND');
    t.is(await codeOf(shim.exec('gone-0123456789abcdef', { cmd: ['true'] })), 'SANDBOX_LOST');
    t.deepEqual(a.seen, ['getSandbox'], 'nothing but the one routed call reached the node');
  } finally {
    await shim.close();
    await a.close();
  }
});

test('pages are merged across nodes in id order, each sandbox once', async (t) => {
  const ids: Record<string, string[]> = {
    a: ['a-0000000000000001', 'a-0000000000000003', 'a-0000000000000005'],
    b: ['b-0000000000000002', 'b-0000000000000004'],
  };
  const page = (node: string) => (args: unknown[]) => {
    const p = args[1] as { limit: number; after?: string };
    const rest = ids[node]!.filter((id) => p.after === undefined || id > p.after);
    const out = rest.slice(0, p.limit);
    return { sandboxes: out.map(info), ...(rest.length > p.limit ? { next: out.at(-1) } : {}) };
  };
  const a = await fakeNode('a', { listSandboxesPage: page('a') });
  const b = await fakeNode('b', { listSandboxesPage: page('b') });
  const shim = shimOf(directory([record('a', a.url), record('b', b.url)]));
  try {
    const got: string[] = [];
    let after: string | undefined;
    for (let i = 0; i < 10; i++) {
      const p = await shim.listSandboxesPage({}, after === undefined ? { limit: 2 } : { limit: 2, after });
      t.true(p.sandboxes.length <= 2);
      got.push(...p.sandboxes.map((s) => s.id));
      if (p.next === undefined) break;
      after = p.next;
    }
    t.deepEqual(got, [...ids.a!, ...ids.b!].sort());
  } finally {
    await shim.close();
    await a.close();
    await b.close();
  }
});

test('a node that never answers is left out of a list within the deadline and named as unreachable', async (t) => {
  const a = await fakeNode('a', { listSandboxes: () => [info('a-0000000000000001')], listSandboxesPage: () => ({ sandboxes: [info('a-0000000000000001')] }) });
  const hole = await blackHole();
  const shim = shimOf(directory([record('a', a.url), record('stuck', hole.url)]), 300);
  try {
    const started = Date.now();
    const list = await shim.listSandboxes({});
    t.deepEqual(
      list.map((s) => s.id),
      ['a-0000000000000001'],
    );
    t.deepEqual(list.unreachable, ['stuck']);
    t.true(Date.now() - started < 5000, `the list took ${Date.now() - started} ms`);
    const page = await shim.listSandboxesPage({}, { limit: 10 });
    t.deepEqual(page.sandboxes.map((s) => s.id), ['a-0000000000000001']);
    t.deepEqual(page.unreachable, ['stuck']);
  } finally {
    await shim.close();
    hole.close();
    await a.close();
  }
});

test('a host that claims to be another node, or does not take the node token, is not called', async (t) => {
  // it holds the token of "a" but says it is "b": a record pointing at the wrong host
  const liar = await fakeNode('a', { getSandbox: ([id]) => info(String(id)) }, 'b');
  // it is "c", with c's token: a record for node "a" pointing at it fails the token check
  const other = await fakeNode('c', { getSandbox: ([id]) => info(String(id)) });
  try {
    const s1 = shimOf(directory([record('a', liar.url)]));
    t.is(await codeOf(s1.getSandbox('a-0123456789abcdef')), 'UNAVAILABLE');
    t.deepEqual(liar.seen, []);
    await s1.close();
    const s2 = shimOf(directory([record('a', other.url)]));
    t.is(await codeOf(s2.getSandbox('a-0123456789abcdef')), 'UNAUTHENTICATED');
    t.deepEqual(other.seen, []);
    await s2.close();
  } finally {
    await liar.close();
    await other.close();
  }
});

test('a create refused by a full node is placed on the next one; an error of the request itself is answered as it is', async (t) => {
  const full = await fakeNode('a', {
    createSandbox: () => {
      throw new WarrenError('RESOURCE_EXHAUSTED', 'full');
    },
  });
  const ok = await fakeNode('b', { createSandbox: () => info('b-0000000000000009') });
  const shim = shimOf(directory([record('a', full.url), record('b', ok.url)]));
  try {
    const spec = { image: 'busybox', backend: 'container', workspaces: [], toolkits: [], owner: 'acct-1', cpu: 1, memoryMb: 64 } as never;
    for (let i = 0; i < 4; i++) {
      const r = await shim.createSandbox(spec, undefined, { placement: {}, explain: true });
      t.is(r.id, 'b-0000000000000009');
      const refused = (r.placement as { refusedBy: string[] }).refusedBy;
      t.true(refused.length === 0 || (refused.length === 1 && refused[0] === 'a'));
    }
    t.is(await codeOf(shim.createSandbox(spec, undefined, { placement: { nodes: ['a'] } })), 'RESOURCE_EXHAUSTED');
    const bad = await fakeNode('c', {
      createSandbox: () => {
        throw new WarrenError('IMAGE_NOT_FOUND', 'no such image');
      },
    });
    const s2 = shimOf(directory([record('c', bad.url), record('b', ok.url)]));
    t.is(await codeOf(s2.createSandbox(spec, undefined, { placement: { nodes: ['c'] } })), 'IMAGE_NOT_FOUND');
    await s2.close();
    await bad.close();
  } finally {
    await shim.close();
    await full.close();
    await ok.close();
  }
});
