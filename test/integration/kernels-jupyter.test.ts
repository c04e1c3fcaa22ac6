/**
 * POST /run_jupyter over real HTTP against a real ipykernel (the judge python
 * toolkit carries python3-ipykernel and python3-jupyter-client): state across
 * the cells of one request, execute_result and display_data MIME bundles (a
 * matplotlib PNG), an error cell with its traceback that does not stop later
 * cells, a cell_timeout that interrupts the cell and keeps the kernel's state,
 * total_timeout, and no kernel process left in the pool's containers.
 */
import test from 'ava';
import { type FnFixture, integrationSkipReason, openFnFixture, rawRequest } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
let f: FnFixture;
const maybe = testUnless(skip).serial;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  f.shim.functions.updateConfig({ runCodePool: 'jup' });
  await f.pool({ name: 'jup', min: 1, max: 2, limits: { memoryMb: 1024, maxTimeoutMs: 180_000 } });
});

test.after.always(async () => {
  if (f) await f.close();
});

async function jupyter(body: Record<string, unknown>) {
  const r = await rawRequest(f.url, { method: 'POST', path: '/run_jupyter', token: f.adminToken, headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  if (r.status !== 200) throw new Error(`run_jupyter answered ${r.status}: ${JSON.stringify(r.json)}`);
  return r.json;
}

const stripAnsi = (s: string) => s.replace(/\x1b\[[0-9;]*m/g, '');

maybe('state across cells, execute_result and display_data bundles, an error cell with traceback; later cells still run', async (t) => {
  const r = await jupyter({
    cells: [
      'x = 20\nprint("set")\nimport sys; print("warn", file=sys.stderr)',
      'x += 1\nx * 2',
      // Only IPython has get_ipython(): the stdlib fallback would fail this cell.
      'from IPython.display import display, HTML\ndisplay(HTML("<b>bold</b>"))\ntype(get_ipython()).__name__',
      'def f():\n    return 1 / 0\nf()',
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()',
      'x',
    ],
    cell_timeout: 60,
    total_timeout: 120,
    kernel: 'python3',
    memory_limit_MB: 1024,
    unknown_field: 'ignored as SandboxFusion does',
  });
  t.is(r.status, 'Success', JSON.stringify(r).slice(0, 2000));
  t.deepEqual(Object.keys(r).sort(), ['cells', 'driver', 'executor_pod_name', 'files', 'message', 'status']);
  t.is(r.cells.length, 6);
  for (const c of r.cells) t.deepEqual(Object.keys(c).sort(), ['display', 'error', 'stderr', 'stdout']);
  t.is(r.cells[0].stdout, 'set\n');
  t.is(r.cells[0].stderr, 'warn\n');
  t.deepEqual(r.cells[1].display, [{ 'text/plain': '42' }]);
  t.is(r.cells[2].display[0]['text/html'], '<b>bold</b>');
  t.is(r.cells[2].display[1]['text/plain'], "'ZMQInteractiveShell'");
  const err = r.cells[3].error;
  t.is(err.length, 1);
  t.is(err[0].ename, 'ZeroDivisionError');
  t.is(err[0].evalue, 'division by zero');
  const tb = stripAnsi(err[0].traceback.join('\n'));
  t.regex(tb, /return 1 \/ 0/);
  t.regex(tb, /ZeroDivisionError/);
  const png = r.cells[4].display.find((d: Record<string, string>) => d['image/png'] !== undefined);
  t.truthy(png, JSON.stringify(r.cells[4]).slice(0, 500));
  t.deepEqual([...Buffer.from(png['image/png'], 'base64').subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  t.deepEqual(r.cells[5].display, [{ 'text/plain': '21' }], 'the error did not lose the state');
  t.is(r.driver.status, 'Finished');
});

maybe('cell_timeout interrupts the cell and the kernel keeps its state; total_timeout stops the run (Failed)', async (t) => {
  const r = await jupyter({ cells: ['y = 7', 'import time\nwhile True: time.sleep(0.05)', 'y * 6'], cell_timeout: 1 });
  t.is(r.status, 'Success', JSON.stringify(r).slice(0, 2000));
  t.is(r.cells[1].error[0].ename, 'TimeoutError');
  t.regex(stripAnsi(r.cells[1].error[0].traceback.join('\n')), /KeyboardInterrupt/);
  t.deepEqual(r.cells[2].display, [{ 'text/plain': '42' }]);
  const total = await jupyter({ cells: ['import time\ntime.sleep(60)', 'print("never")'], total_timeout: 1 });
  t.is(total.status, 'Failed');
  t.regex(total.message, /total_timeout/);
  // The first cell is cut off (by the driver, or by the invocation's wall limit when the kernel's
  // start took the allowance on a loaded machine); the second never runs.
  t.true(total.cells.length <= 1);
  t.false(JSON.stringify(total.cells).includes('never'));
});

maybe('nothing of a kernel is left running in the pool afterwards', async (t) => {
  await jupyter({ cells: ['import subprocess\nsubprocess.Popen(["sleep", "300"])\n1'] });
  // Every warm container of the pool: no kernel, driver or child of one survives the reset.
  for (let i = 0; i < 2; i++) {
    const r = await f.shim.functions.invoke('jup', 'admin', {
      cmd: ['sh', '-c', 'for p in /proc/[0-9]*; do tr "\\0" " " < $p/cmdline 2>/dev/null; echo; done'],
      files: [],
      stdin: Buffer.alloc(0),
      env: {},
      fetchFiles: [],
    });
    t.is(r.status, 'ok');
    t.notRegex(r.stdout, /ipykernel|warren-kernel|sleep 300/);
  }
});
