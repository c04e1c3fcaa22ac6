/**
 * The node-side (shim) contract. The gateway only talks to a `Shim`; on one
 * machine both live in one process, but nothing here assumes it.
 */
import type { Duplex, Readable, Writable } from 'node:stream';
import type { Principal } from './access';
import type { LanguagesInfo } from './fncall/manager';
import type { RunCodeRequest, RunJupyterRequest, RunJupyterResponse } from './fncall/sandboxfusion';
import type { InvokeRequest, InvokeResult, JudgeRequest, JudgeResult, PoolStats } from './fncall/types';
import type { PlacementAsk } from '../validation';

export type { Principal } from './access';

/**
 * Kinds of sandbox a client can create. FnCall pools are not one of them: they
 * are a consumer of the container backend (src/shim/fncall), reached through
 * /v1/functions, and reported as `functions` in the feature report.
 */
export type BackendName = 'container' | 'microvm' | 'vm';
export const BACKEND_NAMES: readonly BackendName[] = ['container', 'microvm', 'vm'];
export type SandboxState = 'creating' | 'running' | 'paused' | 'hibernated' | 'stopped' | 'failed' | 'deleting';
export type Priority = 'normal' | 'idle';

/** A validated create request (see src/validation.ts for the wire form). */
export interface SandboxSpec {
  backend: BackendName;
  /** Image name ("default", "busybox", "name:tag") or "sha256:<hex>" digest. */
  image: string;
  /** Extra layers stacked over the image: workspaces then toolkits, each a name or digest. */
  workspaces: string[];
  toolkits: string[];
  /** CPU limit in cores (0.01 .. host cores x 64). */
  cpu: number;
  memoryMb: number;
  pids: number;
  diskMb: number | null;
  priority: Priority;
  user: string;
  env: Record<string, string>;
  labels: Record<string, string>;
  /** Account that owns the sandbox. */
  owner: string;
  /** Lifetime policy (src/shim/lifecycle/policy.ts); absent = lives until deleted. */
  lifetime?: LifetimePolicy;
  /** services the sandbox may reach ({"pypi": true}); absent = the account's default
   *  (accounts.yaml), which may be no network at all (loopback only). */
  network?: Record<string, boolean>;
}

/** What an idle sandbox becomes; `reclaim` keeps it running and gives its cold memory back. */
export type IdleAction = 'pause' | 'hibernate' | 'stop' | 'delete' | 'reclaim';
export const IDLE_ACTIONS: readonly IdleAction[] = ['pause', 'hibernate', 'stop', 'delete', 'reclaim'];

export interface LifetimePolicy {
  /** Hard maximum age in seconds; the sandbox is stopped when it passes. */
  ttlSeconds?: number;
  /** Seconds without a request after which `onIdle` happens. */
  idleSeconds?: number;
  onIdle?: IdleAction;
}

/** The lifetime clocks of a sandbox, as the API shows them. */
export interface SandboxLifecycleInfo {
  expiresAt: string | null;
  lastActivityAt: string;
  idleAt: string | null;
  idleSeconds: number | null;
  onIdle: IdleAction;
  pausedAt?: string;
  /** Why a sandbox is stopped: "ttl", "idle", "exited". */
  stopReason?: string;
  /** The last cold-memory reclaim (onIdle "reclaim"). */
  coldReclaim?: ColdReclaimResult;
}

/** A running sandbox's cold memory given back (onIdle "reclaim"): the kernel's inactive LRU lists, pushed out. */
export interface ColdReclaimReport {
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  releasedBytes: number;
  /** What the kernel counted as cold (its inactive lists) and was asked to give back. */
  coldBytes: number;
  reclaim: 'memory.reclaim' | 'limit' | 'none';
  note?: string;
  durationMs: number;
}

export interface ColdReclaimResult extends ColdReclaimReport {
  at: string;
}

export interface PauseResult {
  id: string;
  state: SandboxState;
  /** False when the sandbox was already paused. */
  changed: boolean;
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  releasedBytes: number;
  swapBytes: number | null;
  reclaim: 'memory.reclaim' | 'limit' | 'none' | 'criu' | 'snapshot';
  /** Bytes written to disk (snapshot-style pause of a microVM). */
  writtenBytes?: number;
  note?: string;
  durationMs: number;
}

export interface ResumeResult {
  id: string;
  state: SandboxState;
  changed: boolean;
  durationMs: number;
}

