/**
 * Placement: which node a sandbox goes to. Pure functions over the node
 * records the gateway holds from its etcd watch (no I/O), so that a job of
 * 32K sandboxes is placed in milliseconds and the rules are unit-tested.
 *
 * 1. Filter: the node is not fenced, offers the backend, matches the
 *    request's node selector, has the image and every extra layer (held, or
 *    mountable on demand: the node says it can load layers lazily and the
 *    layers are in the registry's staged set), and has room.
 * 2. Pool: on-prem nodes first; once the on-prem pool's utilisation (live +
 *    reserved sandboxes over capacity) passes the overflow threshold (80% by
 *    default), or no on-prem node fits, requests whose layers are all staged
 *    for the overflow pool (or held there) go to overflow nodes.
 * 3. Power-of-k choices (k = 2 by default) over live load, where one of the
 *    samples is drawn from the nodes already holding the request's layers,
 *    and those get a bounded bonus (at most `holderBonus` of utilisation):
 *    a hot image gathers on its holders without piling onto one of them.
 *
 * The node has final admission: a refusal there excludes that node and the
 * request is placed again.
 */
import type { BackendName } from '../shim/types';
import type { PlacementAsk } from '../validation';

export type Pool = 'onprem' | 'overflow';

export interface NodeImage {
  name: string;
  digest: string;
  kind: string;
  /** Layer digests, top-most first. */
  layers: string[];
}

/** What a node publishes about itself (under its lease, about once a second). */
export interface NodeRecord {
  id: string;
  /** Base URL of the node's API (for its operator). */
  url: string;
  /** Base URL of the node's shim protocol: what gateways call (docs/shim-protocol.md). */
  shim: string;
  pool: Pool;
  labels: Record<string, string>;
  /** Registration generation: bumped each time the node re-registers after losing its lease. */
  epoch: number;
  capacity: { sandboxes: number; cpus: number; memoryMb: number };
  used: { sandboxes: number; creating: number; memoryAvailableMb: number; load1: number };
  backends: BackendName[];
  images: NodeImage[];
  /** Layer digests the node holds (mounted or in its store). */
  layers: string[];
  /** The node can mount layers it lacks from the registry on demand. */
  lazy: boolean;
  /** Staged layers a lazy node failed to load lately: it is no candidate for them until the entry lapses. */
  unloadable?: string[];
  /** Live sandboxes per owning account (for cluster-wide quotas). */
  accounts: Record<string, number>;
  /** The cpu and memory those sandboxes were given, per owning account (cluster-wide quotas). */
  resources?: Record<string, { cpu: number; memoryMb: number }>;
  fenced: boolean;
  /** When the record was written (ms since the epoch, node clock). */
  at: number;
}

export interface PlacementRequest {
  backend: BackendName;
  image: string;
  workspaces: readonly string[];
  toolkits: readonly string[];
  /** Node labels the node must carry (all of them). */
  nodeSelector?: Record<string, string>;
  /** Only these nodes (explicit affinity). */
  nodes?: readonly string[];
}

export interface PlacementOptions {
  /** Samples per choice (power-of-k). */
  k?: number;
  /** Largest score bonus for holding the request's layers (utilisation units). */
  holderBonus?: number;
  /** On-prem utilisation above which eligible requests go to the overflow pool. */
  overflowThreshold?: number;
  /** Layers staged in the registry the lazy / overflow nodes load from. */
  staged?: ReadonlySet<string>;
  /** Sandboxes already handed to each node but not yet in its record (this gateway's in-flight creates). */
  reserved?: Map<string, number>;
  /** Nodes that refused this request already. */
  exclude?: ReadonlySet<string>;
  rng?: () => number;
}

export const DEFAULT_K = 2;
export const DEFAULT_HOLDER_BONUS = 0.1;
export const DEFAULT_OVERFLOW_THRESHOLD = 0.8;

export interface NodeVerdict {
  node: string;
  pool: Pool;
  /** Why the node was filtered out; absent when it is a candidate. */
  excluded?: string;
  holds: boolean;
  utilisation: number;
  /** How many of the request's sandboxes went there. */
  placed: number;
}

export interface Explanation {
  pool: Pool | null;
  onpremUtilisation: number;
  overflowThreshold: number;
  overflowEligible: boolean;
  layers: string[] | null;
  k: number;
  nodes: NodeVerdict[];
}

export interface BulkPlacement {
  /** Sandboxes per node. */
  counts: Map<string, number>;
  /** How many found no node. */
  unplaced: number;
  explain: Explanation;
}

