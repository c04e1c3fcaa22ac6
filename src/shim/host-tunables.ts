/**
 * Kernel tunables a node of thousands of sandboxes needs, raised (never lowered) by `warren up`
 * and scripts/setup.sh, and what could not be raised, for /v1/features.
 *
 * - kernel.pid_max: every sandbox's pid 1 and every process in it is a host pid; the 32768 of
 *   older defaults is reached at ~10,000 sandboxes with a couple of processes each.
 * - kernel.threads-max, user.max_{pid,mnt,net,ipc,uts,cgroup}_namespaces: one namespace of each
 *   kind per sandbox; checked, raised when below what the node wants.
 * - RLIMIT_NOFILE: the gateway holds one descriptor per sandbox. Node raises the soft limit to
 *   the hard one at start; raising the hard limit needs CAP_SYS_RESOURCE (fs.nr_open bounds it),
 *   which a container-run gateway often lacks: then the hard limit is the node's ceiling, and
 *   it is reported here.
 * - cgroup favordynmods: moving a process into a cgroup (every exec on a cgroup v1 host joins its
 *   sandbox's v1 groups; exec supervisors are attached after they start) takes the kernel's
 *   global cgroup threadgroup lock for writing, and unless a cgroup mount favours dynamic
 *   modifications that writer first waits for an RCU grace period whenever no other migration
 *   happened within the last one. Measured here: an exec after 50 ms of quiet took 13.5 ms p50,
 *   3.0 ms with the flag (2.6 and 2.0 ms back to back). With the flag, kernels from 6.18 lock
 *   only the process being moved (and keep doing so until reboot, even if the flag is cleared);
 *   6.0 to 6.17 keep the global lock in its writer-friendly mode, where forks and exits pay a
 *   shared atomic instead of a per-CPU count. The flag is set on one cgroup mount (the cgroup2
 *   one where there is one) with a remount; here that one mount was enough for the v1 joins too.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { openFilesLimit } from './capacity';
import { readMountInfo } from './layers/sys';

export interface TunableReport {
  name: string;
  value: number | null;
  wanted: number;
  /** 'ok' (already enough), 'raised' (written now), 'short' (could not be raised: reason). */
  status: 'ok' | 'raised' | 'short';
  reason?: string;
}

/** Sandboxes a node is sized for when nothing else is said (the density target). */
export const DENSITY_TARGET = 10_000;

const WANTED: ReadonlyArray<{ name: string; wanted: number }> = [
  { name: 'kernel.pid_max', wanted: 4_194_304 },
  { name: 'kernel.threads-max', wanted: 8 * DENSITY_TARGET },
  ...['pid', 'mnt', 'net', 'ipc', 'uts', 'cgroup'].map((n) => ({ name: `user.max_${n}_namespaces`, wanted: 2 * DENSITY_TARGET })),
];

let last: TunableReport[] | null = null;

function sysctlPath(name: string): string {
  return `/proc/sys/${name.replace(/\./g, '/')}`;
}

function read(name: string): number | null {
  try {
    const n = Number(readFileSync(sysctlPath(name), 'utf8').trim());
    return Number.isFinite(n) ? n : null;
  } catch {
    return null;
  }
}

/** Hard RLIMIT_NOFILE of this process. */
function hardOpenFiles(): number | null {
  try {
    const m = /^Max open files\s+\S+\s+(\d+|unlimited)/m.exec(readFileSync('/proc/self/limits', 'utf8'));
    return m ? (m[1] === 'unlimited' ? Number.MAX_SAFE_INTEGER : Number(m[1])) : null;
  } catch {
    return null;
  }
}

/** Descriptors the gateway needs for DENSITY_TARGET sandboxes: one each, plus room for execs, shells and clients. */
export const FDS_WANTED = DENSITY_TARGET + 4096;

