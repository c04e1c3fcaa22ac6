/**
 * The python3 zygote of a pool container (docs/fncall.md, "python3 zygote"; SOCK, ATC'18).
 *
 * One python3 per pool container starts up exactly as `python3 -B main.py` does (same argv, same
 * environment, same stdio kinds: pipes) and then only forks: each python3 invocation is a fork of
 * that pre-initialised interpreter, so the interpreter's start-up (~10-15 ms of CPU here) is not
 * paid per invocation. The fork server is C (native/helper/zygote/zygote.c); each child gets the
 * per-process setup a fresh exec gets (its own IPC and network namespaces, the run user, the
 * capability bounding set, no_new_privs, the sandbox's Landlock and seccomp confinement, the
 * rlimits, cwd, environment and stdio of the request) before any Python code runs in it, and the
 * bootstrap below then makes the interpreter's state that of a fresh `python3 -B main.py` in /work.
 *
 * The zygote runs as root with the default capability set of a sandbox root, in a mount namespace
 * made once by the exec that started it (the read-only root, /work, the scratch binds and a
 * /dev/shm tmpfs that reset() empties: the same view an invocation gets), confined by the
 * sandbox's seccomp filter with unshare(2) allowed (its children make their namespaces inside a
 * user namespace of their own, which the zygote maps 1:1; each child then stacks the full filter).
 */
import { existsSync } from 'node:fs';
import { BoundedCollector, pumpInto } from '../output';
import { WarrenError } from '../../errors';
import { confinementOf, native } from '../../native';
import type { ConfineSpec, ExecProcess, ExitStatus, ZygoteReply } from '../../native/types';

/** Where the bootstrap and the fork-server module live in every pool container. */
export const ZYGOTE_DIR = '/run/warren-zygote';
export const ZYGOTE_MODULE = `${ZYGOTE_DIR}/_warren_zygote.so`;
/** seccomp group of the zygote itself (confine.h WN_SC_ZYGOTE): unshare(2) let through. */
const SC_ZYGOTE = 1 << 4;
const SIGKILL = 9;

/**
 * The zygote's main.py. Started as `python3 -B main.py` in ZYGOTE_DIR, so sys.argv, sys.orig_argv
 * and /proc/self/cmdline are a fresh run's. In each child it puts back what a fresh run of
 * /work/main.py has: the environment (C environ and os.environ, in the request's order),
 * sys.path[0], the importer cache entry of the script, the __main__ module's namespace (the
 * startup names only, in their order, with __file__ and __loader__ of the script), the user site
 * directory when the request made one; then it runs the script the way the interpreter runs a
 * file: tracebacks without a frame of the bootstrap, sys.last_* set, SystemExit and the normal
 * interpreter exit (thread joins, atexit, flushing), KeyboardInterrupt ending in SIGINT.
 * The start-up objects are moved to the collector's permanent generation (gc.freeze) before the
 * first fork, so that collections in a child do not write to (and so copy) every page of them.
 * It uses only modules every python3 has loaded at start-up (and gc, removed again from
 * sys.modules), and none stays behind.
 */
/** Source compiled (not run) in the zygote before its first fork: the common syntax of a script. */
const WARM_SOURCE = [
  'import sys, os',
  'from collections import defaultdict as dd',
  'def f(a, b=1, *args, k=None, **kw):',
  "    '''doc'''",
  '    x = [i * 2 for i in range(a) if i % 2]',
  '    y = {k: v for k, v in zip(x, x)}',
  '    z = {1, 2, 3}; t = (a, b); s = f"{a!r:>10} {b}"',
  '    try:',
  '        return lambda q: q + 1',
  '    except (ValueError, KeyError) as e:',
  '        raise RuntimeError(str(e)) from e',
  '    finally:',
  '        pass',
  'class C(object):',
  '    n: int = 0',
  '    def m(self):',
  '        global g',
  '        with open(__file__) as fh:',
  '            for line in fh:',
  '                while line and not line.isspace():',
  '                    line = line[1:]',
  '        return self.n if self.n else -1.5e3 ** 2 // 3 if False else None',
  'async def co():',
  '    await co()',
  'if __name__ == "__main__":',
  '    print(f(3), C().m(), sys.argv[1:], input() if False else "", *[1], sep=" ", end="\\n")',
].join('\n');

