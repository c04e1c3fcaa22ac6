/**
 * One warm pool container and what runs in it.
 *
 * A pool container is an ordinary container sandbox (overlay over the image's
 * EROFS layers, its own cgroup and namespaces, loopback-only network) that is
 * never handed out: invocations run in it directly with the native exec.
 *
 * Isolation between invocations (docs/fncall.md):
 * - Each invocation runs as an unprivileged user (nobody) in a private mount
 *   namespace, a new IPC namespace and a new network namespace (loopback only) of
 *   its own: the root is remounted read-only, /dev/shm is a fresh size-limited
 *   tmpfs that vanishes with the invocation, and only /work (the work dir, HOME)
 *   and the scratch directories (/tmp, /mnt, ...: SCRATCH_TARGETS) are writable.
 * - After each invocation the container is reset and the reset is verified:
 *   every process except pid 1 is killed and the cgroup must hold only pid 1;
 *   /work and the scratch filesystem are emptied and must be empty; and the overlay's upper dir must hold
 *   exactly what it held when the container was made (nothing written anywhere
 *   else survives). A container that fails a check is destroyed and replaced.
 * - The environment is built from scratch for every exec.
 */
import { BoundedCollector, pumpInto } from '../output';
import { isUtf8 } from 'node:buffer';
import { fchmodSync, fchownSync, closeSync, readdirSync, lstatSync, statfsSync, unlinkSync, writeFileSync, writeSync, fstatSync, readSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join, posix } from 'node:path';
import { Socket } from 'node:net';
import { WarrenError } from '../../errors';
import { helperBinary, native } from '../../native';
import type { ExecProcess, ExitStatus } from '../../native/types';
import { DEFAULT_PATH } from '../backends/registry';
import type { HostProcessBackend, HostProcessSandbox, ResolvedLayer, SandboxSpec } from '../types';
import type { InputFile, LimitHit, StepResult, InvokeStatus } from './types';
import { PYTHON_ZYGOTE_BOOTSTRAP, PythonZygote, ZYGOTE_DIR, ZYGOTE_MODULE, zygoteCanRun } from './zygote';
import { defineKey } from '../../validation';

export const WORK_DIR = '/work';
/**
 * The scratch filesystem: a size-limited tmpfs of the container (mounted once, emptied after
 * every invocation) whose directories each invocation sees, writable, at the usual absolute
 * places, so programs can write (and requests can put and fetch) files such as /tmp/x or
 * /mnt/data/y the way they can in SandboxFusion's sandbox. Everything else stays read-only.
 */
export const SCRATCH_DIR = '/run/warren-scratch';
export const SCRATCH_TARGETS: ReadonlyArray<{ path: string; dir: string; mode: number }> = [
  { path: '/tmp', dir: 'tmp', mode: 0o1777 },
  { path: '/var/tmp', dir: 'var-tmp', mode: 0o1777 },
  { path: '/mnt', dir: 'mnt', mode: 0o755 },
  { path: '/home', dir: 'home', mode: 0o755 },
  { path: '/root', dir: 'root', mode: 0o755 },
  { path: '/srv', dir: 'srv', mode: 0o755 },
  { path: '/opt', dir: 'opt', mode: 0o755 },
  { path: '/media', dir: 'media', mode: 0o755 },
  { path: '/data', dir: 'data', mode: 0o755 },
];
/** /etc/hosts of every pool container: localhost resolves (programs bind and connect to it). */
const ETC_HOSTS = '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n';

/**
 * Where a request's path lives in the container: relative paths are under /work, absolute ones
 * under /work or one of the scratch directories (SCRATCH_TARGETS); anything else is null.
 */
export function containerPathOf(p: string): string | null {
  if (!p.startsWith('/')) return posix.join(WORK_DIR, p);
  if (p === WORK_DIR || p.startsWith(`${WORK_DIR}/`)) return p;
  for (const t of SCRATCH_TARGETS) {
    if (p.startsWith(`${t.path}/`)) return `${SCRATCH_DIR}/${t.dir}${p.slice(t.path.length)}`;
  }
  return null;
}

/** Whether invocations get a fresh network namespace each (on unless WARREN_FNCALL_NETNS=0, for measuring its cost). */
function freshNetns(): boolean {
  return process.env.WARREN_FNCALL_NETNS !== '0';
}
/** Whether python3 invocations fork from a zygote (on unless WARREN_FNCALL_ZYGOTE=0). */
export function zygoteEnabled(): boolean {
  return process.env.WARREN_FNCALL_ZYGOTE !== '0';
}
/** The environment every step starts from (the zygote's own). */
function baseEnv(): Record<string, string> {
  return { PATH: DEFAULT_PATH, HOME: WORK_DIR, TMPDIR: '/tmp', LANG: 'C.UTF-8', USER: 'nobody' };
}
/** The fork server module, read once per process. */
let zygoteModule: Buffer | null = null;

