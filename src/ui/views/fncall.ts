/** FnCall pools (warm/busy/queued, p50/p99 over time) and a form to run code or a judge against one. */
import { type Metrics, type PoolStats, ApiError, get, post } from '../api';
import type { View } from '../app';
import { field, h, replace, select, table } from '../dom';
import { plot } from '../plot';

interface TestResult {
  index: number;
  verdict: string;
  status: string;
  exitCode: number | null;
  wallMs: number;
  stdout: string;
  stderr: string;
}

const SAMPLE_CODE = 'a, b = map(int, input().split())\nprint(a + b)\n';
const SAMPLE_TESTS = '[{"stdin": "1 2\\n", "expected": "3\\n"}, {"stdin": "40 2\\n", "expected": "42\\n"}]';

export async function renderFncall(root: HTMLElement, view: View): Promise<void> {
  const poolsEl = h('div', { id: 'pools' });
  const plots = h('div', { class: 'plots', id: 'pool-plots' });
  const result = h('div', { class: 'verdict-box', id: 'fn-result' });
  const poolSel = select('pool', []);
  poolSel.id = 'fn-pool';
  const mode = select('mode', [['judge', 'judge (tests + checker)'], ['invoke', 'run once']], 'judge');
  mode.id = 'fn-mode';
  const language = select('language', ['python3', 'bash', 'c', 'cpp'], 'python3');
  language.id = 'fn-language';
  const code = h('textarea', { attrs: { rows: '8', name: 'code', spellcheck: 'false', id: 'fn-code' } });
  code.value = SAMPLE_CODE;
  const tests = h('textarea', { attrs: { rows: '3', name: 'tests', spellcheck: 'false', id: 'fn-tests' } });
  tests.value = SAMPLE_TESTS;
  const stdin = h('textarea', { attrs: { rows: '2', name: 'stdin', spellcheck: 'false', id: 'fn-stdin' } });
  stdin.value = '1 2\n';
  const checker = select('checker', ['exact', 'tokens', 'float(1e-6)'], 'tokens');
  const form = h(
    'form',
    { class: 'create', id: 'fn-form' },
    h('h3', null, 'Run code'),
    h(
      'div',
      { class: 'form-grid' },
      field('Pool', poolSel),
      field('Mode', mode),
      field('Language', language),
      field('Checker', checker, 'judge mode'),
    ),
    field('Code', code),
    field('Tests (JSON: [{stdin, expected}])', tests, 'judge mode'),
    field('Stdin', stdin, 'run-once mode'),
    h('button', { attrs: { type: 'submit' }, id: 'fn-submit' }, 'Run'),
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const submit = form.querySelector('button[type=submit]') as HTMLButtonElement;
    submit.disabled = true;
    replace(result, h('p', { class: 'hint' }, 'running…'));
    try {
      if (mode.value === 'judge') {
        let parsed: unknown;
        try {
          parsed = JSON.parse(tests.value);
        } catch (err) {
          throw new Error(`tests: not JSON (${(err as Error).message})`);
        }
        const r = await post<{ verdict: string; passed: number; total: number; tests: TestResult[]; maxWallMs: number; compile?: { stderr: string } }>(`/v1/functions/${encodeURIComponent(poolSel.value)}/judge`, {
          code: code.value,
          language: language.value,
          tests: parsed,
          checker: checker.value,
        });
        replace(
          result,
          h('div', { class: `verdict verdict-${r.verdict}`, id: 'fn-verdict' }, r.verdict),
          h('p', null, `${r.passed} / ${r.total} passed; slowest ${r.maxWallMs} ms`),
          r.compile?.stderr ? h('pre', { class: 'file-text' }, r.compile.stderr) : null,
          table(
            ['#', 'verdict', 'status', 'exit', 'wall ms', 'stdout', 'stderr'],
            r.tests.map((t) => [String(t.index), t.verdict, t.status, String(t.exitCode ?? '—'), String(t.wallMs), h('pre', null, t.stdout), h('pre', null, t.stderr)]),
          ),
        );
      } else {
        const r = await post<{ status: string; exitCode: number | null; stdout: string; stderr: string; wallMs: number; queueMs: number }>(`/v1/functions/${encodeURIComponent(poolSel.value)}/invoke`, {
          code: code.value,
          language: language.value,
          stdin: stdin.value,
        });
        replace(
          result,
          h('div', { class: `verdict verdict-${r.status === 'ok' && r.exitCode === 0 ? 'AC' : 'RE'}`, id: 'fn-verdict' }, `${r.status} (exit ${r.exitCode ?? '—'})`),
          h('p', null, `wall ${r.wallMs} ms, waited ${r.queueMs} ms for a container`),
          h('h4', null, 'stdout'),
          h('pre', { class: 'file-text' }, r.stdout),
          h('h4', null, 'stderr'),
          h('pre', { class: 'file-text' }, r.stderr),
        );
      }
    } catch (err) {
      replace(result);
      view.error(err);
    } finally {
      submit.disabled = false;
    }
  });
  replace(root, h('h2', null, 'FnCall'), poolsEl, h('h3', null, 'Over time'), plots, form, result);

  let known = '';
  view.every(2000, async () => {
    let pools: PoolStats[];
    try {
      pools = (await get<{ pools: PoolStats[] }>('/v1/functions')).pools;
    } catch (err) {
      if (err instanceof ApiError && err.code === 'NOT_SUPPORTED') {
        replace(poolsEl, h('p', null, `${err.code}: ${err.message}`));
        return;
      }
      throw err;
    }
    const names = pools.map((p) => p.name).join(',');
    if (names !== known) {
      known = names;
      const keep = poolSel.value;
      replace(poolSel, ...pools.map((p) => h('option', { attrs: { value: p.name } }, p.name)));
      if (pools.some((p) => p.name === keep)) poolSel.value = keep;
    }
    replace(
      poolsEl,
      table(
        ['pool', 'image', 'state', 'warm', 'busy', 'starting', 'queued', 'min..max', 'invocations', 'rejected', 'p50 ms', 'p99 ms'],
        pools.map((p) => [p.name, p.image, p.message ? `${p.state}: ${p.message}` : p.state, String(p.warm), String(p.busy), String(p.starting), String(p.queued), `${p.min}..${p.max}`, String(p.invocations), String(p.rejected), p.p50Ms === null ? '—' : String(p.p50Ms), p.p99Ms === null ? '—' : String(p.p99Ms)]),
        { empty: 'no pools on this node (create them with POST /v1/functions or fncall.json)' },
      ),
    );
    const m = await get<Metrics>('/v1/ui/metrics');
    replace(
      plots,
      ...Object.entries(m.pools).flatMap(([name, pts]) => [
        plot(
          [
            { name: 'p50', cls: 's1', points: pts.map((p) => ({ t: p.t, v: p.p50Ms })) },
            { name: 'p99', cls: 's2', points: pts.map((p) => ({ t: p.t, v: p.p99Ms })) },
          ],
          { title: `${name}: latency (ms)`, empty: 'no invocations yet' },
        ),
        plot(
          [
            { name: 'warm', cls: 's3', points: pts.map((p) => ({ t: p.t, v: p.warm })) },
            { name: 'busy', cls: 's1', points: pts.map((p) => ({ t: p.t, v: p.busy })) },
            { name: 'queued', cls: 's2', points: pts.map((p) => ({ t: p.t, v: p.queued })) },
          ],
          { title: `${name}: containers and queue`, format: (v) => v.toFixed(0), step: true },
        ),
      ]),
    );
  });
}
