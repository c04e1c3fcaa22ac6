/** The Warren dashboard: log in with a token, then the views of ./views. */
import './csp';
import '@xterm/xterm/css/xterm.css';
import './app.css';
import { type Account, ApiError, get, setToken, setUnauthenticatedHandler, token } from './api';
import { errorBox, mount, type Route } from './app';
import { h, replace } from './dom';
import { renderFiles } from './views/files';
import { renderFncall } from './views/fncall';
import { renderNetwork } from './views/network';
import { renderNodes } from './views/nodes';
import { renderOverview } from './views/overview';
import { renderSandbox } from './views/sandbox';
import { renderSandboxes } from './views/sandboxes';
import { renderScreen } from './views/screen';
import { renderTerminal } from './views/terminal';

const ID = '([a-z0-9][a-z0-9-]{0,62})';
const routes: Route[] = [
  { pattern: /^\/(?:overview)?$/, nav: 'overview', render: renderOverview },
  { pattern: /^\/sandboxes$/, nav: 'sandboxes', render: renderSandboxes },
  { pattern: new RegExp(`^/sandboxes/${ID}$`), nav: 'sandboxes', render: renderSandbox },
  { pattern: new RegExp(`^/sandboxes/${ID}/terminal$`), nav: 'sandboxes', render: renderTerminal },
  { pattern: new RegExp(`^/sandboxes/${ID}/files$`), nav: 'sandboxes', render: renderFiles },
  { pattern: new RegExp(`^/sandboxes/${ID}/screen$`), nav: 'sandboxes', render: renderScreen },
  { pattern: /^\/fncall$/, nav: 'fncall', render: renderFncall },
  { pattern: /^\/network$/, nav: 'network', render: renderNetwork },
  { pattern: /^\/nodes$/, nav: 'nodes', render: renderNodes },
];

const app = document.getElementById('app')!;
let unmount: (() => void) | null = null;

function loginPage(problem?: unknown): void {
  unmount?.();
  unmount = null;
  const tokenInput = h('input', { id: 'token', attrs: { type: 'password', name: 'token', autocomplete: 'off', placeholder: 'wrn_…', spellcheck: 'false' } });
  const err = h('div', { id: 'login-error' });
  if (problem !== undefined) err.appendChild(errorBox(problem));
  const form = h(
    'form',
    { class: 'login', id: 'login' },
    h('h1', null, 'Warren'),
    h('p', null, 'Log in with a Warren API token. It is kept in this browser tab only (sessionStorage) and sent to this gateway alone.'),
    h('label', { class: 'field' }, h('span', { class: 'field-label' }, 'Token'), tokenInput),
    h('button', { attrs: { type: 'submit' }, id: 'login-submit' }, 'Log in'),
    err,
  );
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const t = tokenInput.value.trim();
    if (t === '') return;
    setToken(t);
    void start();
  });
  replace(app, form);
  tokenInput.focus();
}

async function start(): Promise<void> {
  if (token() === null) return loginPage();
  let account: Account;
  try {
    account = await get<Account>('/v1/accounts/me');
  } catch (err) {
    // A stale, revoked or foreign token: forget it and say what the API said.
    if (err instanceof ApiError && err.status === 401) setToken(null);
    return loginPage(err);
  }
  unmount?.();
  unmount = mount(app, routes, account, () => {
    setToken(null);
    loginPage();
  });
}

setUnauthenticatedHandler((err) => {
  setToken(null);
  loginPage(err);
});
void start();