/** nobody:nogroup */
export const RUN_UID = 65534;
export const RUN_GID = 65534;
/** Host-side file access for the program runs with its identity (no supplementary groups). */
const RUN_CREDS = { uid: RUN_UID, gid: RUN_GID, groups: [] as number[] };
const SIGKILL = 9;
const SIGXCPU = 24;
const MIB = 1024 * 1024;
const TMPFS_MAGIC = 0x01021994;

export interface StepOptions {
  argv: string[];
  env: Record<string, string>;
  stdin: Buffer;
  wallMs: number;
  cpuMs: number;
  maxOutputBytes: number;
  memoryMb: number;
  fileSizeBytes: number;
  tmpfsBytes: number;
  /** Cores of the container (to schedule CPU-time checks). */
  cpu: number;
  /** A python3 interpreter started ahead of time may run this step (language python3, no env). */
  warmPython?: { script: string };
  /** The step is `python3 -B main.py` in /work: it may be forked from the container's zygote. */
  zygote?: boolean;
}

/** What a prewarmed interpreter was started with; it is used only when a step matches. */
export interface WarmSpec {
  fileSizeBytes: number;
  tmpfsBytes: number;
  /** RLIMIT_CPU backstop: the pool's longest allowed run (the cgroup check enforces each request's cpuMs). */
  maxCpuMs: number;
}

/**
 * The interpreter of a prewarmed python3 step: started (isolated, unprivileged, confined) before
 * the request exists, it reads one line from stdin, the script path, and then runs that script
 * exactly as `python3 -B <script>` would: a fresh __main__ module, sys.argv and sys.path[0] of a
 * script, tracebacks without this frame, SystemExit as usual. The rest of stdin is the program's.
 */
/** Children of pid 1 other than the zygote, and the zygote's children (zombies included). */
function unreapedChildren(initPid: number, zygotePid: number, sparePid: number): number {
  const children = (pid: number): number[] => {
    try {
      return readFileSync(`/proc/${pid}/task/${pid}/children`, 'latin1').trim().split(/\s+/).filter(Boolean).map(Number);
    } catch {
      return [];
    }
  };
  return children(initPid).filter((p) => p !== zygotePid).length + (zygotePid > 0 ? children(zygotePid).filter((p) => p !== sparePid).length : 0);
}

const PF_EXITING = 0x4;

/**
 * Whether the container's pid 1 is gone or on its way out. When it dies the kernel kills every
 * other process of its pid namespace, and the step's end can be seen before the container's: a
 * step killed by a signal while pid 1 is exiting (PF_EXITING is set from the start of its exit,
 * before its namespace is emptied) died with its container, not by its own doing.
 */
export function initExiting(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[0] === 'Z' || fields[0] === 'X' || (Number(fields[6]) & PF_EXITING) !== 0;
  } catch {
    return true;
  }
}

/** How long a prewarmed interpreter may take to reach the read of its script path before it is offered anyway. */
const WARM_START_DEADLINE_MS = 10_000;

/**
 * Resolves once process `pid` is blocked reading its stdin (/proc/<pid>/syscall: read, fd 0), it
 * is gone, or the deadline passed. Asks the kernel, so the interpreter needs no ready signal.
 */
async function waitForStdinRead(pid: number, gone: () => boolean): Promise<void> {
  const deadline = performance.now() + WARM_START_DEADLINE_MS;
  while (!gone() && performance.now() < deadline) {
    let sys = '';
    try {
      sys = readFileSync(`/proc/${pid}/syscall`, 'latin1');
    } catch {
      return;
    }
    if (sys.startsWith('0 0x0 ')) return;
    await new Promise((r) => setTimeout(r, 2));
  }
}

const PYTHON_WARM_BOOTSTRAP = [
  'import os, sys, types',
  'def _warren_run():',
  '    raw = sys.stdin.buffer.raw',
  "    line = b''",
  "    while not line.endswith(b'\\n'):",
  '        c = raw.read(1)',
  '        if not c:',
  '            sys.exit(0)',
  '        line += c',
  '    script = line[:-1].decode()',
  '    path = os.path.abspath(script)',
  '    sys.argv = [script]',
  '    sys.path[0] = os.path.dirname(path)',
  "    main = types.ModuleType('__main__')",
  '    main.__file__ = path',
  '    main.__cached__ = None',
  '    main.__spec__ = None',
  '    main.__builtins__ = __builtins__',
  "    sys.modules['__main__'] = main",
  '    try:',
  "        with open(path, 'rb') as f:",
  "            code = compile(f.read(), path, 'exec')",
  '        exec(code, main.__dict__)',
  '    except SystemExit:',
  '        raise',
  '    except BaseException as e:',
  '        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None',
  '        sys.excepthook(type(e), e.with_traceback(tb), tb)',
  '        sys.exit(1)',
  '_warren_run()',
].join('\n');

