/**
 * The kernel driver: one Python program, run inside a sandbox, that drives a
 * stateful Python kernel for both kernel surfaces (POST /run_jupyter and the
 * E2B code interpreter). It starts a real Jupyter kernel (ipykernel, through
 * jupyter_client) when the image has both, and otherwise falls back to a
 * kernel written with the standard library only (STDLIB_KERNEL below), which
 * speaks the same events. Either way the kernel is a child process of the
 * driver, so the driver can interrupt it (SIGINT to its process group), time
 * a cell out, and restart it without losing its own state.
 *
 * Events (one JSON object per line, or collected per cell in batch mode):
 *   {type: 'ready', backend: 'ipykernel'|'stdlib', reason?}
 *   {type: 'stream', name: 'stdout'|'stderr', text}
 *   {type: 'display_data'|'execute_result', data: {mime: value}, metadata}
 *   {type: 'error', ename, evalue, traceback: [line]}
 *   {type: 'done', status: 'ok'|'error'|'timeout'|'interrupted'|'restarted', execution_count}
 *
 * Modes:
 *   serve  — requests as JSON lines on stdin ({op: 'execute', code, env, timeout}
 *            or {op: 'restart'}), events as JSON lines on stdout; SIGINT interrupts
 *            the running cell. The kernel's own output never reaches stdout.
 *   batch  — one request {cells, cell_timeout, total_timeout} on stdin; the cells
 *            run in order in one kernel and the results go to the file named by
 *            argv[2] (rewritten after every cell), in SandboxFusion's cell shape.
 *
 * A cell that overruns its timeout is interrupted; one that ignores the
 * interrupt for INTERRUPT_GRACE seconds gets its kernel restarted (its state is
 * lost, which the 'restarted' status says).
 */

/**
 * The fallback kernel (standard library only): requests are JSON lines on
 * stdin (`{code}`), events go out on a private copy of stdout. Its fds 1 and 2
 * are pipes read by threads, so output of child processes and C code shows up
 * as stream events too; a sync marker through each pipe keeps it ahead of the
 * 'idle' event. SIGINT interrupts the running cell only.
 */
