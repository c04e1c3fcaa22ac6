/**
 * The cluster's only shared state is etcd. This module makes the client and
 * names the keys.
 *
 * The etcd3 client's default fault handling is a per-host circuit breaker
 * (3 consecutive failures open it for 5 s): after a leader is killed, every
 * host trips it and every call fails for seconds after the cluster has
 * recovered. Here a failed host is skipped for 1 s only, one global retry
 * with exponential backoff runs over all hosts, every unary call has a short
 * deadline, and what is left after the retries becomes CLUSTER_UNAVAILABLE
 * with the cause in its message.
 *
 * The retries are bounded by time, not by a count: losing the leader costs
 * an election (1 s election timeout, several seconds on a loaded host), and
 * during it every member answers with an error, so each host's breaker
 * opens and a fixed number of attempts is spent in a fraction of that.
 */
import { BrokenCircuitError, ConsecutiveBreaker, ExponentialBackoff, TimeoutStrategy, circuitBreaker, handleWhen, retry, timeout, wrap } from 'cockatiel';
import { Etcd3, type IOptions, isRecoverableError } from 'etcd3';
import { WarrenError } from '../errors';

export interface EtcdConfig {
  /** Client URLs (http://127.0.0.1:2379,...). */
  endpoints: string[];
  /** Deadline of one unary call in ms (default 1000). */
  callTimeoutMs?: number;
  /**
   * How long a call is retried over all hosts before it fails, in ms (default
   * 10000: longer than a leader election on a loaded host, so one member's
   * loss is not seen by clients; a quorum loss answers 503 after it).
   */
  retryBudgetMs?: number;
}

export const PREFIX = '/warren/';

/** Key layout (docs/cluster.md). */
export const keys = {
  node: (id: string) => `${PREFIX}nodes/${id}`,
  nodes: `${PREFIX}nodes/`,
  /** A node declared lost, per epoch (the node's registration generation). */
  lost: (node: string, epoch: number) => `${PREFIX}lost/${node}/${epoch}`,
  lostAll: `${PREFIX}lost/`,
  lostOf: (node: string) => `${PREFIX}lost/${node}/`,
  account: (id: string) => `${PREFIX}accounts/${id}`,
  accounts: `${PREFIX}accounts/`,
  token: (hashHex: string) => `${PREFIX}tokens/${hashHex}`,
  /** Bumped by every job admission and block growth of an account: the compare of its quota transactions. */
  quotaEpoch: (account: string) => `${PREFIX}quota/${account}`,
  /** The part of an account's quota a node may hold (quota-blocks.ts), signed. */
  quotaBlock: (account: string, node: string) => `${PREFIX}quota-blocks/${account}/${node}`,
  quotaBlocks: (account: string) => `${PREFIX}quota-blocks/${account}/`,
  quotaBlocksAll: `${PREFIX}quota-blocks/`,
  job: (id: string) => `${PREFIX}jobs/${id}/spec`,
  /** Job-wide state (running, paused, cancelled, deleted), watched by every node. */
  jobControl: (id: string) => `${PREFIX}control/${id}`,
  controls: `${PREFIX}control/`,
  /** A share of a job placed on a node: each node watches only its own prefix. */
  jobShare: (id: string, node: string, share: string) => `${PREFIX}shares/${node}/${id}/${share}`,
  shares: `${PREFIX}shares/`,
  jobProgress: (id: string, node: string, share: string) => `${PREFIX}jobs/${id}/progress/${node}/${share}`,
  jobPrefix: (id: string) => `${PREFIX}jobs/${id}/`,
  jobs: `${PREFIX}jobs/`,
  /** Layers staged in the overflow pool's registry (written by the registry staging). */
  overflowStaged: (digest: string) => `${PREFIX}overflow/staged/${digest}`,
  overflowStagedAll: `${PREFIX}overflow/staged/`,
  /** An image staged for the overflow pool (signed: name, registry ref, layers): lazy nodes pull it. */
  overflowImage: (name: string) => `${PREFIX}overflow/images/${encodeURIComponent(name)}`,
  overflowImages: `${PREFIX}overflow/images/`,
  policy: `${PREFIX}policy/bundle`,
  policyStatus: (node: string) => `${PREFIX}policy/status/${node}`,
  settings: `${PREFIX}settings`,
};

