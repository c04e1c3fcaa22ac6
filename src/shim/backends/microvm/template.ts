/**
 * Templates: a microVM is restored from a snapshot of a guest that booted
 * once, instead of booting its own kernel. The snapshot is taken while the
 * guest's /init waits in front of everything that is the sandbox's own (its
 * id, limits, random seed, clock, the contents of its disks), so one snapshot
 * serves every microVM of the same shape: kernel, initramfs, layer files,
 * disk size, memory and vCPUs.
 *
 * The guest side is in guest.ts (/init with `warren.hold=1`) and the agent's
 * `--scrub` and `--fresh` modes; the handshake over the agent port is a line
 * each way, before the agent's own protocol starts:
 *
 *   guest -> host  WARREN_HOLD            (repeated until configured)
 *   host -> guest  WARREN_CONFIG id=… pids=… seed=<128 hex> clock=<ns>
 *   guest -> host  WARREN_GO
 *
 * Templates live in <dataDir>/microvm-templates/<key>/, built once per key
 * (one build at a time per key in this process; the others wait for it) and
 * evicted least recently used beyond MAX_TEMPLATES.
 */
import { randomBytes, createHash } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import net from 'node:net';
import { totalmem } from 'node:os';
import { join } from 'node:path';
import { WarrenError } from '../../../errors';
import { native } from '../../../native';

/** What a template is made of: a restore needs every one of these to be the same. */
export interface TemplateShape {
  kernel: string;
  /** The cached initramfs (content-keyed). */
  initrd: string;
  layerFiles: readonly string[];
  diskMb: number;
  guestMb: number;
  vcpus: number;
  accel: 'kvm' | 'tcg';
  /** Whether its guests have a NIC (the device set is part of the snapshot). */
  nic: boolean;
  /** Anything else that reaches the VMM's command line (TSC frequency, the VMM user). */
  extra: string;
}

export interface Template {
  key: string;
  dir: string;
  /** The saved guest (memory and devices), root-owned and world-readable: it holds no sandbox's data. */
  snapshot: string;
  /** The guest's RAM at the hold point (the snapshot leaves it out); restores map it copy-on-write. */
  ram: string;
  /** The writable disk as it was at the snapshot (mounted by then): each restore gets a copy. */
  disk: string;
  /** The initramfs the template booted (a restore must name the same one). */
  initrd: string;
  /** The kernel command line it booted with (a restore and every later resume pass it again). */
  cmdline: string;
  snapshotBytes: number;
}

/** Builds a template into `dir` (empty, made by the store); returns the command line it booted. */
export type TemplateBuilder = (key: string, shape: TemplateShape, dir: string) => Promise<{ cmdline: string }>;

/** Bumped when what a snapshot holds changes meaning (the handshake, /init's hold point). */
const FORMAT = 'warren-microvm-template-2';
export const MAX_TEMPLATES = 8;
const LINE_LIMIT = 4096;

export class TemplateStore {
  private readonly building = new Map<string, Promise<Template>>();
  /** Each template's RAM as a sealed memfd, made at its first restore in this process. */
  private readonly rams = new Map<string, RamEntry>();

  constructor(
    readonly root: string,
    private readonly build: TemplateBuilder,
    private readonly log: (line: string) => void = () => undefined,
    /** What the template memfds of this process may hold together (default: a quarter of the host's memory). */
    private readonly ramBudget = Math.floor(totalmem() / 4),
  ) {
    mkdirSync(root, { recursive: true, mode: 0o755 });
  }

  keyOf(shape: TemplateShape): string {
    const h = createHash('sha256').update(FORMAT).update('\0');
    const file = (p: string) => {
      const st = statSync(p);
      h.update(`${p}\0${st.size}\0${st.mtimeMs}\0${st.ino}\0`);
    };
    file(shape.kernel);
    h.update(`${shape.initrd}\0`);
    for (const l of shape.layerFiles) file(l);
    h.update(`${shape.layerFiles.length}\0${shape.diskMb}\0${shape.guestMb}\0${shape.vcpus}\0${shape.accel}\0${shape.nic}\0${shape.extra}\0`);
    try {
      file(qemuBinary());
    } catch {
      /* no QEMU: the build fails with its own error */
    }
    return h.digest('hex').slice(0, 32);
  }

