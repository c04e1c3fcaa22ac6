/**
 * Pause and resume at the cgroup level: freeze, then give the memory back.
 *
 * With swap, every process of the group is first paged out (process_madvise
 * MADV_PAGEOUT over its private writable mappings): the cgroup's reclaim takes
 * pages from the inactive list first, and after a resume read everything back
 * every page is active, so a limit write gives up at its first round. Then:
 *
 * - cgroup v2: `cgroup.freeze`, `memory.swap.max` raised from 0 to the
 *   sandbox's limit, then `memory.reclaim` of the group's whole usage (swap or
 *   zswap takes the anonymous pages; EAGAIN only means "not all of it").
 *   Resume sets `memory.swap.max` back to 0.
 * - cgroup v1: the freezer, then lower `memory.limit_in_bytes` as far as the
 *   kernel lets it: the write reclaims synchronously (anonymous pages go to
 *   swap, e.g. a zram device, page cache is dropped) and fails with EBUSY when
 *   the group cannot get under the new limit; we then settle just above what
 *   is left. memory+swap (`memory.memsw.limit_in_bytes`) stays at the
 *   sandbox's limit, so swapped pages never exceed what the sandbox was given.
 *   The limit is put back before the pause answers, still frozen: nothing
 *   faults the pages back in, and a swapoff of their device can then bring
 *   them back instead of calling the OOM killer on the sandbox.
 *
 * Resume thaws, then prefetches: every swapped-out page of
 * the sandbox's processes is read back in the background (native prefetchAsync:
 * 'touch' faults each one in and maps it again, so the sandbox's own first touch
 * costs nothing; 'willneed' only asks for swap readahead). Neither cgroup v1 nor
 * v2 has a cgroup-level swap-in, so it is done per process. WARREN_RESUME_PREFETCH
 * = touch (default) | willneed | off.
 *
 * The reclaiming writes block in the kernel for as long as reclaim takes
 * (about a second for 200 MiB), so they are done with asynchronous file
 * writes on the libuv thread pool, never on the event loop. Freezing and
 * thawing go through the native helper.
 */
import { readFileSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { WarrenError } from '../../errors';
import { native } from '../../native';
import type { ColdReclaimReport } from '../types';

const MIB = 1024 * 1024;
const SANDBOX_ID_RE = /^[a-z0-9][a-z0-9-]{0,62}$/;

export interface PauseReport {
  /** Memory charged to the sandbox before and after (bytes). */
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  releasedBytes: number;
  /** Bytes of the sandbox in swap after the pause (v1 memsw - usage; v2 memory.swap.current), when known. */
  swapBytes: number | null;
  /** How memory was given back. */
  reclaim: 'memory.reclaim' | 'limit' | 'none';
  /** Why nothing (or less) was reclaimed, when that is the case. */
  note?: string;
  freezeMs: number;
  reclaimMs: number;
  durationMs: number;
}

export interface ResumeReport {
  thawMs: number;
  durationMs: number;
  /** The background prefetch started after the thaw ('off': none). */
  prefetch: PrefetchMode;
}

export type PrefetchMode = 'touch' | 'willneed' | 'off';

export interface PrefetchReport {
  mode: PrefetchMode;
  /** Bytes read back (touch) or advised (willneed). */
  bytes: number;
  processes: number;
  /** From the thaw to the last process done. */
  durationMs: number;
}

/** The prefetch in flight (or last done) per sandbox, for callers that wait for all memory to be resident. */
const prefetches = new Map<string, Promise<PrefetchReport>>();

export function prefetchMode(): PrefetchMode {
  const v = process.env.WARREN_RESUME_PREFETCH;
  return v === 'off' || v === '0' ? 'off' : v === 'willneed' ? 'willneed' : 'touch';
}

/** The latest resume's prefetch of sandbox `id`, if one was started (it never rejects). */
export function prefetchDone(id: string): Promise<PrefetchReport> | undefined {
  return prefetches.get(id);
}

/** Forget a sandbox's prefetch record (destroy). */
export function forgetPrefetch(id: string): void {
  prefetches.delete(id);
}

/** `fn` for every process of cgroup `id` at once; one that fails (it exited) gives `fallback`, a cgroup that is gone nothing. */
async function eachProcess<T>(id: string, fn: (pid: number) => Promise<T>, fallback: T): Promise<T[]> {
  let pids: number[];
  try {
    pids = native.cgroupProcs(id);
  } catch {
    return [];
  }
  return Promise.all(pids.map((p) => fn(p).catch(() => fallback)));
}

/** Read the swapped-out memory of every process of cgroup `id` back. */
export async function prefetchCgroup(id: string, mode: Exclude<PrefetchMode, 'off'>): Promise<PrefetchReport> {
  const t0 = performance.now();
  const done = await eachProcess(id, (p) => native.prefetchAsync(p, mode), { bytes: 0 });
  return { mode, bytes: done.reduce((n, d) => n + d.bytes, 0), processes: done.length, durationMs: round(performance.now() - t0) };
}

/**
 * The kernel operations pause and resume use; the default is the native
 * helper plus cgroup file writes. Tests substitute a fake cgroup tree to check
 * the v2 path on v1 hosts (and the EBUSY fallback of the v1 path).
 */
export interface CgroupOps {
  layout(): { version: 1 | 2; roots: Record<string, string> };
  memoryCurrent(id: string): number;
  freeze(id: string, frozen: boolean): void;
  write(path: string, value: string): Promise<void>;
  read(path: string): Promise<string>;
  swapTotal(): number;
  /** Push the private pages of every process of the cgroup to swap, whichever LRU list they are on. */
  pageout?(id: string): Promise<void>;
}

export const nativeCgroupOps: CgroupOps = {
  layout: () => native.cgroupLayout(),
  memoryCurrent: (id) => native.cgroupStats(id).memoryCurrentBytes,
  freeze: (id, frozen) => native.cgroupFreeze(id, frozen),
  write: (path, value) => writeFile(path, value),
  read: (path) => readFile(path, 'utf8'),
  swapTotal: () => swapTotalBytes(),
  pageout: async (id) => {
    await eachProcess(id, (p) => native.pageoutAsync(p), { bytes: 0 });
  },
};

function check(id: string): void {
  if (!SANDBOX_ID_RE.test(id)) throw new WarrenError('INVALID_ID', `invalid sandbox id ${JSON.stringify(id)}`);
}

function memoryDir(ops: CgroupOps, id: string): { version: 1 | 2; dir: string } {
  const layout = ops.layout();
  const root = layout.version === 2 ? layout.roots.unified ?? layout.roots.memory : layout.roots.memory;
  if (root === undefined) throw new WarrenError('NOT_SUPPORTED', 'no memory cgroup controller on this node');
  return { version: layout.version, dir: join(root, id) };
}

async function readNumber(ops: CgroupOps, path: string): Promise<number | null> {
  try {
    const text = (await ops.read(path)).trim();
    if (text === 'max') return Number.MAX_SAFE_INTEGER;
    const n = Number(text);
    return Number.isFinite(n) ? n : null;
  } catch {
    return null;
  }
}

/** Total swap space on this node (bytes), from /proc/swaps. */
export function swapTotalBytes(): number {
  try {
    return readFileSync('/proc/swaps', 'utf8')
      .split('\n')
      .slice(1)
      .filter((l) => l.trim() !== '')
      .reduce((n, l) => n + Number(l.split(/\s+/)[2] ?? 0) * 1024, 0);
  } catch {
    return 0;
  }
}

function errnoOf(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException).code;
}

/**
 * Freeze the sandbox's cgroup and push its memory out. `limitBytes` is the
 * sandbox's configured memory limit (restored by resume).
 */
