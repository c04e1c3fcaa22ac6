/**
 * The display facet of a vm: screenshots (QMP screendump), input (QMP
 * input-send-event) and the live view (a connection to QEMU's VNC server),
 * all at the hypervisor level. Requests are serialised on the VM's display
 * monitor; the monitor connection is opened on first use and again after the
 * VMM changed (resume starts a new one).
 */
import { readFileSync, statSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import net from 'node:net';
import { join } from 'node:path';
import { WarrenError } from '../../../errors';
import type { DisplayFacet } from '../../types';
import { Qmp } from '../microvm/qmp';
import { compileActions } from './input';
import { encodePng, parsePpm, pngSize, scaleDown } from './png';

export interface DisplayHost {
  width: number;
  height: number;
  /** Where the VMM's sockets and files are, on the host and as the (jailed) VMM sees its data dir. */
  runDir: string;
  dataDir: string;
  inJail(file: string): string;
  /** Throws SANDBOX_NOT_RUNNING while paused or gone. */
  check(): void;
}

const MAX_SCREEN_FILE = 8192 * 8192 * 3 + 64;

export class VmDisplay implements DisplayFacet {
  private qmp: Qmp | null = null;
  private chain: Promise<unknown> = Promise.resolve();
  private seq = 0;

  constructor(private readonly host: DisplayHost) {}

  get width(): number {
    return this.host.width;
  }

  get height(): number {
    return this.host.height;
  }

  /** Drop the monitor connection (before a pause ends the VMM, and on destroy). */
  close(): void {
    this.qmp?.close();
    this.qmp = null;
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const p = this.chain.then(fn, fn);
    this.chain = p.catch(() => undefined);
    return p;
  }

  private async monitor(): Promise<Qmp> {
    this.host.check();
    if (this.qmp === null) this.qmp = await Qmp.connect(join(this.host.runDir, 'display.sock'), 5000);
    return this.qmp;
  }

  /** One QMP command; a monitor that went away (the VMM was restarted) is reconnected once. */
  private async execute(cmd: string, args?: Record<string, unknown>, timeoutMs?: number): Promise<unknown> {
    const q = await this.monitor();
    try {
      return await q.execute(cmd, args, timeoutMs);
    } catch (err) {
      if (!(err instanceof WarrenError && err.code === 'UNAVAILABLE')) throw err;
      this.close();
      return (await this.monitor()).execute(cmd, args, timeoutMs);
    }
  }

  screenshot(opts: { width?: number } = {}): Promise<{ png: Buffer; width: number; height: number }> {
    return this.serial(async () => {
      const scaled = opts.width !== undefined && opts.width !== this.width;
      const name = `screen-${process.pid}-${++this.seq}.${scaled ? 'ppm' : 'png'}`;
      const file = join(this.host.dataDir, name);
      try {
        // QEMU 7.2 writes PNG itself (libpng); scaling needs the pixels, so that path takes PPM.
        await this.execute('screendump', { filename: this.host.inJail(file), ...(scaled ? {} : { format: 'png' }) }, 30_000);
        const size = statSync(file).size;
        if (size > MAX_SCREEN_FILE) throw new WarrenError('INTERNAL', `screendump is ${size} bytes`);
        const data = readFileSync(file);
        if (!scaled) {
          const dim = pngSize(data);
          if (dim === null) throw new WarrenError('INTERNAL', 'screendump did not write a PNG');
          return { png: data, ...dim };
        }
        const rgb = parsePpm(data);
        const w = Math.min(opts.width!, rgb.width);
        const h = Math.max(1, Math.round((w * rgb.height) / rgb.width));
        const out = scaleDown(rgb, w, h);
        return { png: encodePng(out), width: out.width, height: out.height };
      } finally {
        await rm(file, { force: true });
      }
    });
  }

  input(actions: unknown): Promise<{ actions: number; events: number }> {
    // checked whole before anything is sent
    const steps = compileActions(actions, this.width, this.height);
    return this.serial(async () => {
      let events = 0;
      for (const s of steps) {
        if (s.events.length > 0) {
          await this.execute('input-send-event', { events: s.events });
          events += s.events.length;
        }
        if (s.delayMs > 0) await new Promise((r) => setTimeout(r, s.delayMs));
      }
      return { actions: (actions as unknown[]).length, events };
    });
  }

  openVnc(): Promise<net.Socket> {
    this.host.check();
    return new Promise((resolve, reject) => {
      const s = net.createConnection({ path: join(this.host.runDir, 'vnc.sock') });
      s.once('connect', () => {
        s.removeListener('error', reject);
        resolve(s);
      });
      s.once('error', (err) => reject(new WarrenError('UNAVAILABLE', `the VNC server of this vm does not answer: ${err.message}`)));
    });
  }
}
