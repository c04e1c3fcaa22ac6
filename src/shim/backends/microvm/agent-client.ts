/**
 * The shim's connection to a microVM's guest agent (a unix socket QEMU serves
 * for the virtio-serial port, or a guest vsock port through Firecracker's).
 * Requests and processes are multiplexed on channels.
 *
 * The guest is untrusted, so nothing it sends can make this side allocate
 * without bound, wait forever or act on host paths:
 *   - frames are bounded (AgentDecoder), and a connection that breaks the
 *     protocol is dropped;
 *   - every request has a deadline, and what a request collects is capped by
 *     the size the host asked for;
 *   - frames for channels the host did not open (or already gave up on) are
 *     dropped;
 *   - paths only ever travel host -> guest, and what comes back is data.
 */
import net from 'node:net';
import { WarrenError } from '../../../errors';
import { AgentDecoder, type AgentFrame, AgentType, agentError, encodeFrame } from './agent-protocol';

export interface ChannelHandler {
  frame(f: AgentFrame): void;
  fail(err: Error): void;
}

const MAX_CHANNELS = 1024;

export class AgentClient {
  private readonly decoder = new AgentDecoder();
  private readonly chans = new Map<number, ChannelHandler>();
  private nextChan = 1;
  private closed = false;
  private closeReason: Error | null = null;
  private readonly endListeners: Array<(err: Error) => void> = [];
  /** Kernel release the guest reported in HELLO. */
  release = '';

  private constructor(private readonly sock: net.Socket) {
    sock.on('data', (chunk: Buffer) => {
      let frames: AgentFrame[];
      try {
        frames = this.decoder.push(chunk);
      } catch (err) {
        this.end(err as Error);
        return;
      }
      for (const f of frames) {
        const h = this.chans.get(f.chan);
        if (h !== undefined) h.frame(f);
      }
    });
    sock.on('error', (err) => this.end(err));
    sock.on('close', () => this.end(new WarrenError('UNAVAILABLE', 'connection to the guest agent closed')));
    // a dialer may hand the socket over paused (with bytes that came early put back)
    sock.resume();
  }

  /**
   * Connect to the agent (a socket path, or a dialer) and wait for HELLO (the
   * agent answers PING once it runs). Retries until `timeoutMs`: the VMM
   * creates its socket at start, the guest agent comes up seconds later.
   */
  static async connect(to: string | (() => Promise<net.Socket>), timeoutMs: number, isAlive: () => boolean = () => true): Promise<AgentClient> {
    const dial = typeof to === 'function' ? to : () => unixDial(to);
    const deadline = Date.now() + timeoutMs;
    let lastErr = 'no answer';
    while (Date.now() < deadline) {
      if (!isAlive()) throw new WarrenError('UNAVAILABLE', 'the VMM exited before the guest agent answered');
      let sock: net.Socket;
      try {
        sock = await dial();
      } catch (err) {
        lastErr = (err as Error).message;
        await new Promise((r) => setTimeout(r, 50));
        continue;
      }
      const client = new AgentClient(sock);
      try {
        client.release = await client.hello(deadline, isAlive);
        return client;
      } catch (err) {
        client.close();
        lastErr = (err as Error).message;
      }
    }
    throw new WarrenError('TIMEOUT', `the guest agent did not answer within ${timeoutMs} ms (${lastErr})`);
  }

  private hello(deadline: number, isAlive: () => boolean): Promise<string> {
    return new Promise((resolve, reject) => {
      const chan = this.open({
        frame: (f) => {
          if (f.type !== AgentType.HELLO) return;
          finish(null, f.payload.subarray(0, 64).toString('utf8').replace(/[^\x20-\x7e]/g, '?'));
        },
        fail: (err) => finish(err),
      });
      let timer: NodeJS.Timeout | undefined;
      const finish = (err: Error | null, release?: string) => {
        clearInterval(timer);
        this.chans.delete(chan);
        if (err) reject(err);
        else resolve(release!);
      };
      const ping = () => {
        if (Date.now() > deadline) return finish(new WarrenError('TIMEOUT', 'no HELLO from the guest agent'));
        if (!isAlive()) return finish(new WarrenError('UNAVAILABLE', 'the VMM exited'));
        if (!this.closed) this.sock.write(encodeFrame(AgentType.PING, chan));
      };
      // The agent drops what arrives before it runs; ask again until it answers.
      timer = setInterval(ping, 100);
      ping();
    });
  }

