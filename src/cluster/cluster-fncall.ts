/**
 * FnCall across a cluster: a pool lives on one node, and every call about it
 * goes there. Which node holds a pool is asked of the nodes (their pool
 * lists) and remembered; nothing about pools is kept in etcd, so a lost node
 * takes its pools with it (their calls answer NOT_FOUND, as for a deleted
 * pool). A new pool goes to the least loaded node that has FnCall, preferring
 * nodes that hold its image; run_code and run_jupyter go to such a node too
 * (each node makes its run-code pools on first use).
 */
import { WarrenError, asWarrenError } from '../errors';
import type { Principal } from '../shim/access';
import type { LanguagesInfo } from '../shim/fncall/manager';
import type { RunCodeRequest, RunJupyterRequest, RunJupyterResponse } from '../shim/fncall/sandboxfusion';
import type { InvokeRequest, InvokeResult, JudgeRequest, JudgeResult, PoolStats } from '../shim/fncall/types';
import type { RemoteShim } from '../shim/remote/client';
import type { FnCallApi } from '../shim/types';
import { type NodeRecord, imageMatches } from './placement';

/** What ClusterFnCall needs of its ClusterShim. */
export interface FnCallNodes {
  live(): NodeRecord[];
  record(id: string): NodeRecord | undefined;
  node(rec: NodeRecord): Promise<RemoteShim>;
  /** `deadlineMs` null: no deadline (a toolkit build takes minutes). */
  everyNode<T>(what: string, fn: (s: RemoteShim, rec: NodeRecord) => Promise<T>, deadlineMs?: number | null): Promise<T[]>;
}

export class ClusterFnCall implements FnCallApi {
  /** pool -> the node it was last found on */
  private readonly where = new Map<string, string>();

  constructor(private readonly nodes: FnCallNodes) {}

  private async fnOf(rec: NodeRecord): Promise<FnCallApi> {
    const s = await this.nodes.node(rec);
    if (s.functions === undefined) throw new WarrenError('NOT_SUPPORTED', `node ${rec.id} has no FnCall pools`, { node: rec.id });
    return s.functions;
  }

  /** Every live node's pools, remembering where each is. */
  private async pools(): Promise<Array<{ rec: NodeRecord; pools: PoolStats[] }>> {
    const lists = await this.nodes.everyNode('pools', async (s, rec) => ({ rec, pools: s.functions ? await s.functions.listPools() : [] }));
    for (const { rec, pools } of lists) for (const p of pools) this.where.set(p.name, rec.id);
    return lists;
  }

  /** The node pool `name` is on, or null. */
  private async nodeOfPool(name: string): Promise<NodeRecord | null> {
    const known = this.where.get(name);
    const rec = known === undefined ? undefined : this.nodes.record(known);
    if (rec) return rec;
    for (const { rec: r, pools } of await this.pools()) if (pools.some((p) => p.name === name)) return r;
    return null;
  }

  /** Run `fn` on the node of pool `name`; a node that no longer has it is forgotten, and asked for again once. */
  private async onPool<T>(name: string, fn: (f: FnCallApi) => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      const rec = await this.nodeOfPool(name);
      if (rec === null) throw new WarrenError('NOT_FOUND', `no pool ${JSON.stringify(name).slice(0, 40)}`, { pool: name });
      try {
        return await fn(await this.fnOf(rec));
      } catch (err) {
        if (attempt > 0 || asWarrenError(err).code !== 'NOT_FOUND' || this.where.get(name) !== rec.id) throw err;
        this.where.delete(name);
      }
    }
  }

  /** The least loaded live node with FnCall, among those holding `image` when any does. */
  private async pick(image?: string): Promise<{ rec: NodeRecord; fn: FnCallApi }> {
    const live = this.nodes.live().filter((n) => !n.fenced);
    const holders = image === undefined ? [] : live.filter((n) => n.images.some((i) => imageMatches(i, image)));
    const load = (n: NodeRecord) => (n.used.sandboxes + n.used.creating) / Math.max(1, n.capacity.sandboxes);
    let lastErr: unknown = new WarrenError('RESOURCE_EXHAUSTED', 'no node of the cluster has FnCall pools', { retryAfterS: 1 });
    for (const rec of [...(holders.length > 0 ? holders : live)].sort((a, b) => load(a) - load(b))) {
      try {
        return { rec, fn: await this.fnOf(rec) };
      } catch (err) {
        const code = asWarrenError(err).code;
        if (code !== 'NOT_SUPPORTED' && code !== 'UNAVAILABLE') throw err;
        lastErr = err;
      }
    }
    throw lastErr;
  }

  async anonymousRunCode(): Promise<boolean> {
    return (await this.pick()).fn.anonymousRunCode();
  }

  async listPools(): Promise<PoolStats[]> {
    return (await this.pools()).flatMap((l) => l.pools);
  }

  async createPool(body: unknown, principal: Principal, opts?: { wait?: boolean }): Promise<PoolStats> {
    const b = typeof body === 'object' && body !== null ? (body as { name?: unknown; image?: unknown }) : {};
    // a pool of that name somewhere gets the node's own answer for it
    const existing = typeof b.name === 'string' ? await this.nodeOfPool(b.name) : null;
    const { rec, fn } = existing ? { rec: existing, fn: await this.fnOf(existing) } : await this.pick(typeof b.image === 'string' ? b.image : undefined);
    const stats = await fn.createPool(body, principal, opts);
    this.where.set(stats.name, rec.id);
    return stats;
  }

  poolStats(name: string): Promise<PoolStats> {
    return this.onPool(name, (f) => f.poolStats(name));
  }

  async deletePool(name: string): Promise<void> {
    await this.onPool(name, (f) => f.deletePool(name));
    this.where.delete(name);
  }

  invoke(pool: string, account: string, req: InvokeRequest): Promise<InvokeResult> {
    return this.onPool(pool, (f) => f.invoke(pool, account, req));
  }

  judge(pool: string, account: string, req: JudgeRequest): Promise<JudgeResult> {
    return this.onPool(pool, (f) => f.judge(pool, account, req));
  }

  batch(pool: string, account: string, reqs: InvokeRequest[], concurrency?: number): Promise<Array<InvokeResult | { error: { code: string; message: string } }>> {
    return this.onPool(pool, (f) => f.batch(pool, account, reqs, concurrency));
  }

  async runCode(account: string, req: RunCodeRequest): Promise<InvokeResult> {
    return (await this.pick()).fn.runCode(account, req);
  }

  async runJupyter(account: string, req: RunJupyterRequest): Promise<RunJupyterResponse> {
    return (await this.pick()).fn.runJupyter(account, req);
  }

  async languages(): Promise<LanguagesInfo> {
    return (await this.pick()).fn.languages();
  }

  /** Built on every live node with FnCall: a later pool may land on any of them. */
  async ensureToolkit(name: string): Promise<void> {
    await this.nodes.everyNode(
      'toolkit',
      async (s) => {
        await s.functions?.ensureToolkit(name);
      },
      null,
    );
  }
}
