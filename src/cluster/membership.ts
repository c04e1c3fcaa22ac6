/**
 * A gateway's view of the cluster's nodes, kept from etcd by watches: the
 * live node records (only those signed with the cluster credential), the
 * epochs of nodes that lost their lease, and the layers staged for the
 * overflow pool. A node whose lease expires is recorded as lost here (by
 * whichever gateway sees it first), so its sandboxes are reported lost to
 * their owners and jobs, never silently dropped.
 */
import { EventEmitter } from 'node:events';
import type { Etcd3 } from 'etcd3';
import { WarrenError } from '../errors';
import type { NodeDirectory } from './cluster-shim';
import type { ClusterCredential } from './credential';
import { RecentMisses, keys, nextRevision, parseJson, readPrefix, store } from './etcd';
import type { SandboxInfo, SandboxUsage } from '../shim/types';
import type { NodeRecord } from './placement';

/** A create of this gateway that the node's latest record may not count yet. */
interface Placed {
  /** Its createdAt, on the node's clock. */
  at: number;
  owner: string;
  cpu: number;
  memoryMb: number;
}

export class Membership extends EventEmitter implements NodeDirectory {
  readonly nodes = new Map<string, NodeRecord>();
  /** node -> lost epochs */
  readonly lost = new Map<string, Set<number>>();
  readonly staged = new Set<string>();
  /**
   * Sandboxes this gateway created on a node that the node's latest record does not count yet,
   * by their creation time on the node's clock. A record is about a second old: without these,
   * every create in that second sees the same load and power-of-k choices herd them onto
   * whichever node looked least loaded. A record counts every create admitted before its `at`
   * (as being created or as live), so one that arrives before or after the create's answer
   * neither drops nor double-counts it.
   */
  private readonly placedSince = new Map<string, Placed[]>();
  private watchers: { cancel(): Promise<void> }[] = [];

  constructor(
    private readonly etcd: Etcd3,
    private readonly credential: ClusterCredential,
    private readonly log: (line: string) => void,
  ) {
    super();
  }

  async start(): Promise<void> {
    const nodes = await readPrefix(this.etcd, keys.nodes);
    for (const kv of nodes.kvs) this.putNode(kv.value);
    const w = await this.etcd.watch().prefix(keys.nodes).startRevision(nextRevision(nodes.revision)).create();
    w.on('put', (kv) => this.putNode(kv.value.toString('utf8')));
    w.on('delete', (kv) => this.dropNode(kv.key.toString('utf8').slice(keys.nodes.length)));
    this.watchers.push(w);
    const lost = await readPrefix(this.etcd, keys.lostAll);
    for (const kv of lost.kvs) this.putLost(kv.key);
    const lw = await this.etcd.watch().prefix(keys.lostAll).startRevision(nextRevision(lost.revision)).create();
    lw.on('put', (kv) => this.putLost(kv.key.toString('utf8')));
    lw.on('delete', (kv) => this.dropLost(kv.key.toString('utf8')));
    this.watchers.push(lw);
    const staged = await readPrefix(this.etcd, keys.overflowStagedAll);
    for (const kv of staged.kvs) this.staged.add(kv.key.slice(keys.overflowStagedAll.length));
    const sw = await this.etcd.watch().prefix(keys.overflowStagedAll).startRevision(nextRevision(staged.revision)).create();
    sw.on('put', (kv) => this.staged.add(kv.key.toString('utf8').slice(keys.overflowStagedAll.length)));
    sw.on('delete', (kv) => this.staged.delete(kv.key.toString('utf8').slice(keys.overflowStagedAll.length)));
    this.watchers.push(sw);
  }

  private putNode(value: string): void {
    const rec = this.credential.verify(parseJson<NodeRecord & { sig: string }>(value));
    if (rec === null) {
      this.log('cluster: ignoring a node record without a valid cluster signature');
      return;
    }
    this.nodes.set(rec.id, rec);
    const placed = this.placedSince.get(rec.id);
    if (placed !== undefined) {
      const left = placed.filter((p) => p.at >= rec.at);
      if (left.length > 0) this.placedSince.set(rec.id, left);
      else this.placedSince.delete(rec.id);
    }
    this.emit('change');
  }

  private readonly misses = new RecentMisses();

  /**
   * A node record as etcd has it now, for a node this copy does not know: it may have registered
   * through a watch event still on its way. Misses are remembered ({@link RecentMisses}), so ids
   * naming nodes that do not exist cost etcd one read per node name and second at most.
   */
  async readNode(id: string): Promise<NodeRecord | undefined> {
    if (this.misses.has(id)) return undefined;
    const v = await store('read node', () => this.etcd.get(keys.node(id)).string());
    if (v !== null) this.putNode(v);
    const rec = this.nodes.get(id);
    if (rec === undefined) this.misses.add(id);
    return rec;
  }

  /** This gateway created sandbox `info` on `node` (its createdAt is the node's clock). */
  notePlaced(node: string, info: Pick<SandboxInfo, 'createdAt' | 'owner' | 'limits'>): void {
    const at = Date.parse(info.createdAt);
    const rec = this.nodes.get(node);
    if (rec !== undefined && rec.at > at) return; // the latest record counts it already
    const p: Placed = { at, owner: info.owner, cpu: info.limits.cpu, memoryMb: info.limits.memoryMb };
    const list = this.placedSince.get(node);
    if (list) list.push(p);
    else this.placedSince.set(node, [p]);
  }

