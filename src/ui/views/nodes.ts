/**
 * Nodes and jobs. A single `warren up` is one node with the gateway embedded;
 * there is no cluster API yet, so the view asks for one and, when the gateway
 * has none, says so and shows the one node it is.
 */
import { type Features, ApiError, get } from '../api';
import type { View } from '../app';
import { duration, h, kv, replace, table } from '../dom';

async function probe(path: string): Promise<{ ok: true; body: unknown } | { ok: false; err: ApiError }> {
  try {
    return { ok: true, body: await get(path) };
  } catch (err) {
    if (err instanceof ApiError && (err.code === 'NOT_FOUND' || err.code === 'NOT_SUPPORTED')) return { ok: false, err };
    throw err;
  }
}

export async function renderNodes(root: HTMLElement, view: View): Promise<void> {
  const nodes = h('section', { class: 'card wide', id: 'nodes' });
  const jobs = h('section', { class: 'card wide', id: 'jobs' });
  replace(root, h('h2', null, 'Nodes & jobs'), nodes, jobs);
  view.every(5000, async () => {
    const [n, j, health] = await Promise.all([probe('/v1/nodes'), probe('/v1/jobs'), get<{ node: string; version: string; uptimeS: number }>('/v1/health')]);
    let features: Features | null = null;
    try {
      features = await get<Features>('/v1/features');
    } catch {
      /* shown without */
    }
    if (n.ok) {
      const list = (n.body as { nodes?: { id: string; state?: string; load?: number }[] }).nodes ?? [];
      replace(nodes, h('h3', null, 'Nodes'), table(['node', 'state', 'load'], list.map((x) => [x.id, x.state ?? '—', x.load === undefined ? '—' : String(x.load)])));
    } else {
      replace(
        nodes,
        h('h3', null, 'Nodes'),
        h('p', { class: 'absent', id: 'nodes-absent' }, 'Single node (embedded): cluster not configured. This gateway runs its node in-process and has no node registry to list.'),
        kv([
          ['this node', health.node],
          ['version', health.version],
          ['uptime', duration(health.uptimeS)],
          ['kernel', features?.kernel ?? '—'],
          ['enforcer', features?.enforcer ?? '—'],
        ]),
        h('p', { class: 'hint' }, `GET /v1/nodes answered ${n.err.code}: ${n.err.message}`),
      );
    }
    if (j.ok) {
      const list = (j.body as { jobs?: { id: string; state?: string; done?: number; total?: number }[] }).jobs ?? [];
      replace(jobs, h('h3', null, 'Jobs'), table(['job', 'state', 'progress'], list.map((x) => [x.id, x.state ?? '—', x.total ? `${x.done ?? 0} / ${x.total}` : '—'])));
    } else {
      replace(
        jobs,
        h('h3', null, 'Jobs'),
        h('p', { class: 'absent', id: 'jobs-absent' }, 'No job scheduler: cluster not configured. Batch work on one node goes through label selectors (pause or resume every sandbox with a label) and FnCall batches.'),
        h('p', { class: 'hint' }, `GET /v1/jobs answered ${j.err.code}: ${j.err.message}`),
      );
    }
  });
}