/** Raise what is below WANTED (`raise`: false only reports). */
export function raiseHostLimits(raise = true): TunableReport[] {
  const out: TunableReport[] = [];
  for (const { name, wanted } of WANTED) {
    const value = read(name);
    if (value === null) {
      out.push({ name, value, wanted, status: 'short', reason: `${sysctlPath(name)} is not readable here` });
      continue;
    }
    if (value >= wanted) {
      out.push({ name, value, wanted, status: 'ok' });
      continue;
    }
    if (!raise) {
      out.push({ name, value, wanted, status: 'short', reason: 'not raised (report only)' });
      continue;
    }
    try {
      writeFileSync(sysctlPath(name), String(wanted));
      out.push({ name, value: read(name), wanted, status: 'raised' });
    } catch (err) {
      out.push({ name, value, wanted, status: 'short', reason: `cannot write ${sysctlPath(name)}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}` });
    }
  }
  out.push(cgroupFavorDynmods(raise));
  const soft = openFilesLimit();
  const hard = hardOpenFiles();
  if (soft >= FDS_WANTED) out.push({ name: 'RLIMIT_NOFILE', value: soft, wanted: FDS_WANTED, status: 'ok' });
  else {
    const reason =
      hard !== null && hard <= soft
        ? `the hard limit is ${hard} and raising it needs CAP_SYS_RESOURCE (absent here): the gateway's descriptors (one per sandbox, a reserve kept free) cap this node at about ${Math.max(0, soft - Math.max(256, Math.floor(soft * 0.05)) - 64)} sandboxes; raise it where the gateway is started (LimitNOFILE=, ulimit -Hn)`
        : `the soft limit is ${soft} of a hard ${hard ?? '?'}`;
    out.push({ name: 'RLIMIT_NOFILE', value: soft, wanted: FDS_WANTED, status: 'short', reason });
  }
  last = out;
  return out;
}

/** The cgroup mounts of this mount namespace (favordynmods is a super option: the file system's, not the mount's). */
function cgroupMounts(): Array<{ target: string; fstype: string; options: string[] }> {
  try {
    return readMountInfo()
      .filter((m) => m.fstype === 'cgroup2' || m.fstype === 'cgroup')
      .map((m) => ({ target: m.mountPoint, fstype: m.fstype, options: m.superOptions.split(',') }));
  } catch {
    return [];
  }
}

const FAVOR = 'cgroup.favordynmods';

/** Set `favordynmods` on a cgroup mount unless one has it (`raise`: false only reports). */
function cgroupFavorDynmods(raise: boolean): TunableReport {
  const mounts = cgroupMounts();
  if (mounts.some((m) => m.options.includes('favordynmods'))) return { name: FAVOR, value: 1, wanted: 1, status: 'ok' };
  const target = (mounts.find((m) => m.fstype === 'cgroup2') ?? mounts[0])?.target;
  if (target === undefined) return { name: FAVOR, value: null, wanted: 1, status: 'short', reason: 'no cgroup file system is mounted here' };
  if (!raise) return { name: FAVOR, value: 0, wanted: 1, status: 'short', reason: `not set on ${target} (report only)` };
  const r = spawnSync('mount', ['-o', 'remount,favordynmods', target], { encoding: 'utf8', timeout: 10_000 });
  if (r.status === 0 && cgroupMounts().some((m) => m.target === target && m.options.includes('favordynmods'))) return { name: FAVOR, value: 1, wanted: 1, status: 'raised' };
  const why = r.error?.message ?? (r.stderr.trim() || `mount exited with ${r.status ?? r.signal}`);
  return { name: FAVOR, value: 0, wanted: 1, status: 'short', reason: `cannot remount ${target} with favordynmods (the kernel has it from 6.0): ${why}; every cgroup migration after a quiet spell then waits for an RCU grace period` };
}

/** What the last raiseHostLimits found (a report-only pass when `warren up` did not run it). */
export function hostTunables(): TunableReport[] {
  return last ?? raiseHostLimits(false);
}
