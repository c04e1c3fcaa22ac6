/**
 * The typed boundary to the native helper (native/helper/, an N-API addon).
 *
 * TypeScript validates and decides; C++ performs the syscalls and validates its
 * inputs again (ids, absolute paths, numeric ranges). Every failure crosses the
 * boundary as a WarrenError with a stable code and, for syscall failures, the
 * errno in `err.errno`.
 */

export type CgroupVersion = 1 | 2;

export interface CgroupLayout {
  version: CgroupVersion;
  /** Absolute paths of the Warren parent group per controller ("unified" on v2). */
  roots: Record<string, string>;
}

export interface CgroupLimits {
  /** CFS quota per period, microseconds; omitted = unlimited. */
  cpuQuotaUs?: number;
  /** CFS period, microseconds (default 100000). */
  cpuPeriodUs?: number;
  memoryBytes?: number;
  /** memory+swap limit on v1 (memsw) or swap.max on v2; omitted = same as memoryBytes (no swap). */
  memorySwapBytes?: number;
  pidsMax?: number;
}

export interface CgroupStats {
  memoryCurrentBytes: number;
  memoryPeakBytes: number;
  /** Number of OOM kills in this group since it was created. */
  oomKills: number;
  cpuUsageUs: number;
  pidsCurrent: number;
  frozen: boolean;
}

export interface SpawnSandboxSpec {
  /** Sandbox id: [a-z0-9][a-z0-9-]{0,62}. Also the cgroup name and the hostname default. */
  id: string;
  hostname: string;
  /** Read-only lower directories, top-most first (toolkits, workspace, base). Absolute host paths. */
  lowerDirs: string[];
  /** Per-sandbox writable upper dir and overlay work dir (same filesystem). */
  upperDir: string;
  workDir: string;
  /** Mount point for the overlay inside the sandbox's own mount namespace (an empty host dir). */
  rootfsDir: string;
  /** Host path of the static pid-1 reaper (native/helper/out/warren-init). */
  initPath: string;
  /** New network namespace with only loopback up. */
  network: 'loopback';
  /** Run every process of the sandbox under SCHED_IDLE. */
  schedIdle: boolean;
  /** Give the sandbox its own core-scheduling cookie (throws NOT_SUPPORTED where the kernel lacks it). */
  coreSched: boolean;
  /** Size limit of the tmpfs mounted on /dev/shm and /tmp is not touched; bytes. */
  shmBytes?: number;
}

export interface SandboxProcess {
  /** Host pid of the sandbox's pid 1. */
  pid: number;
  /** A pidfd for it, owned by the caller (close with native.close). */
  pidfd: number;
  /** Process start time in clock ticks (from /proc/pid/stat), to detect pid reuse on re-adoption. */
  startTime: number;
}

export interface ExecSpec {
  /** Host pid of the target sandbox's pid 1 (namespaces are taken from it). */
  initPid: number;
  /** Its cgroup name (the sandbox id); the new process joins it. */
  cgroup: string;
  argv: string[];
  /** "KEY=value" strings; the full environment. */
  env: string[];
  cwd: string;
  uid: number;
  gid: number;
  schedIdle: boolean;
  /** With a pty, stdin/stdout/stderr are one terminal and `ptyFd` is its master. */
  pty?: { cols: number; rows: number };
  /** Extra pipe from the child's fd 3 to the caller (used by shell sessions for exit markers). */
  statusPipe?: boolean;
}

export interface ExecProcess {
  pid: number;
  pidfd: number;
  /** Parent ends of the pipes (non-blocking, close-on-exec). Absent in pty mode. */
  stdin?: number;
  stdout?: number;
  stderr?: number;
  /** Parent end of the child's fd 3 when statusPipe was asked for. */
  status?: number;
  /** Master side of the terminal in pty mode. */
  ptyFd?: number;
}

export interface ExitStatus {
  /** Exit code when the process exited, else null. */
  exitCode: number | null;
  /** Signal number when it was killed by a signal, else null. */
  signal: number | null;
}

export type MountFlag = 'ro' | 'nosuid' | 'nodev' | 'noexec' | 'bind' | 'rec' | 'private';

export interface NativeAddon {
  readonly version: string;

  // cgroups: one interface over v1 (one directory per controller) and v2 (unified).
  cgroupLayout(): CgroupLayout;
  cgroupCreate(name: string, limits: CgroupLimits): void;
  cgroupUpdate(name: string, limits: CgroupLimits): void;
  cgroupStats(name: string): CgroupStats;
  cgroupProcs(name: string): number[];
  cgroupFreeze(name: string, frozen: boolean): void;
  /** SIGKILL every process in the group; returns how many were signalled. */
  cgroupKill(name: string): number;
  /** rmdir the group in every hierarchy; throws CGROUP_ERROR (EBUSY) while processes remain. */
  cgroupDestroy(name: string): void;
  cgroupExists(name: string): boolean;
  /** Move an existing host process (e.g. a session holder) into the group. */
  cgroupAttach(name: string, pid: number): void;

  // processes
  spawnSandbox(spec: SpawnSandboxSpec): SandboxProcess;
  exec(spec: ExecSpec): ExecProcess;
  /**
   * Call `callback` once when the process behind `pidfd` ends. For children of
   * this process the status is reaped (waitid P_PIDFD); for adopted processes
   * it is unknown (exitCode and signal null). The pidfd stays owned by the caller.
   */
  watchExit(pidfd: number, callback: (status: ExitStatus) => void): void;
  pidfdOpen(pid: number): number;
  pidfdSendSignal(pidfd: number, signal: number): void;
  /** Start time in clock ticks of `pid`, or 0 when it does not exist. */
  processStartTime(pid: number): number;
  ptyResize(ptyFd: number, cols: number, rows: number): void;
  close(fd: number): void;

  // filesystem, confined to a root (openat2 RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
  /** Open `path` (interpreted inside rootDir, symlinks cannot leave it). flags: 'r' | 'w' (create/truncate) | 'a' | 'dir'. */
  openInRoot(rootDir: string, path: string, flags: 'r' | 'w' | 'a' | 'dir', mode: number): number;
  mkdirInRoot(rootDir: string, path: string, mode: number, recursive: boolean): void;

  // mounts
  mount(source: string, target: string, fstype: string, flags: MountFlag[], data: string): void;
  umount(target: string, detach: boolean): void;

  // scheduling
  /** Whether prctl(PR_SCHED_CORE) works here; never throws. */
  coreSchedSupported(): boolean;
  setSchedIdle(pid: number): void;
}