  /** The template for `shape`, built now if there is none. */
  async get(shape: TemplateShape): Promise<Template> {
    const key = this.keyOf(shape);
    const ready = this.read(key);
    if (ready !== null) return ready;
    let p = this.building.get(key);
    if (p === undefined) {
      p = this.make(key, shape).finally(() => this.building.delete(key));
      this.building.set(key, p);
    }
    return p;
  }

  private read(key: string): Template | null {
    const dir = join(this.root, key);
    try {
      const meta = JSON.parse(readFileSync(join(dir, 'template.json'), 'utf8')) as { cmdline?: unknown; snapshotBytes?: unknown };
      if (typeof meta.cmdline !== 'string' || typeof meta.snapshotBytes !== 'number') return null;
      const snapshot = join(dir, 'snapshot');
      if (!['ram', 'disk.img', 'initrd.cpio'].every((f) => existsSync(join(dir, f))) || !existsSync(snapshot)) return null;
      const now = new Date();
      utimesSync(join(dir, 'template.json'), now, now);
      return { key, dir, snapshot, ram: join(dir, 'ram'), disk: join(dir, 'disk.img'), initrd: join(dir, 'initrd.cpio'), cmdline: meta.cmdline, snapshotBytes: meta.snapshotBytes };
    } catch {
      return null;
    }
  }

