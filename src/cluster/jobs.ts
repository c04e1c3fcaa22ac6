/**
 * Job records: what a gateway writes when it admits a job, and the status
 * computed from what the nodes report. A job's spec, its control state, its
 * shares (one per node it was placed on) and their progress live in etcd;
 * the sandboxes themselves stay on their nodes (labelled warren.job).
 */
import { EventEmitter } from 'node:events';
import type { Etcd3 } from 'etcd3';
import { WarrenError } from '../errors';
import { type PlacementAsk, expectNumber, expectObject, rejectUnknown, validateLabels, validatePlacementAsk } from '../validation';
import type { Principal, SandboxSpec } from '../shim/types';
import type { IndexRange, JobControlState, ShareProgress } from './node-agent';
import type { Explanation } from './placement';
import { keys, nextRevision, parseJson, store } from './etcd';

export const MAX_JOB_COUNT = 32_768;
export const MAX_JOB_CONCURRENCY = 1024;

export interface ShareRef {
  node: string;
  share: string;
  epoch: number;
  count: number;
  ranges: IndexRange[];
}

export interface JobSpec {
  id: string;
  owner: string;
  count: number;
  spec: SandboxSpec;
  principal: Principal;
  labels: Record<string, string>;
  concurrency: number;
  placement: PlacementAsk;
  createdAt: string;
  shares: ShareRef[];
  /** Indices not placed yet (no room anywhere, or handed back by a node). */
  pending: IndexRange[];
  /** Shares whose refusals (or, on lost nodes, whose uncreated sandboxes) were placed again. */
  handled: string[];
  explain?: Explanation;
}


export interface JobRequest {
  count: number;
  template: unknown;
  labels: Record<string, string>;
  concurrency: number;
  /** `all`: refuse the whole job over quota; `upTo`: admit as many as the quota allows. */
  quota: 'all' | 'upTo';
  placement: PlacementAsk;
}


/** The job request, checked before anything is placed (the template is checked like a single create by the caller). */
export function validateJobRequest(body: unknown): JobRequest {
  const b = expectObject(body, 'body');
  rejectUnknown(b, ['count', 'template', 'labels', 'concurrency', 'quota', 'placement']);
  const count = expectNumber(b.count, 'count', 1, MAX_JOB_COUNT, true);
  if (b.template === undefined) throw new WarrenError('INVALID_ARGUMENT', 'template (a create request) is required', { field: 'template' });
  const labels = b.labels === undefined ? {} : validateLabels(b.labels, 'labels');
  for (const k of Object.keys(labels)) if (k.startsWith('warren.')) throw new WarrenError('INVALID_ARGUMENT', `label ${k}: the warren. prefix is reserved`, { field: 'labels' });
  const concurrency = b.concurrency === undefined ? 64 : expectNumber(b.concurrency, 'concurrency', 1, MAX_JOB_CONCURRENCY, true);
  if (b.quota !== undefined && b.quota !== 'all' && b.quota !== 'upTo') throw new WarrenError('INVALID_ARGUMENT', 'quota must be "all" or "upTo"', { field: 'quota' });
  return { count, template: b.template, labels, concurrency, quota: (b.quota as 'all' | 'upTo' | undefined) ?? 'all', placement: validatePlacementAsk(b.placement) };
}

export type JobState = 'creating' | 'done' | 'partial' | 'paused' | 'cancelled' | 'deleting' | 'deleted';

export interface NodeShareStatus {
  assigned: number;
  created: number;
  failed: number;
  refused: number;
  lost: number;
  paused: number;
  releasedBytes: number;
  state: string;
}

export interface JobStatus {
  id: string;
  owner: string;
  count: number;
  state: JobState;
  created: number;
  failed: number;
  lost: number;
  /** Not placed yet, or handed back and waiting to be placed again. */
  pending: number;
  paused: number;
  releasedBytes: number;
  deleted: number;
  labels: Record<string, string>;
  nodes: Record<string, NodeShareStatus>;
  errors: Record<string, number>;
  failures: { index: number; node: string; code: string; message: string }[];
  createdAt: string;
}