export interface PackRequest {
  /** Name (`name` or `name:tag`) of the new environment. */
  name: string;
  /** Extra paths or glob patterns (`*`, `?`, `**`) to remove, on top of the defaults and the node policy. */
  scrub?: string[];
  /** Make the environment usable by runtime accounts right away. */
  publish?: boolean;
  /** Merge the chain's pack layers into one (also done automatically past the node's maximum depth). */
  squash?: boolean;
  compression?: 'none' | 'lz4' | 'lz4hc';
}

export interface PackResult {
  image: ImageInfo;
  environment: EnvironmentInfo;
  layer: string;
  diffBytes: number;
  diffEntries: number;
  scrubbed: string[];
  squashed: boolean;
  /** How long the sandbox was frozen for the copy, and the whole pack. */
  frozenMs: number;
  durationMs: number;
}

export interface EnvironmentInfo {
  name: string;
  digest: string;
  owner: string;
  published: boolean;
  parent: string;
  sourceSandbox: string;
  /** Layers made by pack_diff (top-most first), then those below. */
  diffLayers: string[];
  baseLayers: string[];
  createdAt: string;
}

export interface SandboxInfo {
  id: string;
  backend: BackendName;
  image: string;
  /** Digests of the layers, top-most first. */
  layers: string[];
  state: SandboxState;
  node: string;
  createdAt: string;
  owner: string;
  limits: { cpu: number; memoryMb: number; pids: number; diskMb: number | null };
  priority: Priority;
  labels: Record<string, string>;
  /** Host pid of the sandbox's pid 1 (not part of the public API; stripped by the gateway for non-admins). */
  pid?: number;
  lifecycle?: SandboxLifecycleInfo;
  /** present when the sandbox has network (details: GET /v1/sandboxes/:id/network). */
  network?: { services: Record<string, boolean>; address: string };
  /** How a cluster placed the create, when it was asked to explain (`?explain=1`). */
  placement?: Record<string, unknown>;
}

/** How a create may be placed: asked of a cluster, ignored by a single node (it is the only one). */
export interface CreateOptions {
  placement?: PlacementAsk;
  /** Answer the placement decision in the SandboxInfo's `placement`. */
  explain?: boolean;
}

export interface ExecRequest {
  cmd: string | string[];
  stdin?: Buffer | string;
  env?: Record<string, string>;
  cwd?: string;
  timeoutMs?: number;
  user?: string;
  /** Bytes kept per stream; the rest is dropped and `truncated` is set. */
  maxOutputBytes?: number;
}

export type ExecStatus = 'ok' | 'error' | 'timeout' | 'killed' | 'oom';

export interface ExecResult {
  exitCode: number | null;
  signal: number | null;
  stdout: string;
  stderr: string;
  status: ExecStatus;
  durationMs: number;
  truncated: boolean;
}

/** How an exec ended (an ExecResult without its output). */
export type ExecOutcome = Omit<ExecResult, 'stdout' | 'stderr'>;

/**
 * An exec whose output is read as it comes. `stdout` and `stderr` carry at
 * most `maxOutputBytes` each and follow the reader (a reader that stops
 * holds the process back); both must be consumed (or destroyed) for `done`
 * to resolve.
 */
export interface LiveExec {
  stdout: Readable;
  stderr: Readable;
  done: Promise<ExecOutcome>;
  kill(): void;
}

/** Output kept by the node for a finished exec: memory first, then an unlinked spill file. */
export interface CapturedOutput {
  readonly size: number;
  readonly truncated: boolean;
  /** The bytes in chunks (a multiple of 3 bytes each, except the last). */
  chunks(chunkBytes?: number): Iterable<Buffer>;
  bytes(): Buffer;
}

/** A finished exec with its output held by the node; `release()` frees it (spill files included). */
export interface CapturedExec extends ExecOutcome {
  stdout: CapturedOutput;
  stderr: CapturedOutput;
  release(): void;
}

/** A streaming exec (used for tar up/download and by the CLI). */
export interface ExecStream {
  /** Host pid of the process: in process only (the shim protocol names no host process). */
  pid?: number;
  stdin: Writable;
  stdout: Readable;
  stderr: Readable;
  exited: Promise<{ exitCode: number | null; signal: number | null }>;
  kill(signal?: number): void;
}

export interface FileEntry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime: string;
}

