/**
 * python3 invocations fork from the container's pre-initialised interpreter (the zygote,
 * src/shim/fncall/zygote.ts). Each fork must be indistinguishable from `python3 -B main.py`
 * started on demand (the same program run with `cmd`, which never uses the zygote), must start
 * from the zygote's clean state whatever the previous invocation did, and must get its own
 * namespaces, identity, limits and confinement exactly as a fresh run does.
 */
import test from 'ava';
import type { InvokeOptions, InvokeResult } from '../../src/sdk/functions';
import { type FnFixture, integrationSkipReason, openFnFixture } from './fncall-fixture';
import { testUnless } from '../helpers/skip';
import { elapse } from '../helpers/wait';

const skip = integrationSkipReason();
let f: FnFixture;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  // one container: every invocation lands in the same one, after its reset
  await f.pool({ name: 'z', min: 1, max: 1 });
});

test.after.always(async () => {
  if (f) await f.close();
});

const run = (req: InvokeOptions): Promise<InvokeResult> => f.admin.functions.invoke('z', req);
const forks = (): number => f.shim.functions.pool('z').stats().zygoteRuns;
/** The same program started on demand, exactly as the language runs it. */
const fresh = (code: string, extra: Partial<InvokeOptions> = {}): Promise<InvokeResult> => run({ cmd: ['python3', '-B', 'main.py'], files: { 'main.py': code }, ...extra } as never);
/** The program as a python3 invocation; asserts that it was forked from the zygote. */
async function forked(code: string, extra: Partial<InvokeOptions> = {}): Promise<InvokeResult> {
  const before = forks();
  const r = await run({ code, language: 'python3', ...extra });
  if (forks() !== before + 1) throw new Error(`not forked from the zygote: ${JSON.stringify(r).slice(0, 400)}`);
  return r;
}
const same = (a: InvokeResult) => ({ status: a.status, exitCode: a.exitCode, signal: a.signal, stdout: a.stdout, stderr: a.stderr });

const maybe = testUnless(skip).serial;

maybe('a fork behaves exactly like python3 -B main.py: argv, __main__, sys.path, stdin, exit codes, tracebacks, atexit, threads, flushing', async (t) => {
  const programs: Array<[string, string?]> = [
    ['import sys, __main__\nprint(sys.argv, sys.orig_argv, __file__, __name__, sys.path[0], __main__.__dict__ is globals(), __spec__, __cached__, __package__, __doc__)\n'],
    ['print(list(globals()))\n'],
    ['import sys\nfor line in sys.stdin: print(line.strip()[::-1])\n', 'abc\ndef\n'],
    ['import sys\nprint("partial", end="")\nsys.exit(3)\n'],
    ['import sys\nsys.exit("bye")\n'],
    ['def f():\n    return 1 / 0\nf()\n'],
    ['x = (\n'],
    ['raise KeyboardInterrupt\n'],
    ['import atexit\natexit.register(lambda: print("atexit ran"))\nprint("main")\n'],
    ['import threading, time\ndef w():\n    time.sleep(0.05)\n    print("thread done", flush=True)\nthreading.Thread(target=w).start()\nprint("main done")\n'],
    ['import sys\nsys.stdout.write("no newline, unflushed")\n'],
    ['import os, sys\nprint(sys.last_type if hasattr(sys, "last_type") else None)\nos._exit(7)\n'],
    ['import sys\nprint(sys.excepthook is sys.__excepthook__, sys.getrecursionlimit(), sys.flags.dont_write_bytecode)\n'],
    // the exit: finalizers, exit values, what atexit handlers see, and output written by them
    ['class A:\n    def __del__(self):\n        print("del", NAME)\nNAME = "n"\na = A()\n_b = A()\nprint("main")\n'],
    ['import sys\nsys.exit(300)\n'],
    ['import sys\nsys.exit(-1)\n'],
    ['import sys\nsys.exit(2**40)\n'],
    ['import sys\nsys.exit(None)\n'],
    ['import sys\nsys.exit(True)\n'],
    ['import sys\nsys.exit(["a", 1])\n'],
    ['import atexit, sys\natexit.register(lambda: print("handler sees", sys.exc_info()[0], flush=True))\nraise ValueError("boom")\n'],
    ['import atexit, sys\nclass H:\n    def __repr__(self):\n        return "H"\n    def __call__(self):\n        raise RuntimeError("in handler")\natexit.register(H())\nprint("x")\nsys.exit(4)\n'],
    ['import atexit, sys\natexit.register(lambda: sys.stdout.write("late unflushed"))\n'],
    ['import sys\nsys.stdout.close()\n'],
    ['import sys, io\nsys.stdout = io.StringIO()\nprint("lost")\nsys.__stdout__.write("kept")\n'],
    ['import threading, time\ndef w():\n    time.sleep(0.05)\n    print("daemon", flush=True)\nthreading.Thread(target=w, daemon=True).start()\nprint("main")\n'],
  ];
  for (const [code, stdin] of programs) {
    const extra = stdin !== undefined ? { stdin } : {};
    const a = await fresh(code, extra);
    const b = await forked(code, extra);
    t.deepEqual(same(b), same(a), code);
  }
});

