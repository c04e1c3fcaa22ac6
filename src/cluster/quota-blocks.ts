/**
 * Account quotas across the cluster, reserved in blocks per node.
 *
 * A block is how much of an account's quota (sandboxes, cpu, memory) one node may hold. Its node
 * admits a create of the account only within it, counting exactly (its live sandboxes, the
 * creates it has admitted and not finished, and what the account's job shares there still have
 * to make), so the account's sandboxes on a node never pass its block. The blocks of an account
 * add up to at most its quota: a gateway grows a block in one etcd transaction that compares the
 * account's quota key (as job admissions do) and the block's own revision, after summing the
 * account's blocks. So each create costs etcd nothing while its node has room in its block, and a
 * block that runs out grows by a chunk (an eighth of what is left), never one hot counter per
 * create. Only the node shrinks its own block, back to what it holds, once it has been idle: it
 * knows its usage at the moment it admits, so a shrink never goes below a create in progress.
 *
 * An account without a limit (no maxSandboxes, maxCpu or maxMemoryMb) has no blocks; a quota set
 * back to unlimited removes them. A node that knows no block for an account asks etcd before it
 * admits it as unlimited (a gateway writes the block before it sends the first create there), and
 * then takes the answer for two seconds unless a block arrives by watch. Blocks are signed with
 * the cluster credential like the node records.
 */
import type { Etcd3 } from 'etcd3';
import { WarrenError } from '../errors';
import type { Quota } from '../gateway/auth';
import type { SandboxUsage } from '../shim/types';
import type { ClusterCredential } from './credential';
import { keys, nextRevision, parseJson, store } from './etcd';

export interface QuotaBlock {
  account: string;
  node: string;
  sandboxes: number;
  cpu: number;
  memoryMb: number;
  at: number;
}

export type Amount = Pick<SandboxUsage, 'sandboxes' | 'cpu' | 'memoryMb'>;

const EPS = 1e-9;

export function limited(q: Quota): boolean {
  return q.maxSandboxes !== null || q.maxCpu !== null || q.maxMemoryMb !== null;
}

/** Whether `used` plus one sandbox of `spec` stays within `block`. */
export function fitsBlock(block: Amount, used: Amount, spec: { cpu: number; memoryMb: number }): boolean {
  return used.sandboxes + 1 <= block.sandboxes && used.cpu + spec.cpu <= block.cpu + EPS && used.memoryMb + spec.memoryMb <= block.memoryMb;
}

export function addAmounts(a: Amount, b: Amount, times = 1): Amount {
  return { sandboxes: a.sandboxes + times * b.sandboxes, cpu: a.cpu + times * b.cpu, memoryMb: a.memoryMb + times * b.memoryMb };
}

function maxAmount(a: Amount, b: Amount): Amount {
  return { sandboxes: Math.max(a.sandboxes, b.sandboxes), cpu: Math.max(a.cpu, b.cpu), memoryMb: Math.max(a.memoryMb, b.memoryMb) };
}

export const ZERO: Amount = { sandboxes: 0, cpu: 0, memoryMb: 0 };

/**
 * How many sandboxes of `spec` the quota has room for beyond `committed`, and the limit that
 * says so (null: no limit at all).
 */
export function roomFor(quota: Quota, committed: Amount, spec: { cpu: number; memoryMb: number }): { room: number; limit: 'maxSandboxes' | 'maxCpu' | 'maxMemoryMb'; max: number; used: number } | null {
  const rooms: { room: number; limit: 'maxSandboxes' | 'maxCpu' | 'maxMemoryMb'; max: number; used: number }[] = [];
  if (quota.maxSandboxes !== null) rooms.push({ limit: 'maxSandboxes', max: quota.maxSandboxes, used: committed.sandboxes, room: quota.maxSandboxes - committed.sandboxes });
  if (quota.maxCpu !== null) rooms.push({ limit: 'maxCpu', max: quota.maxCpu, used: committed.cpu, room: spec.cpu > 0 ? Math.floor((quota.maxCpu - committed.cpu + EPS) / spec.cpu) : Infinity });
  if (quota.maxMemoryMb !== null) rooms.push({ limit: 'maxMemoryMb', max: quota.maxMemoryMb, used: committed.memoryMb, room: spec.memoryMb > 0 ? Math.floor((quota.maxMemoryMb - committed.memoryMb) / spec.memoryMb) : Infinity });
  if (rooms.length === 0) return null;
  const tight = rooms.sort((x, y) => x.room - y.room)[0]!;
  return { ...tight, room: Math.max(0, tight.room) };
}

