/**
 * The kernel behind POST /run_jupyter: a stateful Python kernel written with the
 * standard library only, run as one FnCall invocation (python3) that executes
 * the request's cells in order in one namespace, the way a Jupyter kernel does.
 *
 * Why not ipykernel: it needs ZeroMQ, tornado and jupyter-client around a
 * kernel process, a second process talking to it, and ~1 s of start-up, for
 * what one invocation needs: cells sharing state, each with its own stdout,
 * stderr, displayed value (the last expression, like IPython's Out[n]) and
 * error (ename, evalue, traceback). The kernel runs with the same isolation and
 * limits as any invocation, and the container is reset after it.
 *
 * The driver reads {cells, cell_timeout} as JSON on stdin and writes the
 * results as JSON to RESULT_PATH (in the invocation's scratch /tmp), so the
 * program's own prints never mix with them. A cell that raises stops the run
 * (later cells are not run), as "run all" does in Jupyter.
 */
export const RESULT_PATH = '/tmp/.warren-kernel-result.json';
export const DRIVER_PATH = '/tmp/.warren-kernel.py';

export const KERNEL_DRIVER = `
import ast, io, json, os, signal, sys, traceback
_req = json.loads(sys.stdin.read())
_ns = {'__name__': '__main__', '__builtins__': __builtins__}
_results = []
def _alarm(signum, frame):
    raise TimeoutError('the cell ran longer than cell_timeout (%ss)' % _limit)
signal.signal(signal.SIGALRM, _alarm)
_limit = _req.get('cell_timeout') or 0
_real_out, _real_err = sys.stdout, sys.stderr
def _save():
    with open(${JSON.stringify(RESULT_PATH)}, 'w') as f:
        json.dump(_results, f)
for _n, _src in enumerate(_req['cells']):
    _out, _err = io.StringIO(), io.StringIO()
    _cell = {'stdout': '', 'stderr': '', 'display': [], 'error': []}
    _results.append(_cell)
    sys.stdout, sys.stderr = _out, _err
    try:
        if _limit:
            signal.setitimer(signal.ITIMER_REAL, _limit)
        _tree = ast.parse(_src, filename='<cell %d>' % (_n + 1), mode='exec')
        _last = None
        if _tree.body and isinstance(_tree.body[-1], ast.Expr):
            _last = ast.Expression(_tree.body.pop().value)
        exec(compile(_tree, '<cell %d>' % (_n + 1), 'exec'), _ns)
        if _last is not None:
            _v = eval(compile(_last, '<cell %d>' % (_n + 1), 'eval'), _ns)
            if _v is not None:
                _ns['_'] = _v
                _cell['display'].append({'text/plain': repr(_v)})
    except BaseException as _e:
        _tb = traceback.format_exception(type(_e), _e, _e.__traceback__)
        _cell['error'].append({'ename': type(_e).__name__, 'evalue': str(_e), 'traceback': _tb})
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.stdout, sys.stderr = _real_out, _real_err
        _cell['stdout'], _cell['stderr'] = _out.getvalue(), _err.getvalue()
        _save()
    if _cell['error']:
        break
`;
