/**
 * The typed boundary to the native helper (native/helper/, an N-API addon).
 *
 * TypeScript validates and decides; C++ performs the syscalls and validates its
 * inputs again (ids, absolute paths, numeric ranges). Every failure crosses the
 * boundary as a WarrenError with a stable code and, for syscall failures, the
 * errno in `err.errno`.
 */

export type CgroupVersion = 1 | 2;

/** The identity a host-side file access runs with. */
export interface FileCreds {
  uid: number;
  gid: number;
  groups?: number[];
}

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
  /** 'loopback': a new network namespace with only loopback up. 'netns': join `netnsPath`
   *  (a pooled namespace with a veth to the host bridge). */
  network: 'loopback' | 'netns';
  /** Absolute path of the network namespace to join (a /run/netns entry); with network 'netns'. */
  netnsPath?: string;
  /** Run every process of the sandbox under SCHED_IDLE. */
  schedIdle: boolean;
  /** Give the sandbox its own core-scheduling cookie (throws NOT_SUPPORTED where the kernel lacks it). */
  coreSched: boolean;
  /** Size limit of the tmpfs mounted on /dev/shm and /tmp is not touched; bytes. */
  shmBytes?: number;
  /** A host directory bound at /dev/shm instead of a tmpfs of its own (on the disk quota's tmpfs: one budget). */
  shmDir?: string;
  /** A host directory bound at /dev instead of a 64 KiB tmpfs of its own (on the disk quota's tmpfs: one superblock fewer). */
  devDir?: string;
  /**
   * Start the sandbox's mount namespace from this template (`mountTemplateCreate`) instead of a
   * copy of the caller's; the mounts under its paths (layers, the disk tmpfs on the directory
   * of upperDir) are moved in as clones. Every other path must lie on a mount the template kept.
   */
  mountTemplateFd?: number;
  /** With mountTemplateFd: the template's mask tmpfs (`mountTemplateCreate`'s `mask`), bound over every masked directory. */
  maskDir?: string;
  /** With mountTemplateFd: the template's sysfs (`mountTemplateCreate`'s `sysfs`), bound at /sys instead of a sysfs of the sandbox's own. */
  sysfsDir?: string;
  /** confinement; absent = whatever the confinement provider decides (src/native/index.ts), null = none. */
  confine?: ConfineSpec | null;
}

/**
 * Confinement of a sandbox process (native/helper/src/confine.h), applied as the last
 * steps before execve. Built by src/security/confinement.ts from the policy.
 */
export interface ConfineSpec {
  /** The default seccomp filter; `allow` is a mask of optional groups let through
   *  (1 ptrace, 2 io_uring, 4 userfaultfd, 8 perf_event_open). Absent: no filter. */
  seccomp?: { allow: number };
  /** Landlock ABI the rules are written for (0 or absent: no Landlock). */
  landlockAbi?: number;
  /** Full access beneath these paths (inside the sandbox root); at most 32. */
  writable?: string[];
  /** Read + execute beneath these paths; at most 32. */
  readOnly?: string[];
  /** Also full access beneath every top-level directory of the root (at process start) except `protected`. */
  writableTopLevel?: boolean;
  /** Top-level directories `writableTopLevel` leaves alone; at most 32. */
  protected?: string[];
  /** Landlock scopes (ABI 6): 1 abstract unix sockets, 2 signals. */
  scope?: number;
  /** AppArmor profile to change to on exec (only where AppArmor is enabled). */
  apparmorProfile?: string;
  /** RLIMIT_FSIZE in bytes. */
  fsizeBytes?: number;
  /** RLIMIT_NOFILE. */
  nofile?: number;
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
  /** Instead of the pipe: a SOCK_SEQPACKET socket pair, one end on the child's fd 3, the other in `status` (the python3 zygote's channel). */
  statusSocket?: boolean;
  /** confinement; absent = whatever the confinement provider decides (src/native/index.ts), null = none. */
  confine?: ConfineSpec | null;
  /** FnCall: isolate this one process (and its children) from the rest of the sandbox; see ExecIsolation. */
  isolate?: ExecIsolation;
}

/**
 * Per-invocation isolation (native/helper/src/isolate.h), applied in the exec
 * child before the capability drop. Mount changes happen in a private mount
 * namespace of the new process only; the sandbox itself is not touched.
 */
