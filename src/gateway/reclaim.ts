/**
 * Giving memory back after bursts. The queues of slow shell clients and the
 * chunks of large exec responses live in malloc'ed buffers (uWS, libuv,
 * Buffer backing stores). glibc keeps freed pages in its arenas, so without
 * help a gateway stays at its peak size long after the burst is over (and
 * an idle V8 does not collect the garbage Buffers either). Shortly after a
 * burst, one full collection and malloc_trim(0) hand them back to the kernel;
 * at most every 5 s, so that a steady stream of closing connections costs a
 * pause of a few tens of ms per 5 s at worst.
 */
import { native, nativeAvailable } from '../native';

export interface Reclaimer {
  /** Something large was freed: trim soon (coalesced with other notes). */
  note(): void;
  close(): void;
}

/** A reclaimer that trims `delayMs` after a note (later notes join the pending trim), never more often than every `minIntervalMs`. */
export function createReclaimer(opts: { delayMs?: number; minIntervalMs?: number; trim?: () => void } = {}): Reclaimer {
  const delayMs = opts.delayMs ?? 500;
  const minIntervalMs = opts.minIntervalMs ?? 5000;
  const trim =
    opts.trim ??
    (nativeAvailable()
      ? () => {
          native.reclaimMemory(true);
        }
      : null);
  let timer: NodeJS.Timeout | null = null;
  let last = 0;
  let closed = false;
  const run = (): void => {
    timer = null;
    if (closed || trim === null) return;
    last = Date.now();
    trim();
  };
  return {
    note() {
      if (closed || trim === null || timer !== null) return;
      timer = setTimeout(run, Math.max(delayMs, last + minIntervalMs - Date.now()));
      timer.unref();
    },
    close() {
      closed = true;
      if (timer !== null) clearTimeout(timer);
      timer = null;
    },
  };
}
