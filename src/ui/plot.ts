/**
 * Small SVG line plots: a few series of (time, value) points sharing one
 * y axis. No styles are set inline (the page's CSP forbids them); colours
 * come from the stylesheet through the series' class.
 */
import { h, svg } from './dom';

export interface Series {
  name: string;
  /** CSS class giving the colour (s1..s4). */
  cls: string;
  points: { t: number; v: number | null }[];
}

export interface PlotOptions {
  title: string;
  format?: (v: number) => string;
  /** Shown instead of the plot when there is nothing to draw. */
  empty?: string;
  /** Draw points as dots instead of lines (events such as creates). */
  dots?: boolean;
  /** Hold each value until the next sample (counts) instead of interpolating. */
  step?: boolean;
  width?: number;
  height?: number;
}

const W = 360;
const H = 120;
const PAD = { l: 48, r: 8, t: 8, b: 18 };

export function plot(series: Series[], opts: PlotOptions): HTMLElement {
  const fmt = opts.format ?? ((v: number) => (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1)));
  const all = series.flatMap((s) => s.points.filter((p) => p.v !== null)) as { t: number; v: number }[];
  const legend = h(
    'div',
    { class: 'legend' },
    ...series.map((s) => {
      const last = [...s.points].reverse().find((p) => p.v !== null);
      return h('span', { class: `key ${s.cls}` }, `${s.name}${last ? ` ${fmt(last.v as number)}` : ''}`);
    }),
  );
  const figure = h('figure', { class: 'plot' }, h('figcaption', null, opts.title));
  if (all.length === 0) {
    figure.appendChild(h('div', { class: 'plot-empty' }, opts.empty ?? 'no samples yet'));
    return figure;
  }
  const width = opts.width ?? W;
  const height = opts.height ?? H;
  let t0 = Math.min(...all.map((p) => p.t));
  const t1 = Math.max(...all.map((p) => p.t));
  if (t1 - t0 < 1000) t0 = t1 - 60_000;
  const vmax = Math.max(...all.map((p) => p.v), 0) * 1.1 || 1;
  const vmin = Math.min(0, ...all.map((p) => p.v));
  const x = (t: number) => PAD.l + ((t - t0) / (t1 - t0 || 1)) * (width - PAD.l - PAD.r);
  const y = (v: number) => height - PAD.b - ((v - vmin) / (vmax - vmin || 1)) * (height - PAD.t - PAD.b);
  const root = svg('svg', { viewBox: `0 0 ${width} ${height}`, class: 'plot-svg', role: 'img', 'aria-label': opts.title });
  root.appendChild(svg('line', { x1: PAD.l, y1: y(vmin), x2: width - PAD.r, y2: y(vmin), class: 'axis' }));
  root.appendChild(svg('line', { x1: PAD.l, y1: PAD.t, x2: PAD.l, y2: height - PAD.b, class: 'axis' }));
  root.appendChild(svg('text', { x: PAD.l - 4, y: PAD.t + 8, class: 'tick', 'text-anchor': 'end' }, fmt(vmax)));
  root.appendChild(svg('text', { x: PAD.l - 4, y: height - PAD.b, class: 'tick', 'text-anchor': 'end' }, fmt(vmin)));
  const span = Math.round((t1 - t0) / 1000);
  root.appendChild(svg('text', { x: PAD.l, y: height - 4, class: 'tick' }, `-${span >= 120 ? `${Math.round(span / 60)}m` : `${span}s`}`));
  root.appendChild(svg('text', { x: width - PAD.r, y: height - 4, class: 'tick', 'text-anchor': 'end' }, 'now'));
  for (const s of series) {
    if (opts.dots) {
      for (const p of s.points) if (p.v !== null) root.appendChild(svg('circle', { cx: x(p.t).toFixed(1), cy: y(p.v).toFixed(1), r: 2.5, class: `dot ${s.cls}` }));
      continue;
    }
    let d = '';
    let pen = false;
    for (const p of s.points) {
      if (p.v === null) {
        pen = false;
        continue;
      }
      if (pen && opts.step) d += `H${x(p.t).toFixed(1)}`;
      d += `${pen ? 'L' : 'M'}${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`;
      pen = true;
    }
    if (d !== '') root.appendChild(svg('path', { d, class: `line ${s.cls}` }));
    // the latest value as a dot (also makes a single sample visible)
    const last = [...s.points].reverse().find((p) => p.v !== null);
    if (last) root.appendChild(svg('circle', { cx: x(last.t).toFixed(1), cy: y(last.v as number).toFixed(1), r: 2.5, class: `dot ${s.cls}` }));
  }
  figure.appendChild(root);
  figure.appendChild(legend);
  return figure;
}