/**
 * What can differ between backends is a facet: each backend offers it or
 * refuses it with a reason (answered as NOT_SUPPORTED). Lifecycle, files,
 * sessions, pack and network go through these, never through cgroups, CRIU or
 * nsexec directly.
 *
 * - files:    confined file access to the sandbox's root
 * - sessions: the command a session holder runs to reach a shell in the sandbox
 * - freeze:   pause that keeps the sandbox's processes and gives memory back
 *             (container: freezer + reclaim; microVM: snapshot to disk + end the VMM)
 * - snapshot: checkpoint the whole sandbox to disk and restore it later (hibernate)
 * - export:   copy of the writable layer as an overlay upper dir (pack)
 * - network:  attach to the node network with per-service egress
 */
export type FacetName = 'files' | 'sessions' | 'freeze' | 'snapshot' | 'export' | 'network';
export const FACET_NAMES: readonly FacetName[] = ['files', 'sessions', 'freeze', 'snapshot', 'export', 'network'];

export type FacetStatus = { offered: true; how: string } | { offered: false; reason: string };

/** Every backend implements this; test/conformance runs one suite (a block per facet) against each. */
export interface Backend {
  readonly name: BackendName;
  /** Which facets this backend offers; sandboxes carry the implementations of the offered ones. */
  readonly facets: Record<FacetName, FacetStatus>;
  create(id: string, spec: SandboxSpec, layers: ResolvedLayer[]): Promise<BackendSandbox>;
  /** Re-attach to a sandbox that survived a gateway restart; null when it is gone. */
  adopt(record: SandboxRecord): Promise<BackendSandbox | null>;
  /** Remove whatever a dead or half-created sandbox left behind (idempotent). */
  cleanup(id: string, record?: SandboxRecord): Promise<void>;
  /** Ids with this node's `prefix` that the backend finds on the host but that are not in `known` (a crash between making and recording). */
  leftovers?(known: ReadonlySet<string>, prefix: string): string[];
  /** snapshot facet: bring a checkpointed sandbox back (its record's runtime is updated). */
  restore?(record: SandboxRecord, checkpoint: CheckpointRef, lowerPaths: string[]): Promise<BackendSandbox>;
  /** Give back what the backend holds for the node itself (not its sandboxes, which keep running). */
  close?(): void;
  /**
   * Creates made ahead of time (src/shim/prepared.ts): the shape of `spec` over `digests`, that is
   * everything create() makes the sandbox from that claimPrepared cannot change afterwards. Two
   * specs of the same shape give the same sandbox once claimed. null: this spec is always made fresh.
   */
  preparedShape?(spec: SandboxSpec, digests: readonly string[]): string | null;
  /**
   * Turn `box`, made by create() from a spec of the same shape and never used, into the sandbox
   * create(id, spec) would have made (limits, user, env). On failure the box is given back unused.
   */
  claimPrepared?(box: BackendSandbox, spec: SandboxSpec): Promise<void>;
}

export interface SandboxStats {
  memoryCurrentBytes: number;
  memoryPeakBytes: number;
  oomKills: number;
  cpuUsageUs: number;
  pidsCurrent: number;
}

