/**
 * The Python kernel of the code interpreter, run inside the sandbox with
 * python3 and nothing else: one process per context, keeping its globals
 * between executions. Requests arrive as JSON lines on stdin
 * (`{"code", "env"}`); answers go out as JSON lines on a private copy of
 * stdout, in @e2b/code-interpreter's message shapes (`stdout`, `stderr`,
 * `result` for the value of a last bare expression, `error` with
 * name/value/traceback, `number_of_executions`, `end_of_execution`).
 *
 * File descriptors 1 and 2 are pipes read by threads, so output of child
 * processes and C code shows up as stdout/stderr too; a sync marker through
 * each pipe keeps it ahead of `end_of_execution`. SIGINT (sent when a client
 * gives up on an execution) interrupts the running cell only.
 */
export const KERNEL_SOURCE = String.raw`
import ast, json, os, sys, threading, traceback

_proto = os.fdopen(os.dup(1), 'w', buffering=1, encoding='utf-8', errors='replace')
_lock = threading.Lock()
_SYNC = b'\x00\x1ee2b-sync\x1e\x00'

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
            _send({'type': self.name, 'text': head + '\n'})
        return len(text)
    def flush(self):
        if self.buf:
            _send({'type': self.name, 'text': self.buf})
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
                _send({'type': name, 'text': pending[:i].decode('utf-8', 'replace')})
            pending = pending[i + len(_SYNC):]
            _synced[name].set()
        keep = len(_SYNC) - 1
        if len(pending) > keep:
            cut = len(pending) - keep
            while cut > 0 and (pending[cut] & 0xC0) == 0x80:
                cut -= 1
            if cut > 0:
                _send({'type': name, 'text': pending[:cut].decode('utf-8', 'replace')})
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

def _run(code):
    tree = ast.parse(code, '<cell>', 'exec')
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, '<cell>', 'exec'), _globals)
    if last is not None:
        value = eval(compile(last, '<cell>', 'eval'), _globals)
        if value is not None:
            _globals['_'] = value
            sys.stdout.flush()
            try:
                text = repr(value)
            except Exception as e:
                text = '<unrepresentable %s: %s>' % (type(value).__name__, e)
            _send({'type': 'result', 'text': text, 'is_main_result': True})

def _error(e):
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    # Drop this kernel's own frames: the traceback starts at the cell.
    lines = [l for l in tb if 'File "<string>"' not in l]
    _send({'type': 'error', 'name': type(e).__name__, 'value': str(e), 'traceback': ''.join(lines)})

def _sync():
    for name, fd in (('stdout', 1), ('stderr', 2)):
        _synced[name].clear()
        try:
            os.write(fd, _SYNC)
        except OSError:
            _synced[name].set()
    for name in ('stdout', 'stderr'):
        _synced[name].wait(2)

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
    env = req.get('env') or {}
    saved = {k: os.environ.get(k) for k in env}
    try:
        os.environ.update({str(k): str(v) for k, v in env.items()})
        _run(req.get('code', ''))
    except BaseException as e:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        _error(e)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        _sync()
    except KeyboardInterrupt:
        pass
    _send({'type': 'number_of_executions', 'execution_count': _count})
    _send({'type': 'end_of_execution'})
`;