/** What keys.overflowImage holds, signed with the cluster credential. */
export interface StagedImage {
  image: string;
  /** Where it was staged: host/repository:tag. */
  ref: string;
  manifestDigest: string;
  layers: string[];
  at: number;
}

export function openEtcd(cfg: EtcdConfig): Etcd3 {
  if (cfg.endpoints.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'no etcd endpoint given (--etcd URL[,URL...])');
  const callMs = cfg.callTimeoutMs ?? 1000;
  const options: IOptions = {
    hosts: cfg.endpoints,
    dialTimeout: callMs * 2,
    defaultCallOptions: (ctx) => (ctx.isStream ? {} : { deadline: Date.now() + callMs }),
    faultHandling: {
      // a host that failed is skipped for 1 s (not 5): the next attempt goes to another member
      host: () => circuitBreaker(handleWhen(isRecoverableError), { halfOpenAfter: 1000, breaker: new ConsecutiveBreaker(1) }),
      // every host skipped (all failed within the last second) is retried too, after the
      // backoff; the cooperative timeout stops the retries (not a call in flight) at the budget
      global: wrap(
        timeout(cfg.retryBudgetMs ?? 10_000, TimeoutStrategy.Cooperative),
        retry(handleWhen((e) => isRecoverableError(e) || e instanceof BrokenCircuitError), { maxAttempts: Number.MAX_SAFE_INTEGER, backoff: new ExponentialBackoff({ initialDelay: 100, maxDelay: 1000 }) }),
      ),
      // etcd3 itself passes a backoff factory here; its type names the older backoff interface
      watchBackoff: new ExponentialBackoff({ initialDelay: 100, maxDelay: 2000 }) as unknown as NonNullable<NonNullable<IOptions['faultHandling']>['watchBackoff']>,
    },
  };
  return new Etcd3(options);
}

/** Run an etcd call; failures of the store become CLUSTER_UNAVAILABLE (503) with the cause. */
export async function store<T>(what: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    if (err instanceof WarrenError) throw err;
    throw new WarrenError('CLUSTER_UNAVAILABLE', `cluster store unavailable (${what}): ${(err as Error).message}`, { what });
  }
}

export function parseJson<T>(v: Buffer | string | null | undefined): T | null {
  if (v === null || v === undefined) return null;
  try {
    return JSON.parse(typeof v === 'string' ? v : v.toString('utf8')) as T;
  } catch {
    return null;
  }
}

/** A prefix read and the revision it was read at (watch from revision + 1 to miss nothing). */
export async function readPrefix(etcd: Etcd3, prefix: string): Promise<{ kvs: { key: string; value: string }[]; revision: string }> {
  const res = await etcd.getAll().prefix(prefix).exec();
  return { kvs: res.kvs.map((kv) => ({ key: kv.key.toString('utf8'), value: kv.value.toString('utf8') })), revision: res.header.revision };
}

/**
 * Keys etcd did not have, remembered for `ttlMs` in a bounded table: a cache that reads etcd on a
 * miss (its watch may lag behind another gateway's write) then costs etcd at most one read per
 * key and period for names that do not exist.
 */
export class RecentMisses {
  private readonly at = new Map<string, number>();

  constructor(
    private readonly ttlMs = 1000,
    private readonly max = 10_000,
  ) {}

  has(key: string): boolean {
    const t = this.at.get(key);
    return t !== undefined && Date.now() - t < this.ttlMs;
  }

  add(key: string): void {
    const now = Date.now();
    if (this.at.size >= this.max) {
      for (const [k, t] of this.at) if (now - t >= this.ttlMs) this.at.delete(k);
      if (this.at.size >= this.max) this.at.clear();
    }
    this.at.set(key, now);
  }
}

export function nextRevision(rev: string): string {
  return (BigInt(rev) + 1n).toString();
}
