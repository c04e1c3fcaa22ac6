/**
 * Admission against the host's own ceilings, checked before a create touches the kernel.
 *
 * A sandbox costs the node one descriptor (its pid 1's pidfd, held by the exit watcher), at
 * least one task (pid 1), one of each namespace and a little memory. When any of these runs
 * short, a create is refused with NODE_AT_CAPACITY (503, details.resource) while a reserve is
 * left, so that exec, files, shells, list and delete of the sandboxes already there keep
 * working and the gateway itself never runs into EMFILE or EAGAIN.
 *
 * Every check is a few microseconds. Descriptors: counting /proc/self/fd costs ~2 ms per
 * thousand open ones, so it is sampled (in the background every 2 s, synchronously only when
 * the estimate is near the limit), and between samples each sandbox created or deleted counts
 * as the one descriptor it holds. Tasks are the fourth field of /proc/loadavg, free memory is
 * MemAvailable. The limits themselves (RLIMIT_NOFILE, pid_max, threads-max,
 * user.max_*_namespaces) are re-read at most every few seconds, since `prlimit` or sysctl may
 * change them while the node runs. Whatever slips past admission (a burst between samples)
 * fails with EMFILE/EAGAIN in the kernel, which the create path reports as the same 503.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import { WarrenError } from '../errors';

export type CapacityResource = 'fds' | 'pids' | 'namespaces' | 'memory';

export interface CapacityOptions {
  /** Descriptors kept free for everything but creates (default: max(256, 5% of the limit)). */
  fdReserve?: number;
  /** Tasks kept free (default: max(512, 2% of the limit)). */
  taskReserve?: number;
  /** Host tasks this node may fill (default: min(pid_max, threads-max)); an operator's cap below the kernel's. */
  tasksMax?: number;
  /** Bytes of MemAvailable below which creates stop (default 256 MiB). */
  memoryReserveBytes?: number;
  /** How often the limits are re-read (ms, default 5000). */
  refreshMs?: number;
}

export interface CapacityReport {
  fds: { limit: number; reserve: number; open: number };
  pids: { limit: number; reserve: number; tasks: number };
  namespaces: { limit: number; reserve: number; sandboxes: number };
  memory: { availableBytes: number; reserveBytes: number };
}

const MIB = 1024 * 1024;

function readInt(path: string): number | null {
  try {
    const n = Number(readFileSync(path, 'utf8').trim());
    return Number.isFinite(n) ? n : null;
  } catch {
    return null;
  }
}

/** Soft RLIMIT_NOFILE of this process (Node has no getrlimit; /proc/self/limits is its text). */
export function openFilesLimit(): number {
  try {
    const m = /^Max open files\s+(\d+|unlimited)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    if (m && m[1] !== 'unlimited') return Number(m[1]);
  } catch {
    /* fall through */
  }
  return 1024;
}

/** The number of tasks (threads) on the host: the denominator of /proc/loadavg's fourth field. */
export function hostTasks(): number {
  const m = /\s\d+\/(\d+)\s/.exec(readFileSync('/proc/loadavg', 'utf8'));
  return m ? Number(m[1]) : 0;
}

export function memAvailableBytes(): number {
  const m = /MemAvailable:\s+(\d+) kB/.exec(readFileSync('/proc/meminfo', 'utf8'));
  return m ? Number(m[1]) * 1024 : Number.MAX_SAFE_INTEGER;
}

/** Descriptors open in this process right now (minus the one the count itself uses). */
export function openFds(): number {
  return readdirSync('/proc/self/fd').length - 1;
}

const NAMESPACE_SYSCTLS = ['pid', 'mnt', 'net', 'ipc', 'uts', 'cgroup'].map((n) => `/proc/sys/user/max_${n}_namespaces`);

export class HostCapacity {
  private fdLimit = 0;
  private taskLimit = 0;
  private nsLimit = 0;
  private refreshedAt = -Infinity;
  /** The last count of open descriptors and the sandboxes alive at that moment. */
  private fdSample = { total: 0, sandboxes: 0, at: -Infinity };
  private sampling = false;

  constructor(
    private readonly opts: CapacityOptions = {},
    /** Sandboxes alive on this node (each holds one of every namespace). */
    private readonly sandboxes: () => number = () => 0,
  ) {}

  private refresh(): void {
    const now = performance.now();
    if (now - this.refreshedAt < (this.opts.refreshMs ?? 5000)) return;
    this.refreshedAt = now;
    this.fdLimit = openFilesLimit();
    const kernelTasks = Math.min(readInt('/proc/sys/kernel/pid_max') ?? 32768, readInt('/proc/sys/kernel/threads-max') ?? Number.MAX_SAFE_INTEGER);
    this.taskLimit = this.opts.tasksMax !== undefined ? Math.min(this.opts.tasksMax, kernelTasks) : kernelTasks;
    this.nsLimit = Math.min(...NAMESPACE_SYSCTLS.map((p) => readInt(p) ?? Number.MAX_SAFE_INTEGER));
  }

  private sampleFdsNow(): void {
    this.fdSample = { total: openFds(), sandboxes: this.sandboxes(), at: performance.now() };
  }