export const PYTHON_ZYGOTE_BOOTSTRAP = `def _warren_zygote():
    import sys, _imp, _frozen_importlib
    spec = _frozen_importlib.ModuleSpec('_warren_zygote', None, origin=${JSON.stringify(ZYGOTE_MODULE)})
    z = _imp.create_dynamic(spec)
    _imp.exec_dynamic(z)
    # The compiler's first use in a process touches a lot of memory; done here once, it is shared
    # by every fork. The code is compiled only, never run.
    compile(${JSON.stringify(WARM_SOURCE)}, '<warren-zygote>', 'exec', dont_inherit=True)
    def modules_get(name):
        # a module, without leaving it in sys.modules when a fresh interpreter would not have it
        if name in sys.modules:
            return sys.modules[name]
        m = __import__(name)
        del sys.modules[name]
        return m
    gc = modules_get('gc')
    gc.freeze()
    env = z.serve(3)
    del z, spec
    if env is None:
        return
    import os, site
    d = os.environ._data
    d.clear()
    kv = k = v = None
    for kv in env:
        k, _, v = kv.partition('=')
        d[os.environ.encodekey(k)] = os.environ.encodevalue(v)
    path = '/work/main.py'
    sys.path[0] = '/work'
    cache = sys.path_importer_cache
    if ${JSON.stringify(`${ZYGOTE_DIR}/main.py`)} in cache:
        cache[path] = cache.pop(${JSON.stringify(`${ZYGOTE_DIR}/main.py`)})
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        user = site.getusersitepackages()
        sp = [p for p in site.getsitepackages() if p in sys.path]
        at = sys.path.index(sp[0]) if sp else len(sys.path)
        site.addsitedir(user)
        if user in sys.path:
            sys.path.remove(user)
            sys.path.insert(at, user)
    # The program's __main__ is a module of its own, not the one this bootstrap runs in: at the
    # exit nothing here holds it, so it is finalized as the interpreter finalizes a program's.
    old = sys.modules['__main__'].__dict__
    main = type(sys)('__main__')
    g = main.__dict__
    keep = {k: old[k] for k in ('__name__', '__doc__', '__package__', '__loader__', '__spec__', '__annotations__', '__builtins__', '__file__', '__cached__') if k in old}
    keep['__file__'] = path
    keep['__loader__'] = type(keep['__loader__'])('__main__', path)
    g.update(keep)
    sys.modules['__main__'] = main
    del d, env, cache, keep, old, kv, k, v
    preloaded = set(sys.modules)
    preloaded.discard('__main__')
    # built-in modules the exit needs
    atexit, _io, _weakref = [modules_get(n) for n in ('atexit', '_io', '_weakref')]

    # what the exit uses is bound now: the program may rebind any of these names
    def _exit(status, isinstance=isinstance, int=int, type=type, str=str, dict=dict, getattr=getattr, setattr=setattr, BaseException=BaseException, TypeError=TypeError,
              run_atexit=atexit._run_exitfuncs, collect=gc.collect, objects=gc.get_objects, IOBase=_io._IOBase, weak=_weakref.ref, end=os._exit, modules=sys.modules):
        # What the interpreter's exit does that a program can see, in its order: wait for
        # threads, run atexit, flush stdio, finalize the program's objects (its __main__ and the
        # modules it imported), then end. The zygote's own modules are not torn down: freeing
        # them is most of a fork's exit (every object touched is a copy-on-write fault) and runs
        # no code of the program. Anything unusual (an exit value that is not an int, a flush
        # that fails) returns, and the interpreter's own exit handles it as it always does.
        if status is None:
            status = 0
        if not isinstance(status, int) or not -2**31 <= status < 2**31:
            return
        t = modules.get('threading')
        if t is not None:
            t._shutdown()
        run_atexit()
        for s in (sys.stdout, sys.stderr):
            try:
                if s is not None and not s.closed:
                    s.flush()
            except BaseException:
                return
        def flush_files():
            for o in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__, *objects()):
                if isinstance(o, IOBase):
                    try:
                        if not o.closed:
                            o.flush()
                    except BaseException:
                        pass
        def clear(d):
            # as the interpreter clears a module that outlives its finalization: names with one
            # leading underscore to None first, then every other name but __builtins__
            for k in [k for k in d if type(k) is str and k[:1] == '_' and k[1:2] != '_']:
                d[k] = None
            for k in [k for k in d if type(k) is str and k != '__builtins__']:
                d[k] = None
        # As the interpreter finalizes: the program's modules and its __main__ leave sys.modules,
        # sys drops its paths and last exception and gets its original stdio back, and what they
        # alone held is collected with their globals intact (finalizers run then); a module that
        # something else still holds is cleared after that, in reverse import order.
        refs = []
        for n in ['__main__', *[n for n in modules if n not in preloaded and n != '__main__']]:
            m = modules.pop(n, None)
            try:
                refs.append(weak(m))
            except TypeError:
                pass
        m = None
        for n in ('path', 'argv', 'ps1', 'ps2', 'last_type', 'last_value', 'last_traceback', 'path_hooks', 'path_importer_cache', 'meta_path', '__interactivehook__'):
            setattr(sys, n, None)
        for n in ('stdin', 'stdout', 'stderr'):
            setattr(sys, n, getattr(sys, '__' + n + '__', None))
        # Files the program left open are flushed while every part of them is still there: a
        # collection finalizes the parts of a file in no set order, and a text file whose raw
        # file went first would lose what it held.
        flush_files()
        collect()
        for r in refs[::-1]:
            md = getattr(r(), '__dict__', None)
            if type(md) is dict:
                clear(md)
        md = None
        collect()
        # and what finalizers wrote since
        flush_files()
        end(status)

    status = 0
    try:
        with open(path, 'rb') as f:
            code = compile(f.read(), path, 'exec', dont_inherit=True)
        del f
        exec(code, g)
    except SystemExit as e:
        # the interpreter drops the exception (and the frames it holds) before it exits
        status = e.code
        del e
    except BaseException as e:
        tb = e.__traceback__.tb_next if e.__traceback__ is not None else None
        e = e.with_traceback(tb)
        sys.last_type, sys.last_value, sys.last_traceback = type(e), e, tb
        sys.excepthook(type(e), e, tb)
        interrupted = isinstance(e, KeyboardInterrupt)
        del e, tb
        if interrupted:
            if 'threading' in sys.modules:
                sys.modules['threading']._shutdown()
            import atexit, signal
            atexit._run_exitfuncs()
            for s in (sys.stdout, sys.stderr):
                try:
                    s.flush()
                except BaseException:
                    pass
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        status = 1
    # nothing of the program is left in this frame when it exits
    del g, main
    _exit(status)
    raise SystemExit(status)
_warren_zygote()
`;

