/** The live list of sandboxes (polled), its filters, the create form and the row actions. */
import { type Features, type Sandbox, type Usage, ApiError, get, post, request } from '../api';
import { type View, go, link, setQuery } from '../app';
import { age, button, bytes, field, h, input, replace, select, table } from '../dom';

export function stateBadge(state: string): HTMLElement {
  return h('span', { class: `badge state-${state.replace(/[^a-z]/g, '')}` }, state);
}

export function labelChips(labels: Record<string, string>): HTMLElement {
  return h('span', { class: 'labels' }, ...Object.entries(labels).map(([k, v]) => h('span', { class: 'chip' }, `${k}=${v}`)));
}

export function services(s: Sandbox): string {
  if (!s.network) return 'loopback only';
  const on = Object.entries(s.network.services)
    .filter(([, v]) => v)
    .map(([k]) => k);
  return on.length === 0 ? 'none allowed' : on.join(', ');
}

/** A button that asks for a second click before doing something that cannot be undone. */
export function confirmButton(label: string, fn: () => Promise<unknown>, report: (e: unknown) => void): HTMLButtonElement {
  let armed = false;
  const b = h('button', { class: 'danger', attrs: { type: 'button' } }, label);
  b.addEventListener('click', async () => {
    if (!armed) {
      armed = true;
      b.textContent = `Confirm ${label.toLowerCase()}`;
      setTimeout(() => {
        armed = false;
        b.textContent = label;
      }, 4000);
      return;
    }
    b.disabled = true;
    try {
      await fn();
    } catch (err) {
      report(err);
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

export function lifecycleButtons(s: Sandbox, view: View, after: () => void): HTMLElement {
  const report = (e: unknown) => view.error(e);
  const wrap = h('span', { class: 'actions' });
  if (s.state === 'running') {
    wrap.appendChild(
      button(
        'Pause',
        async () => {
          view.notice(describePause(await post(`/v1/sandboxes/${s.id}/pause`)));
          after();
        },
        { report },
      ),
    );
  }
  if (s.state === 'paused' || s.state === 'hibernated') {
    wrap.appendChild(
      button(
        'Resume',
        async () => {
          await post(`/v1/sandboxes/${s.id}/resume`);
          after();
        },
        { report },
      ),
    );
  }
  wrap.appendChild(
    confirmButton(
      'Delete',
      async () => {
        await request('DELETE', `/v1/sandboxes/${s.id}`);
        view.notice(`deleted ${s.id}`);
        after();
      },
      report,
    ),
  );
  return wrap;
}

function describePause(r: unknown): string {
  const p = r as { id: string; releasedBytes: number; reclaim: string; durationMs: number; changed: boolean };
  return p.changed ? `paused ${p.id}: released ${bytes(p.releasedBytes)} (${p.reclaim}) in ${p.durationMs} ms` : `${p.id} was already paused`;
}

function parsePairs(text: string, what: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const raw of text.split(/[\n,]/)) {
    const line = raw.trim();
    if (line === '') continue;
    const i = line.indexOf('=');
    if (i <= 0) throw new Error(`${what}: "${line}" is not key=value`);
    out[line.slice(0, i).trim()] = line.slice(i + 1).trim();
  }
  return out;
}

function numberOrUndefined(v: string, name: string): number | undefined {
  if (v.trim() === '') return undefined;
  const n = Number(v);
  if (!Number.isFinite(n)) throw new Error(`${name}: not a number`);
  return n;
}

function createForm(view: View, features: Features | null, images: string[]): HTMLElement {
  const backends = features ? Object.entries(features.backends).filter(([, b]) => b.available).map(([n]) => n) : ['container'];
  const f = {
    backend: select('backend', backends.length ? backends : ['container'], 'container'),
    image: input('image', 'default', { list: 'image-list', id: 'create-image' }),
    cpu: input('cpu', '1', { inputmode: 'decimal' }),
    memoryMb: input('memoryMb', '512', { inputmode: 'numeric' }),
    pids: input('pids', '1024', { inputmode: 'numeric' }),
    diskMb: input('diskMb', '', { inputmode: 'numeric', placeholder: 'profile default' }),
    labels: h('textarea', { attrs: { name: 'labels', rows: '2', placeholder: 'team=rl\nrun=42', id: 'create-labels' } }),
    network: input('network', '', { placeholder: 'pypi, npm (empty: account default)', id: 'create-network' }),
    ttlSeconds: input('ttlSeconds', '', { inputmode: 'numeric', placeholder: 'none', id: 'create-ttl' }),
    idleSeconds: input('idleSeconds', '', { inputmode: 'numeric', placeholder: 'none' }),
    onIdle: select('onIdle', ['pause', 'hibernate', 'stop', 'delete', 'reclaim'], 'pause'),
  };
  const list = h('datalist', { id: 'image-list' }, ...images.map((i) => h('option', { attrs: { value: i } })));
  const result = h('div', { class: 'form-result' });
  const form = h(
    'form',
    { class: 'create', id: 'create-form' },
    h('h3', null, 'Create a sandbox'),
    h(
      'div',
      { class: 'form-grid' },
      field('Backend', f.backend),
      field('Image / environment', f.image),
      list,
      field('CPU (cores)', f.cpu),
      field('Memory (MiB)', f.memoryMb),
      field('Pids', f.pids),
      field('Disk (MiB)', f.diskMb),
      field('Labels', f.labels, 'key=value, one a line'),
      field('Network services', f.network, 'names from the node policy; "-" = a namespace with nothing allowed'),
      field('Lifetime: TTL (s)', f.ttlSeconds),
      field('Idle after (s)', f.idleSeconds),
      field('On idle', f.onIdle),
    ),
    h('button', { attrs: { type: 'submit' }, id: 'create-submit' }, 'Create'),
    result,
  );
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    replace(result);
    const submit = form.querySelector('button[type=submit]') as HTMLButtonElement;
    submit.disabled = true;
    try {
      const body: Record<string, unknown> = { backend: f.backend.value, image: f.image.value.trim() || 'default' };
      for (const k of ['cpu', 'memoryMb', 'pids', 'diskMb', 'ttlSeconds', 'idleSeconds'] as const) {
        const n = numberOrUndefined(f[k].value, k);
        if (n !== undefined) body[k] = n;
      }
      if (body.idleSeconds !== undefined) body.onIdle = f.onIdle.value;
      const labels = parsePairs(f.labels.value, 'labels');
      if (Object.keys(labels).length) body.labels = labels;
      const net = f.network.value.trim();
      if (net === '-') body.network = {};
      else if (net !== '') body.network = Object.fromEntries(net.split(/[\s,]+/).filter(Boolean).map((s) => [s, true]));
      const s = await post<Sandbox>('/v1/sandboxes', body);
      go(`/sandboxes/${s.id}`);
    } catch (err) {
      view.error(err);
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

export async function renderSandboxes(root: HTMLElement, view: View): Promise<void> {
  const admin = view.account.role === 'admin';
  const labelFilter = input('label', view.query.get('label') ?? '', { placeholder: 'key=value', id: 'filter-label' });
  const stateFilter = select('state', [['', 'any state'], 'running', 'paused', 'hibernated', 'stopped', 'failed', 'creating'], view.query.get('state') ?? '');
  stateFilter.id = 'filter-state';
  const ownerFilter = admin ? input('owner', view.query.get('owner') ?? '', { placeholder: 'account id', id: 'filter-owner' }) : null;
  const listEl = h('div', { id: 'sandbox-list' });
  const filters = h(
    'div',
    { class: 'filters' },
    field('Label', labelFilter),
    field('State', stateFilter),
    ownerFilter ? field('Owner', ownerFilter) : h('span', { class: 'hint' }, `showing the sandboxes of ${view.account.name}`),
  );
  let features: Features | null = null;
  let images: string[] = [];
  try {
    features = await get<Features>('/v1/features');
    const [imgs, envs] = await Promise.all([
      get<{ images: { name: string }[] }>('/v1/images'),
      get<{ environments: { name: string }[] }>('/v1/environments').catch(() => ({ environments: [] })),
    ]);
    images = [...new Set([...imgs.images.map((i) => i.name), ...envs.environments.map((e) => e.name)])];
  } catch (err) {
    if (!(err instanceof ApiError)) throw err;
  }
  const form = createForm(view, features, images);
  const toggle = h('details', { class: 'create-box', id: 'create-box' }, h('summary', null, 'Create a sandbox'), form);
  if (view.query.get('create') === '1') toggle.open = true;
  replace(root, h('h2', null, 'Sandboxes'), toggle, filters, listEl);

  let refresh = async () => undefined as void;
  const onFilter = () => {
    const q: Record<string, string> = {};
    if (labelFilter.value.trim()) q.label = labelFilter.value.trim();
    if (stateFilter.value) q.state = stateFilter.value;
    if (ownerFilter?.value.trim()) q.owner = ownerFilter.value.trim();
    setQuery(q);
    void refresh();
  };
  labelFilter.addEventListener('change', onFilter);
  stateFilter.addEventListener('change', onFilter);
  ownerFilter?.addEventListener('change', onFilter);

  refresh = async () => {
    const query: Record<string, string | string[]> = {};
    const labels = labelFilter.value
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
    if (labels.length) query.label = labels;
    if (ownerFilter?.value.trim()) query.owner = ownerFilter.value.trim();
    const [list, usage] = await Promise.all([get<{ sandboxes: Sandbox[] }>('/v1/sandboxes', query), get<{ sandboxes: Record<string, Usage> }>('/v1/ui/usage')]);
    const rows = list.sandboxes
      .filter((s) => !stateFilter.value || s.state === stateFilter.value)
      .sort((a, b) => (a.createdAt < b.createdAt ? 1 : -1))
      .map((s) => {
        const u = usage.sandboxes[s.id];
        return [
          link(`/sandboxes/${s.id}`, s.id),
          stateBadge(s.state),
          s.backend,
          s.image,
          labelChips(s.labels),
          s.owner,
          age(s.createdAt),
          u?.cpuPercent === null || u === undefined ? '—' : `${u.cpuPercent}%`,
          u ? `${bytes(u.memoryBytes)} / ${s.limits.memoryMb} MiB` : '—',
          services(s),
          lifecycleButtons(s, view, () => void refresh()),
        ];
      });
    replace(listEl, table(['id', 'state', 'backend', 'image', 'labels', 'owner', 'age', 'cpu', 'memory', 'network', ''], rows, { empty: 'no sandboxes', class: 'grid sandboxes' }));
  };
  view.every(2000, refresh);
}