export class PoolContainer {
  /** Paths (relative) in the overlay upper dir right after setup. */
  private baseline = '';
  private memoryMb: number;
  private dead = false;
  /** A python3 interpreter waiting for the next invocation (see prewarmPython). */
  private warm: { proc: ExecProcess; spec: WarmSpec; exited: Promise<ExitStatus>; ready: boolean; since: number } | null = null;
  private warming: Promise<void> | null = null;
  /** The python3 zygote (zygote.ts), or null (off, not started, or it failed). */
  private zygote: PythonZygote | null = null;
  private zygoteStarting: Promise<void> | null = null;
  private zygoteFailures = 0;
  private tmpfsBytes = 0;
  /** Invocations forked from a zygote. */
  zygoteRuns = 0;
  /** No program has run since the container was made or last reset and verified. */
  private pristine = true;
  readonly createdAt = Date.now();
  lastUsed = Date.now();
  uses = 0;

  private constructor(
    readonly box: HostProcessSandbox,
    memoryMb: number,
  ) {
    this.memoryMb = memoryMb;
    void box.ended.then(() => {
      this.dead = true;
    });
  }

  get id(): string {
    return this.box.id;
  }

  get pid(): number {
    return this.box.pid;
  }

  get alive(): boolean {
    return !this.dead;
  }

  /** Host pid of the python3 zygote, or null without one. */
  get zygotePid(): number | null {
    return this.zygote?.alive ? this.zygote.pid : null;
  }

  get ended(): Promise<void> {
    return this.box.ended;
  }

  private get root(): string {
    return this.box.rootPath();
  }

  private get upperDir(): string {
    return this.box.upperDir();
  }

  static async create(backend: HostProcessBackend, id: string, spec: SandboxSpec, layers: ResolvedLayer[], workBytes: number, scratchBytes: number): Promise<PoolContainer> {
    const box = await backend.create(id, spec, layers);
    const c = new PoolContainer(box, spec.memoryMb);
    try {
      // The work dir and the scratch filesystem are size-limited tmpfs mounts, made once in the
      // container's own mount namespace (their pages count against the container's memory).
      for (const d of [WORK_DIR, SCRATCH_DIR, ...SCRATCH_TARGETS.map((t) => t.path)]) {
        try {
          native.mkdirInRoot(c.root, d, 0o755, false);
        } catch (err) {
          if (!(err instanceof WarrenError && err.errno === 17)) throw err;
        }
      }
      c.writeRootFile('/etc/hosts', Buffer.from(ETC_HOSTS), 0o644);
      c.tmpfsBytes = scratchBytes;
      if (zygoteEnabled()) {
        zygoteModule ??= readFileSync(helperBinary('warren_zygote.so'));
        try {
          native.mkdirInRoot(c.root, ZYGOTE_DIR, 0o755, false);
        } catch (err) {
          if (!(err instanceof WarrenError && err.errno === 17)) throw err;
        }
        c.writeRootFile(`${ZYGOTE_DIR}/main.py`, Buffer.from(PYTHON_ZYGOTE_BOOTSTRAP), 0o644);
        c.writeRootFile(ZYGOTE_MODULE, zygoteModule, 0o644);
      }
      await c.mountWork(workBytes, scratchBytes);
      c.makeScratchDirs();
      c.baseline = snapshot(c.upperDir);
      if (zygoteEnabled()) await c.startZygote();
    } catch (err) {
      await box.destroy().catch(() => undefined);
      throw err;
    }
    return c;
  }

  /** Start the python3 zygote (after a failure or its death, at the next reset). */
  private startZygote(): Promise<void> {
    if (this.dead || this.zygote?.alive || this.zygoteFailures >= 3) return Promise.resolve();
    this.zygoteStarting ??= (async () => {
      try {
        this.zygote = await PythonZygote.start(this.box.pid, this.id, baseEnv(), {
          writable: [WORK_DIR],
          binds: SCRATCH_TARGETS.map((t) => ({ source: `${SCRATCH_DIR}/${t.dir}`, target: t.path })),
          tmpfsBytes: this.tmpfsBytes,
        });
      } catch {
        this.zygote = null;
        this.zygoteFailures++;
      } finally {
        this.zygoteStarting = null;
      }
    })();
    return this.zygoteStarting;
  }

  /** The zygote when it can run this step exactly as a fresh `python3 -B main.py` would. */
  private zygoteFor(o: StepOptions): PythonZygote | null {
    if (o.zygote !== true || this.zygote === null || !this.zygote.alive) return null;
    if (o.argv.length !== 3 || o.argv[0] !== 'python3' || o.argv[1] !== '-B' || o.argv[2] !== 'main.py') return null;
    if (!zygoteCanRun(o.env) || o.tmpfsBytes !== this.tmpfsBytes) return null;
    return this.zygote;
  }

  private writeRootFile(path: string, data: Buffer, mode: number): void {
    const fd = native.openInRoot(this.root, path, 'w', mode);
    try {
      let off = 0;
      while (off < data.length) off += writeSync(fd, data, off, data.length - off);
    } finally {
      closeSync(fd);
    }
  }

