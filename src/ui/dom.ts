/**
 * Building the page. Text from the API (sandbox output, file names, labels,
 * error messages) only ever becomes text nodes: nothing here parses HTML.
 */
export type Child = Node | string | number | null | undefined | false;

export interface Props {
  class?: string;
  id?: string;
  title?: string;
  /** Attributes set with setAttribute (values are never parsed as markup). */
  attrs?: Record<string, string>;
  data?: Record<string, string>;
  on?: { [K in keyof HTMLElementEventMap]?: (ev: HTMLElementEventMap[K]) => void };
}

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, props: Props | null = null, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  if (props) {
    if (props.class) el.className = props.class;
    if (props.id) el.id = props.id;
    if (props.title) el.title = props.title;
    for (const [k, v] of Object.entries(props.attrs ?? {})) el.setAttribute(k, v);
    for (const [k, v] of Object.entries(props.data ?? {})) el.dataset[k] = v;
    for (const [ev, fn] of Object.entries(props.on ?? {})) el.addEventListener(ev, fn as EventListener);
  }
  append(el, ...children);
  return el;
}

export function append(el: Node, ...children: Child[]): void {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(typeof c === 'string' || typeof c === 'number' ? document.createTextNode(String(c)) : c);
  }
}

export function clear(el: Node): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

export function replace(el: Node, ...children: Child[]): void {
  clear(el);
  append(el, ...children);
}

const SVG = 'http://www.w3.org/2000/svg';
export function svg<K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number> = {}, ...children: (SVGElement | string)[]): SVGElementTagNameMap[K] {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const c of children) el.appendChild(typeof c === 'string' ? document.createTextNode(c) : c);
  return el;
}

export function bytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (Math.abs(v) >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function age(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return '—';
  const s = Math.round((now - Date.parse(iso)) / 1000);
  return duration(s);
}

export function duration(totalS: number): string {
  const neg = totalS < 0;
  let s = Math.abs(totalS);
  const d = Math.floor(s / 86400);
  s -= d * 86400;
  const hh = Math.floor(s / 3600);
  s -= hh * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  const out = d > 0 ? `${d}d ${hh}h` : hh > 0 ? `${hh}h ${m}m` : m > 0 ? `${m}m ${s}s` : `${s}s`;
  return neg ? `-${out}` : out;
}

export function until(iso: string | null | undefined, now = Date.now()): string {
  if (!iso) return '—';
  const s = Math.round((Date.parse(iso) - now) / 1000);
  return s >= 0 ? `in ${duration(s)}` : `${duration(-s)} ago`;
}

/** A button that runs `fn`, disabled while it runs; errors go to `report`. */
export function button(label: string, fn: () => Promise<unknown> | unknown, opts: { class?: string; title?: string; report?: (err: unknown) => void; id?: string } = {}): HTMLButtonElement {
  const b = h('button', { class: opts.class ?? '', attrs: { type: 'button' } }, label);
  if (opts.title) b.title = opts.title;
  if (opts.id) b.id = opts.id;
  b.addEventListener('click', async () => {
    b.disabled = true;
    try {
      await fn();
    } catch (err) {
      (opts.report ?? defaultReport)(err);
    } finally {
      b.disabled = false;
    }
  });
  return b;
}

let defaultReport: (err: unknown) => void = (err) => {
  throw err;
};
export function setDefaultReport(fn: (err: unknown) => void): void {
  defaultReport = fn;
}

export function field(label: string, input: HTMLElement, hint?: string): HTMLElement {
  return h('label', { class: 'field' }, h('span', { class: 'field-label' }, label), input, hint ? h('span', { class: 'hint' }, hint) : null);
}

export function input(name: string, value = '', attrs: Record<string, string> = {}): HTMLInputElement {
  const i = h('input', { attrs: { name, ...attrs } });
  i.value = value;
  return i;
}

export function select(name: string, options: (string | [string, string])[], value?: string): HTMLSelectElement {
  const s = h('select', { attrs: { name } });
  for (const o of options) {
    const [v, l] = typeof o === 'string' ? [o, o] : o;
    const opt = h('option', null, l);
    opt.value = v;
    s.appendChild(opt);
  }
  if (value !== undefined) s.value = value;
  return s;
}

export function table(headers: string[], rows: Child[][], opts: { class?: string; empty?: string } = {}): HTMLElement {
  const thead = h('thead', null, h('tr', null, ...headers.map((x) => h('th', null, x))));
  const tbody = h('tbody');
  for (const r of rows) tbody.appendChild(h('tr', null, ...r.map((c) => h('td', null, c))));
  if (rows.length === 0 && opts.empty) tbody.appendChild(h('tr', null, h('td', { class: 'empty', attrs: { colspan: String(headers.length) } }, opts.empty)));
  return h('table', { class: opts.class ?? 'grid' }, thead, tbody);
}

export function kv(pairs: [string, Child][]): HTMLElement {
  return h('dl', { class: 'kv' }, ...pairs.flatMap(([k, v]) => [h('dt', null, k), h('dd', null, v)]));
}