/** A block value as stored: signed, with its account and node (a copy under another key is refused). */
export function readBlock(credential: ClusterCredential, key: string, value: Buffer | string): QuotaBlock | null {
  const b = credential.verify(parseJson<QuotaBlock & { sig: string }>(value));
  if (b === null || key !== keys.quotaBlock(b.account, b.node)) return null;
  return b;
}

/** What a gateway knows besides the blocks: which nodes count, and what their records show. */
export interface BlockContext {
  /** Nodes whose blocks count (live ones: a lost node's sandboxes are gone). */
  live: Set<string>;
  /** What the node records say the account holds on a node (for nodes without a block). */
  recorded(node: string): Amount;
}

/** An account's blocks as etcd has them now, with the revisions its quota transactions compare. */
export interface BlockView {
  account: string;
  epochRev: string;
  blocks: Map<string, { block: QuotaBlock; rev: string }>;
}

export async function readBlocks(etcd: Etcd3, credential: ClusterCredential, account: string): Promise<BlockView> {
  // The epoch first, then the blocks, never both at once: every growth bumps the epoch, so blocks
  // read after it are at least as new, and a growth between the two reads fails the transaction's
  // compare. Read the other way round, the blocks could predate a growth whose epoch the compare
  // then accepts, and the quota was handed out twice (seen: 4 sandboxes admitted under a quota of 3).
  const epoch = await store('quota', () => etcd.get(keys.quotaEpoch(account)).exec());
  const all = await store('quota blocks', () => etcd.getAll().prefix(keys.quotaBlocks(account)).exec());
  const blocks = new Map<string, { block: QuotaBlock; rev: string }>();
  for (const kv of all.kvs) {
    const b = readBlock(credential, kv.key.toString('utf8'), kv.value);
    if (b !== null && b.account === account) blocks.set(b.node, { block: b, rev: kv.mod_revision });
  }
  return { account, epochRev: epoch.kvs[0]?.mod_revision ?? '0', blocks };
}

/** What a node holds of the account at least: its block, or what its record shows where that is more. */
function heldOn(view: BlockView, ctx: BlockContext, node: string): Amount {
  return maxAmount(view.blocks.get(node)?.block ?? ZERO, ctx.recorded(node));
}

/** What the account holds or has reserved across the live nodes. */
export function committedOf(view: BlockView, ctx: BlockContext): Amount {
  let c = ZERO;
  for (const n of ctx.live) c = addAmounts(c, heldOn(view, ctx, n));
  return c;
}

/**
 * Whether some live node reserves more than its record shows it holds: room that node gives back
 * once it is unused for a moment (or creates its record does not show yet: either way, worth a
 * short wait before a refusal).
 */
export function slackHeld(view: BlockView, ctx: BlockContext): boolean {
  for (const n of ctx.live) {
    const b = view.blocks.get(n)?.block;
    if (b === undefined) continue;
    const r = ctx.recorded(n);
    if (b.sandboxes > r.sandboxes || b.cpu > r.cpu + EPS || b.memoryMb > r.memoryMb) return true;
  }
  return false;
}

/**
 * The etcd operations that grow the blocks of `counts` (node → sandboxes of `spec`) on top of
 * what each node holds: compares on each block's revision and the account's quota key, and the
 * puts (the quota key bumped too).
 */