export const STDLIB_KERNEL = String.raw`
import ast, base64, json, os, sys, threading, traceback

_proto = os.fdopen(os.dup(1), 'w', buffering=1, encoding='utf-8', errors='replace')
_lock = threading.Lock()
_SYNC = b'\x00\x1ewarren-sync\x1e\x00'

def _send(obj):
    with _lock:
        _proto.write(json.dumps(obj) + '\n')
        _proto.flush()

class _Out:
    def __init__(self, name):
        self.name = name
        self.buf = ''
        self.encoding = 'utf-8'
    def write(self, text):
        if not isinstance(text, str):
            raise TypeError('write() argument must be str')
        self.buf += text
        if '\n' in self.buf:
            head, _, self.buf = self.buf.rpartition('\n')
            _send({'type': 'stream', 'name': self.name, 'text': head + '\n'})
        return len(text)
    def flush(self):
        if self.buf:
            _send({'type': 'stream', 'name': self.name, 'text': self.buf})
            self.buf = ''
    def isatty(self):
        return False
    def writable(self):
        return True
    def fileno(self):
        return 1 if self.name == 'stdout' else 2

_synced = {'stdout': threading.Event(), 'stderr': threading.Event()}

def _pump(fd, name):
    pending = b''
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return
        pending += chunk
        while True:
            i = pending.find(_SYNC)
            if i < 0:
                break
            if i > 0:
                _send({'type': 'stream', 'name': name, 'text': pending[:i].decode('utf-8', 'replace')})
            pending = pending[i + len(_SYNC):]
            _synced[name].set()
        keep = len(_SYNC) - 1
        if len(pending) > keep:
            cut = len(pending) - keep
            while cut > 0 and (pending[cut] & 0xC0) == 0x80:
                cut -= 1
            if cut > 0:
                _send({'type': 'stream', 'name': name, 'text': pending[:cut].decode('utf-8', 'replace')})
                pending = pending[cut:]

for _fd, _name in ((1, 'stdout'), (2, 'stderr')):
    _r, _w = os.pipe()
    os.dup2(_w, _fd)
    os.close(_w)
    threading.Thread(target=_pump, args=(_r, _name), daemon=True).start()

_requests = os.fdopen(os.dup(0), 'r', encoding='utf-8')
_null = os.open(os.devnull, os.O_RDONLY)
os.dup2(_null, 0)
sys.stdin = open(os.devnull)
sys.stdout = _Out('stdout')
sys.stderr = _Out('stderr')

_globals = {'__name__': '__main__', '__builtins__': __builtins__}
_count = 0
_REPRS = (('text/html', '_repr_html_'), ('text/markdown', '_repr_markdown_'), ('image/svg+xml', '_repr_svg_'),
          ('image/png', '_repr_png_'), ('image/jpeg', '_repr_jpeg_'), ('text/latex', '_repr_latex_'),
          ('application/json', '_repr_json_'), ('application/pdf', '_repr_pdf_'))

def _bundle(value):
    data = {}
    try:
        data['text/plain'] = repr(value)
    except Exception as e:
        data['text/plain'] = '<unrepresentable %s: %s>' % (type(value).__name__, e)
    for mime, meth in _REPRS:
        f = getattr(type(value), meth, None)
        if f is None:
            continue
        try:
            v = f(value)
        except Exception:
            continue
        if v is None:
            continue
        if isinstance(v, tuple):
            v = v[0]
        if isinstance(v, bytes):
            v = base64.b64encode(v).decode('ascii')
        data[mime] = v
    return data

def _run(code, count):
    name = '<cell %d>' % count
    tree = ast.parse(code, name, 'exec')
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, 'exec'), _globals)
    if last is not None:
        value = eval(compile(last, name, 'eval'), _globals)
        if value is not None:
            _globals['_'] = value
            sys.stdout.flush()
            _send({'type': 'execute_result', 'data': _bundle(value), 'metadata': {}, 'execution_count': count})

def _error(e):
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    # The traceback starts at the cell: this kernel's own frames are dropped.
    lines = [l for l in tb if 'File "<string>"' not in l]
    _send({'type': 'error', 'ename': type(e).__name__, 'evalue': str(e), 'traceback': lines})

def _sync():
    for name, fd in (('stdout', 1), ('stderr', 2)):
        _synced[name].clear()
        try:
            os.write(fd, _SYNC)
        except OSError:
            _synced[name].set()
    for name in ('stdout', 'stderr'):
        _synced[name].wait(2)

_send({'type': 'started'})
while True:
    try:
        line = _requests.readline()
    except KeyboardInterrupt:
        continue
    if not line:
        break
    try:
        req = json.loads(line)
    except ValueError:
        continue
    _count += 1
    status = 'ok'
    try:
        _run(req.get('code', ''), _count)
    except BaseException as e:
        status = 'error'
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        _error(e)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        _sync()
    except KeyboardInterrupt:
        pass
    _send({'type': 'idle', 'status': status, 'execution_count': _count})
`;

/**
 * How the driver starts ipykernel: as ipykernel_launcher does, except where the sandbox's
 * seccomp filter refuses netlink sockets (FnCall's does). libzmq resolves a TCP bind address
 * as an interface name first (getifaddrs, over netlink) and aborts the process when that fails
 * with EPERM; ipykernel binds one TCP socket, the IOPub pipe that carries output of forked
 * subprocesses, to 127.0.0.1. There that pipe goes over an IPC socket in the kernel's runtime
 * directory instead; everything else is ipykernel's own code. debugpy is kept out (ipykernel
 * runs without its debugger when it cannot import it): nothing in a sandbox attaches a
 * debugger, and its import is about a third of the kernel's start-up.
 */
