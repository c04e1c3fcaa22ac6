/**
 * Lazily loaded layers: the node side of warren-lazyfs (native/lazyfs).
 *
 * One warren-lazyfs daemon per node serves every layer this node mounts without
 * having its blob: <layers>/lazy/mnt/<hex> is a read-only FUSE file whose bytes
 * are fetched from the registry chunk by chunk when read, each chunk checked
 * against the layer's chunk index before it is served. The layer store mounts
 * that file as a file-backed EROFS image, exactly as it mounts a local blob.
 *
 *   <layers>/lazy/mnt/        the FUSE mount (fstype fuse.warren-lazyfs)
 *   <layers>/lazy/desc/       <hex>.desc (blob URL, size, chunk size, auth) and <hex>.chunks, mode 0600
 *   <layers>/lazy/cache/      verified chunks, <hex>/<index>, bounded (LRU) by the daemon
 *   <layers>/lazy/daemon.pid, daemon.log
 *
 * Like layer mounts, the daemon is node state: it outlives the gateway (a kill -9
 * of the gateway leaves sandboxes reading through it), and a new process adopts
 * it. A daemon that died leaves EROFS mounts that can only answer EIO: a new
 * process detaches those and the FUSE mount before starting a new daemon.
 */
import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, renameSync, rmSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { WarrenError } from '../../errors';
import { feature } from '../../features';
import { readMountInfo, type LayerMounter, type MountInfo } from './sys';

export const LAZYFS_FSTYPE = 'fuse.warren-lazyfs';
/** Default bound of the node's chunk cache. */
export const DEFAULT_CACHE_BYTES = 4 * 1024 * 1024 * 1024;

export interface LazyLayerSource {
  url: string;
  size: number;
  chunkSize: number;
  /** The chunk index (32 bytes of sha256 per chunk). */
  chunks: Buffer;
  authorization?: string;
  caFile?: string;
}