/** Request variables that a python3 reads while it starts (or the loader while it execs): such a run starts on its own. */
export function zygoteCanRun(env: Record<string, string>): boolean {
  return Object.keys(env).every((k) => !/^(PYTHON|LC_|LD_|GLIBC_|MALLOC_)/.test(k) && !['LANG', 'LANGUAGE', 'PATH', 'HOME', 'TZ'].includes(k));
}

export interface ZygoteRequest {
  env: Record<string, string>;
  uid: number;
  gid: number;
  cwd: string;
  ipc: boolean;
  net: boolean;
  rlimits: { cpuSeconds: number; fileSizeBytes: number; coreBytes: number; openFiles: number };
}

/** The zygote's request records (zygote.c parse()). */
function payloadOf(r: ZygoteRequest, c: ConfineSpec | null): Buffer {
  const rec: string[] = [`U${r.uid}`, `G${r.gid}`, `C${r.cwd}`];
  if (r.ipc) rec.push('I');
  if (r.net) rec.push('N');
  rec.push(`R${r.rlimits.cpuSeconds} ${r.rlimits.fileSizeBytes} ${r.rlimits.coreBytes} ${r.rlimits.openFiles}`);
  for (const [k, v] of Object.entries(r.env)) {
    if (k.includes('\0') || v.includes('\0') || k.includes('=') || k === '') throw new WarrenError('INVALID_ARGUMENT', `env ${JSON.stringify(k)} cannot be passed`);
    rec.push(`E${k}=${v}`);
  }
  if (c !== null) {
    if (c.seccomp) rec.push(`S${c.seccomp.allow}`);
    if (c.landlockAbi !== undefined && c.landlockAbi > 0) rec.push(`L${c.landlockAbi}`);
    for (const p of c.writable ?? []) rec.push(`W${p}`);
    for (const p of c.readOnly ?? []) rec.push(`O${p}`);
    if (c.writableTopLevel) rec.push('T');
    for (const p of c.protected ?? []) rec.push(`P${p}`);
    if (c.scope !== undefined) rec.push(`X${c.scope}`);
    if (c.apparmorProfile !== undefined) rec.push(`A${c.apparmorProfile}`);
    if (c.fsizeBytes !== undefined) rec.push(`F${c.fsizeBytes}`);
    if (c.nofile !== undefined) rec.push(`Q${c.nofile}`);
  }
  return Buffer.from(`${rec.join('\0')}\0`);
}

