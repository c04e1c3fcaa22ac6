/** One sandbox: limits, lifecycle clocks, live resource use, network and recent denials, sessions, pack. */
import { type Denial, type Sandbox, type Usage, ApiError, get, post } from '../api';
import { type View, go, link } from '../app';
import { button, bytes, field, h, input, kv, replace, table, until, age } from '../dom';
import { plot } from '../plot';
import { labelChips, lifecycleButtons, services, stateBadge } from './sandboxes';

export function sandboxTabs(id: string, active: 'overview' | 'terminal' | 'files' | 'screen'): HTMLElement {
  const tab = (name: typeof active, path: string, label: string) => h('a', { class: name === active ? 'active' : '', attrs: { href: `#${path}` } }, label);
  return h('div', { class: 'tabs' }, tab('overview', `/sandboxes/${id}`, 'Overview'), tab('terminal', `/sandboxes/${id}/terminal`, 'Terminal'), tab('files', `/sandboxes/${id}/files`, 'Files'), tab('screen', `/sandboxes/${id}/screen`, 'Screen'));
}

interface NetworkInfo {
  services: Record<string, boolean>;
  address: string;
  resolver: string;
  rules: number;
  bindings: { service: string; name: string; address: string; expiresInS: number }[];
  denials: Denial[];
}

