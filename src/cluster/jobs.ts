/**
 * Job records: what a gateway writes when it admits a job, and the status
 * computed from what the nodes report. A job's spec, its control state, its
 * shares (one per node it was placed on) and their progress live in etcd;
 * the sandboxes themselves stay on their nodes (labelled warren.job).
 */
import { WarrenError } from '../errors';
import { expectNumber, expectObject, rejectUnknown, validateLabels } from '../validation';
import type { Principal, SandboxSpec } from '../shim/types';
import type { IndexRange, JobControlState, ShareProgress } from './node-agent';
import type { Explanation } from './placement';

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

export interface PlacementAsk {
  nodeSelector?: Record<string, string>;
  nodes?: string[];
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

export function validatePlacementAsk(v: unknown): PlacementAsk {
  if (v === undefined) return {};
  const o = expectObject(v, 'placement');
  rejectUnknown(o, ['nodeSelector', 'nodes'], 'placement.');
  const out: PlacementAsk = {};
  if (o.nodeSelector !== undefined) out.nodeSelector = validateLabels(o.nodeSelector, 'placement.nodeSelector');
  if (o.nodes !== undefined) {
    if (!Array.isArray(o.nodes) || o.nodes.length > 256 || o.nodes.some((n) => typeof n !== 'string' || !/^[a-z0-9][a-z0-9-]{0,15}$/.test(n))) {
      throw new WarrenError('INVALID_ARGUMENT', 'placement.nodes must be a list of node ids', { field: 'placement.nodes' });
    }
    out.nodes = o.nodes as string[];
  }
  return out;
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