const STEPS: Record<number, string> = {
  1: 'request',
  2: 'fork',
  3: 'setsid',
  4: 'stdio',
  5: 'close_range',
  6: 'user namespace',
  7: 'uid/gid map',
  8: 'isolate',
  9: 'drop capabilities',
  10: 'setgroups',
  11: 'setgid',
  12: 'setuid',
  13: 'chdir',
  14: 'no_new_privs',
  15: 'confine',
};

interface Pending {
  resolve: (p: { proc: ExecProcess; exited: Promise<ExitStatus> }) => void;
  reject: (err: unknown) => void;
  fds: { stdin: number; stdout: number; stderr: number };
  started: boolean;
  exited?: (s: ExitStatus) => void;
  pidfd?: number;
}

export class PythonZygote {
  private dead = false;
  private pending: Pending | null = null;
  private readonly log = new BoundedCollector(16 * 1024, () => undefined);
  /** Invocations this zygote forked. */
  forks = 0;
  /** Host pid of the child it forked ahead for the next invocation, or -1 (killLeftovers spares it). */
  sparePid = -1;

  private constructor(
    private readonly proc: ExecProcess,
    private readonly sandboxId: string,
    readonly ended: Promise<ExitStatus>,
  ) {
    native.zygoteWatch(proc.status!, (r) => this.onReply(r));
  }

  /** Host pid of the zygote (killLeftovers spares it). */
  get pid(): number {
    return this.proc.pid;
  }

  get alive(): boolean {
    return !this.dead;
  }

  /** Its stderr so far (start-up failures). */
  get output(): string {
    return this.log.bytes().toString('utf8');
  }

  /**
   * Start the zygote in pool container `sandboxId` (pid 1 `initPid`). `view` is the mount view of
   * an invocation (read-only root, writable /work, the scratch binds, /dev/shm), made for the
   * zygote's mount namespace once.
   */
  static async start(initPid: number, sandboxId: string, env: Record<string, string>, view: { writable: string[]; binds: Array<{ source: string; target: string }>; tmpfsBytes: number }): Promise<PythonZygote> {
    const sandboxConfine = confinementOf(sandboxId);
    const proc = await native.execAsync({
      initPid,
      cgroup: sandboxId,
      argv: ['python3', '-B', 'main.py'],
      env: Object.entries(env).map(([k, v]) => `${k}=${v}`),
      cwd: ZYGOTE_DIR,
      uid: 0,
      gid: 0,
      schedIdle: false,
      statusSocket: true,
      confine: sandboxConfine?.seccomp ? { seccomp: { allow: sandboxConfine.seccomp.allow | SC_ZYGOTE } } : null,
      isolate: {
        readOnlyRoot: true,
        writable: view.writable,
        binds: view.binds,
        tmpfs: [{ path: '/dev/shm', sizeBytes: view.tmpfsBytes, mode: 0o1777 }],
      },
    });
    const ended = new Promise<ExitStatus>((resolve) => native.watchExit(proc.pidfd, resolve));
    const z = new PythonZygote(proc, sandboxId, ended);
    // Nothing reads the zygote's own stdin; its stdout and stderr are kept (bounded) for diagnostics.
    native.close(proc.stdin!);
    void pumpInto(proc.stdout!, z.log);
    void pumpInto(proc.stderr!, z.log);
    void ended.then(() => {
      z.dead = true;
      native.close(proc.pidfd);
    });
    return z;
  }