  /** Per node, the creates of this gateway its latest record does not count. */
  *uncountedCreates(): Iterable<[string, number]> {
    for (const [n, l] of this.placedSince) yield [n, l.length];
  }

  /** What the creates of `owner` through this gateway add to the node records, which do not count them yet. */
  uncountedUsage(owner: string): SandboxUsage {
    const u: SandboxUsage = { sandboxes: 0, cpu: 0, memoryMb: 0 };
    for (const list of this.placedSince.values()) {
      for (const p of list) {
        if (p.owner !== owner) continue;
        u.sandboxes++;
        u.cpu += p.cpu;
        u.memoryMb += p.memoryMb;
      }
    }
    return u;
  }

  private putLost(key: string): void {
    const m = /\/lost\/([^/]+)\/(\d+)$/.exec(key);
    if (!m) return;
    let s = this.lost.get(m[1]!);
    if (!s) this.lost.set(m[1]!, (s = new Set()));
    s.add(Number(m[2]));
    this.emit('lost', m[1]!, Number(m[2]));
  }

  /** A lost epoch forgotten (forget): its sandboxes are no longer reported lost, only not found. */
  private dropLost(key: string): void {
    const m = /\/lost\/([^/]+)\/(\d+)$/.exec(key);
    if (!m) return;
    const s = this.lost.get(m[1]!);
    s?.delete(Number(m[2]));
    if (s?.size === 0) this.lost.delete(m[1]!);
  }

  /**
   * Forget a node that is gone for good: its lost epochs (so its sandboxes answer SANDBOX_NOT_FOUND
   * instead of SANDBOX_LOST) and its quota blocks, which counted for nothing while it was not live
   * and would otherwise stay in etcd. Every delete compares the node's record key absent: a node
   * that holds a lease again is refused with NODE_LIVE and loses nothing (it gives back its own
   * blocks when it returns). A node that comes back after it was forgotten is like a new one: it
   * finds no block and asks etcd, as a node that joins does.
   */
  async forget(node: string): Promise<{ node: string; lostEpochs: number[]; quotaBlocks: number }> {
    const live = () => new WarrenError('NODE_LIVE', `node ${node} holds a lease: only a node that is gone can be forgotten`, { node });
    if (this.nodes.has(node)) throw live();
    const lost = await store('read lost epochs', () => readPrefix(this.etcd, keys.lostOf(node)));
    const blocks = (await store('read quota blocks', () => readPrefix(this.etcd, keys.quotaBlocksAll))).kvs.filter((kv) => kv.key.slice(keys.quotaBlocksAll.length).split('/')[1] === node);
    const doomed = [...lost.kvs, ...blocks].map((kv) => kv.key);
    if (doomed.length === 0) {
      if ((await store('read node', () => this.etcd.get(keys.node(node)).string())) !== null) throw live();
      throw new WarrenError('NOT_FOUND', `the cluster keeps nothing of node ${node} (no lost epoch, no quota block)`, { node });
    }
    // etcd bounds the operations of one transaction (128 by default)
    for (let i = 0; i < doomed.length; i += 100) {
      const res = await store('forget node', () =>
        this.etcd
          .if(keys.node(node), 'Create', '==', 0)
          .then(...doomed.slice(i, i + 100).map((k) => this.etcd.delete().key(k)))
          .commit(),
      );
      if (!res.succeeded) throw live();
    }
    for (const kv of lost.kvs) this.dropLost(kv.key);
    const lostEpochs = lost.kvs.map((kv) => Number(kv.key.slice(keys.lostOf(node).length))).sort((a, b) => a - b);
    this.log(`cluster: node ${node} forgotten (lost epochs ${lostEpochs.join(', ') || 'none'}, ${blocks.length} quota block(s))`);
    return { node, lostEpochs, quotaBlocks: blocks.length };
  }

  /** The lease of a node expired: its sandboxes are lost. One gateway records it (create-if-absent). */
  private dropNode(id: string): void {
    const prev = this.nodes.get(id);
    this.nodes.delete(id);
    this.placedSince.delete(id);
    this.emit('change');
    if (!prev) return;
    const key = keys.lost(id, prev.epoch);
    this.log(`cluster: node ${id} lost its lease (epoch ${prev.epoch}); its sandboxes are lost`);
    this.putLost(key);
    void this.etcd
      .if(key, 'Create', '==', 0)
      .then(this.etcd.put(key).value(JSON.stringify({ node: id, epoch: prev.epoch, at: Date.now(), by: 'gateway' })))
      .commit()
      .catch((err: Error) => this.log(`cluster: cannot record the loss of ${id}: ${err.message}`));
  }

  isLost(node: string, epoch: number): boolean {
    return this.lost.get(node)?.has(epoch) ?? false;
  }

  live(): NodeRecord[] {
    return [...this.nodes.values()];
  }

  async close(): Promise<void> {
    await Promise.all(this.watchers.map((w) => w.cancel().catch(() => undefined)));
  }
}