export interface BackendSandbox {
  readonly id: string;
  /** What must be persisted to adopt this sandbox after a restart. */
  readonly runtime: Record<string, unknown>;
  /** A host pid standing for the sandbox (container pid 1, the VMM), shown to admins only; absent while it has none. */
  readonly pid: number | undefined;
  exec(req: ExecRequest): Promise<ExecResult>;
  /** Output read as it comes, with back-pressure and the output limit. */
  execLive?(req: ExecRequest): Promise<LiveExec>;
  /** Output kept by the node (bounded memory), for answers built after the exit. */
  execCaptured?(req: ExecRequest): Promise<CapturedExec>;
  execStream(req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream>;
  stats(): Promise<SandboxStats>;
  /** Kill everything and release every resource. Idempotent. */
  destroy(): Promise<void>;
  /** Resolves when the sandbox ended by itself (pid 1 gone, VMM gone). */
  readonly ended: Promise<void>;
  // facets: present exactly when the backend's `facets` table offers them
  readonly files?: FilesFacet;
  readonly sessions?: SessionsFacet;
  /** Execs that outlive the gateway process (absent: the backend cannot; see Backend.supervisedReason). */
  readonly supervised?: SupervisedExecFacet | undefined;
  readonly freeze?: FreezeFacet;
  readonly snapshot?: SnapshotFacet;
  readonly export?: ExportFacet;
  /** Screen, keyboard and pointer at the hypervisor level (the vm backend); absent elsewhere. */
  readonly display?: DisplayFacet;
}

export type MouseButton = 'left' | 'middle' | 'right';
/** One computer-use input action (docs/vm.md): what `input` takes, in the API and the SDKs. */
export type InputAction =
  | { type: 'key'; keys: string | string[]; repeat?: number }
  | { type: 'type'; text: string }
  | { type: 'move'; x: number; y: number }
  | { type: 'click'; x?: number; y?: number; button?: MouseButton; count?: number }
  | { type: 'down' | 'up'; x?: number; y?: number; button?: MouseButton }
  | { type: 'drag'; from: { x: number; y: number }; to: { x: number; y: number }; button?: MouseButton }
  | { type: 'scroll'; x?: number; y?: number; dx?: number; dy?: number }
  | { type: 'wait'; ms: number };

/** Computer use: what a person at the VM's screen could do, from the host (QMP, VNC). */
export interface DisplayFacet {
  readonly width: number;
  readonly height: number;
  /** The current screen as PNG, scaled down to `width` (aspect kept) when given. */
  screenshot(opts?: { width?: number }): Promise<{ png: Buffer; width: number; height: number }>;
  /** Send input actions (src/shim/backends/vm/input.ts); checked whole before anything is sent. */
  input(actions: unknown): Promise<{ actions: number; events: number }>;
  /** A connection to the VM's VNC server (RFB, no authentication: reach it only through the gateway's checks). */
  openVnc(): Promise<import('node:net').Socket>;
}

/** Confined file access: every path is resolved inside the sandbox's root; escapes are PATH_ESCAPE. */
export interface FilesFacet {
  readFile(path: string, maxBytes: number): Promise<Buffer>;
  writeFile(path: string, data: Buffer, mode: number): Promise<void>;
  listDir(path: string): Promise<FileEntry[]>;
  /** mkdir -p inside the root. */
  mkdirs(path: string, mode: number): Promise<void>;
  /** What `path` is (FILE_NOT_FOUND / PATH_ESCAPE when it does not resolve inside the root). */
  kind(path: string): Promise<'file' | 'dir' | 'other'>;
  /** Watch a directory (and, recursive, the ones below it); absent where the backend cannot. */
  watch?(path: string, recursive: boolean): Promise<DirWatch>;
}

/** What happened to `name` (relative to the watched directory). */
export interface DirEvent {
  name: string;
  type: 'create' | 'write' | 'remove';
}

/** A directory watch; events before the first listener wait for it (bounded). */
export interface DirWatch {
  onEvent(listener: (e: DirEvent) => void): void;
  close(): void;
}

/** How a session holder (src/shim/sessions) reaches a shell in the sandbox. */
/** How a session holder starts a sandbox's shell (the fields are SpawnHolderOptions'). */
export interface ShellLaunch {
  argv: string[];
  ptmxPath?: string;
  /** Generations from argv's process down to the shell. */
  shellDepth?: number;
  /** argv's process is a bridge to a shell the holder cannot see: it reads MARKs and signals on this fd. */
  controlFd?: number;
}

export interface SessionsFacet {
  shellCommand(opts: { mode: SessionMode; user?: string | undefined; cwd?: string | undefined; env: Record<string, string>; sessionId: string }): Promise<ShellLaunch>;
  /** The holder runs (pid on the host): count it with the sandbox (container: join its cgroup). */
  holderStarted(pid: number): void;
}

/**
 * Execs run by a supervisor process of their own, with output and result in
 * files under the node's data dir, so that another gateway process can follow
 * them to their result (idempotent execs across a restart).
 */
export interface SupervisedExecFacet {
  /** Start `req` as run `runId`; a LiveExec when it ended before it started (command not found), else null: follow it. */
  start(req: ExecRequest, runId: string): Promise<LiveExec | null>;
  /** The run's output from its start and its outcome (done rejects with IDEMPOTENCY_INTERRUPTED when it can have none); null: no such run. */
  follow(runId: string): LiveExec | null;
  /** Remove the run's files. */
  drop(runId: string): Promise<void>;
  /** Remove the files of runs not in `keep` whose supervisor has ended (nobody will ask for them); returns how many went. */
  sweep(keep: ReadonlySet<string>): Promise<number>;
}

export interface PauseReportCore {
  memoryBeforeBytes: number;
  memoryAfterBytes: number;
  releasedBytes: number;
  swapBytes: number | null;
  reclaim: PauseResult['reclaim'];
  note?: string;
  durationMs: number;
  /** Bytes written to disk by the pause (snapshot-style pause), when any. */
  writtenBytes?: number;
  /** Backend state to keep until resume (persisted with the sandbox's lifecycle). */
  keep?: Record<string, unknown>;
}

/** Pause keeping the sandbox's processes (and sessions) and giving memory back. */
export interface FreezeFacet {
  pause(limitBytes: number): Promise<PauseReportCore>;
  resume(limitBytes: number, kept: Record<string, unknown> | undefined): Promise<void>;
  /** Give back the cold part of a running sandbox's memory, leaving it running (absent: the backend cannot). */
  reclaimCold?(limitBytes: number): Promise<ColdReclaimReport>;
}

export interface CheckpointRef {
  dir: string;
}

/** Checkpoint the whole sandbox to disk (the sandbox object is over after it; Backend.restore brings it back). */
export interface SnapshotFacet {
  checkpoint(): Promise<CheckpointRef>;
}

/**
 * Sandboxes that are host process trees (pid 1 on the host, a cgroup named by
 * the sandbox id, the root reachable through /proc). FnCall's verified reset
 * between invocations works on exactly these, so pools take a backend of this
 * kind rather than any Backend.
 */
export interface HostProcessSandbox extends BackendSandbox {
  readonly pid: number;
  /** Host path through which the sandbox's root can be reached. */
  rootPath(): string;
  /** Host path of the overlay upper dir (the writable layer). */
  upperDir(): string;
}

export interface HostProcessBackend extends Backend {
  create(id: string, spec: SandboxSpec, layers: ResolvedLayer[]): Promise<HostProcessSandbox>;
}

/** The writable layer as an overlay upper dir (whiteouts, opaque dirs), for pack. */
export interface ExportFacet {
  /** Apparent and allocated bytes of the writable layer (for the pack budget, before any copy). */
  measureUpper(): Promise<{ bytes: number; allocated: number }>;
  /** Copy the upper dir into `dest` (which must not exist); `frozen`: the sandbox is already paused. */
  exportUpper(dest: string, frozen: boolean): Promise<{ frozenMs: number }>;
}

/** Counters of a sandbox's cgroup. */
export interface SandboxStats {
  memoryCurrentBytes: number;
  memoryPeakBytes: number;
  oomKills: number;
  /** CPU time used since the sandbox started. */
  cpuUsageUs: number;
  pidsCurrent: number;
}

export interface SandboxNetworkInfo {
  services: Record<string, boolean>;
  /** The sandbox's address on the node bridge. */
  address: string;
  /** The node's DNS responder (the sandbox's only resolver). */
  resolver: string;
  /** Raw CIDR rules of the owner's account in force. */
  rules: number;
  /** Addresses learned through DNS for the sandbox's services. */
  bindings: { service: string; name: string; address: string; expiresInS: number }[];
  /** The most recent denials (newest last). */
  /** `reason`: not-allowed, or the special range (metadata, node, operator, ...) or cname; hook `dns` for an answer the resolver would not open. */
  denials: { at: string; service: string; destination: string; proto: string; hook: string; reason: string }[];
}

export interface SandboxRecord {
  id: string;
  spec: SandboxSpec;
  layers: string[];
  state: SandboxState;
  createdAt: string;
  runtime: Record<string, unknown>;
  /** Lifetime clocks and pause state (src/shim/lifecycle), persisted so policies survive restarts. */
  lifecycle?: Record<string, unknown>;
}

/** A layer resolved by the layer store and mounted read-only on this node. */
export interface ResolvedLayer {
  digest: string;
  /** Mounted EROFS directory, shared by all sandboxes on this node. */
  path: string;
  /** The EROFS image file itself (attached read-only to microVMs). */
  file?: string;
}

export interface ImageInfo {
  name: string;
  digest: string;
  kind: 'base' | 'workspace' | 'toolkit';
  /** For images composed of several layers, top-most first. */
  layers: string[];
  sizeBytes: number;
  createdAt: string;
  source: string;
}

export type SessionMode = 'command' | 'pty';

export interface SessionInfo {
  id: string;
  sandboxId: string;
  mode: SessionMode;
  createdAt: string;
  /** Total bytes of output produced so far (the next output offset). */
  outputOffset: number;
  alive: boolean;
}

export interface OpenSessionOptions {
  mode: SessionMode;
  cols?: number;
  rows?: number;
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
}

/** One chunk of session output, with its absolute offset in the session's output stream. */
export interface SessionOutput {
  stream: 'stdout' | 'stderr' | 'pty';
  offset: number;
  data: Buffer;
}

export interface CommandResult {
  commandId: string;
  exitCode: number | null;
  timedOut: boolean;
}

/**
 * A live attachment to a shell session. The session itself (its shell and its
 * output buffer) lives in a holder process and outlives this object and the
 * gateway; `detach()` only drops this attachment.
 */
export interface SessionAttachment {
  readonly info: SessionInfo;
  /** Output from `fromOffset` (replayed from the bounded buffer, then live). `lost` > 0 when the buffer had already dropped bytes. */
  onOutput(listener: (out: SessionOutput) => void): void;
  onCommandDone(listener: (res: CommandResult) => void): void;
  onExit(listener: (status: { exitCode: number | null; signal: number | null }) => void): void;
  /**
   * Command mode: run one command; output streams through onOutput; resolves with its exit code.
   * `resume`: the command may have been sent already over a connection that was lost; the shell
   * runs it only if its last command is not `commandId`, else reports that one's status again.
   */
  run(commandId: string, command: string, timeoutMs?: number, resume?: boolean): Promise<CommandResult>;
  /** PTY mode: raw bytes to the terminal. */
  write(data: Buffer | string): void;
  resize(cols: number, rows: number): void;
  signal(signal: number): void;
  detach(): void;
  /** End the session: kill its shell and holder. */
  close(): Promise<void>;
  /** The holder dropped `bytes` of output this attachment had not taken yet; output goes on at `nextOffset`. */
  onLost?(listener: (bytes: number, nextOffset: number) => void): void;
  /** Back-pressure: take no more output until resumeOutput(); the holder keeps it in its bounded ring meanwhile. */
  pauseOutput?(): void;
  resumeOutput?(): void;
  /**
   * The attachment broke without a detach or an exit (its connection to the node was lost and
   * could not be made again): no more output comes; re-attach from the last offset seen.
   */
  onDisconnect?(listener: (reason: string) => void): void;
  /** Command mode: stop the running command as its timeout would (also one another attachment sent). */
  abortCommand?(): void;
  /** How command `commandId` (whose status line ends past offset `after`) ended, from the holder's last 16 status lines; null when not (yet) known. */
  recentStatus?(commandId: string, after: number): Promise<{ exitCode: number; endOffset: number } | null>;
}

export interface ImagePushResult {
  ref: string;
  manifestDigest: string;
  image: string;
  layers: Array<{ digest: string; size: number; uploaded: boolean }>;
  bytesUploaded: number;
}

export interface ImportProgress {
  phase: string;
  message: string;
  /** 0..1 when known. */
  fraction?: number;
}

export interface BackendStatus {
  available: boolean;
  reason?: string;
  /** microvm/vm: the accelerator in use ("kvm" or "tcg") and why. */
  accelerator?: string;
  facets?: Record<FacetName, FacetStatus>;
}

export interface FeatureReport {
  node: string;
  kernel: string;
  cgroup: { version: 1 | 2; controllers: string[]; bpfHierarchy: string | null };
  features: Record<string, { supported: boolean; reason?: string; action?: string }>;
  backends: Record<BackendName, BackendStatus>;
  /** FnCall pools (/v1/functions): run on the container backend. */
  functions: { available: boolean; reason?: string };
  enforcer: string;
  /** The host's ceilings as the node's admission sees them, and the tunables `warren up` raised or could not (docs/density.md). */
  capacity?: Record<string, unknown>;
  /** The node's machine: what a create's cpu and memory are checked against. */
  host?: { cpus: number; memoryMb: number };
}

/**
 * What the gateway calls: the contract between a gateway and one node. Every
 * method is asynchronous and every argument and answer is data (or a stream
 * described by the types above), so the same contract is served in-process
 * (LocalShim, the embedded default) and across machines (src/shim/remote:
 * docs/shim-protocol.md). A gateway holds nothing else of a node.
 */
export interface Shim {
  readonly nodeId: string;
  features(): Promise<FeatureReport>;
  /** FnCall pools (src/shim/fncall); absent on nodes without them. */
  readonly functions?: FnCallApi;

