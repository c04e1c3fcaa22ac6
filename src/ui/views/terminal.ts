/**
 * A pty shell session in xterm.js over the gateway's shell WebSocket
 * (docs/shell-protocol.md). The session id goes into the URL and
 * sessionStorage, so a reload re-attaches to the same session (output
 * still in the holder's buffer is replayed) instead of opening a new one.
 */
import { FitAddon } from '@xterm/addon-fit';
import { Terminal } from '@xterm/xterm';
import { token } from '../api';
import { type View, setQuery } from '../app';
import { button, h, replace } from '../dom';
import { sandboxTabs } from './sandbox';

const SUBPROTOCOL = 'warren.v1';
const key = (id: string) => `warren.session.${id}`;

export function renderTerminal(root: HTMLElement, view: View): void {
  const id = view.params[0]!;
  const status = h('span', { class: 'term-status', id: 'term-status' }, 'connecting…');
  const host = h('div', { class: 'terminal', id: 'terminal' });
  let session = view.query.get('session') ?? sessionStorage.getItem(key(id)) ?? null;
  const term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, convertEol: false, fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace' });
  const fit = new FitAddon();
  term.loadAddon(fit);
  let ws: WebSocket | null = null;
  let offset = 0;
  let closedByUs = false;
  let retry: number | null = null;
  const enc = new TextEncoder();

  const send = (data: string | Uint8Array) => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(data);
  };
  const copy = async () => {
    const sel = term.getSelection();
    if (sel) await navigator.clipboard.writeText(sel);
  };
  const paste = async () => {
    const text = await navigator.clipboard.readText();
    if (text) term.paste(text);
  };

  const toolbar = h(
    'div',
    { class: 'toolbar' },
    status,
    button('Copy', copy, { title: 'copy the selection (Ctrl+Shift+C)', report: (e) => view.error(e), id: 'term-copy' }),
    button('Paste', paste, { title: 'paste from the clipboard (Ctrl+Shift+V)', report: (e) => view.error(e), id: 'term-paste' }),
    button(
      'New session',
      () => {
        forget();
        connect(null);
      },
      { title: 'open another shell session (this one keeps running)' },
    ),
    button(
      'End session',
      () => {
        send(JSON.stringify({ type: 'close' }));
      },
      { class: 'danger', title: 'end the shell session (its processes are killed)' },
    ),
  );
  replace(root, h('h2', null, 'Terminal ', h('code', null, id)), sandboxTabs(id, 'terminal'), toolbar, host);
  term.open(host);
  fit.fit();

  term.attachCustomKeyEventHandler((ev) => {
    if (ev.type === 'keydown' && ev.ctrlKey && ev.shiftKey && (ev.key === 'C' || ev.key === 'c')) {
      void copy();
      return false;
    }
    if (ev.type === 'keydown' && ev.ctrlKey && ev.shiftKey && (ev.key === 'V' || ev.key === 'v')) {
      void paste();
      return false;
    }
    return true;
  });
  term.onData((d) => send(enc.encode(d)));
  term.onBinary((d) => send(Uint8Array.from(d, (c) => c.charCodeAt(0))));
  term.onResize(({ cols, rows }) => send(JSON.stringify({ type: 'resize', cols, rows })));
  const onWindowResize = () => fit.fit();
  window.addEventListener('resize', onWindowResize);

  function forget(): void {
    session = null;
    sessionStorage.removeItem(key(id));
    setQuery({});
  }

  function connect(attachTo: string | null, from = 0): void {
    if (ws) {
      closedByUs = true;
      ws.close();
    }
    closedByUs = false;
    if (attachTo === null) term.reset();
    const q = new URLSearchParams({ mode: 'pty' });
    if (attachTo !== null) {
      q.set('session', attachTo);
      q.set('offset', String(from));
    } else {
      q.set('cols', String(term.cols));
      q.set('rows', String(term.rows));
    }
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    // Browsers cannot set headers on a WebSocket: the token travels as a subprotocol (never echoed back).
    const sock = new WebSocket(`${proto}//${location.host}/v1/sandboxes/${encodeURIComponent(id)}/shell?${q}`, [SUBPROTOCOL, `bearer.${token() ?? ''}`]);
    sock.binaryType = 'arraybuffer';
    ws = sock;
    let gotHello = false;
    status.textContent = attachTo ? `attaching to ${attachTo}…` : 'opening a session…';
    sock.onmessage = (ev) => {
      if (typeof ev.data !== 'string') {
        const bytes = new Uint8Array(ev.data as ArrayBuffer);
        offset += bytes.length;
        term.write(bytes);
        return;
      }
      let m: { type: string; session?: string; offset?: number; bytes?: number; code?: string; message?: string; exitCode?: number | null };
      try {
        m = JSON.parse(ev.data);
      } catch {
        return;
      }
      if (m.type === 'hello') {
        gotHello = true;
        session = m.session!;
        offset = m.offset ?? 0;
        sessionStorage.setItem(key(id), session);
        setQuery({ session });
        status.textContent = `session ${session}`;
        status.dataset.session = session;
        send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
        term.focus();
      } else if (m.type === 'lost') {
        offset = m.offset ?? offset;
        term.write(`\r\n[${m.bytes} bytes of output were dropped before this view saw them]\r\n`);
      } else if (m.type === 'exit') {
        term.write(`\r\n[session ended${m.exitCode !== undefined && m.exitCode !== null ? `, exit code ${m.exitCode}` : ''}]\r\n`);
        forget();
        status.textContent = 'session ended';
      } else if (m.type === 'error') {
        view.error(new Error(`${m.code}: ${m.message}`));
      }
    };
    sock.onclose = (ev) => {
      if (ws !== sock || closedByUs) return;
      ws = null;
      if (ev.code === 4429 && session !== null) {
        // Too slow for the output: come back from where this view stopped.
        connect(session, offset);
        return;
      }
      if (ev.code === 1000) return;
      if (!gotHello) {
        // The upgrade was refused (the browser does not say why): a remembered session that is gone gets a new one.
        if (attachTo !== null) {
          forget();
          term.write('[the remembered session is gone: opening a new one]\r\n');
          connect(null);
        } else status.textContent = 'the shell could not be opened (is the sandbox running, is the token still valid?)';
        return;
      }
      status.textContent = `disconnected (${ev.code}${ev.reason ? `: ${ev.reason}` : ''}); re-attaching…`;
      if (session !== null) retry = window.setTimeout(() => connect(session, offset), 1500);
    };
  }

  connect(session, 0);
  view.onLeave(() => {
    window.removeEventListener('resize', onWindowResize);
    if (retry !== null) clearTimeout(retry);
    closedByUs = true;
    // A plain close only detaches: the session keeps running for the next visit.
    ws?.close();
    term.dispose();
  });
}