/** The layer digests a request needs (top-most first), from the images the nodes report; null when a reference is known to no node. */
export function resolveLayers(nodes: readonly NodeRecord[], req: PlacementRequest): string[] | null {
  const out: string[] = [];
  for (const ref of [...req.toolkits, ...req.workspaces, req.image]) {
    let found: string[] | null = null;
    for (const n of nodes) {
      const img = n.images.find((i) => imageMatches(i, ref));
      if (img) {
        found = [...imageLayers(img)];
        break;
      }
      if (n.layers.includes(ref)) {
        found = [ref];
        break;
      }
    }
    if (found === null) return null;
    out.push(...found);
  }
  return out;
}

/** The layers of image `i`: a single-layer image may list none, its digest is then its layer's. */
export function imageLayers(i: { digest: string; layers: readonly string[] }): readonly string[] {
  return i.layers.length > 0 ? i.layers : [i.digest];
}

/** Whether image `i` is what `ref` names: its name, its digest, or `name:latest`. */
export function imageMatches(i: NodeImage, ref: string): boolean {
  return i.name === ref || i.digest === ref || `${i.name}:latest` === ref;
}

/** Whether `n` holds what `ref` names: an image by name or digest, or a layer by its digest (a workspace or toolkit may name one). */
export function holdsRef(n: NodeRecord, ref: string): boolean {
  return n.images.some((i) => imageMatches(i, ref)) || n.layers.includes(ref);
}

/** What placement needs of a create: its backend and every layer reference, with the request's ask. */
export function placementRequest(spec: { backend: BackendName; image: string; workspaces: readonly string[]; toolkits: readonly string[] }, ask: PlacementAsk): PlacementRequest {
  const r: PlacementRequest = { backend: spec.backend, image: spec.image, workspaces: spec.workspaces, toolkits: spec.toolkits };
  if (ask.nodeSelector) r.nodeSelector = ask.nodeSelector;
  if (ask.nodes) r.nodes = ask.nodes;
  return r;
}

function capacityLeft(n: NodeRecord, reserved: Map<string, number> | undefined): number {
  return n.capacity.sandboxes - n.used.sandboxes - n.used.creating - (reserved?.get(n.id) ?? 0);
}

function utilisation(n: NodeRecord, reserved: Map<string, number> | undefined): number {
  return n.capacity.sandboxes <= 0 ? 1 : (n.used.sandboxes + n.used.creating + (reserved?.get(n.id) ?? 0)) / n.capacity.sandboxes;
}

/** The reason `n` cannot take the request (capacity aside), or null. */
function filterReason(n: NodeRecord, req: PlacementRequest, layers: string[] | null, staged: ReadonlySet<string>, exclude: ReadonlySet<string> | undefined): string | null {
  if (n.fenced) return 'fenced: re-registering after a lost lease';
  if (exclude?.has(n.id)) return 'refused this request already';
  if (req.nodes && !req.nodes.includes(n.id)) return 'not in the requested nodes';
  if (!n.backends.includes(req.backend)) return `no ${req.backend} backend`;
  for (const [k, v] of Object.entries(req.nodeSelector ?? {})) if (n.labels[k] !== v) return `label ${k}=${v} not on the node`;
  const refs = [req.image, ...req.workspaces, ...req.toolkits];
  if (refs.every((r) => holdsRef(n, r))) return null;
  if (n.lazy && layers !== null && layers.every((d) => n.layers.includes(d) || staged.has(d))) {
    const failed = layers.filter((d) => !n.layers.includes(d) && n.unloadable?.includes(d));
    if (failed.length === 0) return null;
    return `does not hold ${refs.filter((r) => !holdsRef(n, r)).join(', ')}, and its last pull of staged layers ${failed.map((d) => d.slice(0, 19)).join(', ')} failed`;
  }
  return `does not hold ${refs.filter((r) => !holdsRef(n, r)).join(', ')}${n.lazy ? ' and its layers are not all staged in the registry' : ''}`;
}

function holdsAll(n: NodeRecord, layers: string[] | null): boolean {
  return layers !== null && layers.length > 0 && layers.every((d) => n.layers.includes(d));
}

/**
 * Place `count` sandboxes of one request. Reservations are counted as they
 * are made (in `opts.reserved` when given, so that the caller's in-flight
 * view stays right).
 */