export function rangesCount(r: readonly IndexRange[]): number {
  return r.reduce((s, x) => s + x.count, 0);
}

export function jobStatus(spec: JobSpec, control: JobControlState, progress: ReadonlyMap<string, ShareProgress>, isLost: (node: string, epoch: number) => boolean): JobStatus {
  const st: JobStatus = {
    id: spec.id,
    owner: spec.owner,
    count: spec.count,
    state: 'creating',
    created: 0,
    failed: 0,
    lost: 0,
    pending: rangesCount(spec.pending),
    paused: 0,
    releasedBytes: 0,
    deleted: 0,
    labels: spec.labels,
    nodes: {},
    errors: {},
    failures: [],
    createdAt: spec.createdAt,
  };
  let open = 0;
  let deletedShares = 0;
  for (const ref of spec.shares) {
    const p = progress.get(`${ref.node}/${ref.share}`);
    const n = (st.nodes[ref.node] ??= { assigned: 0, created: 0, failed: 0, refused: 0, lost: 0, paused: 0, releasedBytes: 0, state: 'creating' });
    n.assigned += ref.count;
    const lost = isLost(ref.node, ref.epoch);
    const created = p?.created ?? 0;
    const failed = p?.failed ?? 0;
    if (lost) {
      n.lost += created;
      st.lost += created;
      n.state = 'lost';
      // the sandboxes it never made are placed again (counted pending until they are)
      if (!spec.handled.includes(`${ref.node}/${ref.share}`)) st.pending += Math.max(0, ref.count - created - failed);
    } else {
      n.created += created;
      st.created += created;
      if (p) n.state = p.state;
    }
    n.failed += failed;
    st.failed += failed;
    if (p) {
      n.refused += p.refused;
      if (p.refused > 0 && !spec.handled.includes(`${ref.node}/${ref.share}`)) st.pending += p.refused;
      st.paused += p.paused;
      st.releasedBytes += p.releasedBytes;
      n.paused += p.paused;
      n.releasedBytes += p.releasedBytes;
      st.deleted += p.deleted;
      for (const [c, k] of Object.entries(p.errors)) st.errors[c] = (st.errors[c] ?? 0) + k;
      for (const f of p.failures) if (st.failures.length < 50) st.failures.push({ ...f, node: ref.node });
      if (p.state === 'deleted') deletedShares++;
    }
    if (!lost && (p === undefined || p.state === 'creating')) open++;
    if (lost) deletedShares++;
  }
  if (control === 'deleted') st.state = deletedShares >= spec.shares.length ? 'deleted' : 'deleting';
  else if (control === 'cancelled') st.state = 'cancelled';
  else if (control === 'paused') st.state = 'paused';
  else if (open === 0 && st.pending === 0 && st.created + st.failed + st.lost >= spec.count) st.state = st.failed + st.lost > 0 ? 'partial' : 'done';
  return st;
}

export function isTerminal(s: JobState): boolean {
  return s === 'done' || s === 'partial' || s === 'cancelled' || s === 'deleted';
}

// ------------------------------------------------------------------ the gateway's copy

export interface CachedJob {
  spec: JobSpec | null;
  specRev: string;
  control: JobControlState;
  progress: Map<string, ShareProgress>;
  /** The mod revision of each key applied: a fresh read and the watch may deliver one key in either order. */
  revs: Map<string, bigint>;
}

/**
 * Every job's records, watched: follow streams and lists are answered from here. The watch can
 * lag behind a write another gateway made (while etcd elects a leader, for one), so reads of one
 * job go to etcd first (`fresh`): a job admitted through any gateway is seen through every one.
 */
export class JobsCache extends EventEmitter {
  readonly jobs = new Map<string, CachedJob>();
  private watcher: { cancel(): Promise<void> } | null = null;
  private controlWatcher: { cancel(): Promise<void> } | null = null;