export async function pauseCgroup(id: string, limitBytes: number, opts: { reclaim?: boolean; ops?: CgroupOps } = {}): Promise<PauseReport> {
  check(id);
  const ops = opts.ops ?? nativeCgroupOps;
  // The prefetch of the last resume charges the sandbox's cgroup as it reads: running on while the
  // limit is lowered, it would fight the reclaim and could make the OOM killer end a process.
  await prefetches.get(id);
  const started = performance.now();
  const { version, dir } = memoryDir(ops, id);
  const before = ops.memoryCurrent(id);
  ops.freeze(id, true);
  const frozen = performance.now();
  let reclaim: PauseReport['reclaim'] = 'none';
  let note: string | undefined;
  try {
    if (opts.reclaim === false) {
      note = 'reclaim not requested';
    } else if (version === 2) {
      reclaim = 'memory.reclaim';
      // Sandboxes run with memory.swap.max = 0; while paused they may swap up to their limit.
      await ops.write(join(dir, 'memory.swap.max'), String(limitBytes)).catch(() => undefined);
      if (ops.swapTotal() > 0) await ops.pageout?.(id);
      try {
        await ops.write(join(dir, 'memory.reclaim'), String(Math.max(before, MIB)));
      } catch (err) {
        if (errnoOf(err) === 'ENOENT') {
          reclaim = 'none';
          note = 'memory.reclaim is missing (kernel < 5.19)';
        } else if (errnoOf(err) !== 'EAGAIN') throw err;
        // EAGAIN: could not reclaim all of it (no swap for anonymous pages); what went, went.
      }
      if (ops.swapTotal() === 0) note = 'no swap on this node: only page cache was reclaimed';
    } else if (ops.swapTotal() === 0) {
      // Lowering the limit without swap can only drop page cache and takes the
      // kernel's full retry loop to give up: not worth freezing longer for.
      note = 'no swap on this node (enable a zram swap device): memory stays resident';
    } else {
      reclaim = 'limit';
      // The limit's reclaim rounds give up on pages that are all on the active list (as after a
      // resume read everything back): page the processes out first, the limit takes the rest.
      await ops.pageout?.(id);
      try {
        await lowerLimitV1(ops, dir, limitBytes);
      } finally {
        // Frozen, nothing brings the pages back: the limit goes back at once. A lowered limit
        // held while paused would make their only other way back, a swapoff of the device
        // they are on, call the OOM killer on the sandbox.
        await ops.write(join(dir, 'memory.limit_in_bytes'), String(limitBytes));
      }
    }
  } catch (err) {
    // Leave the sandbox as it was.
    ops.freeze(id, false);
    throw err instanceof WarrenError ? err : new WarrenError('CGROUP_ERROR', `reclaiming memory of ${id}: ${(err as Error).message}`);
  }
  const reclaimed = performance.now();
  const after = ops.memoryCurrent(id);
  let swapBytes: number | null = null;
  if (version === 1) {
    const memsw = await readNumber(ops, join(dir, 'memory.memsw.usage_in_bytes'));
    const usage = await readNumber(ops, join(dir, 'memory.usage_in_bytes'));
    if (memsw !== null && usage !== null) swapBytes = Math.max(0, memsw - usage);
  } else {
    swapBytes = await readNumber(ops, join(dir, 'memory.swap.current'));
  }
  const report: PauseReport = {
    memoryBeforeBytes: before,
    memoryAfterBytes: after,
    releasedBytes: Math.max(0, before - after),
    swapBytes,
    reclaim,
    freezeMs: round(frozen - started),
    reclaimMs: round(reclaimed - frozen),
    durationMs: round(performance.now() - started),
  };
  if (note !== undefined) report.note = note;
  return report;
}

/**
 * v1: ask for 1 MiB; when the kernel answers EBUSY (kernel memory, locked or
 * unswappable pages stay), settle a little above what is left. The caller puts
 * the limit back.
 */
async function lowerLimitV1(ops: CgroupOps, dir: string, limitBytes: number): Promise<void> {
  const file = join(dir, 'memory.limit_in_bytes');
  let target = MIB;
  let last = Number.MAX_SAFE_INTEGER;
  let settle = 0;
  let forced = false;
  for (let attempt = 0; attempt < 8; attempt++) {
    try {
      await ops.write(file, String(target));
      return;
    } catch (err) {
      if (errnoOf(err) !== 'EBUSY') throw err;
    }
    const usage = (await readNumber(ops, join(dir, 'memory.usage_in_bytes'))) ?? limitBytes;
    // Still going down (recently used pages are moved to the inactive list first, a write at a
    // time): ask again. Stuck: settle a little above what is left.
    if (target === MIB && last - usage > 4 * MIB) {
      last = usage;
      continue;
    }
    // The limit write gives up at the first reclaim round without progress (all pages on the
    // active list, as after a full re-read); force_empty keeps going through a few such rounds.
    if (target === MIB && !forced) {
      forced = true;
      await ops.write(join(dir, 'memory.force_empty'), '0').catch(() => undefined);
      last = usage;
      continue;
    }
    settle++;
    target = Math.ceil((usage + settle * MIB) / (64 * 1024)) * 64 * 1024;
    if (target >= limitBytes) return;
  }
}

/** Thaw (and restore a v1 limit that a pause of an earlier version left lowered). */
export async function resumeCgroup(id: string, limitBytes: number, pausedLimitBytes: number | undefined, ops: CgroupOps = nativeCgroupOps, prefetch: PrefetchMode = prefetchMode()): Promise<ResumeReport> {
  check(id);
  const started = performance.now();
  const { version, dir } = memoryDir(ops, id);
  if (version === 1 && pausedLimitBytes !== undefined && pausedLimitBytes !== limitBytes) {
    // memsw stayed at limitBytes, so raising memory back to it is always allowed.
    await ops.write(join(dir, 'memory.limit_in_bytes'), String(limitBytes));
  }
  if (version === 2) {
    // Pages already in swap stay there until touched; no new swap-out once running again.
    await ops.write(join(dir, 'memory.swap.max'), '0').catch(() => undefined);
  }
  const t = performance.now();
  ops.freeze(id, false);
  const now = performance.now();
  if (prefetch !== 'off' && ops === nativeCgroupOps) prefetches.set(id, prefetchCgroup(id, prefetch));
  return { thawMs: round(now - t), durationMs: round(now - started), prefetch: ops === nativeCgroupOps ? prefetch : 'off' };
}