  /** The scratch directories, empty and the run user's (after creation and after every reset). */
  private makeScratchDirs(): void {
    for (const t of SCRATCH_TARGETS) {
      const p = `${SCRATCH_DIR}/${t.dir}`;
      // after a reset nothing runs in the container: a directory already as it should be stays
      try {
        const st = lstatSync(`${this.root}${p}`);
        if (st.isDirectory() && st.uid === RUN_UID && st.gid === RUN_GID && (st.mode & 0o7777) === t.mode) continue;
      } catch {
        /* made below */
      }
      try {
        native.mkdirInRoot(this.root, p, 0o755, false);
      } catch (err) {
        if (!(err instanceof WarrenError && err.errno === 17)) throw err;
      }
      const fd = native.openInRoot(this.root, p, 'dir', 0);
      try {
        fchownSync(fd, RUN_UID, RUN_GID);
        fchmodSync(fd, t.mode);
      } finally {
        closeSync(fd);
      }
    }
  }

  private async mountWork(sizeBytes: number, scratchBytes: number): Promise<void> {
    const proc = await native.execAsync({
      initPid: this.box.pid,
      cgroup: this.id,
      argv: ['/bin/true'],
      env: [`PATH=${DEFAULT_PATH}`],
      cwd: '/',
      uid: 0,
      gid: 0,
      schedIdle: false,
      isolate: {
        inPlace: true,
        tmpfs: [
          { path: WORK_DIR, sizeBytes, mode: 0o755, uid: RUN_UID, gid: RUN_GID },
          { path: SCRATCH_DIR, sizeBytes: scratchBytes, mode: 0o755 },
        ],
      },
    });
    const status = await new Promise<ExitStatus>((resolve) => native.watchExit(proc.pidfd, resolve));
    native.close(proc.pidfd);
    for (const fd of [proc.stdin, proc.stdout, proc.stderr]) if (fd !== undefined) native.close(fd);
    const st = statfsSync(`${this.root}${WORK_DIR}`);
    const sc = statfsSync(`${this.root}${SCRATCH_DIR}`);
    if (status.exitCode !== 0 || st.type !== TMPFS_MAGIC || sc.type !== TMPFS_MAGIC) {
      throw new WarrenError('MOUNT_ERROR', `could not mount the work dir tmpfs in pool container ${this.id} (exit ${status.exitCode}, fs type 0x${st.type.toString(16)})`);
    }
  }

  /** The writable directory (the work dir or one scratch directory) a request's file lives in. */
  private static baseOf(full: string): string {
    return full.startsWith(`${WORK_DIR}/`) ? WORK_DIR : `${SCRATCH_DIR}/${full.slice(SCRATCH_DIR.length + 1).split('/')[0]}`;
  }

  /**
   * Open a request's file (a path of containerPathOf); every input and fetched file goes through
   * here. As the run user and rooted at its writable directory: a link the program planted (to
   * /etc/shadow, to /) reaches nothing that user could not reach itself.
   */
  private openRequestFile(full: string, mode: 'r' | 'w', fileMode = 0): number {
    const base = PoolContainer.baseOf(full);
    // Right after a verified reset no program has run since the writable directories were emptied,
    // so nothing can be planted there: the input files are written without taking the run user's
    // identity (which costs a thread per call). Everything after a program ran uses it.
    return native.openInRoot(`${this.root}${base}`, full.slice(base.length + 1), mode, fileMode, this.pristine && mode === 'w' ? undefined : RUN_CREDS);
  }

  /** Write the invocation's input files under /work or the scratch directories (owned by the run user). */
  writeFiles(files: InputFile[]): void {
    for (const f of files) {
      const full = containerPathOf(f.path);
      if (full === null) throw new WarrenError('PATH_ESCAPE', `${f.path} is outside the sandbox's writable directories`);
      const base = PoolContainer.baseOf(full);
      const parent = posix.dirname(full);
      if (parent !== base) this.mkdirs(base, parent);
      const fd = this.openRequestFile(full, 'w', f.mode);
      try {
        let off = 0;
        while (off < f.data.length) off += writeSync(fd, f.data, off, f.data.length - off);
        fchownSync(fd, RUN_UID, RUN_GID);
      } finally {
        closeSync(fd);
      }
    }
  }

  private mkdirs(base: string, dir: string): void {
    let cur = base;
    for (const part of dir.slice(base.length + 1).split('/')) {
      cur = `${cur}/${part}`;
      try {
        const rel = cur.slice(base.length + 1);
        const creds = this.pristine ? undefined : RUN_CREDS;
        native.mkdirInRoot(`${this.root}${base}`, rel, 0o755, false, creds);
        const fd = native.openInRoot(`${this.root}${base}`, rel, 'dir', 0, creds);
        try {
          fchownSync(fd, RUN_UID, RUN_GID);
        } finally {
          closeSync(fd);
        }
      } catch (err) {
        if (!(err instanceof WarrenError && err.errno === 17)) throw err;
      }
    }
  }