  constructor(private readonly etcd: Etcd3) {
    super();
    this.setMaxListeners(0);
  }

  private job(id: string): CachedJob {
    let j = this.jobs.get(id);
    if (!j) this.jobs.set(id, (j = { spec: null, specRev: '0', control: 'running', progress: new Map(), revs: new Map() }));
    return j;
  }

  /** False when this key is already known at `modRev` or later. */
  private newer(j: CachedJob, key: string, modRev: string): boolean {
    const rev = BigInt(modRev);
    if ((j.revs.get(key) ?? -1n) >= rev) return false;
    j.revs.set(key, rev);
    return true;
  }

  private apply(key: string, value: string, modRev: string): void {
    const rest = key.slice(keys.jobs.length);
    const [id, kind, node, share] = rest.split('/');
    if (!id) return;
    const j = this.job(id);
    if (!this.newer(j, key, modRev)) return;
    if (kind === 'spec') {
      const s = parseJson<JobSpec>(value);
      if (s) {
        j.spec = s;
        j.specRev = modRev;
      }
    } else if (kind === 'progress' && node && share) {
      const p = parseJson<ShareProgress>(value);
      if (p) {
        j.progress.set(`${node}/${share}`, p);
        this.emit(`progress:${id}`, p);
      }
    }
    this.emit(`job:${id}`);
  }

  /** A job this gateway just admitted: known here at once (its own watch event follows). */
  admitted(spec: JobSpec, rev: string): void {
    const j = this.job(spec.id);
    if (j.spec === null) {
      j.spec = spec;
      j.specRev = rev;
    }
  }

  async start(): Promise<void> {
    const res = await this.etcd.getAll().prefix(keys.jobs).exec();
    for (const kv of res.kvs) this.apply(kv.key.toString('utf8'), kv.value.toString('utf8'), kv.mod_revision);
    const w = await this.etcd.watch().prefix(keys.jobs).startRevision(nextRevision(res.header.revision)).create();
    w.on('put', (kv) => this.apply(kv.key.toString('utf8'), kv.value.toString('utf8'), kv.mod_revision));
    this.watcher = w;
    const c = await this.etcd.getAll().prefix(keys.controls).exec();
    for (const kv of c.kvs) this.setControl(kv.key.toString('utf8'), kv.value.toString('utf8'), kv.mod_revision);
    const cw = await this.etcd.watch().prefix(keys.controls).startRevision(nextRevision(c.header.revision)).create();
    cw.on('put', (kv) => this.setControl(kv.key.toString('utf8'), kv.value.toString('utf8'), kv.mod_revision));
    this.controlWatcher = cw;
  }

  /**
   * One job as etcd has it now (a linearizable read of its spec, progress and control), merged
   * into the cache; undefined when etcd has no such job.
   */
  async fresh(id: string): Promise<CachedJob | undefined> {
    const [records, control] = await store('job read', () => Promise.all([this.etcd.getAll().prefix(keys.jobPrefix(id)).exec(), this.etcd.get(keys.jobControl(id)).exec()]));
    for (const kv of records.kvs) this.apply(kv.key.toString('utf8'), kv.value.toString('utf8'), kv.mod_revision);
    for (const kv of control.kvs) this.setControl(kv.key.toString('utf8'), kv.value.toString('utf8'), kv.mod_revision);
    const j = this.jobs.get(id);
    return j?.spec ? j : undefined;
  }

  private setControl(key: string, value: string, modRev: string): void {
    const id = key.slice(keys.controls.length);
    const j = this.job(id);
    if (!this.newer(j, key, modRev)) return;
    const c = parseJson<{ state: JobControlState }>(value);
    if (!c) return;
    j.control = c.state;
    this.emit(`job:${id}`);
  }

  async close(): Promise<void> {
    await this.watcher?.cancel().catch(() => undefined);
    await this.controlWatcher?.cancel().catch(() => undefined);
  }
}