  /**
   * `principal`: the account asking; every image, workspace and toolkit
   * reference is checked for it (access.ts). The gateway always passes one;
   * without it the node itself asks (tests, node-internal callers) and may use
   * anything.
   */
  createSandbox(spec: SandboxSpec, principal?: Principal, opts?: CreateOptions): Promise<SandboxInfo>;
  getSandbox(id: string): Promise<SandboxInfo>;
  listSandboxes(filter?: SandboxFilter): Promise<SandboxList>;
  /** One page in id order after the cursor `after`; `next` names the next page's cursor. */
  listSandboxesPage(filter: SandboxFilter, page: { limit: number; after?: string }): Promise<{ sandboxes: SandboxInfo[]; next?: string; unreachable?: string[] }>;
  /** Sandboxes, cpu and memory an account's live sandboxes hold (quota checks). */
  sandboxUsage(owner: string): Promise<SandboxUsage>;
  deleteSandbox(id: string): Promise<void>;

  exec(id: string, req: ExecRequest): Promise<ExecResult>;
  /** exec with the output kept in bounded memory (the gateway streams it out). */
  execCaptured(id: string, req: ExecRequest): Promise<CapturedExec>;
  /** exec with the output read as it comes (streamed answers). */
  execLive(id: string, req: ExecRequest): Promise<LiveExec>;
  execStream(id: string, req: Omit<ExecRequest, 'stdin' | 'maxOutputBytes'>): Promise<ExecStream>;
  /** Why sandbox `id` cannot run execs that outlive the gateway process (null: it can). */
  supervisedReason(id: string): Promise<string | null>;
  /** exec under a supervisor process of its own (run `runId`), followed from here. */
  execSupervised(id: string, req: ExecRequest, runId: string): Promise<LiveExec>;
  /** Follow a supervised run (of this gateway process or an earlier one); null when it has no files. */
  followSupervised(id: string, runId: string): Promise<LiveExec | null>;
  dropSupervised(id: string, runId: string): Promise<void>;
  /** Remove sandbox `id`'s supervised runs not in `keep` that have ended. */
  sweepSupervised(id: string, keep: ReadonlySet<string>): Promise<number>;