  private async make(key: string, shape: TemplateShape): Promise<Template> {
    const dir = join(this.root, `${key}.build-${process.pid}-${randomBytes(4).toString('hex')}`);
    mkdirSync(dir, { mode: 0o700 });
    const started = performance.now();
    try {
      const { cmdline } = await this.build(key, shape, dir);
      const snapshotBytes = statSync(join(dir, 'snapshot')).size;
      writeFileSync(join(dir, 'template.json'), JSON.stringify({ format: FORMAT, cmdline, snapshotBytes, builtAt: new Date().toISOString(), buildMs: Math.round(performance.now() - started), shape }));
      const final = join(this.root, key);
      rmSync(final, { recursive: true, force: true });
      renameSync(dir, final);
      this.log(`microvm: template ${key} built in ${Math.round(performance.now() - started)} ms (${snapshotBytes} bytes)`);
      this.evict(key);
      const t = this.read(key);
      if (t === null) throw new WarrenError('INTERNAL', `template ${key} is unreadable right after its build`);
      return t;
    } catch (err) {
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /**
   * The template's RAM as a sealed memfd, which restores map copy-on-write. The VMM of a restored
   * microVM gets this fd, never the file: it opens its RAM read-write, and a VMM taken over by its
   * guest could otherwise write into every later sandbox's memory.
   *
   * Every page of it is filled, zero pages too: a fault on a hole of a private shmem mapping (a
   * read, or the copy before a write) allocates that page in the memfd, charged to the faulting
   * VMM's cgroup. A pause reads all of guest RAM, so a sparse memfd would charge a paused VM up to
   * its whole guest size of pages it shares with every sibling, and could push it past its limit.
   * Filled, the template costs its guest size once per node process, charged to the node.
   */
  async acquireRam(t: Template): Promise<{ fd: number; release: () => void }> {
    let e = this.rams.get(t.key);
    if (e === undefined) {
      const bytes = statSync(t.ram).size;
      e = { fd: sealedCopy(t.ram, `warren-template-${t.key.slice(0, 16)}`), users: 0, dropped: false, bytes, usedAt: 0 };
      const made = e;
      made.fd.catch(() => {
        if (this.rams.get(t.key) === made) this.rams.delete(t.key);
      });
      this.rams.set(t.key, e);
      this.trimRams(t.key);
    }
    const entry = e;
    entry.users++;
    entry.usedAt = Date.now();
    let fd: number;
    try {
      fd = await entry.fd;
    } catch (err) {
      this.unuse(entry);
      throw err;
    }
    let released = false;
    return {
      fd,
      release: () => {
        if (released) return;
        released = true;
        this.unuse(entry);
      },
    };
  }

  private unuse(e: RamEntry): void {
    e.users--;
    if (e.dropped && e.users === 0) e.fd.then((fd) => native.close(fd), () => undefined);
  }

  /** Stop offering a template's memfd; it is closed once no restore is passing it on. */
  private dropRam(key: string): void {
    const e = this.rams.get(key);
    if (e === undefined) return;
    this.rams.delete(key);
    e.dropped = true;
    if (e.users === 0) e.fd.then((fd) => native.close(fd), () => undefined);
  }

  /** Keep the memfds this process holds within the budget: the least recently used go first (VMs mapping one keep it alive). */
  private trimRams(keep: string): void {
    let total = [...this.rams.values()].reduce((a, e) => a + e.bytes, 0);
    const lru = [...this.rams.entries()].filter(([k]) => k !== keep).sort((a, b) => a[1].usedAt - b[1].usedAt);
    for (const [k, e] of lru) {
      if (total <= this.ramBudget) break;
      this.dropRam(k);
      total -= e.bytes;
    }
  }

  close(): void {
    for (const key of [...this.rams.keys()]) this.dropRam(key);
  }

  /** Drop the least recently used templates beyond MAX_TEMPLATES (never `keep`). */
  private evict(keep: string): void {
    const all = this.list().filter((t) => t.key !== keep);
    all.sort((a, b) => b.usedMs - a.usedMs);
    // one used in the last minute may be in the middle of a restore (its disk is being copied, its snapshot bound)
    for (const t of all.slice(MAX_TEMPLATES - 1).filter((t) => Date.now() - t.usedMs > IN_USE_MS)) {
      this.dropRam(t.key);
      rmSync(join(this.root, t.key), { recursive: true, force: true });
    }
  }

  list(): { key: string; usedMs: number; bytes: number }[] {
    const out: { key: string; usedMs: number; bytes: number }[] = [];
    for (const name of readdirSync(this.root)) {
      if (!/^[0-9a-f]{32}$/.test(name)) continue;
      try {
        const st = statSync(join(this.root, name, 'template.json'));
        out.push({ key: name, usedMs: st.mtimeMs, bytes: statSync(join(this.root, name, 'snapshot')).size });
      } catch {
        /* incomplete: removed by sweep */
      }
    }
    return out;
  }

  /**
   * Before any build of this process: remove what builds of an earlier process left (it died mid-build): their VMMs (recorded in
   * vmm.json with their start time, so a reused pid is not killed), cgroups and directories.
   */
  async sweep(kill: (pid: number) => Promise<void>, destroyCgroup: (id: string) => Promise<void>): Promise<number> {
    let n = 0;
    for (const name of readdirSync(this.root)) {
      const dir = join(this.root, name);
      if (/^[0-9a-f]{32}$/.test(name) && existsSync(join(dir, 'template.json'))) continue;
      try {
        const rec = JSON.parse(readFileSync(join(dir, 'vmm.json'), 'utf8')) as { pid?: unknown; startTime?: unknown; cgroup?: unknown };
        if (typeof rec.pid === 'number' && rec.pid > 0 && native.processStartTime(rec.pid) === rec.startTime) await kill(rec.pid);
        if (typeof rec.cgroup === 'string' && native.cgroupExists(rec.cgroup)) await destroyCgroup(rec.cgroup);
      } catch {
        /* no VMM was started */
      }
      rmSync(dir, { recursive: true, force: true });
      n++;
    }
    return n;
  }
}

interface RamEntry {
  fd: Promise<number>;
  /** Restores between taking the fd and handing it to their VMM. */
  users: number;
  dropped: boolean;
  bytes: number;
  usedAt: number;
}

const IN_USE_MS = 60_000;


/** Copy all of `file` into a new memfd and seal it. */
async function sealedCopy(file: string, name: string): Promise<number> {
  const size = statSync(file).size;
  const fd = native.memfdCreate(name, size);
  try {
    const src = await open(file, 'r');
    const dst = await open(`/proc/self/fd/${fd}`, 'r+');
    try {
      const buf = Buffer.alloc(1 << 20);
      for (let off = 0; off < size; off += buf.length) {
        const want = Math.min(buf.length, size - off);
        const { bytesRead } = await src.read(buf, 0, want, off);
        if (bytesRead !== want) throw new WarrenError('INTERNAL', `template RAM ${file} is shorter than its ${size} bytes`);
        await dst.write(buf, 0, want, off);
      }
    } finally {
      await src.close();
      await dst.close();
    }
    native.memfdSeal(fd);
    return fd;
  } catch (err) {
    native.close(fd);
    throw err;
  }
}

function qemuBinary(): string {
  for (const d of (process.env.PATH ?? '/usr/bin').split(':')) if (existsSync(join(d, 'qemu-system-x86_64'))) return join(d, 'qemu-system-x86_64');
  return '/usr/bin/qemu-system-x86_64';
}

/**
 * The line that makes a restored guest this sandbox: its id, pids limit, and for a NIC its
 * address/prefix, gateway and MAC (the one its tap's programs pin).
 */
export function configLine(o: { id: string; pids?: number; net?: { cidr: string; gateway: string; mac: string } }): string {
  if (!/^[a-z0-9][a-z0-9-]{0,62}$/.test(o.id)) throw new WarrenError('INVALID_ARGUMENT', `bad sandbox id ${JSON.stringify(o.id)}`);
  if (o.pids !== undefined && !(Number.isInteger(o.pids) && o.pids > 0)) throw new WarrenError('INVALID_ARGUMENT', `bad pids limit ${o.pids}`);
  const ipv4 = '(25[0-5]|2[0-4]\\d|1?\\d?\\d)(\\.(25[0-5]|2[0-4]\\d|1?\\d?\\d)){3}';
  if (o.net !== undefined) {
    const ok = new RegExp(`^${ipv4}/([0-9]|[12][0-9]|3[0-2])$`).test(o.net.cidr) && new RegExp(`^${ipv4}$`).test(o.net.gateway) && /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/.test(o.net.mac);
    if (!ok) throw new WarrenError('INVALID_ARGUMENT', `bad guest network ${JSON.stringify(o.net)}`);
  }
  const clock = BigInt(Date.now()) * 1_000_000n;
  const net = o.net === undefined ? '' : ` net=${o.net.cidr},${o.net.gateway} mac=${o.net.mac}`;
  return `WARREN_CONFIG id=${o.id}${o.pids !== undefined ? ` pids=${o.pids}` : ''}${net} seed=${randomBytes(64).toString('hex')} clock=${clock}\n`;
}

/**
 * The pre-agent handshake on the agent port's socket: connect (retrying while QEMU has not
 * created it or the VMM is starting), write `send` if given, and read lines until one equals
 * `want`. Lines are bounded (a longer one is dropped unread), the whole exchange has a deadline,
 * and a VMM that exits ends the wait at once.
 */
export async function portHandshake(path: string, o: { send?: string; want: string; timeoutMs: number; isAlive: () => boolean }): Promise<void> {
  const deadline = Date.now() + o.timeoutMs;
  for (;;) {
    if (!o.isAlive()) throw new WarrenError('UNAVAILABLE', 'the VMM exited before the guest was ready');
    const sock = await new Promise<net.Socket | null>((resolve) => {
      const s = net.connect(path);
      s.once('connect', () => resolve(s));
      s.once('error', () => {
        s.destroy();
        resolve(null);
      });
    });
    if (sock === null) {
      if (Date.now() > deadline) throw new WarrenError('TIMEOUT', `the guest's agent port did not open within ${o.timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, 20));
      continue;
    }
    try {
      await new Promise<void>((resolve, reject) => {
        let buf = '';
        let dropping = false;
        const finish = (err?: Error) => {
          clearInterval(tick);
          sock.removeAllListeners('data');
          if (err) reject(err);
          else resolve();
        };
        const tick = setInterval(() => {
          if (!o.isAlive()) finish(new WarrenError('UNAVAILABLE', 'the VMM exited before the guest was ready'));
          else if (Date.now() > deadline) finish(new WarrenError('TIMEOUT', `the guest did not answer ${o.want} within ${o.timeoutMs} ms`));
        }, 50);
        sock.on('data', (chunk: Buffer) => {
          buf += chunk.toString('latin1');
          for (;;) {
            const nl = buf.indexOf('\n');
            if (nl < 0) break;
            const line = buf.slice(0, nl);
            buf = buf.slice(nl + 1);
            if (dropping) dropping = false;
            else if (line === o.want) return finish();
          }
          if (buf.length > LINE_LIMIT) {
            buf = '';
            dropping = true;
          }
        });
        sock.once('close', () => finish(new WarrenError('UNAVAILABLE', `the guest's agent port closed before ${o.want}`)));
        if (o.send !== undefined) sock.write(o.send);
      });
      return;
    } finally {
      sock.destroy();
    }
  }
}