maybe('at exit a fork finalizes what the program made: files left open are written, modules it imported are cleared', async (t) => {
  const files = {
    'helper.py': 'class D:\n    def __del__(self):\n        print("helper del", flush=True)\nd = D()\nlog = open("/work/helper.log", "w")\nlog.write("from helper")\n',
  };
  const code = 'import helper, os\nf = open("/work/out.txt", "w")\nf.write("unclosed " * 1000)\nos.f2 = open("/work/os.txt", "w")\nos.f2.write("on a preloaded module")\nprint("main")\n';
  const fetchFiles = ['out.txt', 'helper.log', 'os.txt'];
  const a = await run({ cmd: ['python3', '-B', 'main.py'], files: { ...files, 'main.py': code }, fetchFiles });
  const b = await forked(code, { files, fetchFiles });
  t.deepEqual(same(b), same(a));
  t.is(a.stdout, 'main\nhelper del\n');
  t.deepEqual(b.files, a.files);
  const text = (name: string) => Buffer.from(b.files?.[name] ?? '', 'base64').toString();
  t.is(text('out.txt'), 'unclosed '.repeat(1000));
  t.is(text('helper.log'), 'from helper');
  t.is(text('os.txt'), 'on a preloaded module');
});

const INTROSPECT = `import sys, os, json, gc
def rd(p):
    try:
        with open(p) as fh:
            return fh.read()
    except Exception as e:
        return type(e).__name__
status = {}
for line in rd('/proc/self/status').splitlines():
    k, _, v = line.partition(':')
    if k in ('Uid', 'Gid', 'Groups', 'CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb', 'NoNewPrivs', 'Seccomp', 'SigBlk', 'SigIgn', 'SigCgt', 'Umask'):
        status[k] = v.strip()
mounts = sorted((l.split()[4], l.split()[5]) for l in rd('/proc/self/mountinfo').splitlines())
out = {
    'argv': sys.argv, 'orig_argv': sys.orig_argv, 'path': sys.path, 'modules': sorted(sys.modules),
    'globals': [k for k in globals()], 'loader': [type(__loader__).__name__, __loader__.name, __loader__.path],
    'file': __file__, 'cwd': os.getcwd(), 'environ': list(os.environ.items()), 'cmdline': rd('/proc/self/cmdline'),
    'fds': sorted(os.listdir('/proc/self/fd')), 'status': status, 'limits': rd('/proc/self/limits'),
    'uid_map': rd('/proc/self/uid_map'), 'gid_map': rd('/proc/self/gid_map'), 'setgroups': rd('/proc/self/setgroups'),
    'importer_cache': sorted(sys.path_importer_cache), 'flags': str(sys.flags),
    'stdio': [(s.name, s.encoding, s.errors, s.line_buffering, s.buffer.raw.mode, type(s.buffer).__name__) for s in (sys.stdin, sys.stdout, sys.stderr)],
    'session_leader': os.getsid(0) == os.getpid(), 'group_leader': os.getpgid(0) == os.getpid(),
    'net': sorted(l.split(':')[0].strip() for l in rd('/proc/net/dev').splitlines()[2:]),
    'mounts': mounts, 'oom': rd('/proc/self/oom_score_adj'), 'nice': os.nice(0), 'affinity': sorted(os.sched_getaffinity(0)),
    'gc': [gc.isenabled(), gc.get_threshold()], 'hostname': os.uname().nodename, 'ids': [os.getuid(), os.geteuid(), os.getgid(), os.getegid(), os.getgroups()],
    'writable': [os.access(p, os.W_OK) for p in ('/', '/usr', '/etc', '/work', '/tmp', '/dev/shm', '/mnt')],
}
print(json.dumps(out, default=str, indent=0))
`;