export async function renderSandbox(root: HTMLElement, view: View): Promise<void> {
  const id = view.params[0]!;
  const head = h('div', { class: 'detail-head' });
  const info = h('div', { class: 'cards' });
  const usage = h('div', { class: 'plots', id: 'usage-plots' });
  const net = h('section', { class: 'card wide', id: 'sandbox-network' });
  const sessions = h('section', { class: 'card wide', id: 'sandbox-sessions' });
  const pack = h('section', { class: 'card wide' });
  replace(root, head, sandboxTabs(id, 'overview'), info, h('h3', null, 'Resource use'), usage, net, sessions, pack);

  if (view.account.role !== 'runtime') {
    const name = input('name', '', { placeholder: 'env-name:v1', id: 'pack-name' });
    const scrub = input('scrub', '', { placeholder: '/answers, /srv/**/*.key' });
    const publish = h('input', { attrs: { type: 'checkbox', name: 'publish' } });
    replace(
      pack,
      h('h3', null, 'Pack into an environment'),
      h(
        'div',
        { class: 'filters' },
        field('Name', name),
        field('Scrub', scrub),
        field('Publish', publish),
        button(
          'Pack',
          async () => {
            const body: Record<string, unknown> = { name: name.value.trim() };
            const paths = scrub.value.split(',').map((s) => s.trim()).filter(Boolean);
            if (paths.length) body.scrub = paths;
            if (publish.checked) body.publish = true;
            const r = await post<{ environment: { name: string }; diffBytes: number; frozenMs: number }>(`/v1/sandboxes/${id}/pack`, body);
            view.notice(`packed into ${r.environment.name}: ${bytes(r.diffBytes)} of changes, frozen ${r.frozenMs} ms`);
          },
          { report: (e) => view.error(e) },
        ),
      ),
    );
  } else {
    replace(pack, h('h3', null, 'Pack'), h('p', { class: 'hint' }, 'Packing needs the builder or admin role.'));
  }

  view.every(2000, async () => {
    let s: Sandbox;
    try {
      s = await get<Sandbox>(`/v1/sandboxes/${id}`);
    } catch (err) {
      if (err instanceof ApiError && err.code === 'SANDBOX_NOT_FOUND') {
        replace(root, h('h2', null, `Sandbox ${id}`), h('p', { class: 'error' }, `${err.code}: ${err.message}`), link('/sandboxes', 'back to the list'));
        return;
      }
      throw err;
    }
    const lc = s.lifecycle;
    replace(head, h('h2', null, 'Sandbox ', h('code', null, s.id), ' ', stateBadge(s.state)), lifecycleButtons(s, view, () => (s.state === 'running' || s.state === 'paused' ? undefined : go('/sandboxes'))));
    replace(
      info,
      h(
        'section',
        { class: 'card' },
        h('h3', null, 'Sandbox'),
        kv([
          ['backend', s.backend],
          ['image', s.image],
          ['owner', s.owner],
          ['node', s.node],
          ['created', `${s.createdAt} (${age(s.createdAt)} ago)`],
          ['labels', labelChips(s.labels)],
          ['priority', s.priority],
          ...(s.pid !== undefined ? ([['host pid', String(s.pid)]] as [string, string][]) : []),
        ]),
      ),
      h(
        'section',
        { class: 'card' },
        h('h3', null, 'Limits'),
        kv([
          ['cpu', `${s.limits.cpu} cores`],
          ['memory', `${s.limits.memoryMb} MiB`],
          ['pids', String(s.limits.pids)],
          ['disk', s.limits.diskMb === null ? 'profile default' : `${s.limits.diskMb} MiB`],
        ]),
      ),
      h(
        'section',
        { class: 'card', id: 'lifecycle' },
        h('h3', null, 'Lifecycle'),
        lc
          ? kv([
              ['expires', lc.expiresAt ? `${until(lc.expiresAt)}` : 'never (no ttl)'],
              ['last activity', `${age(lc.lastActivityAt)} ago`],
              ['idle action', lc.idleAt ? `${lc.onIdle} ${until(lc.idleAt)}` : 'none'],
              ['paused at', lc.pausedAt ?? '—'],
              ['stop reason', lc.stopReason ?? '—'],
              ['idle reclaim', lc.coldReclaim ? `${bytes(lc.coldReclaim.releasedBytes)} of ${bytes(lc.coldReclaim.coldBytes)} cold given back ${age(lc.coldReclaim.at)} ago` : '—'],
            ])
          : h('p', null, 'no lifecycle clocks'),
      ),
    );
    const u = await get<{ samples: Usage[]; limits: Sandbox['limits'] }>(`/v1/ui/sandboxes/${id}/usage`);
    replace(
      usage,
      plot([{ name: 'cpu %', cls: 's1', points: u.samples.map((p) => ({ t: p.t, v: p.cpuPercent })) }], { title: `CPU (% of one core; limit ${s.limits.cpu * 100}%)` }),
      plot(
        [
          { name: 'current', cls: 's2', points: u.samples.map((p) => ({ t: p.t, v: p.memoryBytes })) },
          { name: 'peak', cls: 's4', points: u.samples.map((p) => ({ t: p.t, v: p.memoryPeakBytes })) },
        ],
        { title: `Memory (limit ${s.limits.memoryMb} MiB)`, format: (v) => bytes(v) },
      ),
      plot([{ name: 'pids', cls: 's3', points: u.samples.map((p) => ({ t: p.t, v: p.pids })) }], { title: `Processes (limit ${s.limits.pids})`, format: (v) => v.toFixed(0) }),
    );
    if (s.network) {
      let n: NetworkInfo | null = null;
      try {
        n = await get<NetworkInfo>(`/v1/sandboxes/${id}/network`);
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
      }
      replace(
        net,
        h('h3', null, 'Network'),
        kv([
          ['services', services(s)],
          ['address', s.network.address],
          ['resolver', n?.resolver ?? '—'],
          ['raw CIDR rules', String(n?.rules ?? '—')],
        ]),
        h('h4', null, 'Recent denials'),
        table(
          ['at', 'destination', 'service', 'proto', 'hook'],
          [...(n?.denials ?? [])].reverse().map((d) => [d.at, d.destination, d.service, d.proto, d.hook]),
          { empty: 'no denials' },
        ),
      );
    } else replace(net, h('h3', null, 'Network'), h('p', null, 'No network: loopback only.'));
    if (s.state !== 'running') {
      // Asking a paused sandbox's holders would resume it; the dashboard only looks.
      replace(sessions, h('h3', null, 'Shell sessions'), h('p', { class: 'hint' }, `the sandbox is ${s.state}: its sessions are listed once it runs`));
    } else {
      const ss = await get<{ sessions: { id: string; mode: string; createdAt: string; outputOffset: number; alive: boolean }[] }>(`/v1/sandboxes/${id}/sessions`);
      replace(
        sessions,
        h('h3', null, 'Shell sessions'),
        table(
          ['session', 'mode', 'created', 'output', 'alive', ''],
          ss.sessions.map((x) => [x.id, x.mode, x.createdAt, bytes(x.outputOffset), x.alive ? 'yes' : 'no', x.mode === 'pty' && x.alive ? link(`/sandboxes/${id}/terminal?session=${encodeURIComponent(x.id)}`, 'attach') : '']),
          { empty: 'no sessions' },
        ),
      );
    }
  });
}