  /** Read files the program left in /work or the scratch directories (regular files only, with the run user's rights). */
  readFiles(paths: string[], maxBytes: number): Record<string, string> {
    const out: Record<string, string> = {};
    for (const p of paths) {
      const full = containerPathOf(p);
      if (full === null) continue;
      let fd: number;
      try {
        fd = this.openRequestFile(full, 'r');
      } catch {
        continue;
      }
      try {
        const st = fstatSync(fd);
        if (!st.isFile() || st.size > maxBytes) continue;
        const buf = Buffer.alloc(st.size);
        let n = 0;
        while (n < buf.length) {
          const r = readSync(fd, buf, n, buf.length - n, null);
          if (r === 0) break;
          n += r;
        }
        // a file named __proto__ is a key like any other
        defineKey(out, p, buf.subarray(0, n).toString('base64'));
      } finally {
        closeSync(fd);
      }
    }
    return out;
  }

  /** Run one program to completion under the step's limits. */
  async run(o: StepOptions): Promise<StepResult> {
    if (this.dead) return internalError('the pool container is gone');
    if (o.memoryMb !== this.memoryMb) {
      const bytes = o.memoryMb * MIB;
      native.cgroupUpdate(this.id, { memoryBytes: bytes, memorySwapBytes: bytes });
      this.memoryMb = o.memoryMb;
    }
    if (this.warming) await this.warming;
    if (this.zygoteStarting) await this.zygoteStarting;
    this.pristine = false;
    const z = this.zygoteFor(o);
    if (z === null) await this.zygote?.dropSpare();
    const warm = await this.takeWarm(z !== null ? { ...o, warmPython: undefined } : o);
    resetMemoryPeak(this.id);
    const before = native.cgroupStats(this.id);
    const started = performance.now();
    let proc: ExecProcess;
    let forked: Promise<ExitStatus> | null = null;
    try {
      if (z !== null) {
        try {
          const f = await z.spawn({
            env: { ...baseEnv(), ...o.env },
            uid: RUN_UID,
            gid: RUN_GID,
            cwd: WORK_DIR,
            ipc: true,
            net: freshNetns(),
            rlimits: { cpuSeconds: Math.ceil(o.cpuMs / 1000) + 1, fileSizeBytes: o.fileSizeBytes, coreBytes: 0, openFiles: 1024 },
          });
          proc = f.proc;
          forked = f.exited;
          this.zygoteRuns++;
        } catch {
          // a zygote that cannot fork is not used again in this container; this step starts on its own
          this.zygoteFailures = 3;
          void this.zygote?.kill();
          this.zygote = null;
          proc = await this.spawnStep(o.argv, o.env, { fileSizeBytes: o.fileSizeBytes, tmpfsBytes: o.tmpfsBytes, maxCpuMs: o.cpuMs });
        }
      } else {
        proc = warm?.proc ?? (await this.spawnStep(o.argv, o.env, { fileSizeBytes: o.fileSizeBytes, tmpfsBytes: o.tmpfsBytes, maxCpuMs: o.cpuMs }));
      }
    } catch (err) {
      if (err instanceof WarrenError && err.code === 'SPAWN_ERROR' && (err.errno === 2 || err.errno === 13)) {
        const msg = `warren: ${o.argv[0]}: ${err.errno === 2 ? 'command not found' : 'permission denied'}\n`;
        return { ...emptyStep(), status: 'runtime_error', exitCode: err.errno === 2 ? 127 : 126, stderr: msg, wallMs: ms(performance.now() - started) };
      }
      if (this.dead || (err instanceof WarrenError && err.code === 'SANDBOX_NOT_RUNNING')) return internalError('the pool container is gone');
      throw err;
    }

    let limit: LimitHit | undefined;
    const kill = (why: LimitHit) => {
      if (limit === undefined) limit = why;
      try {
        process.kill(-proc.pid, SIGKILL);
      } catch {
        /* gone */
      }
      try {
        native.pidfdSendSignal(proc.pidfd, SIGKILL);
      } catch {
        /* gone */
      }
    };
    const stdout = new BoundedCollector(o.maxOutputBytes, () => kill('maxOutputBytes'));
    const stderr = new BoundedCollector(o.maxOutputBytes, () => kill('maxOutputBytes'));
    const outDone = pumpInto(proc.stdout!, stdout);
    const errDone = pumpInto(proc.stderr!, stderr);
    const stdin = new Socket({ fd: proc.stdin!, readable: false, writable: true });
    stdin.on('error', () => undefined);
    // a prewarmed interpreter first reads the script's path, then the program reads the rest
    const input = warm ? Buffer.concat([Buffer.from(`${o.warmPython!.script}\n`), o.stdin]) : o.stdin;
    if (input.length > 0) stdin.end(input);
    else stdin.end();

    // one watcher per pidfd: the exit status goes to whoever reaps first
    const exited = forked ?? warm?.exited ?? new Promise<ExitStatus>((resolve) => native.watchExit(proc.pidfd, resolve));
    const wallTimer = setTimeout(() => kill('wallMs'), o.wallMs);
    // CPU time: the container runs one invocation at a time, so its cgroup's usage is the invocation's.
    // Check when the budget could first be spent at full speed, then again for what is left.
    let cpuTimer: NodeJS.Timeout | null = null;
    const cpuCheck = () => {
      let used = 0;
      try {
        used = (native.cgroupStats(this.id).cpuUsageUs - before.cpuUsageUs) / 1000;
      } catch {
        return;
      }
      if (used >= o.cpuMs) kill('cpuMs');
      else cpuTimer = setTimeout(cpuCheck, Math.max(2, (o.cpuMs - used) / Math.max(o.cpu, 0.01)));
    };
    cpuTimer = setTimeout(cpuCheck, Math.max(2, o.cpuMs / Math.max(o.cpu, 1)));
    const status = await Promise.race([exited, this.box.ended.then(() => null)]);
    clearTimeout(wallTimer);
    if (cpuTimer) clearTimeout(cpuTimer);
    const wallMs = ms(performance.now() - started);
    if (status === null) {
      native.close(proc.pidfd);
      stdout.stop();
      stderr.stop();
      return { ...internalError('the pool container died during the invocation'), wallMs };
    }
    native.close(proc.pidfd);
    if (status.signal === SIGKILL && limit === undefined && !this.dead) {
      // Killed by nobody we know of: when the container's pid 1 died, its pid namespace took the program along.
      await Promise.race([this.box.ended, new Promise((r) => setTimeout(r, 50))]);
    }
    // Background children may hold the pipes: they are killed now (the reset kills them anyway).
    await this.killLeftovers();
    await Promise.race([Promise.all([outDone, errDone]), new Promise((r) => setTimeout(r, 100))]);
    stdout.stop();
    stderr.stop();

    let after = before;
    try {
      after = native.cgroupStats(this.id);
    } catch {
      /* the container died just now; reported below */
    }
    const cpuMs = ms((after.cpuUsageUs - before.cpuUsageUs) / 1000);
    if (limit === undefined && cpuMs > o.cpuMs) limit = 'cpuMs';
    if (limit === undefined && status.signal === SIGXCPU) limit = 'cpuMs';
    const oom = after.oomKills > before.oomKills;
    if (oom && limit === undefined) limit = 'memoryMb';
    let st: InvokeStatus;
    if (this.dead || (status.signal !== null && initExiting(this.box.pid))) st = 'internal_error';
    else if (oom) st = 'memory_limit';
    else if (limit === 'maxOutputBytes') st = 'output_limit';
    else if (limit === 'wallMs' || limit === 'cpuMs') st = 'timeout';
    else if (status.signal !== null) st = 'signal';
    else if (status.exitCode !== 0) st = 'runtime_error';
    else st = 'ok';
    const r: StepResult = {
      status: st,
      exitCode: status.exitCode,
      signal: status.signal,
      stdout: '',
      stderr: '',
      truncated: stdout.truncated || stderr.truncated,
      wallMs,
      cpuMs,
      memPeakBytes: after.memoryPeakBytes,
    };
    const out = textResult(stdout.bytes(), stdout.truncated);
    const err = textResult(stderr.bytes(), stderr.truncated);
    r.stdout = out.text;
    r.stderr = err.text;
    if (out.base64 !== undefined) r.stdoutBase64 = out.base64;
    if (err.base64 !== undefined) r.stderrBase64 = err.base64;
    if (limit !== undefined) r.limit = limit;
    if (st === 'internal_error') r.message = 'the pool container died during the invocation';
    return r;
  }