maybe('a fork has the state, identity, limits, namespaces and confinement of a fresh run', async (t) => {
  const a = await fresh(INTROSPECT);
  const b = await forked(INTROSPECT);
  t.is(a.status, 'ok', a.stderr);
  t.is(b.status, 'ok', b.stderr);
  const x = JSON.parse(a.stdout) as Record<string, unknown>;
  const y = JSON.parse(b.stdout) as Record<string, unknown>;
  for (const k of Object.keys(x)) t.deepEqual(y[k], x[k], k);
  t.deepEqual(Object.keys(y).sort(), Object.keys(x).sort());
});

maybe('the request environment reaches a fork in its order; a variable the interpreter reads at start-up makes the run fresh', async (t) => {
  const code = 'import os\nprint(list(os.environ.items()))\nprint(open("/proc/self/environ").read().count("\\0") > 0)\n';
  const env = { ZED: '1', ALPHA: 'two words', EMPTY: '' };
  const a = await fresh(code, { env });
  const b = await forked(code, { env });
  t.is(b.stdout.split('\n')[0], a.stdout.split('\n')[0]);
  const before = forks();
  const c = await run({ code: 'import sys\nprint(sys.flags.hash_randomization)\n', language: 'python3', env: { PYTHONHASHSEED: '0' } });
  t.is(c.stdout, '0\n');
  t.is(forks(), before, 'PYTHONHASHSEED is read at start-up: the run starts on its own');
});

maybe('nothing an invocation does reaches the next fork: modules, sys.modules, env, cwd, files, signals, threads, processes', async (t) => {
  const dirty = `import os, sys, signal, threading, time, json, builtins
os.environ['LEAK'] = '1'
json.LEAK = 1
sys.modules['leaky'] = json
sys.setrecursionlimit(77)
sys.path.append('/leak')
builtins.LEAK = 1
os.chdir('/tmp')
for p in ('/tmp/leak', '/dev/shm/leak', '/work/leak', '/mnt/leak'):
    with open(p, 'w') as fh:
        fh.write('x')
os.umask(0o077)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, lambda *a: None)
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
    os._exit(0)
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0); s.bind(('127.0.0.1', 4321)); s.listen()
print('dirty')
`;
  const d = await forked(dirty);
  t.is(d.stdout, 'dirty\n', d.stderr);
  const check = `import os, sys, signal, builtins, threading, socket
procs = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
print(sorted({
    'env': 'LEAK' in os.environ, 'json': 'json' in sys.modules, 'leaky': 'leaky' in sys.modules,
    'rec': sys.getrecursionlimit(), 'path': '/leak' in sys.path, 'builtins': hasattr(builtins, 'LEAK'),
    'cwd': os.getcwd(), 'files': [os.path.exists(p) for p in ('/tmp/leak', '/dev/shm/leak', '/work/leak', '/mnt/leak')],
    'umask': os.umask(0o022), 'sigterm': signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
    'sigusr1': signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, 'threads': threading.active_count(), 'procs': len(procs),
}.items()))
s = socket.socket(); s.bind(('127.0.0.1', 4321)); print('bound')
`;
  const clean = await fresh(check);
  await forked(dirty);
  const after = await forked(check);
  t.is(clean.status, 'ok', clean.stderr);
  t.is(after.stdout, clean.stdout);
  t.regex(after.stdout, /\('env', False\).*\('files', \[False, False, False, False\]\)/s);
  t.regex(after.stdout, /bound/);
});

maybe('forks keep the limits of the request: output, wall clock, CPU, memory and file size', async (t) => {
  const out = await forked('import sys\nwhile True: sys.stdout.write("x" * 65536)\n', { maxOutputBytes: 100_000 });
  t.is(out.status, 'output_limit');
  const wall = await forked('import time\ntime.sleep(30)\n', { timeoutMs: 300 });
  t.is(wall.status, 'timeout');
  t.is(wall.limit, 'wallMs');
  const cpu = await forked('while True: pass\n', { cpuMs: 200, timeoutMs: 5000 });
  t.is(cpu.status, 'timeout');
  t.is(cpu.limit, 'cpuMs');
  const mem = await forked('x = bytearray(1 << 30)\nprint(len(x))\n', { memoryMb: 64 });
  t.true(mem.status === 'memory_limit' || (mem.status === 'runtime_error' && mem.stderr.includes('MemoryError')), JSON.stringify(mem).slice(0, 300));
  const ok = await forked('print("still fine")\n');
  t.is(ok.stdout, 'still fine\n');
});