  get isClosed(): boolean {
    return this.closed;
  }

  onEnd(listener: (err: Error) => void): void {
    if (this.closed) queueMicrotask(() => listener(this.closeReason!));
    else this.endListeners.push(listener);
  }

  /** Register a channel; its number is not reused while the handler is registered. */
  open(handler: ChannelHandler): number {
    if (this.closed) throw new WarrenError('SANDBOX_NOT_RUNNING', 'the guest agent is not connected');
    if (this.chans.size >= MAX_CHANNELS) throw new WarrenError('RESOURCE_EXHAUSTED', `more than ${MAX_CHANNELS} requests in flight to one microVM`);
    let chan = this.nextChan;
    while (this.chans.has(chan)) chan = chan >= 0x7fffffff ? 1 : chan + 1;
    this.nextChan = chan >= 0x7fffffff ? 1 : chan + 1;
    this.chans.set(chan, handler);
    return chan;
  }

  releaseChannel(chan: number): void {
    this.chans.delete(chan);
  }

  send(buf: Buffer): boolean {
    if (this.closed) throw new WarrenError('SANDBOX_NOT_RUNNING', 'the guest agent is not connected');
    return this.sock.write(buf);
  }

  /** Resolves when the socket's write buffer has drained (backpressure for large writes). */
  drained(): Promise<void> {
    if (this.sock.writableLength === 0 || this.closed) return Promise.resolve();
    return new Promise((r) => this.sock.once('drain', () => r()));
  }

  /**
   * One request: resolves with the OK payload and the stream-1 data that came
   * before it (at most `maxData` bytes), rejects on ERR, on a deadline, or
   * when the guest sends more than asked for.
   */
  request(frame: (chan: number) => Buffer, what: string, opts: { timeoutMs: number; maxData?: number }): Promise<{ ok: Buffer; data: Buffer }> {
    return new Promise((resolve, reject) => {
      const parts: Buffer[] = [];
      let size = 0;
      const maxData = opts.maxData ?? 0;
      const finish = (err: Error | null, ok?: Buffer) => {
        clearTimeout(timer);
        this.chans.delete(chan);
        if (err) reject(err);
        else resolve({ ok: Buffer.from(ok!), data: Buffer.concat(parts) });
      };
      const chan = this.open({
        frame: (f) => {
          if (f.type === AgentType.OK) return finish(null, f.payload);
          if (f.type === AgentType.ERR) return finish(agentError(f.payload, what));
          if (f.type === AgentType.OUT && f.payload.length >= 1 && f.payload[0] === 1) {
            size += f.payload.length - 1;
            if (size > maxData) return finish(new WarrenError('PAYLOAD_TOO_LARGE', `${what}: the guest sent more than the ${maxData} bytes asked for`));
            parts.push(Buffer.from(f.payload.subarray(1)));
          }
        },
        fail: (err) => finish(err),
      });
      const timer = setTimeout(() => finish(new WarrenError('TIMEOUT', `${what}: the guest agent did not answer within ${opts.timeoutMs} ms`)), opts.timeoutMs);
      try {
        this.send(frame(chan));
      } catch (err) {
        finish(err as Error);
      }
    });
  }

  /** Power the guest off (the agent syncs, kills everything and powers off). */
  shutdown(): void {
    if (!this.closed) this.sock.write(encodeFrame(AgentType.SHUTDOWN, 0));
  }

  close(): void {
    this.sock.destroy();
    this.end(new WarrenError('UNAVAILABLE', 'connection to the guest agent closed'));
  }

  private end(err: Error): void {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = err;
    this.sock.destroy();
    const chans = [...this.chans.values()];
    this.chans.clear();
    for (const h of chans) h.fail(err instanceof WarrenError ? err : new WarrenError('UNAVAILABLE', `guest agent connection broke: ${err.message}`));
    for (const l of this.endListeners.splice(0)) l(err);
  }
}

/** A connected unix socket at `path` (how QEMU serves a virtio port's host end). */
export function unixDial(path: string): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path });
    s.once('connect', () => {
      s.removeAllListeners('error');
      resolve(s);
    });
    s.once('error', (err) => {
      s.destroy();
      reject(err);
    });
  });
}