  readFile(id: string, path: string, maxBytes: number): Promise<Buffer>;
  writeFile(id: string, path: string, data: Buffer, mode?: number): Promise<void>;
  listDir(id: string, path: string): Promise<FileEntry[]>;
  /** Watch a directory of the sandbox: NOT_SUPPORTED for backends whose files facet cannot. */
  watchDir(id: string, path: string, opts: { recursive: boolean }): Promise<DirWatch>;
  // computer use (vm backend): NOT_SUPPORTED for sandboxes without a screen
  screenshot?(id: string, opts?: { width?: number }): Promise<{ png: Buffer; width: number; height: number }>;
  sendInput?(id: string, actions: unknown): Promise<{ actions: number; events: number }>;
  openVnc?(id: string): Promise<Duplex>;
  /** Extract a tar stream into `dir` inside the sandbox; entries escaping `dir` are refused before anything is written. */
  uploadTar(id: string, dir: string, tar: Buffer): Promise<{ entries: number }>;
  downloadTar(id: string, path: string): Promise<Readable>;

  openSession(id: string, opts: OpenSessionOptions): Promise<SessionAttachment>;
  attachSession(id: string, sessionId: string, fromOffset: number): Promise<SessionAttachment>;
  listSessions(id: string): Promise<SessionInfo[]>;

