import { Socket } from 'node:net';

/**
 * Keeps the first `limit` bytes of a stream; past it, calls `onOverflow` once
 * and keeps draining (and dropping) so the writer never blocks on a full pipe.
 */
export class BoundedCollector {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  truncated = false;
  private stopListeners: Array<() => void> = [];

  constructor(
    private readonly limit: number,
    private readonly onOverflow: () => void = () => undefined,
  ) {}

  push(chunk: Buffer): void {
    const room = this.limit - this.size;
    if (chunk.length > room) {
      if (room > 0) {
        this.chunks.push(chunk.subarray(0, room));
        this.size += room;
      }
      if (!this.truncated) {
        this.truncated = true;
        this.onOverflow();
      }
      return;
    }
    this.chunks.push(chunk);
    this.size += chunk.length;
  }

  onStop(listener: () => void): void {
    this.stopListeners.push(listener);
  }

  /** Stop reading: the pipe is destroyed even if a background process still holds its other end. */
  stop(): void {
    for (const l of this.stopListeners) l();
    this.stopListeners = [];
  }

  bytes(): Buffer {
    return Buffer.concat(this.chunks, this.size);
  }

  text(): string {
    return this.bytes().toString('utf8');
  }
}

/** Read a raw pipe fd into `sink` until EOF; resolves on close or error. */
export function pumpInto(fd: number, sink: BoundedCollector): Promise<void> {
  return new Promise((resolve) => {
    const sock = new Socket({ fd, readable: true, writable: false });
    sink.onStop(() => sock.destroy());
    sock.on('data', (chunk: Buffer) => sink.push(chunk));
    sock.on('error', () => resolve());
    sock.on('close', () => resolve());
  });
}