  private onReply(r: ZygoteReply): void {
    const p = this.pending;
    if (r.kind === 0) {
      this.dead = true;
      this.sparePid = -1;
      try {
        native.close(this.proc.status!);
      } catch {
        /* closed */
      }
      if (p === null) return;
      this.pending = null;
      if (!p.started) {
        closeAll(p.fds);
        p.reject(new WarrenError('SANDBOX_NOT_RUNNING', 'the python3 zygote is gone'));
      } else {
        // the zygote died under its child: the child is killed (its status is unknown)
        try {
          if (p.pidfd !== undefined) native.pidfdSendSignal(p.pidfd, SIGKILL);
        } catch {
          /* gone */
        }
        p.exited?.({ exitCode: null, signal: SIGKILL });
      }
      return;
    }
    if (p === null) return;
    if (r.kind === 1 && !p.started) {
      // the spare, if there was one, is this invocation now
      this.sparePid = -1;
      p.started = true;
      p.pidfd = r.pidfd!;
      this.forks++;
      const exited = new Promise<ExitStatus>((resolve) => {
        p.exited = resolve;
      });
      p.resolve({ proc: { pid: r.pid!, pidfd: r.pidfd!, ...p.fds }, exited });
    } else if (r.kind === 2 && !p.started) {
      this.pending = null;
      closeAll(p.fds);
      p.reject(new WarrenError('SPAWN_ERROR', `python3 zygote: ${STEPS[r.step ?? 0] ?? 'setup'} (step ${r.index ?? 0}) failed: errno ${r.errno ?? 0}`, undefined, r.errno));
    } else if (r.kind === 3 && p.started) {
      this.pending = null;
      this.sparePid = r.spare ?? -1;
      p.exited?.({ exitCode: r.exitCode ?? null, signal: r.signal ?? null });
    }
  }

  /** Fork one invocation; resolves once its setup is complete (it runs /work/main.py). */
  spawn(req: ZygoteRequest): Promise<{ proc: ExecProcess; exited: Promise<ExitStatus> }> {
    if (this.dead) return Promise.reject(new WarrenError('SANDBOX_NOT_RUNNING', 'the python3 zygote is gone'));
    if (this.pending !== null) return Promise.reject(new WarrenError('INTERNAL', 'the python3 zygote is busy'));
    const payload = payloadOf(req, confinementOf(this.sandboxId));
    const fds = native.zygoteSpawn(this.proc.status!, payload);
    return new Promise((resolve, reject) => {
      this.pending = { resolve, reject, fds, started: false };
    });
  }

  /**
   * Kill the spare and wait (up to a second) until the zygote has reaped it: an invocation that is
   * not forked must not find it in the container's process table.
   */
  async dropSpare(): Promise<void> {
    const pid = this.sparePid;
    if (pid <= 0) return;
    this.sparePid = -1;
    try {
      // still the zygote's child: its pid cannot have been reused before the zygote reaps it
      process.kill(pid, SIGKILL);
    } catch {
      return;
    }
    const deadline = Date.now() + 1000;
    while (existsSync(`/proc/${pid}`) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 1));
  }

  /** Kill it; resolves when its exit has been seen. */
  kill(): Promise<void> {
    try {
      native.pidfdSendSignal(this.proc.pidfd, SIGKILL);
    } catch {
      /* gone */
    }
    return this.ended.then(() => undefined);
  }
}

function closeAll(fds: { stdin: number; stdout: number; stderr: number }): void {
  for (const fd of [fds.stdin, fds.stdout, fds.stderr]) {
    try {
      native.close(fd);
    } catch {
      /* closed */
    }
  }
}
