/**
 * One connection to a session holder's unix socket. Thin: it frames requests,
 * decodes replies and hands them to callbacks. Session semantics (commands,
 * status lines, timeouts) live in shell-session.ts.
 */
import net from 'node:net';
import { WarrenError } from '../../errors';
import {
  FrameDecoder,
  encodeAttach,
  encodeClose,
  encodeInfo,
  encodeInput,
  encodeMark,
  encodeResize,
  encodeSignal,
  parseHolderFrame,
  type HolderFrame,
  type HolderInfo,
  type RawFrame,
} from './holder-protocol';

export interface HolderClientHandlers {
  /** Every frame except INFO replies (those resolve `info()`). */
  onFrame?(frame: HolderFrame): void;
  /** The connection ended (holder exited, closed us, or `destroy()`); `err` when it broke. */
  onEnd?(err?: Error): void;
}

export class HolderClient {
  private readonly decoder = new FrameDecoder();
  private readonly infoWaiters: Array<{ resolve(i: HolderInfo): void; reject(e: Error): void }> = [];
  private ended = false;
  private endError: Error | undefined;
  private endWaiters: Array<() => void> = [];
  private paused = false;
  handlers: HolderClientHandlers = {};

  private constructor(readonly socketPath: string, private readonly sock: net.Socket) {
    const frames: RawFrame[] = [];
    sock.on('data', (chunk: Buffer) => {
      frames.length = 0;
      try {
        this.decoder.push(chunk, frames);
      } catch (e) {
        this.fail(e as Error);
        return;
      }
      for (const f of frames) {
        let hf: HolderFrame;
        try {
          hf = parseHolderFrame(f);
        } catch (e) {
          this.fail(e as Error);
          return;
        }
        if (hf.type === 'info') {
          this.infoWaiters.shift()?.resolve(hf.info);
          if (this.paused && this.infoWaiters.length === 0) this.sock.pause();
        }
        else this.handlers.onFrame?.(hf);
        if (this.ended) return;
      }
    });
    sock.on('error', (e) => this.finish(e));
    sock.on('close', () => this.finish());
  }

  /** Connect; rejects with SESSION_NOT_FOUND when nothing listens there, UNAVAILABLE on timeout. */
  static connect(socketPath: string, timeoutMs = 5000): Promise<HolderClient> {
    return new Promise((resolve, reject) => {
      const sock = net.createConnection({ path: socketPath });
      const timer = setTimeout(() => {
        sock.destroy();
        reject(new WarrenError('UNAVAILABLE', `session holder at ${socketPath} did not accept within ${timeoutMs} ms`));
      }, timeoutMs);
      sock.once('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        if (e.code === 'ENOENT' || e.code === 'ECONNREFUSED') {
          reject(new WarrenError('SESSION_NOT_FOUND', `no session holder listens at ${socketPath} (${e.code})`, { socketPath, errno: e.code }));
        } else {
          reject(new WarrenError('UNAVAILABLE', `cannot connect to session holder at ${socketPath}: ${e.message}`, { socketPath }));
        }
      });
      sock.once('connect', () => {
        clearTimeout(timer);
        sock.removeAllListeners('error');
        resolve(new HolderClient(socketPath, sock));
      });
    });
  }

  get isEnded(): boolean {
    return this.ended;
  }

  /** Ask for the holder's INFO. */
  info(timeoutMs = 5000): Promise<HolderInfo> {
    if (this.ended) return Promise.reject(this.gone());
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const i = this.infoWaiters.indexOf(w);
        if (i >= 0) this.infoWaiters.splice(i, 1);
        reject(new WarrenError('UNAVAILABLE', `session holder at ${this.socketPath} did not answer INFO within ${timeoutMs} ms`));
      }, timeoutMs);
      const w = {
        resolve: (i: HolderInfo) => { clearTimeout(timer); resolve(i); },
        reject: (e: Error) => { clearTimeout(timer); reject(e); },
      };
      this.infoWaiters.push(w);
      // The reply comes in order with the output: a paused socket would never
      // see it. Take output until it is here (one frame or so), then pause again.
      if (this.paused) this.sock.resume();
      this.sock.write(encodeInfo());
    });
  }

  attach(fromOffset: number): void { this.send(encodeAttach(fromOffset)); }
  input(data: Buffer | string): void { this.send(encodeInput(data)); }
  resize(cols: number, rows: number): void { this.send(encodeResize(cols, rows)); }
  signal(signo: number, target: number): void { this.send(encodeSignal(signo, target)); }
  mark(): void { this.send(encodeMark()); }
  /** Write several encoded frames with one syscall. */
  sendFrames(...frames: Buffer[]): void { this.send(frames.length === 1 ? frames[0]! : Buffer.concat(frames)); }

  /** Ask the holder to kill the session; resolves when it has hung up (CLOSED seen or connection gone). */
  close(timeoutMs = 5000): Promise<void> {
    if (this.ended) return Promise.resolve();
    this.resume(); // the hang-up is only seen by a reading socket
    this.send(encodeClose());
    return new Promise((resolve) => {
      const timer = setTimeout(() => { this.destroy(); resolve(); }, timeoutMs);
      this.endWaiters.push(() => { clearTimeout(timer); resolve(); });
    });
  }

  /**
   * Stop taking output from the holder (back-pressure): the kernel's socket
   * buffer fills, the holder holds its child back for its stall time and then
   * lets this connection fall behind in its ring (LOST when it catches up).
   */
  pause(): void {
    this.paused = true;
    if (!this.ended) this.sock.pause();
  }

  /** Take output again after pause(). */
  resume(): void {
    this.paused = false;
    if (!this.ended) this.sock.resume();
  }

  /** Drop the connection (the session lives on). */
  destroy(): void {
    this.sock.destroy();
    this.finish();
  }

  private send(buf: Buffer): void {
    if (this.ended) throw this.gone();
    this.sock.write(buf);
  }

  private gone(): WarrenError {
    return new WarrenError('UNAVAILABLE', `connection to session holder at ${this.socketPath} is closed${this.endError ? `: ${this.endError.message}` : ''}`);
  }

  private fail(e: Error): void {
    this.sock.destroy();
    this.finish(e);
  }

  private finish(err?: Error): void {
    if (this.ended) return;
    this.ended = true;
    this.endError = err;
    const e = this.gone();
    for (const w of this.infoWaiters.splice(0)) w.reject(e);
    for (const w of this.endWaiters.splice(0)) w();
    this.handlers.onEnd?.(err);
  }
}