export interface ExecIsolation {
  /** New IPC namespace: SysV IPC and POSIX message queues die with the process. */
  ipc?: boolean;
  /** Remount / read-only in the process's own mount namespace (paths in `writable` stay writable). */
  readOnlyRoot?: boolean;
  /** Absolute paths (at most 16) kept writable under a read-only root. */
  writable?: string[];
  /** Directories of the sandbox (at most 16) bind-mounted onto other absolute paths (writable under a read-only root). */
  binds?: Array<{ source: string; target: string }>;
  /** A new network namespace with only loopback (up): sockets, ports and conntrack state die with the process. */
  net?: boolean;
  /** Fresh tmpfs mounts (at most 16) over these absolute paths; sizeBytes 4096..2^40, mode 0..0o7777, owner uid/gid (default 0). */
  tmpfs?: Array<{ path: string; sizeBytes: number; mode: number; uid?: number; gid?: number }>;
  /** Make the tmpfs mounts in the sandbox's own mount namespace (no private namespace; nothing else allowed). */
  inPlace?: boolean;
  /** Resource limits (soft = hard): RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_CORE, RLIMIT_NOFILE. */
  rlimits?: { cpuSeconds?: number; fileSizeBytes?: number; coreBytes?: number; openFiles?: number };
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

/** A reply of the python3 zygote: 1 started (pid in our namespace, a pidfd we own), 2 failed, 3 exited, 0 gone. */
export interface ZygoteReply {
  kind: 0 | 1 | 2 | 3;
  pid?: number;
  pidfd?: number;
  step?: number;
  index?: number;
  errno?: number;
  exitCode?: number | null;
  signal?: number | null;
  /** With an exit: host pid of the child the zygote forked ahead for the next request (-1: none). */
  spare?: number;
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
  /** cgroupCreate on the thread pool (a mkdir and limit writes per hierarchy). */
  cgroupCreateAsync(name: string, limits: CgroupLimits): Promise<void>;
  cgroupUpdate(name: string, limits: CgroupLimits): void;
  cgroupStats(name: string): CgroupStats;
  /** The group's OOM kill count alone (CgroupStats.oomKills), one file read. */
  cgroupOomKills(name: string): number;
  cgroupProcs(name: string): number[];
  cgroupFreeze(name: string, frozen: boolean): void;
  /** SIGKILL every process in the group; returns how many were signalled. */
  cgroupKill(name: string): number;
  /** cgroupKill on the thread pool (v1 freezes, signals and thaws). */
  cgroupKillAsync(name: string): Promise<number>;
  /** rmdir the group in every hierarchy; throws CGROUP_ERROR (EBUSY) while processes remain. */
  cgroupDestroy(name: string): void;
  /** cgroupDestroy on the thread pool (an rmdir waits for the memory controller to offline the group). */
  cgroupDestroyAsync(name: string): Promise<void>;
  cgroupExists(name: string): boolean;
  /** Move an existing host process (e.g. a session holder) into the group. */
  cgroupAttach(name: string, pid: number): void;

  // processes
  spawnSandbox(spec: SpawnSandboxSpec): SandboxProcess;
  exec(spec: ExecSpec): ExecProcess;
  /**
   * The same, on the libuv thread pool: the calling thread waits while the
   * CLONE_VFORK child sets the sandbox up, so the synchronous forms stall the
   * event loop for that long. Inputs are validated synchronously (throws);
   * kernel failures reject with the same WarrenError.
   */
  spawnSandboxAsync(spec: SpawnSandboxSpec): Promise<SandboxProcess>;
  execAsync(spec: ExecSpec): Promise<ExecProcess>;
  /**
   * Call `callback` once when the process behind `pidfd` ends. For children of
   * this process the status is reaped (waitid P_PIDFD); for adopted processes
   * it is unknown (exitCode and signal null). The pidfd stays owned by the caller
   * (the watcher holds a duplicate), unless `owned`: then the watcher keeps the
   * caller's descriptor itself and closes it after the exit (also when the call
   * throws), so a watched process costs one descriptor; the caller must not close it.
   */
  watchExit(pidfd: number, callback: (status: ExitStatus) => void, owned?: boolean): void;
  /**
   * The FnCall python3 zygote (native/helper/zygote/zygote.c): send one fork request (`payload`, the
   * zygote's record format) with three new pipes over the zygote's channel `fd`; returns the
   * caller's ends (non-blocking). The replies arrive through zygoteWatch.
   */
  zygoteSpawn(fd: number, payload: Buffer): { stdin: number; stdout: number; stderr: number };
  /** Call `callback` for every reply on a zygote channel; kind 0 (the zygote is gone) is the last call. */
  zygoteWatch(fd: number, callback: (reply: ZygoteReply) => void): void;
  /**
   * Bring the swapped-out pages of process `pid` back (native/helper/src/prefetch.c), on the thread
   * pool: 'touch' reads each swapped page (it is faulted in and mapped), 'willneed' asks for swap
   * readahead (process_madvise MADV_WILLNEED). Resolves with the bytes asked for.
   */
  prefetchAsync(pid: number, mode: 'touch' | 'willneed'): Promise<{ bytes: number }>;
  /**
   * Push the private writable pages of process `pid` to swap (process_madvise MADV_PAGEOUT),
   * whichever LRU list they are on. Resolves with the size of the mappings advised.
   */
  pageoutAsync(pid: number): Promise<{ bytes: number }>;
  pidfdOpen(pid: number): number;
  pidfdSendSignal(pidfd: number, signal: number): void;
  /** Start time in clock ticks of `pid`, or 0 when it does not exist. */
  processStartTime(pid: number): number;
  ptyResize(ptyFd: number, cols: number, rows: number): void;
  close(fd: number): void;
  /** A memfd of `size` bytes (sparse) that can be sealed; close-on-exec. */
  memfdCreate(name: string, size: number): number;
  /** Seal a memfd against writes, resizes and shared writable mappings (private mappings stay writable). */
  memfdSeal(fd: number): void;
  /** Give freed memory back to the kernel: with `collect` a full V8 collection first, then malloc_trim(0). True when pages were released. */
  reclaimMemory(collect: boolean): boolean;