export function blockGrowth(etcd: Etcd3, credential: ClusterCredential, view: BlockView, ctx: BlockContext, counts: Map<string, number>, spec: { cpu: number; memoryMb: number }) {
  const epochKey = keys.quotaEpoch(view.account);
  const now = Date.now();
  const compares: [string, string][] = [[epochKey, view.epochRev]];
  const puts = [etcd.put(epochKey).value(`blocks ${now}`)];
  for (const [node, n] of counts) {
    if (n <= 0) continue;
    const grown = addAmounts(heldOn(view, ctx, node), { sandboxes: 1, cpu: spec.cpu, memoryMb: spec.memoryMb }, n);
    const next: QuotaBlock = { account: view.account, node, sandboxes: grown.sandboxes, cpu: grown.cpu, memoryMb: grown.memoryMb, at: now };
    const key = keys.quotaBlock(view.account, node);
    compares.push([key, view.blocks.get(node)?.rev ?? '0']);
    puts.push(etcd.put(key).value(JSON.stringify(credential.sign(next))));
  }
  return { compares, puts };
}

/** A transaction that applies only if none of `compares` (key, mod revision; '0' = absent) changed. */
export function whenUnchanged(etcd: Etcd3, compares: [string, string][]) {
  const [first, ...rest] = compares;
  let txn = etcd.if(first![0], 'Mod', '==', first![1]);
  for (const [k, r] of rest) txn = txn.and(k, 'Mod', '==', r);
  return txn;
}

/** How long a node takes an account without a block for one without a limit before it asks etcd again. */
const UNLIMITED_FOR_MS = 2000;

/** How long a gateway waits for nodes to give back reserved room before it refuses for the quota. */
const SLACK_WAIT_MS = 2500;

/**
 * Read the account's blocks until the quota has room for `want` sandboxes of `spec` or no node
 * holds reserved room it is about to give back (then the answer stands); `want` is the most
 * worth waiting for.
 */
export async function viewWithRoom(etcd: Etcd3, credential: ClusterCredential, account: string, quota: Quota, spec: { cpu: number; memoryMb: number }, want: number, ctx: () => BlockContext) {
  const deadline = Date.now() + SLACK_WAIT_MS;
  for (;;) {
    const view = await readBlocks(etcd, credential, account);
    const c = ctx();
    const room = roomFor(quota, committedOf(view, c), spec);
    if (room === null || room.room >= want || !slackHeld(view, c) || Date.now() > deadline) return { view, ctx: c, room };
    await new Promise((r) => setTimeout(r, 200));
  }
}

/**
 * Grow `account`'s block on `node` so that it has room for one more sandbox of `spec` (and a
 * chunk more, an eighth of the quota's room, so that the next creates there need no
 * transaction), or throw QUOTA_EXCEEDED when the quota has no room for it.
 */
export async function growBlock(
  etcd: Etcd3,
  credential: ClusterCredential,
  args: { account: string; node: string; quota: Quota; spec: { cpu: number; memoryMb: number }; ctx: () => BlockContext },
): Promise<void> {
  const { account, node, quota, spec } = args;
  for (let attempt = 0; attempt < 8; attempt++) {
    const { view, ctx, room } = await viewWithRoom(etcd, credential, account, quota, spec, 1, args.ctx);
    if (room === null) return; // no limit (any more): nothing to reserve
    if (room.room < 1) {
      const asked = room.limit === 'maxSandboxes' ? 1 : room.limit === 'maxCpu' ? spec.cpu : spec.memoryMb;
      throw new WarrenError('QUOTA_EXCEEDED', `account quota exceeded: ${room.limit} (limit ${room.max}, in use or reserved ${room.used}, requested ${asked})`, { quota: room.limit, limit: room.max, used: room.used, requested: asked });
    }
    const { compares, puts } = blockGrowth(etcd, credential, view, ctx, new Map([[node, Math.max(1, Math.floor(room.room / 8))]]), spec);
    const res = await store('grow quota block', () => whenUnchanged(etcd, compares).then(...puts).commit());
    if (res.succeeded) return;
  }
  throw new WarrenError('CLUSTER_UNAVAILABLE', `the quota of ${account} kept changing while a block was grown (retry)`, { retryAfterS: 1 });
}

/** Remove every block of an account (its quota has no limit any more). */
export async function dropBlocks(etcd: Etcd3, account: string): Promise<void> {
  await store('drop quota blocks', () => etcd.delete().prefix(keys.quotaBlocks(account)).exec());
}