  /** Open descriptors: the last sample plus one for each sandbox made since (minus one per sandbox gone). */
  private fdsEstimate(): number {
    const now = performance.now();
    if (now - this.fdSample.at > 2000 && !this.sampling) {
      this.sampling = true;
      const sandboxes = this.sandboxes();
      void readdir('/proc/self/fd')
        .then((l) => {
          this.fdSample = { total: l.length - 1, sandboxes, at: performance.now() };
        }, () => undefined)
        .finally(() => {
          this.sampling = false;
        });
    }
    if (this.fdSample.at === -Infinity) this.sampleFdsNow();
    let est = this.fdSample.total + (this.sandboxes() - this.fdSample.sandboxes);
    if (est >= this.fdLimit - 2 * this.fdReserve() && now - this.fdSample.at > 200) {
      // near the limit: count exactly (at most five times a second)
      this.sampleFdsNow();
      est = this.fdSample.total;
    }
    return est;
  }

  private fdReserve(): number {
    return this.opts.fdReserve ?? Math.max(256, Math.floor(this.fdLimit * 0.05));
  }

  private taskReserve(): number {
    return this.opts.taskReserve ?? Math.max(512, Math.floor(this.taskLimit * 0.02));
  }

  report(): CapacityReport {
    this.refresh();
    return {
      fds: { limit: this.fdLimit, reserve: this.fdReserve(), open: this.fdsEstimate() },
      pids: { limit: this.taskLimit, reserve: this.taskReserve(), tasks: hostTasks() },
      namespaces: { limit: this.nsLimit, reserve: 64, sandboxes: this.sandboxes() },
      memory: { availableBytes: memAvailableBytes(), reserveBytes: this.opts.memoryReserveBytes ?? 256 * MIB },
    };
  }

  /** Throw NODE_AT_CAPACITY when a new sandbox would eat into a reserve. */
  admit(): void {
    this.refresh();
    const fdReserve = this.fdReserve();
    const open = this.fdsEstimate();
    if (open >= this.fdLimit - fdReserve) {
      throw full('fds', `the node's gateway holds ${open} descriptors, within ${fdReserve} of its RLIMIT_NOFILE (${this.fdLimit}); nothing new can start until sandboxes end`, { limit: this.fdLimit, reserve: fdReserve, open });
    }
    const taskReserve = this.taskReserve();
    const tasks = hostTasks();
    if (tasks >= this.taskLimit - taskReserve) {
      throw full('pids', `the host has ${tasks} tasks, within ${taskReserve} of its limit (${this.taskLimit}: kernel.pid_max, kernel.threads-max or the node's cap)`, { limit: this.taskLimit, reserve: taskReserve, tasks });
    }
    const alive = this.sandboxes();
    if (alive >= this.nsLimit - 64) {
      throw full('namespaces', `${alive} sandboxes hold namespaces; the host allows ${this.nsLimit} of each kind (user.max_*_namespaces)`, { limit: this.nsLimit, sandboxes: alive });
    }
    const reserveBytes = this.opts.memoryReserveBytes ?? 256 * MIB;
    const avail = memAvailableBytes();
    if (avail < reserveBytes) {
      throw full('memory', `the host has ${Math.round(avail / MIB)} MiB available, below the node's reserve of ${Math.round(reserveBytes / MIB)} MiB`, { availableBytes: avail, reserveBytes });
    }
  }
}

function full(resource: CapacityResource, message: string, details: Record<string, unknown>): WarrenError {
  return new WarrenError('NODE_AT_CAPACITY', message, { resource, ...details });
}

const EAGAIN = 11;
const ENOMEM = 12;
const ENOSPC = 28;
const EMFILE = 24;
const ENFILE = 23;

/**
 * A kernel refusal on the create path that means the host is full, as NODE_AT_CAPACITY; null
 * for anything else. clone() says EAGAIN for pids (pid_max, threads-max), ENOSPC for a
 * namespace count (user.max_*_namespaces; not a full disk), ENOMEM for memory; any step says
 * EMFILE/ENFILE for descriptors (the sandbox's confinement set-up runs in the gateway's
 * descriptor table until it execs).
 */
export function capacityErrorOf(err: unknown): WarrenError | null {
  if (!(err instanceof WarrenError) || err.errno === undefined) return null;
  if (err.code !== 'SPAWN_ERROR' && err.code !== 'NATIVE_ERROR' && err.code !== 'CGROUP_ERROR' && err.code !== 'MOUNT_ERROR') return null;
  const clone = /clone sandbox init/.test(err.message);
  if (err.errno === EMFILE || err.errno === ENFILE) return full('fds', `the node is out of file descriptors (${err.message})`, { errno: err.errno });
  if (clone && err.errno === EAGAIN) return full('pids', `the host cannot start another process (${err.message}: EAGAIN; kernel.pid_max or kernel.threads-max)`, { errno: err.errno });
  if (clone && err.errno === ENOSPC) return full('namespaces', `the host allows no more namespaces (${err.message}: ENOSPC; user.max_*_namespaces)`, { errno: err.errno });
  if (err.errno === ENOMEM) return full('memory', `the host is out of memory (${err.message})`, { errno: err.errno });
  return null;
}