export interface LazyStats {
  fetches: number;
  fetchedBytes: number;
  hits: number;
  verifyFailures: number;
  fetchErrors: number;
  evictions: number;
  cacheBytes: number;
  cacheLimit: number;
  pid: number;
  layers: Record<string, { size: number; fetches: number; fetchedBytes: number; hits: number; cachedChunks: number; chunks: number }>;
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The warren-lazyfs binary: $WARREN_LAZYFS, else native/lazyfs/out of this checkout. */
export function lazyfsBinary(): string | null {
  const env = process.env.WARREN_LAZYFS;
  if (env) return existsSync(env) ? env : null;
  const p = resolve(__dirname, '..', '..', '..', '..', 'native', 'lazyfs', 'out', 'warren-lazyfs');
  return existsSync(p) ? p : null;
}

/** Why lazy layers cannot work on this machine, or null when they can (the feature probe). */
export function lazyUnavailableReason(): string | null {
  const f = feature('lazy-layers');
  return f.supported ? null : (f.reason ?? 'unsupported');
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export class LazyLayers {
  readonly dir: string;
  readonly mnt: string;
  readonly descDir: string;
  readonly cacheDir: string;
  private readonly pidFile: string;
  private readonly logFile: string;
  private readonly cacheBytes: number;
  private readonly log: (msg: string) => void;
  private readonly mounter: LayerMounter;
  /** Counters for tests and metrics: daemons started and adopted, stale mounts cleaned. */
  readonly counters = { started: 0, adopted: 0, staleCleaned: 0 };
  private pid = 0;

  constructor(opts: { root: string; cacheBytes?: number; log?: (msg: string) => void; mounter: LayerMounter }) {
    this.dir = join(opts.root, 'lazy');
    this.mnt = join(this.dir, 'mnt');
    this.descDir = join(this.dir, 'desc');
    this.cacheDir = join(this.dir, 'cache');
    this.pidFile = join(this.dir, 'daemon.pid');
    this.logFile = join(this.dir, 'daemon.log');
    this.cacheBytes = opts.cacheBytes ?? DEFAULT_CACHE_BYTES;
    this.log = opts.log ?? (() => undefined);
    this.mounter = opts.mounter;
    if (!Number.isSafeInteger(this.cacheBytes) || this.cacheBytes < 0) throw new WarrenError('INVALID_ARGUMENT', 'the lazy layer cache bound must be a byte count');
  }

  filePath(digest: string): string {
    return join(this.mnt, digest.slice('sha256:'.length));
  }

  private fuseMounts(infos: MountInfo[] = readMountInfo()): MountInfo[] {
    return infos.filter((m) => m.mountPoint === this.mnt);
  }

  /** EROFS mounts whose backing file is served by this node's daemon. */
  erofsMountsOnFuse(infos: MountInfo[] = readMountInfo()): MountInfo[] {
    const prefix = this.mnt + '/';
    return infos.filter((m) => m.fstype === 'erofs' && m.source.startsWith(prefix));
  }

  private daemonPid(): number {
    try {
      const pid = Number(readFileSync(this.pidFile, 'utf8').trim());
      if (!Number.isInteger(pid) || pid <= 0 || !pidAlive(pid)) return 0;
      const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      return cmd.includes('warren-lazyfs') && cmd.includes(this.mnt) ? pid : 0;
    } catch {
      return 0;
    }
  }

  /** Whether the FUSE mount is there (served or not). */
  fuseMounted(): boolean {
    return this.fuseMounts().length > 0;
  }

  /** Whether a daemon serves the FUSE mount now. */
  running(): boolean {
    return this.daemonPid() !== 0 && this.fuseMounts().length > 0;
  }

  /**
   * At store start: adopt a live daemon, or clean what a dead one left (its FUSE
   * mount and the EROFS mounts over it, which can only fail). Returns the
   * digests whose stale mounts were detached.
   */
  recover(): string[] {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    const infos = readMountInfo();
    const pid = this.daemonPid();
    if (pid !== 0 && this.fuseMounts(infos).length > 0) {
      this.pid = pid;
      this.counters.adopted++;
      this.log(`layers: adopted warren-lazyfs (pid ${pid})`);
      return [];
    }
    const cleaned: string[] = [];
    for (const m of this.erofsMountsOnFuse(infos)) {
      try {
        this.mounter.umount(m.mountPoint, true);
        this.counters.staleCleaned++;
        cleaned.push('sha256:' + m.source.slice(this.mnt.length + 1));
        this.log(`layers: detached ${m.mountPoint}: its lazy file server is gone`);
      } catch (err) {
        this.log(`layers: cannot detach ${m.mountPoint}: ${(err as Error).message}`);
      }
    }
    for (let i = 0; i < this.fuseMounts(infos).length; i++) {
      try {
        this.mounter.umount(this.mnt, true);
      } catch {
        /* reported by ensureRunning */
      }
    }
    if (pid !== 0) {
      // Alive but not mounted: not serving anything; stop it.
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        /* gone */
      }
    }
    try {
      unlinkSync(this.pidFile);
    } catch {
      /* none */
    }
    return cleaned;
  }

  /** Start the daemon unless it runs; waits until its FUSE mount is there. */
  async ensureRunning(): Promise<void> {
    if (this.pid !== 0 && pidAlive(this.pid) && this.fuseMounts().length > 0) return;
    const adopted = this.daemonPid();
    if (adopted !== 0 && this.fuseMounts().length > 0) {
      this.pid = adopted;
      return;
    }
    if (this.fuseMounts().length > 0 || this.erofsMountsOnFuse().length > 0) this.recover();
    const bin = lazyfsBinary();
    const why = lazyUnavailableReason();
    if (!bin || why) throw new WarrenError('NOT_SUPPORTED', `lazy layers are not available: ${why ?? 'no warren-lazyfs binary'}`);
    for (const d of [this.mnt, this.descDir, this.cacheDir]) mkdirSync(d, { recursive: true, mode: 0o700 });
    const logFd = openSync(this.logFile, 'a', 0o600);
    let child;
    try {
      child = spawn(bin, [this.mnt, '--desc', this.descDir, '--cache', this.cacheDir, '--cache-bytes', String(this.cacheBytes), '--pid-file', this.pidFile], {
        detached: true,
        stdio: ['ignore', logFd, logFd],
      });
    } finally {
      closeSync(logFd);
    }
    let exited: number | string | null = null;
    child.on('exit', (code, sig) => (exited = sig ?? code));
    child.on('error', (err) => (exited = err.message));
    child.unref();
    const deadline = Date.now() + 10_000;
    while (Date.now() < deadline) {
      if (exited !== null) break;
      if (this.fuseMounts().length > 0 && this.daemonPid() === child.pid) {
        this.pid = child.pid!;
        this.counters.started++;
        this.log(`layers: started warren-lazyfs (pid ${child.pid}, cache bound ${this.cacheBytes} bytes)`);
        return;
      }
      await sleep(20);
    }
    if (exited === null && child.pid) {
      try {
        process.kill(child.pid, 'SIGKILL');
      } catch {
        /* gone */
      }
    }
    throw new WarrenError('MOUNT_ERROR', `warren-lazyfs did not start (${exited === null ? 'no mount within 10 s' : `exit ${String(exited)}`}): ${this.logTail()}`);
  }

  logTail(lines = 5): string {
    try {
      return readFileSync(this.logFile, 'utf8').trim().split('\n').slice(-lines).join(' | ');
    } catch {
      return '';
    }
  }

  /** Describe a layer to the daemon (before its first lookup). Atomic: the index first, then the descriptor. */
  describe(digest: string, src: LazyLayerSource): void {
    mkdirSync(this.descDir, { recursive: true, mode: 0o700 });
    const hex = digest.slice('sha256:'.length);
    const n = Math.ceil(src.size / src.chunkSize);
    if (src.chunks.length !== n * 32) throw new WarrenError('INVALID_ARCHIVE', `chunk index of ${digest} has ${src.chunks.length / 32} digests, expected ${n}`);
    for (const v of [src.url, src.authorization ?? '', src.caFile ?? '']) {
      if (/[\r\n]/.test(v)) throw new WarrenError('INVALID_ARGUMENT', 'registry URL or credentials contain a line break');
    }
    const tmp = (f: string) => `${f}.tmp-${process.pid}`;
    const chunks = join(this.descDir, `${hex}.chunks`);
    const desc = join(this.descDir, `${hex}.desc`);
    writeFileSync(tmp(chunks), src.chunks, { mode: 0o600 });
    renameSync(tmp(chunks), chunks);
    const text = [`url ${src.url}`, `size ${src.size}`, `chunk ${src.chunkSize}`, ...(src.authorization ? [`auth ${src.authorization}`] : []), ...(src.caFile ? [`cainfo ${src.caFile}`] : [])].join('\n') + '\n';
    writeFileSync(tmp(desc), text, { mode: 0o600 });
    renameSync(tmp(desc), desc);
  }

  /** Forget a layer removed from the node: its descriptor and cached chunks. */
  forget(digest: string): void {
    const hex = digest.slice('sha256:'.length);
    for (const f of [`${hex}.desc`, `${hex}.chunks`]) rmSync(join(this.descDir, f), { force: true });
    rmSync(join(this.cacheDir, hex), { recursive: true, force: true });
  }

  /** The daemon's counters, or null when it does not run. A synchronous read of the FUSE mount: for tests, benchmarks and tools, not the gateway's request path. */
  stats(): LazyStats | null {
    if (!this.running()) return null;
    try {
      return JSON.parse(readFileSync(join(this.mnt, '.stats'), 'utf8')) as LazyStats;
    } catch {
      return null;
    }
  }

  /** Bytes of chunk files on disk now (what the bound applies to). */
  cacheDiskBytes(): number {
    let n = 0;
    if (!existsSync(this.cacheDir)) return 0;
    for (const d of readdirSync(this.cacheDir)) {
      const sub = join(this.cacheDir, d);
      try {
        for (const f of readdirSync(sub)) n += statSync(join(sub, f)).size;
      } catch {
        /* raced with eviction */
      }
    }
    return n;
  }

  /**
   * Stop the daemon. Refused while EROFS mounts still read through it (they would
   * answer EIO): unmount those first.
   */
  async stop(): Promise<void> {
    const left = this.erofsMountsOnFuse();
    if (left.length > 0) throw new WarrenError('IMAGE_IN_USE', `${left.length} lazily loaded layer(s) are still mounted`);
    const pid = this.daemonPid() || this.pid;
    if (pid !== 0 && pidAlive(pid)) {
      try {
        process.kill(pid, 'SIGTERM');
      } catch {
        /* gone */
      }
      const deadline = Date.now() + 5000;
      while (pidAlive(pid) && Date.now() < deadline) await sleep(20);
      if (pidAlive(pid)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone */
        }
      }
    }
    this.pid = 0;
    for (let i = 0; i < 4 && this.fuseMounts().length > 0; i++) {
      try {
        this.mounter.umount(this.mnt, true);
      } catch {
        break;
      }
    }
    rmSync(this.pidFile, { force: true });
    this.log('layers: stopped warren-lazyfs');
  }
}