  // lifecycle (src/shim/lifecycle, docs/lifecycle.md)
  /** Freeze and give memory back; requests to a paused sandbox resume it first. */
  pauseSandbox(id: string): Promise<PauseResult>;
  resumeSandbox(id: string): Promise<ResumeResult>;
  /** Pause every live sandbox matching all labels (and owner, when given): the preemption case. */
  pauseSandboxes(filter: { labels: Record<string, string>; owner?: string }): Promise<PauseResult[]>;
  resumeSandboxes(filter: { labels: Record<string, string>; owner?: string }): Promise<ResumeResult[]>;
  /** Checkpoint to disk with CRIU (NOT_SUPPORTED where the criu probe fails). */
  hibernateSandbox(id: string): Promise<PauseResult>;
  /** Move the hard maximum: `seconds` past the current expiry, or `ttlSeconds` from now. */
  extendSandbox(id: string, req: { seconds?: number; ttlSeconds?: number }): Promise<SandboxInfo>;
  packSandbox(id: string, req: PackRequest, owner: string): Promise<PackResult>;
  /** A packed environment by image name or digest, or null for images that are not packed environments. */
  environment(ref: string, principal?: Principal): Promise<EnvironmentInfo | null>;
  /** With a principal: only what it may use (the same check as createSandbox's). */
  listEnvironments(principal?: Principal): Promise<EnvironmentInfo[]>;
  /** Rejects (FORBIDDEN, or not found for digests) unless `principal` may use every reference. */
  authorizeContent(principal: Principal, refs: ContentRefs): Promise<void>;
  publishEnvironment(name: string, published: boolean): Promise<EnvironmentInfo>;