export function placeMany(nodes: readonly NodeRecord[], req: PlacementRequest, count: number, opts: PlacementOptions = {}): BulkPlacement {
  const k = Math.max(1, opts.k ?? DEFAULT_K);
  const bonus = Math.max(0, Math.min(0.5, opts.holderBonus ?? DEFAULT_HOLDER_BONUS));
  const threshold = opts.overflowThreshold ?? DEFAULT_OVERFLOW_THRESHOLD;
  const staged = opts.staged ?? new Set<string>();
  const rng = opts.rng ?? Math.random;
  const reserved = opts.reserved ?? new Map<string, number>();
  const layers = resolveLayers(nodes, req);

  const verdicts = new Map<string, NodeVerdict>();
  const fits: NodeRecord[] = [];
  for (const n of nodes) {
    const why = filterReason(n, req, layers, staged, opts.exclude);
    const v: NodeVerdict = { node: n.id, pool: n.pool, holds: holdsAll(n, layers), utilisation: utilisation(n, reserved), placed: 0 };
    if (why !== null) v.excluded = why;
    verdicts.set(n.id, v);
    if (why === null) fits.push(n);
  }
  const onprem = nodes.filter((n) => n.pool === 'onprem' && !n.fenced);
  const onCap = onprem.reduce((s, n) => s + n.capacity.sandboxes, 0);
  let onUsed = onprem.reduce((s, n) => s + n.used.sandboxes + n.used.creating + (reserved.get(n.id) ?? 0), 0);
  const onFits = fits.filter((n) => n.pool === 'onprem');
  // Overflow nodes serve only requests whose layers they hold or can load from the staged registry
  // (checked by the filter above), and only once the on-prem pool is past its threshold.
  const ovFits = fits.filter((n) => n.pool === 'overflow');
  const overflowEligible = ovFits.length > 0;

  const counts = new Map<string, number>();
  let unplaced = 0;
  let lastPool: Pool | null = null;
  // What each candidate holds and has left is computed once; nodes that fill up leave the
  // sampling lists, so that each sandbox costs O(k), not O(nodes).
  const holds = new Map<string, boolean>();
  const left = new Map<string, number>();
  for (const n of fits) {
    holds.set(n.id, holdsAll(n, layers));
    left.set(n.id, capacityLeft(n, reserved));
  }
  interface Lists {
    open: NodeRecord[];
    holders: NodeRecord[];
  }
  const lists = (cands: NodeRecord[]): Lists => {
    const open = cands.filter((n) => left.get(n.id)! > 0);
    return { open, holders: open.filter((n) => holds.get(n.id)) };
  };
  const onLists = lists(onFits);
  const ovLists = lists(ovFits);
  const drop = (arr: NodeRecord[], n: NodeRecord) => {
    const i = arr.indexOf(n);
    if (i >= 0) {
      arr[i] = arr[arr.length - 1]!;
      arr.pop();
    }
  };
  const pick = (l: Lists): NodeRecord | null => {
    const { open, holders } = l;
    if (open.length === 0) return null;
    // distinct samples (with two nodes, power-of-two compares both)
    const samples = new Set<NodeRecord>();
    if (holders.length > 0) samples.add(holders[Math.floor(rng() * holders.length)]!);
    const want = Math.min(k, open.length);
    for (let tries = 0; samples.size < want && tries < 4 * k; tries++) samples.add(open[Math.floor(rng() * open.length)]!);
    let best: NodeRecord | null = null;
    let bestScore = Infinity;
    for (const n of samples) {
      const score = utilisation(n, reserved) - (holds.get(n.id) ? bonus : 0);
      if (score < bestScore) {
        bestScore = score;
        best = n;
      }
    }
    return best;
  };
  for (let i = 0; i < count; i++) {
    const onUtil = onCap === 0 ? 1 : onUsed / onCap;
    let chosen: NodeRecord | null = null;
    let from: Lists | null = null;
    if (onUtil < threshold || !overflowEligible) chosen = pick((from = onLists));
    if (chosen === null && overflowEligible) chosen = pick((from = ovLists));
    if (chosen === null && onUtil >= threshold) chosen = pick((from = onLists));
    if (chosen === null || from === null) {
      unplaced = count - i;
      break;
    }
    reserved.set(chosen.id, (reserved.get(chosen.id) ?? 0) + 1);
    counts.set(chosen.id, (counts.get(chosen.id) ?? 0) + 1);
    const l = left.get(chosen.id)! - 1;
    left.set(chosen.id, l);
    if (l <= 0) {
      drop(from.open, chosen);
      drop(from.holders, chosen);
    }
    if (chosen.pool === 'onprem') onUsed++;
    lastPool = chosen.pool;
    verdicts.get(chosen.id)!.placed++;
  }
  return {
    counts,
    unplaced,
    explain: {
      pool: lastPool,
      onpremUtilisation: onCap === 0 ? 1 : onUsed / onCap,
      overflowThreshold: threshold,
      overflowEligible,
      layers,
      k,
      nodes: [...verdicts.values()],
    },
  };
}

/** The node id a sandbox id names (`<node>-<16 hex>`), or null. */
export function nodeOfSandbox(id: string): string | null {
  const m = /^([a-z0-9][a-z0-9-]{0,15})-[0-9a-f]{16}$/.exec(id);
  return m ? m[1]! : null;
}