  /** One isolated, unprivileged, confined process in the container (docs/fncall.md). */
  private spawnStep(argv: string[], extraEnv: Record<string, string>, limits: WarmSpec): Promise<ExecProcess> {
    const env = { ...baseEnv(), ...extraEnv };
    return native.execAsync({
      initPid: this.box.pid,
      cgroup: this.id,
      argv,
      env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
      cwd: WORK_DIR,
      uid: RUN_UID,
      gid: RUN_GID,
      schedIdle: false,
      isolate: {
        ipc: true,
        net: freshNetns(),
        readOnlyRoot: true,
        writable: [WORK_DIR],
        binds: SCRATCH_TARGETS.map((t) => ({ source: `${SCRATCH_DIR}/${t.dir}`, target: t.path })),
        tmpfs: [{ path: '/dev/shm', sizeBytes: limits.tmpfsBytes, mode: 0o1777 }],
        rlimits: { cpuSeconds: Math.ceil(limits.maxCpuMs / 1000) + 1, fileSizeBytes: limits.fileSizeBytes, coreBytes: 0, openFiles: 1024 },
      },
    });
  }

  /**
   * Start the next invocation's python3 ahead of time: the same isolation, user, confinement and
   * limits as a step started on demand, in a container that was just reset and verified; it only
   * waits for its script. It serves exactly one step, and any other step kills it first (it is
   * never left next to another invocation's processes). Its start-up CPU is not the invocation's.
   */
  prewarmPython(spec: WarmSpec): Promise<void> {
    if (this.dead || this.warm !== null || this.warming !== null) return this.warming ?? Promise.resolve();
    this.warming = (async () => {
      try {
        const proc = await this.spawnStep(['python3', '-B', '-c', PYTHON_WARM_BOOTSTRAP], {}, spec);
        const exited = new Promise<ExitStatus>((resolve) => native.watchExit(proc.pidfd, resolve));
        const w = { proc, spec, exited, ready: true, since: performance.now() };
        let gone = false;
        void exited.then(() => {
          w.ready = false;
          gone = true;
        });
        // Offered only once its start-up is over (a step waits for `warming`): an interpreter taken
        // while still importing would spend the rest of its start-up inside the step, billed to it.
        await waitForStdinRead(proc.pid, () => gone);
        this.warm = w;
      } catch {
        /* the next python3 step starts on demand */
      } finally {
        this.warming = null;
      }
    })();
    return this.warming;
  }