  // per-service egress
  /** Enable (true) or disable (false) services of a running sandbox; atomic in the kernel. */
  updateNetwork(id: string, change: Record<string, boolean>): Promise<SandboxNetworkInfo>;
  networkInfo(id: string): Promise<SandboxNetworkInfo>;
  /** Cgroup counters of a running or paused sandbox (null otherwise); optional for shims that cannot read them. */
  sandboxStats?(id: string): Promise<SandboxStats | null>;

  /** With a principal: only the images it may use. */
  listImages(principal?: Principal): Promise<ImageInfo[]>;
  /** `source.path`: a path on the node's own file system (the node's operator imports from it). */
  importImage(req: ImportImageRequest, onProgress?: (p: ImportProgress) => void): Promise<ImageInfo>;
  /** Push an image to an OCI registry (host[:port]/repo[:tag]) as a Warren image artifact (docs/images.md). */
  pushImage?(req: { image: string; ref: string }, onProgress?: (p: ImportProgress) => void): Promise<ImagePushResult>;
  /** Stage an image into an overflow pool's registry repository (host[:port]/repo). */
  stageImage?(req: { image: string; repository: string }, onProgress?: (p: ImportProgress) => void): Promise<ImagePushResult>;
  /** Which layers the node holds and how (all, or those of `digests`). */
  layerStates?(digests?: string[]): Promise<LayerState[]>;
  /** Remove an image and its layers no other image uses; IMAGE_IN_USE while a sandbox holds one of them. */
  removeImage?(name: string): Promise<ImageRemoval>;

  close(): Promise<void>;
}

export interface ImageRemoval {
  name: string;
  /** Layers deleted with it (those no other image of the node uses). */
  removedLayers: string[];
}

export interface LayerState {
  digest: string;
  /** local: whole on disk; lazy: fetched on read from its registry; absent. */
  state: 'local' | 'lazy' | 'absent';
  mounted: boolean;
}

/**
 * A list of sandboxes. `unreachable` (a cluster): the nodes that did not
 * answer, whose sandboxes are missing from the list; absent when every node
 * answered, and on a single node.
 */
export type SandboxList = SandboxInfo[] & { unreachable?: string[] };

export interface SandboxFilter {
  owner?: string;
  labels?: Record<string, string>;
}

export interface SandboxUsage {
  sandboxes: number;
  cpu: number;
  memoryMb: number;
}

export interface ContentRefs {
  image?: string;
  workspaces?: readonly string[];
  toolkits?: readonly string[];
  backend?: string;
}

export interface ImportImageRequest {
  name: string;
  kind?: ImageInfo['kind'];
  source: { type: 'directory' | 'oci-archive'; path: string } | { type: 'debootstrap'; suite?: string; include?: string[] } | { type: 'registry'; ref: string; mode?: 'lazy' | 'eager' };
}

/**
 * FnCall on the contract: pools, invocations and the SandboxFusion calls. The
 * node validates limits against the pool's policy (LIMIT_OUT_OF_RANGE before
 * anything runs) and admits per account (RESOURCE_EXHAUSTED with retryAfterS).
 */
export interface FnCallApi {
  /** Whether /run_code and /run_jupyter may be called without a token on this node. */
  anonymousRunCode(): Promise<boolean>;
  listPools(): Promise<PoolStats[]>;
  /** `wait`: answer once the pool's minimum is warm. The principal must be allowed the pool's content. */
  createPool(body: unknown, principal: Principal, opts?: { wait?: boolean }): Promise<PoolStats>;
  poolStats(name: string): Promise<PoolStats>;
  deletePool(name: string): Promise<void>;
  invoke(pool: string, account: string, req: InvokeRequest): Promise<InvokeResult>;
  judge(pool: string, account: string, req: JudgeRequest): Promise<JudgeResult>;
  batch(pool: string, account: string, reqs: InvokeRequest[], concurrency?: number): Promise<Array<InvokeResult | { error: { code: string; message: string } }>>;
  /** POST /run_code: the pool that carries the language, the request fitted to its policy. */
  runCode(account: string, req: RunCodeRequest): Promise<InvokeResult>;
  runJupyter(account: string, req: RunJupyterRequest): Promise<RunJupyterResponse>;
  languages(): Promise<LanguagesInfo>;
  /** Build (or find cached) a toolkit layer; rejects when it cannot be built here. */
  ensureToolkit(name: string): Promise<void>;
}
