/** Browse, view, upload and download the files of a sandbox (the /files routes of the API). */
import { get, request } from '../api';
import { type View, link } from '../app';
import { button, bytes, h, replace, table } from '../dom';
import { sandboxTabs } from './sandbox';

interface Entry {
  name: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mode: number;
  mtime: string;
}

const VIEW_LIMIT = 1024 * 1024;

function join(dir: string, name: string): string {
  return dir === '/' ? `/${name}` : `${dir}/${name}`;
}

function parent(path: string): string {
  const i = path.lastIndexOf('/');
  return i <= 0 ? '/' : path.slice(0, i);
}

function download(name: string, data: Uint8Array): void {
  const blobUrl = URL.createObjectURL(new Blob([data as BlobPart], { type: 'application/octet-stream' }));
  const a = h('a', { attrs: { href: blobUrl, download: name } });
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(blobUrl), 10_000);
}

export async function renderFiles(root: HTMLElement, view: View): Promise<void> {
  const id = view.params[0]!;
  const dir = view.query.get('path') ?? '/';
  const here = (p: string) => `/sandboxes/${id}/files?path=${encodeURIComponent(p)}`;
  const crumbs = h('div', { class: 'crumbs', id: 'crumbs' });
  const parts = dir.split('/').filter(Boolean);
  crumbs.appendChild(link(here('/'), '/'));
  parts.forEach((p, i) => {
    crumbs.appendChild(link(here(`/${parts.slice(0, i + 1).join('/')}`), p));
    if (i < parts.length - 1) crumbs.appendChild(document.createTextNode('/'));
  });
  const listing = h('div', { id: 'file-list' });
  const viewer = h('div', { class: 'viewer', id: 'file-viewer' });
  const upload = h('input', { attrs: { type: 'file', multiple: '', id: 'upload-input' } });
  const uploadBtn = button(
    'Upload',
    async () => {
      const files = [...(upload.files ?? [])];
      if (files.length === 0) throw new Error('choose a file first');
      for (const f of files) {
        const r = await request<{ path: string; bytes: number }>('PUT', `/v1/sandboxes/${id}/files`, { query: { path: join(dir, f.name) }, raw: await f.arrayBuffer() });
        view.notice(`uploaded ${r.path} (${bytes(r.bytes)})`);
      }
      upload.value = '';
      await refresh();
    },
    { report: (e) => view.error(e), id: 'upload-submit' },
  );
  replace(root, h('h2', null, 'Files ', h('code', null, id)), sandboxTabs(id, 'files'), crumbs, h('div', { class: 'toolbar' }, upload, uploadBtn, button('Download this folder (tar)', async () => download(`${id}${dir === '/' ? '' : dir.replaceAll('/', '_')}.tar`, await request<Uint8Array>('GET', `/v1/sandboxes/${id}/files/archive`, { query: { path: dir }, binary: true })), { report: (e) => view.error(e) })), listing, viewer);

  const show = async (e: Entry) => {
    const path = join(dir, e.name);
    const data = e.size > VIEW_LIMIT ? null : await request<Uint8Array>('GET', `/v1/sandboxes/${id}/files`, { query: { path }, binary: true });
    let text: string | null = null;
    if (data !== null) {
      try {
        text = new TextDecoder('utf-8', { fatal: true }).decode(data);
      } catch {
        text = null;
      }
    }
    replace(
      viewer,
      h('div', { class: 'viewer-head' }, h('code', null, path), ' ', bytes(e.size), ' ', button('Download', async () => download(e.name, data ?? (await request<Uint8Array>('GET', `/v1/sandboxes/${id}/files`, { query: { path }, binary: true }))), { report: (x) => view.error(x) })),
      // textContent: a file's bytes are shown, never interpreted.
      text !== null ? h('pre', { class: 'file-text' }, text) : h('p', { class: 'hint' }, data === null ? `larger than ${bytes(VIEW_LIMIT)}: download it` : 'binary file: download it'),
    );
  };

  const refresh = async () => {
    const r = await get<{ path: string; entries: Entry[] }>(`/v1/sandboxes/${id}/files/list`, { path: dir });
    const entries = [...r.entries].sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name));
    const rows = entries.map((e) => {
      const name =
        e.type === 'dir'
          ? link(here(join(dir, e.name)), `${e.name}/`)
          : e.type === 'file'
            ? h('a', { attrs: { href: '#', role: 'button' }, class: 'file', on: { click: (ev) => (ev.preventDefault(), void show(e).catch((x) => view.error(x))) } }, e.name)
            : e.name;
      return [name, e.type, e.type === 'dir' ? '' : bytes(e.size), (e.mode & 0o7777).toString(8).padStart(4, '0'), e.mtime];
    });
    if (dir !== '/') rows.unshift([link(here(parent(dir)), '../'), 'dir', '', '', '']);
    replace(listing, table(['name', 'type', 'size', 'mode', 'modified'], rows, { empty: 'empty directory', class: 'grid files' }));
  };
  await refresh();
}