  get hasWarmPython(): boolean {
    return this.warm !== null && this.warm.ready;
  }

  /** When the waiting interpreter was started (performance.now()), or null without one. */
  get warmSince(): number | null {
    return this.warm !== null && this.warm.ready ? this.warm.since : null;
  }

  /**
   * The warm interpreter when it fits this step; otherwise it is killed, and gone (its exit seen),
   * before the step runs: a step must never share the container with a process it did not start.
   */
  private async takeWarm(o: StepOptions): Promise<{ proc: ExecProcess; exited: Promise<ExitStatus> } | null> {
    const w = this.warm;
    if (w === null) return null;
    this.warm = null;
    const fits = o.warmPython !== undefined && Object.keys(o.env).length === 0 && w.ready && w.spec.fileSizeBytes === o.fileSizeBytes && w.spec.tmpfsBytes === o.tmpfsBytes && w.spec.maxCpuMs >= o.cpuMs;
    if (fits) return w;
    await this.discardWarm(w);
    return null;
  }

  /** Kills a waiting interpreter; the promise settles when its exit has been seen. */
  private discardWarm(w: { proc: ExecProcess; exited: Promise<ExitStatus> }): Promise<void> {
    try {
      native.pidfdSendSignal(w.proc.pidfd, SIGKILL);
    } catch {
      /* gone */
    }
    // the pidfd has an exit watcher: it is closed once that has fired
    const gone = w.exited.then(() => native.close(w.proc.pidfd));
    for (const fd of [w.proc.stdin, w.proc.stdout, w.proc.stderr]) {
      if (fd === undefined) continue;
      try {
        native.close(fd);
      } catch {
        /* closed */
      }
    }
    return gone;
  }

  /** Kill every process of the container except its pid 1; true when only pid 1 is left. */
  async killLeftovers(deadlineMs = 2000): Promise<boolean> {
    const deadline = Date.now() + deadlineMs;
    let frozen = false;
    try {
      for (;;) {
        if (this.dead) return false;
        const zpid = this.zygote?.alive ? this.zygote.pid : -1;
        // The zygote's spare (forked when the invocation ended, for the next one) is the zygote's.
        const spare = this.zygote?.alive ? this.zygote.sparePid : -1;
        const others = native.cgroupProcs(this.id).filter((p) => p !== this.box.pid && p !== zpid && p !== spare);
        // Killed processes leave the cgroup at once but stay in the container's /proc as zombies
        // until their parent (pid 1 for orphans, the zygote for its forks) reaps them: the next
        // invocation must not see them either.
        if (others.length === 0 && unreapedChildren(this.box.pid, zpid, spare) === 0) return true;
        if (Date.now() > deadline) return false;
        if (!frozen && others.length > 1) {
          // Freeze so a fork bomb cannot outrun the kills; pid 1 (the reaper) is thawed with the rest.
          try {
            native.cgroupFreeze(this.id, true);
            frozen = true;
          } catch {
            /* kill anyway */
          }
        }
        for (const p of others) {
          try {
            process.kill(p, SIGKILL);
          } catch {
            /* already gone */
          }
        }
        if (frozen) {
          native.cgroupFreeze(this.id, false);
          frozen = false;
        }
        await new Promise((r) => setTimeout(r, 1));
      }
    } catch {
      return false;
    } finally {
      if (frozen) {
        try {
          native.cgroupFreeze(this.id, false);
        } catch {
          /* destroyed below */
        }
      }
    }
  }