  // filesystem, confined to a root (openat2 RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, else a
  // component-by-component O_NOFOLLOW walk; rootfs.c)
  /**
   * Open `path` (interpreted inside rootDir, symlinks cannot leave it). flags: 'r' | 'w' (create/truncate) | 'a' | 'dir'.
   * `creds`: do it with that fsuid/fsgid/groups (the sandbox program's), so permissions and owners are the program's;
   * refusals are FORBIDDEN.
   */
  openInRoot(rootDir: string, path: string, flags: 'r' | 'w' | 'a' | 'dir', mode: number, creds?: FileCreds): number;
  mkdirInRoot(rootDir: string, path: string, mode: number, recursive: boolean, creds?: FileCreds): void;

  // mounts
  mount(source: string, target: string, fstype: string, flags: MountFlag[], data: string): void;
  umount(target: string, detach: boolean): void;
  /** umount on the thread pool (an unmount waits for an RCU grace period). */
  umountAsync(target: string, detach: boolean): Promise<void>;
  /**
   * A mount namespace for new sandboxes: this process's, less every mount that is not "/", /dev,
   * /proc, /sys (and below) or a mount holding one of `keep` (native/helper/src/mnt_template.c);
   * with `mask` (an empty directory on a kept mount), an empty read-only tmpfs there, in the
   * template only; with `sysfs` (another), a read-only sysfs of a network namespace of its own
   * (only `lo`) there, for every sandbox to bind at /sys. Returns its descriptor (close with `close`).
   */
  mountTemplateCreate(keep: string[], mask?: string, sysfs?: string): number;

  // scheduling
  /** Whether prctl(PR_SCHED_CORE) works here; never throws. */
  coreSchedSupported(): boolean;
  setSchedIdle(pid: number): void;

  // confinement probes
  /** landlock_create_ruleset(NULL, 0, VERSION): the ABI, or -errno. */
  landlockAbi(): number;
  seccompSupported(): boolean;
  /** 0 when the kernel would load BPF-LSM programs, else -errno (EPERM: refused). */
  bpfLsmProbe(): number;
  /** Instructions in the cached seccomp program for `allow`. */
  seccompFilterLength(allow: number): number;
  /** Release the cached Landlock rulesets of sandbox `cgroup` (they pin its inodes); call on destroy. */
  landlockCacheDrop(cgroup: string): void;

  // egress enforcement (native/helper/src/bpf_egress.c). Keys and values are encoded
  // by src/native/bpf-layouts.ts; the addon checks their sizes against the map's.
  /** Loads a BPF object with its maps pinned by name under pinDir (existing pins are reused)
   *  and pins every program as pinDir/<name>; returns how many programs it pinned. */
  bpfLoadPinned(objectPath: string, pinDir: string): number;
  /** Links a pinned program to a cgroup2 directory and pins the link at linkPin. */
  bpfAttachCgroup(programPin: string, cgroupDir: string, attach: BpfCgroupAttach, linkPin: string): void;
  /** Load a copy of the tap programs with `settings` (a tap_port; interface indexes filled in) and attach them at tcx ingress of `tap` and `uplink` in the netns at netnsPath; links pinned at the two paths. */
  bpfAttachTap(objectPath: string, pinDir: string, netnsPath: string, tap: string, uplink: string, settings: Buffer, tapLinkPin: string, uplinkLinkPin: string): void;
  /** An O_CLOEXEC fd of a pinned map or program; release with close(). */
  bpfObjGet(path: string): number;
  bpfMapInfo(fd: number): BpfMapInfo;
  /** flags: 0 any, 1 only new, 2 only existing. */
  bpfMapUpdate(fd: number, key: Buffer, value: Buffer, flags?: 0 | 1 | 2): void;
  /** True when the key existed. */
  bpfMapDelete(fd: number, key: Buffer): boolean;
  bpfMapLookup(fd: number, key: Buffer): Buffer | null;
  /** The key after `key` (null: the first key); null at the end. */
  bpfMapNextKey(fd: number, key: Buffer | null): Buffer | null;
  /** A consumer of a BPF ring buffer map; returns a handle id. */
  bpfRingbufOpen(mapFd: number): number;
  /** Every record available now, oldest first; never blocks. */
  bpfRingbufDrain(ringbuf: number): Buffer[];
  bpfRingbufClose(ringbuf: number): void;
}

export type BpfCgroupAttach = 'connect4' | 'connect6' | 'sendmsg4' | 'sendmsg6' | 'egress';

export interface BpfMapInfo {
  type: number;
  keySize: number;
  valueSize: number;
  maxEntries: number;
  id: number;
  name: string;
}
