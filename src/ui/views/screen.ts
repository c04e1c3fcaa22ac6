/**
 * The screen of a vm sandbox: a frame stream (a PNG from GET /screen about
 * once a second, shown as it arrives) that takes clicks and typed text
 * (POST /input), for people watching or helping a computer-use agent. Full
 * VNC is `warren vnc ID` (or any noVNC pointed at WS /v1/sandboxes/:id/vnc).
 */
import { request } from '../api';
import type { View } from '../app';
import { button, h, replace } from '../dom';
import { sandboxTabs } from './sandbox';

export async function renderScreen(root: HTMLElement, view: View): Promise<void> {
  const id = view.params[0]!;
  const img = h('img', { id: 'screen-image', class: 'screen', attrs: { alt: `screen of ${id}` } });
  const text = h('input', { id: 'screen-text', attrs: { type: 'text', placeholder: 'text to type into the vm', spellcheck: 'false', autocomplete: 'off' } });
  const send = (actions: unknown[]) => request('POST', `/v1/sandboxes/${id}/input`, { body: { actions } });
  replace(
    root,
    h('h2', null, 'Screen ', h('code', null, id)),
    sandboxTabs(id, 'screen'),
    h(
      'div',
      { class: 'toolbar' },
      text,
      button('Type', async () => {
        await send([{ type: 'type', text: text.value }]);
        text.value = '';
      }, { report: (e) => view.error(e), id: 'screen-type' }),
      button('Enter', () => send([{ type: 'key', keys: 'ret' }]), { report: (e) => view.error(e) }),
      button('Ctrl-C', () => send([{ type: 'key', keys: 'ctrl+c' }]), { report: (e) => view.error(e) }),
    ),
    h('p', { class: 'hint' }, 'Click the screen to click in the vm. Live VNC: warren vnc ', h('code', null, id)),
    img,
  );
  let shown: string | null = null;
  view.onLeave(() => {
    if (shown !== null) URL.revokeObjectURL(shown);
  });
  img.addEventListener('click', (ev) => {
    if (img.naturalWidth === 0) return;
    const x = Math.min(img.naturalWidth - 1, Math.max(0, Math.round((ev.offsetX * img.naturalWidth) / img.clientWidth)));
    const y = Math.min(img.naturalHeight - 1, Math.max(0, Math.round((ev.offsetY * img.naturalHeight) / img.clientHeight)));
    send([{ type: 'click', x, y }]).catch((e: unknown) => view.error(e));
  });
  view.every(1000, async () => {
    const png = await request<Uint8Array>('GET', `/v1/sandboxes/${id}/screen`, { binary: true });
    const next = URL.createObjectURL(new Blob([png as BlobPart], { type: 'image/png' }));
    img.setAttribute('src', next);
    if (shown !== null) URL.revokeObjectURL(shown);
    shown = next;
  });
}
