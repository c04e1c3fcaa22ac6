/**
 * Input that reaches a session exactly once across broken connections.
 *
 * A connection that breaks may or may not have carried the frames sent last, so a client that
 * attaches again sends them again. To tell a repeat from new input, the client names itself (a
 * writer: random, one per attachment that re-attaches) and numbers its input frames 1, 2, ...;
 * the receiving end applies a frame only if its number is above the last one applied for that
 * writer, and acknowledges what it has, so that the client can let go of it. The gateway's
 * public shell protocol and the shim protocol between gateway and node both work this way.
 */
import { WarrenError } from '../../errors';

/** A writer's name: 8 to 64 characters of [A-Za-z0-9_-]. */
export const WRITER_PATTERN = /^[A-Za-z0-9_-]{8,64}$/;

/** Writers remembered, at most (a few dozen bytes each). */
export const INPUT_WRITERS_MAX = 65_536;

export function validateWriter(v: unknown, field = 'writer'): string {
  if (typeof v !== 'string' || !WRITER_PATTERN.test(v)) throw new WarrenError('INVALID_ARGUMENT', `${field}: 8 to 64 characters of [A-Za-z0-9_-]`, { field });
  return v;
}

export function validateSeq(v: unknown): number {
  if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 1) throw new WarrenError('INVALID_ARGUMENT', 'seq: a positive integer', { field: 'seq' });
  return v;
}

/**
 * The last input frame applied per writer key. Bounded: past `max` writers the one heard from
 * least recently is forgotten (its repeats would then be applied again, so the bound is far
 * above the writers that can be re-attaching at once).
 */
export class InputNumbering {
  private readonly last = new Map<string, number>();

  constructor(private readonly max = INPUT_WRITERS_MAX) {}

  /** Whether frame `seq` of `key` is new; if so it counts as applied from now on. */
  take(key: string, seq: number): boolean {
    const prev = this.last.get(key) ?? 0;
    if (seq <= prev) return false;
    // re-inserted last: the map's order is least recently heard first
    this.last.delete(key);
    this.last.set(key, seq);
    if (this.last.size > this.max) this.last.delete(this.last.keys().next().value!);
    return true;
  }

  /** The writer left for good (a detach): its numbering is not needed any more. */
  forget(key: string): void {
    this.last.delete(key);
  }

  get size(): number {
    return this.last.size;
  }
}

/** Acknowledgements coalesced to one per event-loop turn, for the highest number seen. */
export function ackBatcher(send: (seq: number) => void): (seq: number) => void {
  let upTo = 0;
  let queued = false;
  return (seq) => {
    upTo = Math.max(upTo, seq);
    if (queued) return;
    queued = true;
    setImmediate(() => {
      queued = false;
      send(upTo);
    });
  };
}

/**
 * The sending side: input frames numbered 1, 2, ... and kept, oldest first, until the receiver
 * acknowledges them (sent again on a new connection), at most `maxBytes` of them.
 */
export class UnackedInput {
  private frames: { seq: number; text: string }[] = [];
  private bytes = 0;
  private seq = 0;

  constructor(private readonly maxBytes: number) {}

  /** `frame` numbered and kept, as the text to send; null (nothing kept) past the bound. */
  add(frame: Record<string, unknown>): string | null {
    const text = JSON.stringify({ ...frame, seq: this.seq + 1 });
    if (this.bytes + text.length > this.maxBytes) return null;
    this.seq++;
    this.frames.push({ seq: this.seq, text });
    this.bytes += text.length;
    return text;
  }

  /** The receiver has taken every frame up to `upTo`. */
  ack(upTo: number): void {
    let n = 0;
    while (n < this.frames.length && this.frames[n]!.seq <= upTo) this.bytes -= this.frames[n++]!.text.length;
    if (n > 0) this.frames.splice(0, n);
  }

  /** What is not acknowledged, oldest first. */
  texts(): string[] {
    return this.frames.map((f) => f.text);
  }

  clear(): void {
    this.frames = [];
    this.bytes = 0;
  }

  get pendingBytes(): number {
    return this.bytes;
  }
}