/**
 * The blocks of one node, kept by watch, with the node's side of the bargain: admission within
 * them, and giving back what has been unused for a while.
 */
export class NodeBlocks {
  private readonly blocks = new Map<string, { block: QuotaBlock; rev: string }>();
  /** Lowered before a shrink is written, so that no create is admitted into what is given back. */
  private readonly caps = new Map<string, Amount>();
  private watcher: { cancel(): Promise<void> } | null = null;
  private timer: NodeJS.Timeout | null = null;
  /** The give-back under way: one at a time. */
  private shrinking: Promise<void> | null = null;
  /** Accounts etcd had no block for, and when it said so. */
  private readonly unlimitedAt = new Map<string, number>();
  /** When each account's block was last seen with more than the node needs. */
  private readonly slackSince = new Map<string, number>();

  constructor(
    private readonly etcd: Etcd3,
    private readonly credential: ClusterCredential,
    private readonly node: string,
    /** What the node needs for an account now: live sandboxes, admitted creates, job shares' remaining work. */
    private readonly need: (account: string) => Amount,
    private readonly log: (line: string) => void,
    private readonly idleMs = 2000,
  ) {}

  async start(): Promise<void> {
    const all = await this.etcd.getAll().prefix(keys.quotaBlocksAll).exec();
    for (const kv of all.kvs) this.put(kv.key.toString('utf8'), kv.value, kv.mod_revision);
    const w = await this.etcd.watch().prefix(keys.quotaBlocksAll).startRevision(nextRevision(all.header.revision)).create();
    w.on('put', (kv) => this.put(kv.key.toString('utf8'), kv.value, kv.mod_revision));
    w.on('delete', (kv) => {
      const key = kv.key.toString('utf8');
      for (const [account, e] of this.blocks) if (keys.quotaBlock(account, this.node) === key && BigInt(kv.mod_revision) >= BigInt(e.rev)) this.blocks.delete(account);
    });
    this.watcher = w;
    this.timer = setInterval(() => void this.giveBack(), Math.max(250, this.idleMs / 2));
    this.timer.unref();
  }

  private put(key: string, value: Buffer | string, rev: string): void {
    const b = readBlock(this.credential, key, value);
    if (b === null || b.node !== this.node) return;
    const cur = this.blocks.get(b.account);
    if (cur !== undefined && BigInt(cur.rev) > BigInt(rev)) return;
    this.blocks.set(b.account, { block: b, rev });
    this.unlimitedAt.delete(b.account);
  }

  /** The block in force for `account`, or undefined (no limit). */
  private limit(account: string): Amount | undefined {
    const b = this.blocks.get(account)?.block;
    if (b === undefined) return undefined;
    const cap = this.caps.get(account);
    return cap === undefined ? b : { sandboxes: Math.min(b.sandboxes, cap.sandboxes), cpu: Math.min(b.cpu, cap.cpu), memoryMb: Math.min(b.memoryMb, cap.memoryMb) };
  }

  /**
   * Refuse (QUOTA_EXCEEDED, details.block) a create that its account's block on this node has no
   * room for; `used` is what the node holds and has promised for the account. A block that looks
   * full is read again from etcd first: a gateway may have just grown it.
   */
  async admit(account: string, used: Amount, spec: { cpu: number; memoryMb: number }): Promise<void> {
    let b = this.limit(account);
    if (b !== undefined && fitsBlock(b, used, spec)) return;
    // No block known: the account has no limit, or a gateway has just reserved one that the
    // watch has not brought yet (it writes the block before it sends the create). Ask etcd, and
    // take "no limit" for a moment: a block that arrives by watch ends that at once.
    if (b === undefined) {
      const seen = this.unlimitedAt.get(account);
      if (seen !== undefined && Date.now() - seen < UNLIMITED_FOR_MS) return;
    }
    const kv = await store('read quota block', () => this.etcd.get(keys.quotaBlock(account, this.node)).exec());
    const fresh = kv.kvs[0];
    if (fresh === undefined) {
      // none, or gone: the quota has no limit (a block is never deleted otherwise)
      if (!this.caps.has(account)) this.blocks.delete(account);
      if (this.unlimitedAt.size > 10_000) this.unlimitedAt.clear();
      this.unlimitedAt.set(account, Date.now());
    } else this.put(keys.quotaBlock(account, this.node), fresh.value, fresh.mod_revision);
    b = this.limit(account);
    if (b === undefined || fitsBlock(b, used, spec)) return;
    throw new WarrenError('QUOTA_EXCEEDED', `account ${account}: node ${this.node} holds its block of the quota (${b.sandboxes} sandboxes, ${b.cpu} cpu, ${b.memoryMb} MiB)`, {
      block: true,
      node: this.node,
      limit: b,
      used,
    });
  }

