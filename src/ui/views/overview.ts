/** Node health and the numbers over time: live sandboxes, create latency, memory released by pauses. */
import { type Features, type Metrics, type Sandbox, get } from '../api';
import type { View } from '../app';
import { bytes, duration, h, kv, replace } from '../dom';
import { plot } from '../plot';

export async function renderOverview(root: HTMLElement, view: View): Promise<void> {
  const head = h('div', { class: 'cards' });
  const plots = h('div', { class: 'plots', id: 'overview-plots' });
  replace(root, h('h2', null, 'Overview'), head, h('h3', null, 'Over time'), plots);
  const health = await get<{ node: string; version: string; uptimeS: number }>('/v1/health');
  let features: Features | null = null;
  try {
    features = await get<Features>('/v1/features');
  } catch {
    /* shown as unknown */
  }
  view.every(3000, async () => {
    const [sandboxes, metrics] = await Promise.all([get<{ sandboxes: Sandbox[] }>('/v1/sandboxes'), get<Metrics>('/v1/ui/metrics')]);
    const byState: Record<string, number> = {};
    for (const s of sandboxes.sandboxes) byState[s.state] = (byState[s.state] ?? 0) + 1;
    const backends = features ? Object.entries(features.backends).map(([b, st]) => `${b}: ${st.available ? 'yes' : `no (${st.reason ?? 'unavailable'})`}`) : [];
    replace(
      head,
      h(
        'section',
        { class: 'card' },
        h('h3', null, 'Node'),
        kv([
          ['node', health.node],
          ['version', health.version],
          ['uptime', duration(health.uptimeS + Math.round((Date.now() - metrics.now) / 1000))],
          ['kernel', features?.kernel ?? '—'],
          ['enforcer', features?.enforcer ?? '—'],
        ]),
      ),
      h(
        'section',
        { class: 'card' },
        h('h3', null, view.account.role === 'admin' ? 'Sandboxes (all accounts)' : 'Your sandboxes'),
        kv(Object.keys(byState).length === 0 ? [['total', '0']] : Object.entries(byState).map(([k, v]) => [k, String(v)])),
      ),
      h('section', { class: 'card' }, h('h3', null, 'Backends'), h('ul', null, ...backends.map((b) => h('li', null, b)))),
    );
    const nodeOnly = 'node-wide figure: shown to admins';
    replace(
      plots,
      plot([{ name: 'live', cls: 's1', points: metrics.live }], { title: metrics.scope === 'node' ? 'Live sandboxes (node)' : 'Your live sandboxes', format: (v) => v.toFixed(0), step: true }),
      metrics.createMs
        ? plot([{ name: 'create', cls: 's2', points: metrics.createMs }], { title: 'Create latency (ms, each create)', dots: true, empty: 'no creates since the node started' })
        : plot([], { title: 'Create latency', empty: nodeOnly }),
      metrics.pauseReleasedBytes
        ? plot([{ name: 'released', cls: 's3', points: metrics.pauseReleasedBytes }], { title: 'Memory released by pauses', dots: true, format: (v) => bytes(v), empty: 'no pauses since the node started' })
        : plot([], { title: 'Memory released by pauses', empty: nodeOnly }),
    );
  });
}