  /**
   * Reset after an invocation and verify it. False means the container must
   * not be reused (the caller destroys it).
   */
  async reset(): Promise<{ ok: boolean; reason?: string }> {
    if (this.dead) return { ok: false, reason: 'container died' };
    if (this.warming) await this.warming;
    if (this.warm !== null) {
      const w = this.warm;
      this.warm = null;
      await this.discardWarm(w);
    }
    if (!(await this.killLeftovers())) return { ok: false, reason: 'processes survived the kill' };
    const work = `${this.root}${WORK_DIR}`;
    try {
      // Nothing runs in the container any more, so nothing can swap a path under the removal.
      if (!(await emptyDir(work))) return { ok: false, reason: '/work could not be emptied' };
      const st = lstatSync(work);
      if (!st.isDirectory() || st.uid !== RUN_UID) return { ok: false, reason: '/work was replaced' };
      // The scratch directories are emptied, not made anew: the zygote's mount namespace binds them.
      const scratch = `${this.root}${SCRATCH_DIR}`;
      const targets = new Set(SCRATCH_TARGETS.map((t) => t.dir));
      await Promise.all(readdirSync(scratch).filter((e) => !targets.has(e)).map((e) => rm(join(scratch, e), { recursive: true, force: true })));
      const dirs = SCRATCH_TARGETS.map((t) => join(scratch, t.dir));
      const shm = this.zygote?.alive ? `/proc/${this.zygote.pid}/root/dev/shm` : null;
      if (shm !== null) dirs.push(shm);
      for (const d of dirs) {
        let empty: boolean;
        try {
          empty = await emptyDir(d);
        } catch (err) {
          if (d === shm) continue; // the zygote ended just now; it is started anew below
          throw new Error(`${d}: ${(err as Error).message}`);
        }
        if (!empty) return { ok: false, reason: 'the scratch filesystem could not be emptied' };
      }
      this.makeScratchDirs();
      const now = snapshot(this.upperDir);
      if (now !== this.baseline) return { ok: false, reason: 'the root filesystem changed outside /work' };
    } catch (err) {
      return { ok: false, reason: `reset failed: ${(err as Error).message}` };
    }
    if (zygoteEnabled() && !this.zygote?.alive) await this.startZygote();
    this.pristine = true;
    this.lastUsed = Date.now();
    this.uses++;
    return { ok: true };
  }

  destroy(): Promise<void> {
    this.dead = true;
    if (this.warm !== null) {
      // the container's destruction kills it too; its exit is not waited for here
      void this.discardWarm(this.warm);
      this.warm = null;
    }
    if (this.zygote !== null) void this.zygote.kill();
    return this.box.destroy();
  }
}

/**
 * Remove what directory `dir` holds; true when it is empty then. Files go with one unlink each
 * (most resets remove only the program's few files), directories with a recursive rm.
 */
async function emptyDir(dir: string): Promise<boolean> {
  const entries = readdirSync(dir, { withFileTypes: true });
  if (entries.length === 0) return true;
  await Promise.all(
    entries.map(async (e) => {
      const p = join(dir, e.name);
      if (e.isDirectory()) return rm(p, { recursive: true, force: true });
      try {
        unlinkSync(p);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
      }
    }),
  );
  return readdirSync(dir).length === 0;
}

/** A cheap fingerprint of a directory tree: relative paths, types and sizes. */
function snapshot(dir: string): string {
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      const st = lstatSync(p);
      const r = `${rel}/${name}`;
      out.push(`${r}:${st.mode.toString(8)}:${st.isDirectory() ? '' : st.size}`);
      if (st.isDirectory()) walk(p, r);
    }
  };
  walk(dir, '');
  return out.join('\n');
}

/** cgroup v1 keeps a resettable high-water mark; v2 has no reset (memory.peak since the group was made). */
function resetMemoryPeak(id: string): void {
  const layout = native.cgroupLayout();
  if (layout.version !== 1 || layout.roots.memory === undefined) return;
  try {
    writeFileSync(join(layout.roots.memory, id, 'memory.max_usage_in_bytes'), '0');
  } catch {
    /* the peak then covers the container's earlier invocations too */
  }
}

function ms(x: number): number {
  return Math.round(x * 1000) / 1000;
}

export function emptyStep(): StepResult {
  return { status: 'ok', exitCode: null, signal: null, stdout: '', stderr: '', truncated: false, wallMs: 0, cpuMs: 0, memPeakBytes: 0 };
}

export function internalError(message: string): StepResult {
  return { ...emptyStep(), status: 'internal_error', message };
}

/** Text (U+FFFD for invalid sequences), plus the exact bytes in base64 when they are not valid UTF-8. */
export function textResult(buf: Buffer, truncated: boolean): { text: string; base64?: string } {
  const out: { text: string; base64?: string } = { text: buf.toString('utf8') };
  // A truncated stream may end inside a multi-byte character; that alone is not "binary".
  let valid = isUtf8(buf);
  if (!valid && truncated) {
    for (let cut = 1; cut <= 3 && !valid; cut++) valid = isUtf8(buf.subarray(0, buf.length - cut));
  }
  if (!valid) out.base64 = buf.toString('base64');
  return out;
}



