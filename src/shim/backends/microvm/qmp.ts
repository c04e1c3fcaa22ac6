/**
 * A small QMP client (QEMU's JSON monitor on a unix socket): commands are
 * sent one at a time, replies and events are lines of JSON. Lines are capped
 * (QEMU runs on behalf of an untrusted guest; a broken VMM must not grow this
 * process) and every command has a deadline.
 */
import net from 'node:net';
import { WarrenError } from '../../../errors';

const MAX_LINE = 1 << 20;

export class Qmp {
  private buf = '';
  private waiting: Array<{ resolve(v: unknown): void; reject(e: Error): void }> = [];
  private chain: Promise<unknown> = Promise.resolve();
  private closed = false;

  private constructor(private readonly sock: net.Socket) {
    sock.setEncoding('utf8');
    sock.on('data', (d: string) => {
      this.buf += d;
      if (this.buf.length > MAX_LINE && !this.buf.includes('\n')) return this.fail(new WarrenError('INTERNAL', 'QMP line too long'));
      let nl: number;
      while ((nl = this.buf.indexOf('\n')) >= 0) {
        const line = this.buf.slice(0, nl).trim();
        this.buf = this.buf.slice(nl + 1);
        if (line === '') continue;
        let msg: Record<string, unknown>;
        try {
          msg = JSON.parse(line) as Record<string, unknown>;
        } catch {
          return this.fail(new WarrenError('INTERNAL', 'malformed QMP line'));
        }
        if ('return' in msg || 'error' in msg || 'QMP' in msg) {
          const w = this.waiting.shift();
          if (!w) continue;
          if ('error' in msg) {
            const e = msg.error as { class?: string; desc?: string };
            w.reject(new WarrenError('INTERNAL', `QMP: ${String(e?.desc ?? e?.class ?? 'error').slice(0, 300)}`));
          } else w.resolve(msg.return ?? msg.QMP);
        }
      }
    });
    sock.on('error', (e) => this.fail(e));
    sock.on('close', () => this.fail(new WarrenError('UNAVAILABLE', 'QMP connection closed')));
  }

  static async connect(path: string, timeoutMs = 5000): Promise<Qmp> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        const sock = await new Promise<net.Socket>((resolve, reject) => {
          const s = net.createConnection({ path });
          s.once('connect', () => resolve(s));
          s.once('error', reject);
        });
        const q = new Qmp(sock);
        await q.next(deadline - Date.now()); // greeting
        await q.execute('qmp_capabilities', undefined, Math.max(1000, deadline - Date.now()));
        return q;
      } catch (err) {
        if (Date.now() > deadline) throw new WarrenError('TIMEOUT', `QMP at ${path} did not answer: ${(err as Error).message}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
  }

  private next(timeoutMs: number): Promise<unknown> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new WarrenError('TIMEOUT', 'QMP did not answer')), Math.max(1, timeoutMs));
      this.waiting.push({
        resolve: (v) => (clearTimeout(timer), resolve(v)),
        reject: (e) => (clearTimeout(timer), reject(e)),
      });
    });
  }

  execute(command: string, args?: Record<string, unknown>, timeoutMs = 10_000): Promise<unknown> {
    const run = async () => {
      if (this.closed) throw new WarrenError('UNAVAILABLE', 'QMP connection closed');
      const reply = this.next(timeoutMs);
      this.sock.write(JSON.stringify(args === undefined ? { execute: command } : { execute: command, arguments: args }) + '\n');
      return reply;
    };
    const p = this.chain.then(run, run);
    this.chain = p.catch(() => undefined);
    return p;
  }

  close(): void {
    this.closed = true;
    this.sock.destroy();
  }

  private fail(err: Error): void {
    this.closed = true;
    this.sock.destroy();
    for (const w of this.waiting.splice(0)) w.reject(err);
  }
}
