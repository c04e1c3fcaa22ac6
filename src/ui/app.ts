/** Routing (hash URLs, so a reload comes back to the same view), the page frame and polling. */
import { type Account, ApiError, describe } from './api';
import { type Child, h, replace } from './dom';

export interface View {
  /** Run `fn` now and every `ms` while the view is shown; errors are shown in the view's status line. */
  every(ms: number, fn: () => Promise<void> | void): void;
  /** Called when the view goes away. */
  onLeave(fn: () => void): void;
  account: Account;
  params: string[];
  query: URLSearchParams;
  /** Show an error (or clear it with null). */
  error(err: unknown): void;
  notice(text: string): void;
}

export type Render = (root: HTMLElement, view: View) => void | Promise<void>;

export interface Route {
  pattern: RegExp;
  nav: string;
  render: Render;
}

export function hashPath(): { path: string; query: URLSearchParams } {
  const raw = location.hash.replace(/^#/, '') || '/';
  const i = raw.indexOf('?');
  return i < 0 ? { path: raw, query: new URLSearchParams() } : { path: raw.slice(0, i), query: new URLSearchParams(raw.slice(i + 1)) };
}

export function go(path: string, query?: Record<string, string>): void {
  const q = query ? new URLSearchParams(query).toString() : '';
  location.hash = q ? `${path}?${q}` : path;
}

/** Change the query of the current view without re-rendering it. */
export function setQuery(query: Record<string, string>): void {
  const { path } = hashPath();
  const q = new URLSearchParams(query).toString();
  history.replaceState(null, '', `#${path}${q ? `?${q}` : ''}`);
}

export function link(path: string, ...children: Child[]): HTMLAnchorElement {
  return h('a', { attrs: { href: `#${path}` } }, ...children);
}

export function errorBox(err: unknown): HTMLElement {
  const e = h('div', { class: 'error', attrs: { role: 'alert' } });
  if (err instanceof ApiError) {
    e.appendChild(h('code', { class: 'code' }, err.code));
    e.appendChild(document.createTextNode(` ${err.message}`));
  } else e.appendChild(document.createTextNode(describe(err)));
  return e;
}

const NAV: [string, string][] = [
  ['overview', 'Overview'],
  ['sandboxes', 'Sandboxes'],
  ['fncall', 'FnCall'],
  ['network', 'Network & security'],
  ['nodes', 'Nodes & jobs'],
];

let current: { leave: (() => void)[]; timers: number[] } | null = null;

function leave(): void {
  if (current === null) return;
  for (const t of current.timers) clearInterval(t);
  for (const fn of current.leave) {
    try {
      fn();
    } catch {
      /* leaving anyway */
    }
  }
  current = null;
}

export function mount(app: HTMLElement, routes: Route[], account: Account, logout: () => void): () => void {
  const main = h('main', { id: 'main' });
  const status = h('div', { class: 'status', id: 'status', attrs: { 'aria-live': 'polite' } });
  const navEl = h('nav');
  const header = h(
    'header',
    null,
    h('span', { class: 'brand' }, 'Warren'),
    navEl,
    h('span', { class: 'who', id: 'who' }, `${account.name} (${account.role})`),
    h('button', { class: 'ghost', attrs: { type: 'button' }, id: 'logout', on: { click: logout } }, 'Log out'),
  );
  replace(app, header, status, main);

  const render = async () => {
    leave();
    const { path, query } = hashPath();
    const route = routes.find((r) => r.pattern.test(path)) ?? routes[0]!;
    const params = (route.pattern.exec(path) ?? []).slice(1).map((p) => decodeURIComponent(p ?? ''));
    replace(navEl, ...NAV.map(([id, label]) => h('a', { class: id === route.nav ? 'active' : '', attrs: { href: `#/${id}` } }, label)));
    const state = { leave: [] as (() => void)[], timers: [] as number[] };
    current = state;
    replace(status);
    const view: View = {
      account,
      params,
      query,
      every(ms, fn) {
        const run = async () => {
          if (current !== state) return;
          try {
            await fn();
            if (status.dataset.kind === 'poll') replace(status);
          } catch (err) {
            if (current !== state) return;
            status.dataset.kind = 'poll';
            replace(status, errorBox(err));
          }
        };
        void run();
        state.timers.push(window.setInterval(run, ms));
      },
      onLeave(fn) {
        state.leave.push(fn);
      },
      error(err) {
        if (current !== state) return;
        status.dataset.kind = 'action';
        if (err === null) replace(status);
        else replace(status, errorBox(err));
      },
      notice(text) {
        if (current !== state) return;
        status.dataset.kind = 'action';
        replace(status, h('div', { class: 'notice' }, text));
      },
    };
    const page = h('div', { class: `page page-${route.nav}` });
    replace(main, page);
    try {
      await route.render(page, view);
    } catch (err) {
      if (current === state) replace(page, errorBox(err));
    }
  };
  window.addEventListener('hashchange', render);
  void render();
  return () => {
    window.removeEventListener('hashchange', render);
    leave();
  };
}