function round(ms: number): number {
  return Math.round(ms * 1000) / 1000;
}

/** The inactive (cold) bytes of a memory cgroup from its memory.stat; v1 counts the hierarchy (total_*). */
export function coldBytesFromStat(stat: string, version: 1 | 2): { anon: number; file: number } {
  const values = new Map<string, number>();
  for (const line of stat.split('\n')) {
    const [k, v] = line.split(' ');
    if (k !== undefined && v !== undefined && /^\d+$/.test(v)) values.set(k, Number(v));
  }
  const get = (k: string) => (version === 1 ? values.get(`total_${k}`) ?? values.get(k) : values.get(k)) ?? 0;
  return { anon: get('inactive_anon'), file: get('inactive_file') };
}

/**
 * Proactive reclaim of a running sandbox's cold memory. The kernel already ages pages: what has
 * not been touched lately sits on the inactive LRU lists. That much is pushed out (anonymous
 * pages to swap, page cache dropped); the working set stays resident and the sandbox keeps its
 * processes and its limits.
 * - v2: `memory.reclaim` of that many bytes. Swap is allowed for it and then capped at what
 *   went there (`memory.swap.max`), so the sandbox's own pressure still never swaps.
 * - v1: frozen for the moment it takes (a process allocating into a lowered limit could be
 *   OOM-killed), `memory.limit_in_bytes` lowered by that many bytes and put back; the write
 *   reclaims synchronously and EBUSY only means less went. memsw stays at the limit, so
 *   resident plus swapped never exceeds what the sandbox was given.
 * Without swap only the page cache part can go.
 */
export async function reclaimColdCgroup(id: string, limitBytes: number, ops: CgroupOps = nativeCgroupOps): Promise<ColdReclaimReport> {
  check(id);
  await prefetches.get(id); // as in pauseCgroup
  const started = performance.now();
  const { version, dir } = memoryDir(ops, id);
  const before = ops.memoryCurrent(id);
  const swap = ops.swapTotal() > 0;
  const cold = coldBytesFromStat(await ops.read(join(dir, 'memory.stat')).catch(() => ''), version);
  const coldBytes = (swap ? cold.anon : 0) + cold.file;
  let reclaim: ColdReclaimReport['reclaim'] = 'none';
  let note = swap ? undefined : 'no swap on this node: only cold page cache was reclaimed';
  if (coldBytes >= MIB) {
    if (version === 2) {
      reclaim = 'memory.reclaim';
      if (swap) await ops.write(join(dir, 'memory.swap.max'), String(limitBytes)).catch(() => undefined);
      try {
        await ops.write(join(dir, 'memory.reclaim'), String(coldBytes));
      } catch (err) {
        if (errnoOf(err) === 'ENOENT') {
          reclaim = 'none';
          note = 'memory.reclaim is missing (kernel < 5.19)';
        } else if (errnoOf(err) !== 'EAGAIN') throw new WarrenError('CGROUP_ERROR', `reclaiming cold memory of ${id}: ${(err as Error).message}`);
      } finally {
        if (swap) {
          const swapped = (await readNumber(ops, join(dir, 'memory.swap.current'))) ?? 0;
          await ops.write(join(dir, 'memory.swap.max'), String(swapped)).catch(() => undefined);
        }
      }
    } else {
      reclaim = 'limit';
      const file = join(dir, 'memory.limit_in_bytes');
      const target = Math.max(MIB, Math.ceil((before - coldBytes) / (64 * 1024)) * 64 * 1024);
      ops.freeze(id, true);
      try {
        await ops.write(file, String(target)).catch((err) => {
          if (errnoOf(err) !== 'EBUSY') throw err;
        });
      } catch (err) {
        throw new WarrenError('CGROUP_ERROR', `reclaiming cold memory of ${id}: ${(err as Error).message}`);
      } finally {
        await ops.write(file, String(limitBytes)).catch(() => undefined);
        ops.freeze(id, false);
      }
    }
  } else {
    note = 'nothing cold to reclaim';
  }
  const after = ops.memoryCurrent(id);
  const report: ColdReclaimReport = { memoryBeforeBytes: before, memoryAfterBytes: after, releasedBytes: Math.max(0, before - after), coldBytes, reclaim, durationMs: round(performance.now() - started) };
  if (note !== undefined) report.note = note;
  return report;
}
