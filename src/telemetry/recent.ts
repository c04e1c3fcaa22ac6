/**
 * The last values of a few metrics, kept in memory next to the OpenTelemetry
 * instruments. OTel only hands values to an exporter (when one is installed);
 * the dashboard needs the recent history on the node itself, without a
 * collector, so the instruments that matter for it also append here. Each
 * series is a bounded ring: memory stays constant however long the node runs.
 */
import type { Attributes, Histogram } from '@opentelemetry/api';

export interface RecentSample {
  /** Milliseconds since the epoch. */
  t: number;
  v: number;
  attrs: Record<string, string>;
}

export class RecentRing {
  private readonly buf: RecentSample[] = [];
  private next = 0;

  constructor(readonly capacity: number) {}

  push(v: number, attrs: Attributes = {}, t = Date.now()): void {
    const flat: Record<string, string> = {};
    for (const [k, val] of Object.entries(attrs)) if (val !== undefined) flat[k] = String(val);
    const s = { t, v, attrs: flat };
    if (this.buf.length < this.capacity) this.buf.push(s);
    else this.buf[this.next] = s;
    this.next = (this.next + 1) % this.capacity;
  }

  /** Samples newer than `sinceMs` (all when omitted), oldest first. */
  since(sinceMs = 0): RecentSample[] {
    const ordered = this.buf.length < this.capacity ? this.buf : [...this.buf.slice(this.next), ...this.buf.slice(0, this.next)];
    return ordered.filter((s) => s.t > sinceMs);
  }
}

const RING_CAPACITY = 512;
const rings = new Map<string, RecentRing>();

/** The process-wide ring of a metric (created on first use). */
export function recentSeries(name: string): RecentRing {
  let r = rings.get(name);
  if (r === undefined) rings.set(name, (r = new RecentRing(RING_CAPACITY)));
  return r;
}

/** A histogram that also keeps its recent values in `recentSeries(name)`. */
export function keepRecent(name: string, h: Histogram): Histogram {
  const ring = recentSeries(name);
  return {
    record(value, attributes, context) {
      ring.push(value, attributes);
      h.record(value, attributes, context);
    },
  };
}