export const IPYKERNEL_LAUNCHER = String.raw`
import os, socket, sys
sys.modules['debugpy'] = None
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close()
except OSError:
    import zmq
    from ipykernel import iostream
    _pipe = 'ipc://' + os.path.join(os.environ.get('JUPYTER_RUNTIME_DIR', '/tmp'), 'iopub-pipe-%d' % os.getpid())
    def _setup_pipe_in(self):
        self._pipe_uuid = os.urandom(16)
        pipe_in = self.socket.context.socket(zmq.PULL)
        pipe_in.linger = 0
        pipe_in.bind(_pipe)
        self._pipe_in = iostream.ZMQStream(pipe_in, self.io_loop)
        self._pipe_in.on_recv(self._handle_pipe_msg)
    def _setup_pipe_out(self):
        ctx = zmq.Context()
        pipe_out = ctx.socket(zmq.PUSH)
        pipe_out.linger = 3000
        pipe_out.connect(_pipe)
        return ctx, pipe_out
    iostream.IOPubThread._setup_pipe_in = _setup_pipe_in
    iostream.IOPubThread._setup_pipe_out = _setup_pipe_out
from ipykernel.kernelapp import launch_new_instance
launch_new_instance()
`;

export const KERNEL_DRIVER = String.raw`
import json, os, queue, signal, subprocess, sys, tempfile, threading, time

INTERRUPT_GRACE = 3.0
STDLIB_KERNEL = ${JSON.stringify(STDLIB_KERNEL)}
IPYKERNEL_LAUNCHER = ${JSON.stringify(IPYKERNEL_LAUNCHER)}

_interrupt = threading.Event()
signal.signal(signal.SIGINT, lambda *a: _interrupt.set())

def _die_with_parent():
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:
        pass

_RUNTIME = tempfile.mkdtemp(prefix='.warren-kernel-')
_KENV = dict(os.environ)
_KENV.update({'JUPYTER_RUNTIME_DIR': _RUNTIME, 'IPYTHONDIR': os.path.join(_RUNTIME, 'ipython'),
              'MPLCONFIGDIR': os.path.join(_RUNTIME, 'matplotlib'), 'JUPYTER_PLATFORM_DIRS': '1',
              'PYDEVD_DISABLE_FILE_VALIDATION': '1', 'PYTHONUNBUFFERED': '1'})
_KENV.pop('JPY_PARENT_PID', None)
os.environ.update({'PYDEVD_DISABLE_FILE_VALIDATION': '1', 'JUPYTER_PLATFORM_DIRS': '1'})

def _cleanup():
    import shutil
    shutil.rmtree(_RUNTIME, ignore_errors=True)

def _env_code(env):
    return 'import os as _w_os\n_w_os.environ.update(%s)\ndel _w_os' % json.dumps(env)

class Ipykernel:
    backend = 'ipykernel'
    def __init__(self, cwd):
        from jupyter_client.kernelspec import KernelSpecManager
        from jupyter_client.manager import KernelManager
        self.cwd = cwd
        specs = os.path.join(_RUNTIME, 'kernels')
        os.makedirs(os.path.join(specs, 'warren-python3'), exist_ok=True)
        with open(os.path.join(specs, 'warren-python3', 'kernel.json'), 'w') as f:
            json.dump({'argv': [sys.executable, '-c', IPYKERNEL_LAUNCHER, '-f', '{connection_file}'], 'display_name': 'Python 3', 'language': 'python'}, f)
        n = time.monotonic_ns()
        self.km = KernelManager(kernel_name='warren-python3', kernel_spec_manager=KernelSpecManager(kernel_dirs=[specs]), transport='ipc',
                                ip=os.path.join(_RUNTIME, 'kernel-%d' % n), connection_file=os.path.join(_RUNTIME, 'kernel-%d.json' % n))
        log = open(os.path.join(_RUNTIME, 'kernel.log'), 'ab')
        self.km.start_kernel(cwd=cwd, env=_KENV, stdout=subprocess.DEVNULL, stderr=log, preexec_fn=_die_with_parent,
                             extra_arguments=['--HistoryManager.enabled=False', '--IPKernelApp.trio_loop=False'])
        log.close()
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=60)
        self.count = 0
    def alive(self):
        return self.km.is_alive()
    def interrupt(self):
        self.km.interrupt_kernel()
    def silent(self, code):
        mid = self.kc.execute(code, silent=True, store_history=False, allow_stdin=False)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                m = self.kc.get_shell_msg(timeout=0.2)
            except queue.Empty:
                continue
            if m['parent_header'].get('msg_id') == mid:
                return
    def start(self, code):
        self.mid = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=False)
    def next(self, timeout):
        try:
            m = self.kc.get_iopub_msg(timeout=timeout)
        except queue.Empty:
            return None
        if m['parent_header'].get('msg_id') != self.mid:
            return None
        t, c = m['msg_type'], m['content']
        if t == 'stream':
            return {'type': 'stream', 'name': c['name'], 'text': c['text']}
        if t in ('display_data', 'execute_result', 'update_display_data'):
            ev = {'type': 'display_data' if t == 'update_display_data' else t, 'data': c.get('data', {}), 'metadata': c.get('metadata', {})}
            if t == 'execute_result':
                ev['execution_count'] = c.get('execution_count')
            return ev
        if t == 'error':
            return {'type': 'error', 'ename': c.get('ename', ''), 'evalue': c.get('evalue', ''), 'traceback': c.get('traceback', [])}
        if t == 'execute_input':
            self.count = c.get('execution_count') or self.count
        if t == 'status' and c.get('execution_state') == 'idle':
            return {'type': 'idle', 'execution_count': self.count}
        return None
    def close(self):
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        try:
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass

class Stdlib:
    backend = 'stdlib'
    def __init__(self, cwd):
        self.cwd = cwd
        self.proc = subprocess.Popen([sys.executable, '-u', '-c', STDLIB_KERNEL], cwd=cwd, env=_KENV, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        first = self.q.get(timeout=60)
        if first is None or first.get('type') != 'started':
            raise RuntimeError('the stdlib kernel did not start')
    def _read(self):
        for line in self.proc.stdout:
            try:
                self.q.put(json.loads(line))
            except ValueError:
                pass
        self.q.put(None)
    def alive(self):
        return self.proc.poll() is None
    def interrupt(self):
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
        except OSError:
            pass
    def _send(self, code):
        self.proc.stdin.write((json.dumps({'code': code}) + '\n').encode('utf-8'))
        self.proc.stdin.flush()
    def silent(self, code):
        self._send(code)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                ev = self.q.get(timeout=0.2)
            except queue.Empty:
                continue
            if ev is None or ev.get('type') == 'idle':
                return
    def start(self, code):
        self._send(code)
    def next(self, timeout):
        try:
            ev = self.q.get(timeout=timeout)
        except queue.Empty:
            return None
        return {'type': 'idle', 'execution_count': 0, 'dead': True} if ev is None else ev
    def close(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()

_reason = None

def start_kernel(cwd):
    global _reason
    try:
        import ipykernel, jupyter_client  # noqa: F401
    except Exception as e:
        _reason = 'ipykernel/jupyter_client are not installed in this image (%s); the standard-library kernel runs instead' % e
        return Stdlib(cwd)
    return Ipykernel(cwd)

class Driver:
    def __init__(self, cwd):
        self.cwd = cwd
        self.kernel = start_kernel(cwd)

    def restart(self):
        self.kernel.close()
        self.kernel = start_kernel(self.cwd)

    def execute(self, code, emit, timeout=None, env=None):
        k = self.kernel
        _interrupt.clear()
        if env:
            saved = {str(key): os.environ.get(str(key)) for key in env}
            k.silent(_env_code({str(a): str(b) for a, b in env.items()}))
        k.start(code)
        deadline = time.monotonic() + timeout if timeout else None
        interrupted_at = None
        why = None
        status = 'ok'
        count = 0
        while True:
            now = time.monotonic()
            if interrupted_at is None and (_interrupt.is_set() or (deadline is not None and now >= deadline)):
                why = 'interrupted' if _interrupt.is_set() else 'timeout'
                interrupted_at = now
                k.interrupt()
            if interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE:
                emit({'type': 'error', 'ename': 'KernelRestarted', 'evalue': 'the cell did not stop within %ss of being interrupted; the kernel was restarted and its state is lost' % INTERRUPT_GRACE, 'traceback': []})
                self.restart()
                return {'type': 'done', 'status': 'restarted', 'execution_count': 0}
            ev = k.next(0.1)
            if ev is None:
                if not k.alive():
                    emit({'type': 'error', 'ename': 'KernelDied', 'evalue': 'the kernel exited (it is restarted for the next cell; its state is lost)', 'traceback': []})
                    self.restart()
                    return {'type': 'done', 'status': 'restarted', 'execution_count': 0}
                continue
            if ev['type'] == 'idle':
                if ev.get('dead'):
                    continue
                count = ev.get('execution_count') or 0
                break
            if ev['type'] == 'error':
                status = 'error'
                if why == 'timeout' and ev.get('ename') == 'KeyboardInterrupt':
                    ev = dict(ev, ename='TimeoutError', evalue='the cell ran longer than its timeout (%gs) and was interrupted' % timeout)
            emit(ev)
        if env:
            restore = {key: v for key, v in saved.items() if v is not None}
            drop = [key for key, v in saved.items() if v is None]
            k.silent('import os as _w_os\n_w_os.environ.update(%s)\nfor _w_k in %s: _w_os.environ.pop(_w_k, None)\ndel _w_os' % (json.dumps(restore), json.dumps(drop)))
        if why is not None:
            status = why
        return {'type': 'done', 'status': status, 'execution_count': count}

def serve():
    out = os.fdopen(os.dup(1), 'w', buffering=1, encoding='utf-8')
    os.dup2(2, 1)
    lock = threading.Lock()
    def emit(ev):
        with lock:
            out.write(json.dumps(ev) + '\n')
            out.flush()
    d = Driver(os.getcwd())
    emit({'type': 'ready', 'backend': d.kernel.backend, 'reason': _reason})
    while True:
        try:
            line = sys.stdin.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            break
        try:
            req = json.loads(line)
        except ValueError:
            continue
        try:
            if req.get('op') == 'restart':
                d.restart()
                emit({'type': 'done', 'status': 'ok', 'execution_count': 0, 'backend': d.kernel.backend})
            else:
                emit(d.execute(req.get('code', ''), emit, req.get('timeout'), req.get('env')))
        except Exception as e:
            emit({'type': 'error', 'ename': 'DriverError', 'evalue': str(e), 'traceback': []})
            emit({'type': 'done', 'status': 'error', 'execution_count': 0})
    d.kernel.close()
    _cleanup()

def batch(result_path):
    req = json.loads(sys.stdin.read())
    cell_timeout = req.get('cell_timeout') or 0
    total = req.get('total_timeout') or 0
    result = {'status': 'Finished', 'backend': None, 'reason': None, 'cells': []}
    def save():
        with open(result_path + '.tmp', 'w') as f:
            json.dump(result, f)
        os.replace(result_path + '.tmp', result_path)
    d = Driver(os.getcwd())
    result['backend'], result['reason'] = d.kernel.backend, _reason
    started = time.monotonic()
    for code in req['cells']:
        left = None
        if total:
            left = total - (time.monotonic() - started)
            if left <= 0:
                result['status'] = 'TimeLimitExceeded'
                break
        limit = min(x for x in (cell_timeout or None, left) if x is not None) if (cell_timeout or left) else None
        cell = {'stdout': '', 'stderr': '', 'display': [], 'error': []}
        result['cells'].append(cell)
        def emit(ev):
            t = ev['type']
            if t == 'stream':
                cell[ev['name'] if ev['name'] in ('stdout', 'stderr') else 'stdout'] += ev['text']
            elif t in ('display_data', 'execute_result'):
                cell['display'].append(ev['data'])
            elif t == 'error':
                cell['error'].append({'ename': ev['ename'], 'evalue': ev['evalue'], 'traceback': ev['traceback']})
        done = d.execute(code, emit, limit)
        save()
        if done['status'] in ('timeout', 'restarted') and left is not None and limit == left and (not cell_timeout or left < cell_timeout):
            result['status'] = 'TimeLimitExceeded'
            break
    save()
    d.kernel.close()
    _cleanup()

if __name__ == '__main__':
    if len(sys.argv) > 2 and sys.argv[1] == 'batch':
        batch(sys.argv[2])
    else:
        serve()
`;
