/**
 * Image fixtures: a busybox root filesystem, real `docker save` and OCI layout
 * archives built with GNU tar, raw tar archives with arbitrary (also hostile)
 * headers, and a throwaway LayerStore that always cleans up after itself.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, renameSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { LayerStore, type LayerStoreOptions, type SqlDatabase } from '../../src/shim/layers/store';
import { readMountInfo, removeTree } from '../../src/shim/layers/sys';
import { hostPlatform } from '../../src/shim/layers/oci';

// ---------------------------------------------------------------- busybox

function findBusybox(): string {
  for (const p of ['/bin/busybox', '/usr/bin/busybox']) if (existsSync(p)) return p;
  throw new Error('busybox not found (apt-get install busybox-static)');
}

/**
 * A minimal root filesystem: static /bin/busybox with every applet linked at
 * its usual path, /etc/passwd and /etc/group with root and nobody, /etc/hostname,
 * /tmp (1777), /root (0700), and empty /dev, /proc, /sys mount points.
 */
export async function buildBusyboxRootfs(dir: string): Promise<void> {
  const busybox = findBusybox();
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o755);
  for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'dev', 'proc', 'sys', 'home', 'var/tmp', 'run', 'mnt']) {
    mkdirSync(join(dir, d), { recursive: true, mode: 0o755 });
  }
  copyFileSync(busybox, join(dir, 'bin/busybox'));
  chmodSync(join(dir, 'bin/busybox'), 0o755);
  const applets = execFileSync(busybox, ['--list-full'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.includes('..') && !l.startsWith('/'));
  for (const applet of applets) {
    const p = join(dir, applet);
    if (applet === 'bin/busybox' || existsSync(p)) continue;
    mkdirSync(dirname(p), { recursive: true, mode: 0o755 });
    symlinkSync(relative(dirname(p), join(dir, 'bin/busybox')), p);
  }
  writeFileSync(join(dir, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n');
  writeFileSync(join(dir, 'etc/group'), 'root:x:0:\nnogroup:x:65534:\n');
  writeFileSync(join(dir, 'etc/hostname'), 'busybox\n');
  mkdirSync(join(dir, 'tmp'), { recursive: true });
  chmodSync(join(dir, 'tmp'), 0o1777);
  mkdirSync(join(dir, 'root'), { recursive: true });
  chmodSync(join(dir, 'root'), 0o700);
}

// ---------------------------------------------------------------- layers with whiteouts

export interface LayerDirSpec {
  /** Files to write: path (relative, no leading /) -> content. */
  files?: Record<string, string>;
  /** Paths the layer deletes from the layers below (`.wh.<name>` markers). */
  remove?: string[];
  /** Directories the layer replaces opaquely (`.wh..wh..opq` markers). */
  opaque?: string[];
  /** Symlinks: path -> target. */
  symlinks?: Record<string, string>;
}

/** Write an OCI layer's directory form (to be tarred by buildOciArchive). */
export function buildLayerDir(dir: string, spec: LayerDirSpec): void {
  mkdirSync(dir, { recursive: true });
  chmodSync(dir, 0o755);
  for (const d of spec.opaque ?? []) {
    mkdirSync(join(dir, d), { recursive: true, mode: 0o755 });
    writeFileSync(join(dir, d, '.wh..wh..opq'), '');
  }
  for (const p of spec.remove ?? []) {
    mkdirSync(join(dir, dirname(p)), { recursive: true, mode: 0o755 });
    writeFileSync(join(dir, dirname(p), `.wh.${p.split('/').pop()}`), '');
  }
  for (const [p, content] of Object.entries(spec.files ?? {})) {
    mkdirSync(join(dir, dirname(p)), { recursive: true, mode: 0o755 });
    writeFileSync(join(dir, p), content);
  }
  for (const [p, target] of Object.entries(spec.symlinks ?? {})) {
    mkdirSync(join(dir, dirname(p)), { recursive: true, mode: 0o755 });
    symlinkSync(target, join(dir, p));
  }
}

// ---------------------------------------------------------------- archives

export type LayerCompression = 'none' | 'gzip' | 'zstd';

export interface OciArchiveOptions {
  format: 'docker' | 'oci';
  /** More layer directories applied over the rootfs, bottom first (see buildLayerDir). Or prebuilt layer tars. */
  layers?: Array<string | { tar: string }>;
  /** Per layer (index 0 = rootfs), or one for all. Default: docker none, oci gzip then zstd alternating. */
  compression?: LayerCompression | LayerCompression[];
  /** Tag recorded in the archive. Default "test:latest". */
  tag?: string;
  /** OCI only: index.json -> image index (with a decoy manifest for another platform) -> manifest. */
  nestedIndex?: boolean;
  /** Compress the whole archive too. */
  outerCompression?: 'none' | 'gzip';
  /** GNU tar --format for the layer tars (default: gnu for docker, posix for oci). */
  tarFormat?: 'gnu' | 'posix' | 'ustar';
}

const sha256 = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

function tarDir(dir: string, out: string, format: string): void {
  execFileSync('tar', [`--format=${format}`, '--sort=name', '--numeric-owner', '-C', dir, '-cf', out, '.'], { stdio: ['ignore', 'ignore', 'pipe'] });
}

function compress(file: string, how: LayerCompression): string {
  if (how === 'none') return file;
  if (how === 'gzip') {
    execFileSync('gzip', ['-n', '-f', file]);
    return `${file}.gz`;
  }
  execFileSync('zstd', ['-q', '-f', '--rm', file]);
  return `${file}.zst`;
}

const LAYER_MEDIA: Record<LayerCompression, string> = {
  none: 'application/vnd.oci.image.layer.v1.tar',
  gzip: 'application/vnd.oci.image.layer.v1.tar+gzip',
  zstd: 'application/vnd.oci.image.layer.v1.tar+zstd',
};

interface BuiltLayer {
  /** The blob as stored (maybe compressed). */
  file: string;
  digest: string;
  diffId: string;
  size: number;
  compression: LayerCompression;
}

/**
 * Write a real `docker save` archive or OCI image layout tar of `rootfsDir`
 * (the bottom layer) plus `opts.layers`, with GNU tar and sha256 digests.
 * Returns the digests of the layer blobs.
 */
export function buildOciArchive(rootfsDir: string, outTar: string, opts: OciArchiveOptions): { layers: string[]; diffIds: string[] } {
  const work = mkdtempSync(join(tmpdir(), 'warren-oci-'));
  try {
    const stage = join(work, 'stage');
    mkdirSync(stage);
    const sources: Array<string | { tar: string }> = [rootfsDir, ...(opts.layers ?? [])];
    const comp = (i: number): LayerCompression => {
      if (Array.isArray(opts.compression)) return opts.compression[i] ?? 'none';
      if (opts.compression) return opts.compression;
      return opts.format === 'docker' ? 'none' : i % 2 === 0 ? 'gzip' : 'zstd';
    };
    const tarFormat = opts.tarFormat ?? (opts.format === 'docker' ? 'gnu' : 'posix');
    const layers: BuiltLayer[] = sources.map((src, i) => {
      const raw = join(work, `layer${i}.tar`);
      if (typeof src === 'string') tarDir(src, raw, tarFormat);
      else copyFileSync(src.tar, raw);
      const diffId = `sha256:${sha256(readFileSync(raw))}`;
      const file = compress(raw, comp(i));
      const data = readFileSync(file);
      return { file, digest: `sha256:${sha256(data)}`, diffId, size: data.length, compression: comp(i) };
    });
    const platform = hostPlatform();
    const config = {
      architecture: platform.architecture,
      os: 'linux',
      config: { Env: ['PATH=/usr/sbin:/usr/bin:/sbin:/bin'], Cmd: ['/bin/sh'], WorkingDir: '/root' },
      rootfs: { type: 'layers', diff_ids: layers.map((l) => l.diffId) },
      history: layers.map(() => ({ created_by: 'warren test fixture' })),
    };
    const configBuf = Buffer.from(JSON.stringify(config));
    const tag = opts.tag ?? 'test:latest';
    let members: string[];

    if (opts.format === 'docker') {
      const configName = `${sha256(configBuf)}.json`;
      writeFileSync(join(stage, configName), configBuf);
      const layerPaths: string[] = [];
      let parent = '';
      for (const l of layers) {
        const id = sha256(`${parent}\n${l.diffId}`);
        mkdirSync(join(stage, id));
        renameSync(l.file, join(stage, id, 'layer.tar'));
        writeFileSync(join(stage, id, 'VERSION'), '1.0');
        writeFileSync(join(stage, id, 'json'), JSON.stringify({ id, ...(parent ? { parent } : {}) }));
        layerPaths.push(`${id}/layer.tar`);
        parent = id;
      }
      writeFileSync(join(stage, 'manifest.json'), JSON.stringify([{ Config: configName, RepoTags: [tag], Layers: layerPaths }]));
      const [repo, t] = tag.split(':');
      writeFileSync(join(stage, 'repositories'), JSON.stringify({ [repo!]: { [t ?? 'latest']: parent } }));
      members = ['manifest.json', 'repositories', configName, ...layerPaths.map((p) => p.split('/')[0]!)];
    } else {
      const blobs = join(stage, 'blobs', 'sha256');
      mkdirSync(blobs, { recursive: true });
      const putBlob = (buf: Buffer) => {
        const hex = sha256(buf);
        writeFileSync(join(blobs, hex), buf);
        return { digest: `sha256:${hex}`, size: buf.length };
      };
      for (const l of layers) renameSync(l.file, join(blobs, l.digest.slice(7)));
      const cfg = putBlob(configBuf);
      const manifest = Buffer.from(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: 'application/vnd.oci.image.manifest.v1+json',
          config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...cfg },
          layers: layers.map((l) => ({ mediaType: LAYER_MEDIA[l.compression], digest: l.digest, size: l.size })),
        }),
      );
      const man = putBlob(manifest);
      let top = { mediaType: 'application/vnd.oci.image.manifest.v1+json', ...man };
      if (opts.nestedIndex) {
        // A decoy image for another platform, listed first.
        const decoyDir = join(work, 'decoy');
        buildLayerDir(decoyDir, { files: { 'etc/decoy': 'wrong platform\n' } });
        const decoyTar = join(work, 'decoy.tar');
        tarDir(decoyDir, decoyTar, 'posix');
        const decoyLayer = putBlob(readFileSync(decoyTar));
        const decoyCfg = putBlob(Buffer.from(JSON.stringify({ architecture: 's390x', os: 'linux', rootfs: { type: 'layers', diff_ids: [decoyLayer.digest] } })));
        const decoyMan = putBlob(
          Buffer.from(
            JSON.stringify({
              schemaVersion: 2,
              mediaType: 'application/vnd.oci.image.manifest.v1+json',
              config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...decoyCfg },
              layers: [{ mediaType: LAYER_MEDIA.none, ...decoyLayer }],
            }),
          ),
        );
        const idx = putBlob(
          Buffer.from(
            JSON.stringify({
              schemaVersion: 2,
              mediaType: 'application/vnd.oci.image.index.v1+json',
              manifests: [
                { mediaType: 'application/vnd.oci.image.manifest.v1+json', ...decoyMan, platform: { os: 'linux', architecture: 's390x' } },
                { mediaType: 'application/vnd.oci.image.manifest.v1+json', ...man, platform: { os: 'linux', architecture: platform.architecture } },
              ],
            }),
          ),
        );
        top = { mediaType: 'application/vnd.oci.image.index.v1+json', ...idx };
      }
      writeFileSync(join(stage, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
      writeFileSync(
        join(stage, 'index.json'),
        JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.index.v1+json', manifests: [{ ...top, annotations: { 'org.opencontainers.image.ref.name': tag.split(':')[1] ?? 'latest', 'io.containerd.image.name': tag } }] }),
      );
      members = ['.'];
    }
    const plain = opts.outerCompression === 'gzip' ? join(work, 'outer.tar') : outTar;
    execFileSync('tar', ['--sort=name', '--numeric-owner', '-C', stage, '-cf', plain, ...members], { stdio: ['ignore', 'ignore', 'pipe'] });
    if (opts.outerCompression === 'gzip') writeFileSync(outTar, execFileSync('gzip', ['-n', '-c', plain], { maxBuffer: 1 << 30 }));
    return { layers: layers.map((l) => l.digest), diffIds: layers.map((l) => l.diffId) };
  } finally {
    execFileSync('rm', ['-rf', work]);
  }
}