maybe('an invocation cannot reach the zygote: no signal, no memory, no environment, no new namespace', async (t) => {
  const attack = `import os, signal, ctypes
z = os.getppid()
res = {}
for sig in (signal.SIGKILL, signal.SIGSTOP, 0):
    try:
        os.kill(z, sig)
        res[str(sig)] = 'sent'
    except OSError as e:
        res[str(sig)] = e.errno
for f in ('mem', 'environ', 'maps'):
    try:
        with open(f'/proc/{z}/{f}', 'rb') as fh:
            fh.read(1)
        res[f] = 'read'
    except OSError as e:
        res[f] = e.errno
libc = ctypes.CDLL(None, use_errno=True)
res['unshare'] = [libc.unshare(0x10000000), ctypes.get_errno()]
res['ptrace'] = [libc.ptrace(16, z, 0, 0), ctypes.get_errno()]
print(sorted(res.items()))
`;
  const r = await forked(attack);
  t.is(r.status, 'ok', r.stderr);
  // EPERM (1) for signals, EACCES (13) or EPERM for its /proc files, EPERM from seccomp for unshare and ptrace
  t.is(r.stdout, "[('0', 1), ('19', 1), ('9', 1), ('environ', 13), ('maps', 13), ('mem', 13), ('ptrace', [-1, 1]), ('unshare', [-1, 1])]\n");
  const again = await forked('print("zygote still serving")\n');
  t.is(again.stdout, 'zygote still serving\n');
});

/** Seconds since this process started (its start time in /proc against the uptime). */
const AGE = `import os
ticks = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19])
age = float(open('/proc/uptime').read().split()[0]) - ticks / os.sysconf('SC_CLK_TCK')
print(round(age, 2))
`;

maybe('the next fork is made ahead, while the last one is reported, and is the zygote\'s until its request', async (t) => {
  await forked('print("first")\n');
  // the spare forked when that invocation ended is older than the request that it serves
  await elapse(500, 'the spare waits for its request');
  const r = await forked(AGE);
  t.is(r.status, 'ok', r.stderr);
  t.true(Number(r.stdout) >= 0.3, `the process that ran the request is ${r.stdout.trim()} s old`);
  // a spare made for other rlimits does not serve a request: each gets its own
  const rl = 'import resource\nprint(resource.getrlimit(resource.RLIMIT_CPU))\n';
  t.is((await forked(rl, { cpuMs: 3000 })).stdout, '(4, 4)\n');
  t.is((await forked(rl, { cpuMs: 3000 })).stdout, '(4, 4)\n');
  t.is((await forked(rl, { cpuMs: 1000 })).stdout, '(2, 2)\n');
  // A program leaves a process behind that tries for a second to kill, stop and read every other
  // process it can see but the program itself (which it could kill, being its own uid, before the
  // program prints). It is killed when the program ends; the spare waiting meanwhile is root and
  // out of its reach. The next fork runs as usual.
  const attack = `import os, signal, time
program = os.getpid()
if os.fork() == 0:
    os.setsid()
    me = os.getpid()
    end = time.time() + 1
    while time.time() < end:
        for p in os.listdir('/proc'):
            if p.isdigit() and int(p) not in (me, program):
                for sig in (signal.SIGSTOP, signal.SIGKILL):
                    try: os.kill(int(p), sig)
                    except OSError: pass
                try: open(f'/proc/{p}/mem', 'rb').read(1)
                except OSError: pass
    os._exit(0)
print("left a process behind")
`;
  const a = await forked(attack);
  t.is(a.stdout, 'left a process behind\n', a.stderr);
  const after = await forked('import os\nprint(sorted(os.listdir("/work")), os.getuid())\n');
  t.is(after.status, 'ok', after.stderr);
  t.is(after.stdout, "['main.py'] 65534\n");
});

maybe('a run that is not forked sees no spare: the zygote reaps it first', async (t) => {
  await forked('print("make a spare")\n');
  const r = await fresh('import os\nprint(sorted(open(f"/proc/{p}/comm").read().strip() for p in os.listdir("/proc") if p.isdigit()))\n');
  t.is(r.status, 'ok', r.stderr);
  // pid 1, the zygote, and this program: no waiting fork, and no zombie of one
  t.is(JSON.parse(r.stdout.replace(/'/g, '"')).length, 3, r.stdout);
  t.is((await forked('print("forks again")\n')).stdout, 'forks again\n');
});