  /**
   * While true, the timer gives nothing back: the node has not yet loaded everything its need
   * counts (its job shares), and would give back room they are about to use.
   */
  holdGiveBack = false;

  /**
   * Give back at once what every block holds beyond the node's need: for a node whose epoch was
   * declared lost. While it was lost its blocks did not count, so the gateways may have handed
   * that room to other nodes; it must not admit within them again. Waits for a give-back already
   * under way, and tries again where a block changed meanwhile.
   */
  async giveBackAll(): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      while (this.shrinking !== null) await this.shrinking;
      await this.giveBack(true);
      if (![...this.blocks].some(([account, { block }]) => !fitsBlockOrEqual(block, this.need(account)))) return;
      // a block moved under the transaction: read them all again
      const all = await store('quota blocks', () => this.etcd.getAll().prefix(keys.quotaBlocksAll).exec());
      for (const kv of all.kvs) this.put(kv.key.toString('utf8'), kv.value, kv.mod_revision);
    }
    this.log(`cluster: node ${this.node} could not give back every quota block of its lost epoch; the timer goes on trying`);
  }

  /** Give back what an account's block holds beyond the node's need, once it has been so for idleMs (`immediately`: at once). */
  private async giveBack(immediately = false): Promise<void> {
    if (this.shrinking !== null || (this.holdGiveBack && !immediately)) return;
    const run = this.shrink(immediately);
    this.shrinking = run;
    try {
      await run;
    } finally {
      this.shrinking = null;
    }
  }

  private async shrink(immediately: boolean): Promise<void> {
    const now = Date.now();
    for (const [account, { block, rev }] of [...this.blocks]) {
      const need = this.need(account);
      const slack = block.sandboxes > need.sandboxes || block.cpu > need.cpu + EPS || block.memoryMb > need.memoryMb;
      if (!slack) {
        this.slackSince.delete(account);
        continue;
      }
      const since = this.slackSince.get(account);
      if (since === undefined && !immediately) {
        this.slackSince.set(account, now);
        continue;
      }
      if (!immediately && now - since! < this.idleMs) continue;
      this.slackSince.delete(account);
      const next: QuotaBlock = { ...block, sandboxes: Math.min(block.sandboxes, need.sandboxes), cpu: Math.min(block.cpu, need.cpu), memoryMb: Math.min(block.memoryMb, need.memoryMb), at: now };
      const key = keys.quotaBlock(account, this.node);
      this.caps.set(account, next);
      try {
        // the cap holds from before the write: what is given back is never admitted meanwhile
        if (!fitsBlockOrEqual(this.need(account), next)) continue;
        const res = await this.etcd.if(key, 'Mod', '==', rev).then(this.etcd.put(key).value(JSON.stringify(this.credential.sign(next)))).commit();
        if (res.succeeded) this.put(key, JSON.stringify(this.credential.sign(next)), res.header.revision);
      } catch (err) {
        this.log(`cluster: cannot give back the unused quota block of ${account}: ${(err as Error).message}`);
      } finally {
        this.caps.delete(account);
      }
    }
  }

  /** The block of `account` on this node (tests, diagnostics). */
  blockOf(account: string): QuotaBlock | undefined {
    return this.blocks.get(account)?.block;
  }

  async close(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    await this.watcher?.cancel().catch(() => undefined);
  }
}

function fitsBlockOrEqual(need: Amount, block: Amount): boolean {
  return need.sandboxes <= block.sandboxes && need.cpu <= block.cpu + EPS && need.memoryMb <= block.memoryMb;
}