// ---------------------------------------------------------------- raw tars

export interface RawTarEntry {
  name: string;
  type?: 'file' | 'dir' | 'symlink' | 'hardlink' | 'fifo';
  data?: string | Buffer;
  linkname?: string;
  mode?: number;
  /** Raw typeflag (e.g. 'x' or 'g' for pax headers, whose `data` is the records); overrides `type`. */
  typeflag?: string;
  /** Break the header checksum. */
  badChecksum?: boolean;
}

/** pax extended header records for makeTar entries of typeflag 'x' / 'g'. */
export function paxRecords(records: Record<string, string>): Buffer {
  const out: Buffer[] = [];
  for (const [k, v] of Object.entries(records)) {
    const body = ` ${k}=${v}\n`;
    let len = Buffer.byteLength(body) + 1;
    while (String(len).length + Buffer.byteLength(body) !== len) len = String(len).length + Buffer.byteLength(body);
    out.push(Buffer.from(`${len}${body}`));
  }
  return Buffer.concat(out);
}

/** A ustar archive with exactly these headers (no normalization: for hostile inputs). Names up to 100 bytes. */
export function makeTar(entries: RawTarEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const data = Buffer.from(e.data ?? '');
    const h = Buffer.alloc(512);
    const type = e.type ?? 'file';
    const hasData = e.typeflag !== undefined || type === 'file';
    h.write(e.name, 0, 100, 'utf8');
    h.write(((e.mode ?? (type === 'dir' ? 0o755 : 0o644)).toString(8).padStart(7, '0')) + '\0', 100, 'latin1');
    h.write('0000000\0', 108, 'latin1');
    h.write('0000000\0', 116, 'latin1');
    h.write((hasData ? data.length : 0).toString(8).padStart(11, '0') + '\0', 124, 'latin1');
    h.write('00000000000\0', 136, 'latin1');
    h.write(e.typeflag ?? { file: '0', dir: '5', symlink: '2', hardlink: '1', fifo: '6' }[type], 156, 'latin1');
    if (e.linkname) h.write(e.linkname, 157, 100, 'utf8');
    h.write('ustar\0', 257, 'latin1');
    h.write('00', 263, 'latin1');
    h.fill(0x20, 148, 156);
    let sum = 0;
    for (const b of h) sum += b;
    if (e.badChecksum) sum += 1;
    h.write(sum.toString(8).padStart(6, '0') + '\0 ', 148, 'latin1');
    blocks.push(h);
    if (hasData && data.length > 0) {
      blocks.push(data, Buffer.alloc((512 - (data.length % 512)) % 512));
    }
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

// ---------------------------------------------------------------- store fixture

export interface TestStore {
  store: LayerStore;
  dataDir: string;
  db: SqlDatabase & { close(): void };
}

export function openSqlite(path: string): SqlDatabase & { close(): void } {
  // better-sqlite3 ships no type declarations here; the store needs only SqlDatabase.
  // eslint-disable-next-line @typescript-eslint/no-var-requires
  const Database = require('better-sqlite3') as new (file: string) => SqlDatabase & { close(): void; pragma(s: string): unknown };
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  db.pragma('foreign_keys = ON');
  db.pragma('busy_timeout = 5000');
  return db;
}

/** Every mount on `path` in this mount namespace. */
export function mountsAt(path: string): number {
  return readMountInfo().filter((m) => m.mountPoint === path).length;
}

export function loopDevices(): string {
  try {
    return execFileSync('losetup', ['-a'], { encoding: 'utf8' });
  } catch {
    return '';
  }
}

/**
 * A temp data dir, SQLite db and initialised LayerStore for `fn`; afterwards the
 * store is closed, its layers unmounted and everything deleted, whatever happened.
 */
export async function withTestStore<T>(fn: (ctx: TestStore) => Promise<T>, opts: Partial<Omit<LayerStoreOptions, 'db'>> = {}): Promise<T> {
  const dataDir = opts.dataDir ?? mkdtempSync(join(tmpdir(), 'warren-layers-'));
  const db = openSqlite(join(dataDir, 'warren.db'));
  const store = new LayerStore({ ...opts, dataDir, db });
  try {
    store.init();
    return await fn({ store, dataDir, db });
  } finally {
    store.close();
    try {
      store.unmountUnused();
      await store.closeLazy();
    } catch {
      /* removeTree below detaches whatever is left */
    }
    db.close();
    // A failed test may leave a lazy layer held: its file server outlives closeLazy; end it with the data dir.
    let lazyPid = 0;
    try {
      lazyPid = Number(readFileSync(join(dataDir, 'layers/lazy/daemon.pid'), 'utf8').trim());
    } catch {
      /* none ran or it stopped */
    }
    removeTree(dataDir);
    if (Number.isInteger(lazyPid) && lazyPid > 0) {
      try {
        process.kill(lazyPid, 'SIGKILL');
      } catch {
        /* already gone */
      }
    }
  }
}
