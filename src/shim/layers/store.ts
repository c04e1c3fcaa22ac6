/**
 * The layer store: content-addressed, read-only EROFS layers on this node, the
 * images (named, ordered lists of layers) built from them, and the node-level
 * cache of mounted layers that sandboxes stack with overlayfs.
 *
 * On disk, under <dataDir>/layers:
 *   blobs/<hex>.erofs   one immutable file per layer; digest = sha256 of the file
 *   mnt/<hex>           where that layer is mounted (once per node, read-only)
 *   tmp/                scratch space of running imports (<op>-<pid>-<random>)
 *   lazy/                warren-lazyfs: layers mounted from a registry without their blob (lazy.ts)
 * In the shared SQLite database: layer_blobs, image_images, image_layers, and
 * layer_remote (where a layer without a local blob is read from).
 *
 * Mounts are node state, not process state: they outlive the gateway, and a new
 * store adopts what /proc/self/mountinfo shows instead of mounting again.
 * Refcounts are process state: whoever re-adopts a sandbox acquires its layers again.
 */
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  linkSync,
  mkdirSync,
  openSync,
  readSync,
  readFileSync,
  writeFileSync,
  closeSync,
  readdirSync,
  realpathSync,
  renameSync,
  rmdirSync,
  rmSync,
  statSync,
  statfsSync,
  unlinkSync,
  createWriteStream,
  createReadStream,
} from 'node:fs';
import { join } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { WarrenError, asWarrenError } from '../../errors';
import type { ImageInfo, ImportProgress, ResolvedLayer } from '../types';
import { debianCachePath, debianLayerCachePath, normalizeDebianOptions, runAptLayer, runDebootstrap, scrubDebianRoot, scrubLayerUpper, DEFAULT_CACHE_DIR, type DebianOptions } from './debian';
import { EROFS_MAGIC, LAYER_EPOCH, assertErofsImage, mkfsErofs, sha256File, type ErofsCompression } from './erofs';
import { alignPycTimestamps } from './pyc';
import { ArchiveReader, decompress, detectCompression, openLayer, readArchiveImage, type ArchiveImage } from './oci';
import { assertDigest, nameCandidates, parseName, parseRef } from './refs';
import { RootfsBuilder } from './rootfs';
import { native } from '../../native';
import { LazyLayers, type LazyStats } from './lazy';
import { RegistryClient, parseRegistryRef, type RegistryConfig } from './distribution';
import { LAYER_MOUNT_FLAGS, hasLayerMountFlags, mountErofsAsync, nativeMounter, readMountInfo, removeTree, type LayerMounter, type MountInfo } from './sys';
import { checkConfined, readTarStream, type TarEntry } from './tar';

export type ImageKind = ImageInfo['kind'];
const KINDS: readonly ImageKind[] = ['base', 'workspace', 'toolkit'];

export type SqlDatabase = import('better-sqlite3').Database;

export interface LayerStoreOptions {
  dataDir: string;
  /** The node's SQLite database (better-sqlite3), shared with other components. */
  db: SqlDatabase;
  log?: (msg: string) => void;
  /** Node-wide cache of built images (Debian). Default $WARREN_CACHE_DIR or /var/cache/warren. */
  cacheDir?: string;
  /** How layers are mounted; default: mount(2) directly (file-backed EROFS). */
  mounter?: LayerMounter;
  /** EROFS compression of new layers (default lz4hc). Part of a layer's identity. */
  compression?: ErofsCompression;
  /** Registries (auth, TLS) by host[:port], for pulls, pushes and lazily loaded layers. */
  registries?: RegistryConfig;
  /** Bound of the node's chunk cache of lazily loaded layers (bytes; default 4 GiB). */
  lazyCacheBytes?: number;
  /** How `pull` fetches layers when the request does not say: 'lazy' (default where warren-lazyfs works) or 'eager'. */
  pullMode?: PullMode;
}

export type PullMode = 'lazy' | 'eager';

/** Where a layer's bytes are on this node: its blob ('local'), a registry it can be mounted from ('lazy'), or nowhere. */
export type LayerAvailability = 'local' | 'lazy' | 'absent';

/** Where a layer without a local blob is read from (table layer_remote). */
export interface RemoteLayer {
  digest: string;
  /** scheme://host[:port] */
  base: string;
  repository: string;
  size: number;
  chunkSize: number;
  chunks: Buffer;
}

export interface ImportOptions {
  /** `name` or `name:tag`; importing under an existing name moves the name to the new content. */
  name: string;
  kind?: ImageKind;
  onProgress?: (p: ImportProgress) => void;
  /** EROFS compression for this layer (default: the store's). lz4 packs ~5x faster, lz4hc ~8% smaller. */
  compression?: ErofsCompression;
}

export interface ArchiveImportOptions extends ImportOptions {
  /** Which image of a multi-image archive (a RepoTag or OCI ref.name). */
  ref?: string;
}

export interface DebianBuildOptions extends DebianOptions {
  name: string;
  kind?: ImageKind;
  onProgress?: (p: ImportProgress) => void;
  /** Build even when the node cache has the image (and replace the cached file). */
  refresh?: boolean;
}

export interface LayerInfo {
  digest: string;
  /** The image that consists of exactly this layer, if any. */
  name: string | null;
  kind: ImageKind;
  sizeBytes: number;
  createdAt: string;
  source: string;
}

export interface LayerMountState {
  digest: string;
  path: string;
  /** Holders in this process (acquire minus release). */
  refs: number;
  mounted: boolean;
  /** Mounted before this store started (by an earlier gateway process) and taken over. */
  adopted: boolean;
}

/** Parts of an image config worth keeping for sandboxes (from OCI/docker archives). */
export interface ImageRuntimeConfig {
  env?: string[];
  cmd?: string[];
  entrypoint?: string[];
  workingDir?: string;
  user?: string;
}

interface MountState {
  digest: string;
  path: string;
  refs: number;
  mounted: boolean;
  adopted: boolean;
}

interface ImageRow {
  name: string;
  digest: string;
  kind: ImageKind;
  created_at: string;
  source: string;
  config: string | null;
}

const HEX_RE = /^[a-f0-9]{64}$/;

function hexOf(digest: string): string {
  return digest.slice('sha256:'.length);
}

/** An image's digest: its layer's digest when it has one layer, else the hash of the ordered layer list. */
export function imageDigest(layers: string[]): string {
  if (layers.length === 1) return layers[0]!;
  return 'sha256:' + createHash('sha256').update(JSON.stringify({ layers })).digest('hex');
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function throttle(fn: (p: ImportProgress) => void, ms = 200): (p: ImportProgress, force?: boolean) => void {
  let last = 0;
  return (p, force = false) => {
    const now = Date.now();
    if (!force && now - last < ms) return;
    last = now;
    fn(p);
  };
}

export class LayerStore {
  readonly dataDir: string;
  readonly cacheDir: string;
  /** How many times this store mounted, adopted and unmounted a layer (for tests and metrics). */
  readonly counters = { mounts: 0, adoptions: 0, unmounts: 0 };

  private readonly db: SqlDatabase;
  private readonly log: (msg: string) => void;
  private readonly mounter: LayerMounter;
  private readonly compression: ErofsCompression;
  private root = '';
  private blobsDir = '';
  private mntDir = '';
  private tmpDir = '';
  /** When this process last fetched apt's package lists for layer builds (0: never). */
  private aptListsAt = 0;
  private initialized = false;
  private closed = false;
  private readonly mounts = new Map<string, MountState>();
  readonly registries: RegistryConfig;
  readonly pullMode: PullMode | undefined;
  private readonly lazyCacheBytes: number | undefined;
  private lazyLayers: LazyLayers | null = null;
  private readonly lazyPending = new Map<string, Promise<void>>();

  constructor(opts: LayerStoreOptions) {
    this.dataDir = opts.dataDir;
    this.db = opts.db;
    this.log = opts.log ?? (() => undefined);
    this.cacheDir = opts.cacheDir ?? process.env.WARREN_CACHE_DIR ?? DEFAULT_CACHE_DIR;
    this.mounter = opts.mounter ?? nativeMounter(native, this.log);
    this.compression = opts.compression ?? 'lz4hc';
    this.registries = opts.registries ?? {};
    this.pullMode = opts.pullMode;
    this.lazyCacheBytes = opts.lazyCacheBytes;
  }

  /** Every create resolves its image and layers (twice: the access check and the create): compile each query once. */
  private readonly statements = new Map<string, import('better-sqlite3').Statement>();
  private sql(text: string): import('better-sqlite3').Statement {
    let st = this.statements.get(text);
    if (st === undefined) {
      st = this.db.prepare(text);
      this.statements.set(text, st);
    }
    return st;
  }

  /** The node's lazy layer file server (created by init()). */
  get lazy(): LazyLayers {
    this.ready();
    return this.lazyLayers!;
  }

  /** Create the tables and directories; remove scratch space left by crashed imports. Idempotent. */
  init(): void {
    if (this.initialized) return;
    mkdirSync(join(this.dataDir, 'layers'), { recursive: true, mode: 0o755 });
    // mountinfo shows canonical paths.
    this.root = realpathSync(join(this.dataDir, 'layers'));
    this.blobsDir = join(this.root, 'blobs');
    this.mntDir = join(this.root, 'mnt');
    this.tmpDir = join(this.root, 'tmp');
    mkdirSync(this.blobsDir, { recursive: true, mode: 0o700 });
    mkdirSync(this.mntDir, { recursive: true, mode: 0o755 });
    mkdirSync(this.tmpDir, { recursive: true, mode: 0o700 });
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS layer_blobs (
        digest     TEXT PRIMARY KEY,
        size_bytes INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        source     TEXT NOT NULL
      );
      CREATE TABLE IF NOT EXISTS image_images (
        name       TEXT PRIMARY KEY,
        digest     TEXT NOT NULL,
        kind       TEXT NOT NULL CHECK (kind IN ('base', 'workspace', 'toolkit')),
        created_at TEXT NOT NULL,
        source     TEXT NOT NULL,
        config     TEXT
      );
      CREATE TABLE IF NOT EXISTS image_layers (
        image_name TEXT NOT NULL REFERENCES image_images(name) ON DELETE CASCADE,
        position   INTEGER NOT NULL,
        digest     TEXT NOT NULL REFERENCES layer_blobs(digest),
        PRIMARY KEY (image_name, position)
      );
      CREATE INDEX IF NOT EXISTS image_layers_by_digest ON image_layers(digest);
      CREATE TABLE IF NOT EXISTS layer_remote (
        digest      TEXT PRIMARY KEY REFERENCES layer_blobs(digest),
        base        TEXT NOT NULL,
        repository  TEXT NOT NULL,
        size_bytes  INTEGER NOT NULL,
        chunk_size  INTEGER NOT NULL,
        chunks      BLOB NOT NULL
      );
      CREATE INDEX IF NOT EXISTS image_images_by_digest ON image_images(digest);
    `);
    for (const name of readdirSync(this.tmpDir)) {
      const pid = Number(/^[a-z]+-(\d+)-/.exec(name)?.[1] ?? NaN);
      if (Number.isInteger(pid) && pid !== process.pid && pidAlive(pid)) continue;
      if (pid === process.pid) continue;
      this.log(`layers: removing scratch ${name} left by an interrupted import`);
      try {
        removeTree(join(this.tmpDir, name), this.mounter);
      } catch (err) {
        this.log(`layers: cannot remove ${name}: ${asWarrenError(err).message}`);
      }
    }
    this.lazyLayers = new LazyLayers({ root: this.root, cacheBytes: this.lazyCacheBytes, log: this.log, mounter: this.mounter });
    for (const d of this.lazyLayers.recover()) this.log(`layers: ${d} must be mounted again`);
    this.initialized = true;
  }

  private ready(): void {
    if (!this.initialized) throw new WarrenError('INTERNAL', 'LayerStore.init() was not called');
  }

  private open(): void {
    this.ready();
    if (this.closed) throw new WarrenError('UNAVAILABLE', 'the layer store is closed');
  }

  /** Stop taking acquires and imports. Mounts stay until unmountUnused (the node calls it as it stops); release still works. */
  close(): void {
    this.closed = true;
    if (this.aptListsAt !== 0) rmSync(join(this.tmpDir, `aptlists-${process.pid}-shared`), { recursive: true, force: true });
  }

  // ---------------------------------------------------------------- lookup

  blobPath(digest: string): string {
    this.ready();
    return join(this.blobsDir, `${hexOf(assertDigest(digest))}.erofs`);
  }

  mountPath(digest: string): string {
    this.ready();
    return join(this.mntDir, hexOf(assertDigest(digest)));
  }

  private imageRow(name: string): ImageRow | undefined {
    return this.sql('SELECT name, digest, kind, created_at, source, config FROM image_images WHERE name = ?').get(name) as ImageRow | undefined;
  }

  private findImageRow(ref: { name: string; repository: string; tag: string | null }): ImageRow | undefined {
    for (const n of nameCandidates(ref)) {
      const row = this.imageRow(n);
      if (row) return row;
    }
    return undefined;
  }

  private toInfo(row: ImageRow): ImageInfo {
    const layers = this.sql('SELECT l.digest AS digest, b.size_bytes AS size FROM image_layers l JOIN layer_blobs b ON b.digest = l.digest WHERE l.image_name = ? ORDER BY l.position')
      .all(row.name) as Array<{ digest: string; size: number }>;
    return {
      name: row.name,
      digest: row.digest,
      kind: row.kind,
      layers: layers.map((l) => l.digest),
      sizeBytes: layers.reduce((n, l) => n + l.size, 0),
      createdAt: row.created_at,
      source: row.source,
    };
  }

  listImages(): ImageInfo[] {
    this.ready();
    const rows = this.sql('SELECT name, digest, kind, created_at, source, config FROM image_images ORDER BY name').all() as ImageRow[];
    return rows.map((r) => this.toInfo(r));
  }

  /** An image by `name`, `name:tag`, or the `sha256:` digest of an image or of a single layer. */
  resolveImage(ref: string): ImageInfo {
    this.ready();
    const r = parseRef(ref);
    if (r.type === 'name') {
      const row = this.findImageRow(r);
      if (!row) throw new WarrenError('IMAGE_NOT_FOUND', `image ${JSON.stringify(ref)} not found`, { ref });
      return this.toInfo(row);
    }
    const row = this.sql('SELECT name, digest, kind, created_at, source, config FROM image_images WHERE digest = ? ORDER BY name LIMIT 1').get(r.digest) as ImageRow | undefined;
    if (row) return this.toInfo(row);
    const layer = this.layerRow(r.digest);
    if (!layer) throw new WarrenError('IMAGE_NOT_FOUND', `image ${ref} not found`, { ref });
    return { name: r.digest, digest: r.digest, kind: 'base', layers: [r.digest], sizeBytes: layer.size_bytes, createdAt: layer.created_at, source: layer.source };
  }

  /** Names of the images whose image digest is `digest` (a single-layer image's digest is its layer's). */
  imageNamesWithDigest(digest: string): string[] {
    this.ready();
    return (this.sql('SELECT name FROM image_images WHERE digest = ? ORDER BY name').all(assertDigest(digest)) as Array<{ name: string }>).map((r) => r.name);
  }

  /** Names of the images that have `digest` among their layers. */
  imageNamesWithLayer(digest: string): string[] {
    this.ready();
    return (this.sql('SELECT DISTINCT image_name AS name FROM image_layers WHERE digest = ? ORDER BY image_name').all(assertDigest(digest)) as Array<{ name: string }>).map((r) => r.name);
  }

  private layerRow(digest: string): { digest: string; size_bytes: number; created_at: string; source: string } | undefined {
    return this.sql('SELECT digest, size_bytes, created_at, source FROM layer_blobs WHERE digest = ?').get(digest) as
      | { digest: string; size_bytes: number; created_at: string; source: string }
      | undefined;
  }

  /**
   * A single layer to stack on an image: a workspace or toolkit by name, or any
   * layer by digest. With `kind`, a name must denote an image of that kind.
   */
  resolveLayer(ref: string, kind?: ImageKind): LayerInfo {
    this.ready();
    if (kind !== undefined && !KINDS.includes(kind)) throw new WarrenError('INVALID_ARGUMENT', `invalid layer kind ${JSON.stringify(kind)}`);
    const r = parseRef(ref);
    const what = kind ?? 'layer';
    if (r.type === 'digest') {
      const layer = this.layerRow(r.digest);
      if (!layer) throw new WarrenError('LAYER_NOT_FOUND', `${what} ${ref} not found`, { ref });
      const owners = this.sql(
        `SELECT i.name AS name, i.kind AS kind FROM image_images i
           WHERE i.digest = ? AND (SELECT COUNT(*) FROM image_layers l WHERE l.image_name = i.name) = 1 ORDER BY i.name`,
      ).all(r.digest) as Array<{ name: string; kind: ImageKind }>;
      const owner = owners.find((o) => o.kind === kind) ?? owners[0];
      return { digest: r.digest, name: owner?.name ?? null, kind: kind ?? owner?.kind ?? 'base', sizeBytes: layer.size_bytes, createdAt: layer.created_at, source: layer.source };
    }
    const row = this.findImageRow(r);
    if (!row) throw new WarrenError('LAYER_NOT_FOUND', `${what} ${JSON.stringify(ref)} not found`, { ref });
    if (kind !== undefined && row.kind !== kind) {
      throw new WarrenError('LAYER_NOT_FOUND', `${what} ${JSON.stringify(ref)} not found (${JSON.stringify(row.name)} is a ${row.kind} image)`, { ref });
    }
    const info = this.toInfo(row);
    if (info.layers.length !== 1) {
      throw new WarrenError('INVALID_ARGUMENT', `${JSON.stringify(row.name)} has ${info.layers.length} layers; workspaces and toolkits are single layers`, { ref });
    }
    return { digest: info.layers[0]!, name: row.name, kind: row.kind, sizeBytes: info.sizeBytes, createdAt: row.created_at, source: row.source };
  }

  /** Env, cmd, working dir and user recorded from an imported OCI/docker image; null when there is none. */
  imageConfig(ref: string): ImageRuntimeConfig | null {
    this.ready();
    const r = parseRef(ref);
    const row = r.type === 'name' ? this.findImageRow(r) : (this.sql('SELECT * FROM image_images WHERE digest = ? ORDER BY name LIMIT 1').get(r.digest) as ImageRow | undefined);
    if (!row) throw new WarrenError('IMAGE_NOT_FOUND', `image ${JSON.stringify(ref)} not found`, { ref });
    return row.config ? (JSON.parse(row.config) as ImageRuntimeConfig) : null;
  }

  // ---------------------------------------------------------------- mounts

  private state(digest: string): MountState {
    let st = this.mounts.get(digest);
    if (!st) {
      st = { digest, path: this.mountPath(digest), refs: 0, mounted: false, adopted: false };
      this.mounts.set(digest, st);
    }
    return st;
  }

  private static at(infos: MountInfo[], path: string): MountInfo[] {
    return infos.filter((m) => m.mountPoint === path);
  }

  /** Make sure the layer is mounted; adopt a mount made by an earlier process. Synchronous: one mount per layer, ever. */
  private ensureMounted(st: MountState, infos: () => MountInfo[]): void {
    if (st.refs > 0 && st.mounted) return;
    // Mounted here before and still an EROFS mount point: one statfs instead of reading the whole
    // mount table (which grows with every sandbox's disk) on each create from an idle layer.
    if (st.mounted && isErofsMountPoint(st.path)) return;
    const blob = this.layerFile(st.digest);
    const here = LayerStore.at(infos(), st.path);
    if (here.length > 0) {
      const foreign = here.find((m) => m.fstype !== 'erofs');
      if (foreign) throw new WarrenError('MOUNT_ERROR', `${st.path} has a ${foreign.fstype} mount that is not this layer`);
      if (!st.mounted && st.refs === 0 && !here.every(hasLayerMountFlags)) {
        // A mount made before layers were mounted nodev,nosuid,noexec: replace it. Sandboxes
        // already running keep their overlay's own reference to the old one.
        if (blob === null) throw new WarrenError('LAYER_NOT_FOUND', `layer ${st.digest} has no blob on this node`, { digest: st.digest });
        for (let i = 0; i < here.length; i++) this.mounter.umount(st.path, true);
        this.log(`layers: remounting ${st.digest} with ${LAYER_MOUNT_FLAGS.join(',')}`);
        this.mounter.mountErofs(blob, st.path);
        this.counters.mounts++;
        st.mounted = true;
        st.adopted = false;
        return;
      }
      if (!st.mounted) {
        st.adopted = true;
        this.counters.adoptions++;
        this.log(`layers: adopted existing mount of ${st.digest}`);
      }
      st.mounted = true;
      // Two processes raced and both mounted: drop the extras (nobody in this process holds the layer yet).
      for (let i = 1; i < here.length; i++) {
        try {
          this.mounter.umount(st.path);
          this.log(`layers: removed a duplicate mount of ${st.digest}`);
        } catch (err) {
          this.log(`layers: cannot remove duplicate mount of ${st.digest}: ${asWarrenError(err).message}`);
          break;
        }
      }
      return;
    }
    if (blob === null) throw new WarrenError('LAYER_NOT_FOUND', `layer ${st.digest} has no blob on this node and no registry to read it from`, { digest: st.digest });
    mkdirSync(st.path, { recursive: true, mode: 0o755 });
    try {
      this.mounter.mountErofs(blob, st.path);
    } catch (err) {
      try {
        rmdirSync(st.path);
      } catch {
        /* leave it */
      }
      throw err;
    }
    this.counters.mounts++;
    st.mounted = true;
    st.adopted = false;
  }

  /**
   * Mount the layers that are not mounted yet (each once per node) and take a
   * reference on every one. Returns their mount points in the given order.
   * All or nothing: on failure no reference is kept.
   */
  async acquire(digests: string[]): Promise<ResolvedLayer[]> {
    this.open();
    if (!Array.isArray(digests)) throw new WarrenError('INVALID_ARGUMENT', 'digests must be an array');
    for (const d of digests) {
      assertDigest(d);
      if (!this.layerRow(d)) throw new WarrenError('LAYER_NOT_FOUND', `layer ${d} not found`, { digest: d });
    }
    await this.prepareLazy(digests);
    let cached: MountInfo[] | null = null;
    const infos = () => (cached ??= readMountInfo());
    const taken: MountState[] = [];
    try {
      for (const d of digests) {
        const st = this.state(d);
        this.ensureMounted(st, infos);
        st.refs++;
        taken.push(st);
      }
    } catch (err) {
      for (const st of taken) st.refs--;
      throw err;
    }
    return taken.map((st) => ({ digest: st.digest, path: st.path, file: this.layerFile(st.digest) ?? this.blobPath(st.digest) }));
  }

  // ---------------------------------------------------------------- lazy layers

  /** The file a layer is mounted from: its blob, else its lazy file (null: neither). */
  private layerFile(digest: string): string | null {
    const blob = this.blobPath(digest);
    if (existsSync(blob)) return blob;
    if (this.remoteLayer(digest)) return this.lazy.filePath(digest);
    return null;
  }

  /** Where a layer without a local blob is read from, or null. */
  remoteLayer(digest: string): RemoteLayer | null {
    const r = this.sql('SELECT digest, base, repository, size_bytes, chunk_size, chunks FROM layer_remote WHERE digest = ?').get(digest) as
      | { digest: string; base: string; repository: string; size_bytes: number; chunk_size: number; chunks: Buffer }
      | undefined;
    return r ? { digest: r.digest, base: r.base, repository: r.repository, size: r.size_bytes, chunkSize: r.chunk_size, chunks: r.chunks } : null;
  }

  /**
   * Mount the lazily loaded layers among `digests` that are not mounted: start the
   * file server, describe each layer to it, and mount(2) in a child process (the
   * kernel reads the superblock through the registry meanwhile). ensureMounted
   * then finds them mounted.
   */
  private async prepareLazy(digests: string[]): Promise<void> {
    for (const d of new Set(digests)) {
      if (existsSync(this.blobPath(d)) || !this.remoteLayer(d)) continue;
      let pending = this.lazyPending.get(d);
      if (!pending) {
        pending = this.mountLazy(d).finally(() => this.lazyPending.delete(d));
        this.lazyPending.set(d, pending);
      }
      await pending;
    }
  }

  private async mountLazy(d: string): Promise<void> {
    const remote = this.remoteLayer(d)!;
    const st = this.state(d);
    if (LayerStore.at(readMountInfo(), st.path).length > 0 && this.lazy.running()) return;
    await this.lazy.ensureRunning();
    const client = new RegistryClient(parseRegistryRef(`${remote.base}/${remote.repository}`, this.registries), this.registries);
    try {
      const access = await client.blobAccess(remote.repository, d);
      this.lazy.describe(d, { url: access.url, size: remote.size, chunkSize: remote.chunkSize, chunks: remote.chunks, authorization: access.authorization, caFile: access.caFile });
    } finally {
      client.close();
    }
    if (LayerStore.at(readMountInfo(), st.path).length > 0) return; // mounted by the recovery above or meanwhile
    mkdirSync(st.path, { recursive: true, mode: 0o755 });
    try {
      await mountErofsAsync(this.lazy.filePath(d), st.path);
    } catch (err) {
      try {
        rmdirSync(st.path);
      } catch {
        /* leave it */
      }
      const e = asWarrenError(err);
      throw new WarrenError('MOUNT_ERROR', `${e.message}; lazy file server: ${this.lazy.logTail(3)}`, { digest: d });
    }
    this.counters.mounts++;
    st.mounted = true;
    st.adopted = false;
  }

  /**
   * Where each layer's bytes are on this node, for placement: 'local' (its blob is
   * here), 'lazy' (no blob, but it can be mounted from a registry, reading only
   * what is used), 'absent'. `mounted` says whether it is mounted now.
   */
  layerStates(digests: string[]): Array<{ digest: string; state: LayerAvailability; mounted: boolean }> {
    this.ready();
    const infos = readMountInfo();
    return digests.map((d) => {
      assertDigest(d);
      const known = this.layerRow(d) !== undefined;
      const state: LayerAvailability = known && existsSync(this.blobPath(d)) ? 'local' : known && this.remoteLayer(d) ? 'lazy' : 'absent';
      return { digest: d, state, mounted: LayerStore.at(infos, this.mountPath(d)).length > 0 };
    });
  }

  /** Every layer this node knows, with its availability (what a node publishes for placement). */
  allLayerStates(): Array<{ digest: string; state: LayerAvailability; mounted: boolean }> {
    const rows = this.sql('SELECT digest FROM layer_blobs ORDER BY digest').all() as Array<{ digest: string }>;
    return this.layerStates(rows.map((r) => r.digest));
  }

  /** The lazy file server's counters (null when it does not run). */
  lazyStats(): LazyStats | null {
    return this.lazy.stats();
  }

  /**
   * For node shutdown: unmount lazily loaded layers nobody holds and, when no
   * lazy mount is left, stop the file server. Lazy layers of sandboxes that
   * outlive the gateway stay mounted and served.
   */
  async closeLazy(): Promise<void> {
    if (!this.initialized) return;
    const infos = readMountInfo();
    for (const m of this.lazy.erofsMountsOnFuse(infos)) {
      const hex = m.mountPoint.slice(this.mntDir.length + 1);
      if (!m.mountPoint.startsWith(this.mntDir + '/') || !HEX_RE.test(hex)) continue;
      const st = this.state(`sha256:${hex}`);
      if (st.refs === 0) this.unmountAll(st);
    }
    // Only mountinfo and the pid file are consulted: touching the FUSE mount itself would wait for the daemon.
    if (this.lazy.erofsMountsOnFuse().length === 0 && (this.lazy.running() || this.lazy.fuseMounted())) await this.lazy.stop();
  }

  /** Record a layer that is read from a registry (no blob here). */
  addRemoteLayer(remote: RemoteLayer, source: string): void {
    this.open();
    assertDigest(remote.digest);
    this.db.transaction(() => {
      this.sql('INSERT OR IGNORE INTO layer_blobs (digest, size_bytes, created_at, source) VALUES (?, ?, ?, ?)').run(remote.digest, remote.size, new Date().toISOString(), source);
      this.db
        .prepare(
          `INSERT INTO layer_remote (digest, base, repository, size_bytes, chunk_size, chunks) VALUES (?, ?, ?, ?, ?, ?)
           ON CONFLICT(digest) DO UPDATE SET base = excluded.base, repository = excluded.repository, size_bytes = excluded.size_bytes,
             chunk_size = excluded.chunk_size, chunks = excluded.chunks`,
        )
        .run(remote.digest, remote.base, remote.repository, remote.size, remote.chunkSize, remote.chunks);
    })();
  }

  /** Take a downloaded, verified blob (`file` on the store's file system, named by its sha256 `hex`) as a layer. */
  addDownloadedBlob(file: string, hex: string, source: string): string {
    this.open();
    assertErofsImage(file);
    const blob = this.finalizeBlob(file, hex);
    this.sql('INSERT OR IGNORE INTO layer_blobs (digest, size_bytes, created_at, source) VALUES (?, ?, ?, ?)').run(blob.digest, blob.size, new Date().toISOString(), source);
    return blob.digest;
  }

  /** Register an image over layers this store already knows (local or lazy), top-most first. */
  registerLayers(opts: { name: string; kind: ImageKind; layers: string[]; source: string; config: ImageRuntimeConfig | null }): ImageInfo {
    const { name, kind } = this.validateImport({ name: opts.name, kind: opts.kind });
    const layers = opts.layers.map((d) => {
      const row = this.layerRow(assertDigest(d));
      if (!row) throw new WarrenError('LAYER_NOT_FOUND', `layer ${d} not found`, { digest: d });
      return { digest: d, size: row.size_bytes, created: false };
    });
    return this.register({ name, kind, layers, source: opts.source, config: opts.config });
  }

  /** Run `fn` in a private scratch directory of the store (removed afterwards). */
  scratch<T>(op: string, fn: (dir: string) => Promise<T>): Promise<T> {
    this.open();
    return this.withScratch(op, fn);
  }

  /** A file to read a layer's bytes from: its blob, else (starting the lazy file server) its lazy file. */
  async readableLayerFile(digest: string): Promise<string> {
    this.ready();
    assertDigest(digest);
    if (existsSync(this.blobPath(digest))) return this.blobPath(digest);
    if (!this.remoteLayer(digest)) throw new WarrenError('LAYER_NOT_FOUND', `layer ${digest} has no blob on this node`, { digest });
    await this.prepareLazy([digest]);
    return this.lazy.filePath(digest);
  }

  /** Drop one reference per digest. Layers stay mounted (node-level cache) until unmountUnused(). */
  release(digests: string[]): void {
    this.ready();
    for (const d of digests) {
      const st = this.mounts.get(d);
      if (!st || st.refs === 0) {
        this.log(`layers: release of ${d}, which is not held`);
        continue;
      }
      st.refs--;
    }
  }

  /** Unmount every layer of this store that nobody in this process holds. Returns the digests unmounted. */
  unmountUnused(): string[] {
    this.ready();
    const infos = readMountInfo();
    const prefix = this.mntDir + '/';
    const candidates = new Set<string>();
    for (const m of infos) {
      if (!m.mountPoint.startsWith(prefix)) continue;
      const hex = m.mountPoint.slice(prefix.length);
      if (HEX_RE.test(hex)) candidates.add(`sha256:${hex}`);
    }
    for (const st of this.mounts.values()) if (st.mounted) candidates.add(st.digest);
    const out: string[] = [];
    for (const digest of candidates) {
      const st = this.state(digest);
      if (st.refs > 0) continue;
      if (this.unmountAll(st, infos)) out.push(digest);
    }
    return out;
  }

  /** Unmount every mount on the layer's mount point; true when none is left. */
  private unmountAll(st: MountState, infos = readMountInfo()): boolean {
    const n = LayerStore.at(infos, st.path).length;
    for (let i = 0; i < n; i++) {
      try {
        this.mounter.umount(st.path);
        this.counters.unmounts++;
      } catch (err) {
        this.log(`layers: cannot unmount ${st.digest}: ${asWarrenError(err).message}`);
        return false;
      }
    }
    st.mounted = false;
    st.adopted = false;
    try {
      rmdirSync(st.path);
    } catch {
      /* already gone */
    }
    return true;
  }

  /** Mount state of every layer this store knows to be mounted or held. */
  mountStates(): LayerMountState[] {
    this.ready();
    const infos = readMountInfo();
    const prefix = this.mntDir + '/';
    for (const m of infos) {
      if (!m.mountPoint.startsWith(prefix)) continue;
      const hex = m.mountPoint.slice(prefix.length);
      if (HEX_RE.test(hex)) this.state(`sha256:${hex}`);
    }
    return [...this.mounts.values()]
      .map((st) => ({ ...st, mounted: LayerStore.at(infos, st.path).length > 0 }))
      .filter((s) => s.mounted || s.refs > 0);
  }

  // ---------------------------------------------------------------- removal

  /**
   * Remove an image. Its layers that no other image uses are unmounted and
   * deleted. Refused with IMAGE_IN_USE while a sandbox holds any of its layers.
   */
  async removeImage(name: string): Promise<{ name: string; removedLayers: string[] }> {
    this.ready();
    const r = parseName(name);
    const row = this.findImageRow(r);
    if (!row) throw new WarrenError('IMAGE_NOT_FOUND', `image ${JSON.stringify(name)} not found`, { ref: name });
    const info = this.toInfo(row);
    const held = info.layers.filter((d) => (this.mounts.get(d)?.refs ?? 0) > 0);
    if (held.length > 0) {
      throw new WarrenError('IMAGE_IN_USE', `image ${JSON.stringify(row.name)} is in use by sandboxes on this node (layers ${held.join(', ')})`, { name: row.name, layers: held });
    }
    const orphans = info.layers.filter(
      (d) => (this.sql('SELECT COUNT(*) AS n FROM image_layers WHERE digest = ? AND image_name != ?').get(d, row.name) as { n: number }).n === 0,
    );
    const infos = readMountInfo();
    for (const d of orphans) {
      const st = this.state(d);
      if (!this.unmountAll(st, infos)) {
        throw new WarrenError('IMAGE_IN_USE', `image ${JSON.stringify(row.name)}: layer ${d} is still mounted and busy`, { name: row.name, layers: [d] });
      }
    }
    this.db.transaction(() => {
      this.sql('DELETE FROM image_layers WHERE image_name = ?').run(row.name);
      this.sql('DELETE FROM image_images WHERE name = ?').run(row.name);
      for (const d of orphans) {
        this.sql('DELETE FROM layer_remote WHERE digest = ? AND NOT EXISTS (SELECT 1 FROM image_layers WHERE digest = ?)').run(d, d);
        this.sql('DELETE FROM layer_blobs WHERE digest = ? AND NOT EXISTS (SELECT 1 FROM image_layers WHERE digest = ?)').run(d, d);
      }
    })();
    for (const d of orphans) {
      this.mounts.delete(d);
      this.lazy.forget(d);
      try {
        unlinkSync(this.blobPath(d));
      } catch {
        /* already gone */
      }
    }
    return { name: row.name, removedLayers: orphans };
  }

  /** Delete layers that no image references and nobody holds (left behind when a name moved to new content). */
  prune(): string[] {
    this.ready();
    const rows = this.sql('SELECT digest FROM layer_blobs WHERE digest NOT IN (SELECT digest FROM image_layers)').all() as Array<{ digest: string }>;
    const infos = readMountInfo();
    const out: string[] = [];
    for (const { digest } of rows) {
      const st = this.state(digest);
      if (st.refs > 0 || !this.unmountAll(st, infos)) continue;
      this.sql('DELETE FROM layer_remote WHERE digest = ? AND NOT EXISTS (SELECT 1 FROM image_layers WHERE digest = ?)').run(digest, digest);
      this.sql('DELETE FROM layer_blobs WHERE digest = ? AND NOT EXISTS (SELECT 1 FROM image_layers WHERE digest = ?)').run(digest, digest);
      this.mounts.delete(digest);
      this.lazy.forget(digest);
      try {
        unlinkSync(this.blobPath(digest));
      } catch {
        /* already gone */
      }
      out.push(digest);
    }
    return out;
  }

  // ---------------------------------------------------------------- imports

  private validateImport(opts: ImportOptions): { name: string; kind: ImageKind; progress: (p: ImportProgress, force?: boolean) => void } {
    this.open();
    const { name } = parseName(opts.name);
    const kind = opts.kind ?? 'base';
    if (!KINDS.includes(kind)) throw new WarrenError('INVALID_ARGUMENT', `invalid image kind ${JSON.stringify(kind)} (base, workspace or toolkit)`);
    if (opts.compression !== undefined && !['none', 'lz4', 'lz4hc'].includes(opts.compression)) {
      throw new WarrenError('INVALID_ARGUMENT', `invalid compression ${JSON.stringify(opts.compression)} (none, lz4 or lz4hc)`);
    }
    const cb = opts.onProgress;
    const safe = (p: ImportProgress) => {
      try {
        cb?.(p);
      } catch (err) {
        this.log(`layers: progress callback threw: ${String(err)}`);
      }
    };
    const t = throttle(safe);
    return { name, kind, progress: (p, force = p.fraction === undefined || p.fraction >= 1) => t(p, force) };
  }

  /** A private scratch directory, always removed (with anything mounted below it) when `fn` settles. */
  private async withScratch<T>(op: string, fn: (dir: string) => Promise<T>): Promise<T> {
    const dir = join(this.tmpDir, `${op}-${process.pid}-${randomBytes(6).toString('hex')}`);
    mkdirSync(dir, { mode: 0o700 });
    try {
      return await fn(dir);
    } finally {
      try {
        removeTree(dir, this.mounter);
      } catch (err) {
        this.log(`layers: cannot remove scratch ${dir}: ${asWarrenError(err).message}`);
      }
    }
  }

  /**
   * Move a finished image file (on the blobs filesystem) into the store under
   * its digest. Returns whether the blob is new (false: same content existed).
   */
  private finalizeBlob(file: string, hex: string): { digest: string; size: number; created: boolean } {
    const dest = join(this.blobsDir, `${hex}.erofs`);
    const size = statSync(file).size;
    let created = true;
    chmodSync(file, 0o444);
    try {
      linkSync(file, dest); // never replaces: a blob is immutable once there
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      created = false;
    }
    unlinkSync(file);
    return { digest: `sha256:${hex}`, size, created };
  }

  private register(args: { name: string; kind: ImageKind; layers: Array<{ digest: string; size: number; created: boolean }>; source: string; config: ImageRuntimeConfig | null }): ImageInfo {
    const now = new Date().toISOString();
    const digests = args.layers.map((l) => l.digest);
    const digest = imageDigest(digests);
    try {
      this.db.transaction(() => {
        for (const l of args.layers) {
          this.sql('INSERT OR IGNORE INTO layer_blobs (digest, size_bytes, created_at, source) VALUES (?, ?, ?, ?)').run(l.digest, l.size, now, args.source);
        }
        const parsed = parseName(args.name);
        const existing = this.findImageRow(parsed);
        const name = existing?.name ?? args.name;
        const createdAt = existing && existing.digest === digest && existing.kind === args.kind ? existing.created_at : now;
        this.db
          .prepare(
            `INSERT INTO image_images (name, digest, kind, created_at, source, config) VALUES (?, ?, ?, ?, ?, ?)
             ON CONFLICT(name) DO UPDATE SET digest = excluded.digest, kind = excluded.kind, created_at = excluded.created_at,
               source = excluded.source, config = excluded.config`,
          )
          .run(name, digest, args.kind, createdAt, args.source, args.config ? JSON.stringify(args.config) : null);
        this.sql('DELETE FROM image_layers WHERE image_name = ?').run(name);
        digests.forEach((d, i) => this.sql('INSERT INTO image_layers (image_name, position, digest) VALUES (?, ?, ?)').run(name, i, d));
        args.name = name;
      })();
    } catch (err) {
      // Leave nothing behind: a blob this import created and nobody references goes again.
      for (const l of args.layers) {
        if (!l.created) continue;
        const used = this.sql('SELECT 1 FROM layer_blobs WHERE digest = ?').get(l.digest);
        if (!used) unlinkSync(join(this.blobsDir, `${hexOf(l.digest)}.erofs`));
      }
      throw err;
    }
    return this.toInfo(this.imageRow(args.name)!);
  }

  /** Keep the tree's valid Python caches valid in the layer (pyc.ts); only for trees built here. */
  private alignPyc(tree: string): void {
    const r = alignPycTimestamps(tree, LAYER_EPOCH);
    if (r.aligned > 0) this.log(`layers: ${r.aligned} Python caches kept valid for the layer's timestamp (${r.skipped} left as they were)`);
  }

  private async packTree(
    tree: string,
    scratch: string,
    progress: (p: ImportProgress, force?: boolean) => void,
    compression: ErofsCompression = this.compression,
  ): Promise<{ digest: string; size: number; created: boolean }> {
    progress({ phase: 'mkfs', message: 'packing the layer with mkfs.erofs', fraction: 0 }, true);
    const started = Date.now();
    const out = join(scratch, 'layer.erofs');
    const hex = await mkfsErofs(out, tree, { compression, log: (l) => this.log(`mkfs.erofs: ${l}`) });
    const blob = this.finalizeBlob(out, hex);
    progress({ phase: 'mkfs', message: `${blob.digest} (${blob.size} bytes, ${Date.now() - started} ms)`, fraction: 1 }, true);
    return blob;
  }

  /** Import a directory tree as one layer (it becomes the layer's root). */
  async importDirectory(dir: string, opts: ImportOptions): Promise<ImageInfo> {
    const { name, kind, progress } = this.validateImport(opts);
    let real: string;
    try {
      real = realpathSync(dir);
      if (!statSync(real).isDirectory()) throw new Error('not a directory');
    } catch {
      throw new WarrenError('INVALID_ARGUMENT', `${dir} is not a directory`, { path: dir });
    }
    return this.withScratch('dir', async (scratch) => {
      const blob = await this.packTree(real, scratch, progress, opts.compression);
      progress({ phase: 'register', message: `registering ${name}` }, true);
      return this.register({ name, kind, layers: [blob], source: `directory:${real}`, config: null });
    });
  }

  /** Import a ready EROFS image file as one layer (its bytes are kept as they are). */
  async importErofsFile(file: string, opts: ImportOptions & { source?: string }): Promise<ImageInfo> {
    const { name, kind, progress } = this.validateImport(opts);
    try {
      if (!statSync(file).isFile()) throw new Error('not a file');
    } catch {
      throw new WarrenError('INVALID_ARGUMENT', `${file} is not a file`, { path: file });
    }
    assertErofsImage(file);
    return this.withScratch('erofs', async (scratch) => {
      progress({ phase: 'fetch', message: `taking ${file}` }, true);
      const tmp = join(scratch, 'layer.erofs');
      try {
        linkSync(file, tmp); // same filesystem: no copy
      } catch {
        copyFileSync(file, tmp);
      }
      const hex = await sha256File(tmp);
      const blob = this.finalizeBlob(tmp, hex);
      progress({ phase: 'register', message: `registering ${name}` }, true);
      return this.register({ name, kind, layers: [blob], source: opts.source ?? `erofs:${file}`, config: null });
    });
  }

  /**
   * Take a ready EROFS image file as a layer blob without registering any
   * image name: pack and squash make layers that must not be usable by anyone
   * until the environment that owns them is recorded. Returns the digest.
   */
  async importLayerFile(file: string, source: string): Promise<string> {
    this.open();
    assertErofsImage(file);
    return this.withScratch('erofs', async (scratch) => {
      const tmp = join(scratch, 'layer.erofs');
      try {
        linkSync(file, tmp);
      } catch {
        copyFileSync(file, tmp);
      }
      const blob = this.finalizeBlob(tmp, await sha256File(tmp));
      this.sql('INSERT OR IGNORE INTO layer_blobs (digest, size_bytes, created_at, source) VALUES (?, ?, ?, ?)').run(blob.digest, blob.size, new Date().toISOString(), source);
      return blob.digest;
    });
  }

  /**
   * Import a `docker save` archive or an OCI image layout tar (plain, gzip or
   * zstd). Its layers are checked (digests, no escaping entries) before
   * anything is written, then flattened in order into one tree honouring
   * whiteouts, and packed into one layer.
   */
  async importOciArchive(tarPath: string, opts: ArchiveImportOptions): Promise<ImageInfo> {
    const { name, kind, progress } = this.validateImport(opts);
    if (opts.ref !== undefined && (typeof opts.ref !== 'string' || opts.ref.length > 255 || opts.ref.includes('\0'))) {
      throw new WarrenError('INVALID_ARGUMENT', 'invalid ref');
    }
    let size: number;
    try {
      const st = statSync(tarPath);
      if (!st.isFile()) throw new Error('not a file');
      size = st.size;
    } catch {
      throw new WarrenError('INVALID_ARGUMENT', `${tarPath} is not a file`, { path: tarPath });
    }
    return this.withScratch('oci', async (scratch) => {
      // fetch: an uncompressed view of the outer archive.
      let outer = tarPath;
      const head = Buffer.alloc(8);
      const fd = openSync(tarPath, 'r');
      try {
        readSync(fd, head, 0, 8, 0);
      } finally {
        closeSync(fd);
      }
      const compression = detectCompression(head);
      if (compression !== 'none') {
        outer = join(scratch, 'archive.tar');
        let read = 0;
        const src = createReadStream(tarPath, { highWaterMark: 1 << 20 });
        src.on('data', (c) => {
          read += c.length;
          progress({ phase: 'fetch', message: `decompressing ${compression} archive`, fraction: read / size });
        });
        const { stream, done } = decompress(src, compression);
        await pipeline(stream, createWriteStream(outer));
        await done;
      }
      const ar = new ArchiveReader(outer);
      const image = readArchiveImage(ar, opts.ref);
      const total = image.layers.reduce((n, l) => n + l.size, 0) || 1;
      progress({ phase: 'fetch', message: `${image.format} archive: ${image.layers.length} layer(s)${image.names.length ? ` (${image.names.join(', ')})` : ''}`, fraction: 1 }, true);

      // verify: digests and entry names of every layer, before anything is written.
      let done = 0;
      for (const [i, layer] of image.layers.entries()) {
        const entries: TarEntry[] = [];
        const { stream, finish } = openLayer(ar, layer, (n) => {
          done += n;
          progress({ phase: 'verify', message: `checking layer ${i + 1}/${image.layers.length}`, fraction: done / total });
        });
        for await (const { entry } of readTarStream(stream)) entries.push(entry);
        await finish();
        checkConfined(entries, 'in-root');
      }
      progress({ phase: 'verify', message: 'layers verified', fraction: 1 }, true);

      // extract: flatten the layers, bottom first.
      const tree = join(scratch, 'rootfs');
      mkdirSync(tree, { mode: 0o755 });
      chmodSync(tree, 0o755);
      const builder = new RootfsBuilder(tree);
      done = 0;
      for (const [i, layer] of image.layers.entries()) {
        const { stream, finish } = openLayer(ar, layer, (n) => {
          done += n;
          progress({ phase: 'extract', message: `applying layer ${i + 1}/${image.layers.length}`, fraction: done / total });
        });
        const stats = await builder.applyLayer(stream);
        await finish();
        this.log(`layers: applied ${layer.member}: ${stats.entries} entries, ${stats.whiteouts} whiteouts`);
      }
      progress({ phase: 'extract', message: 'layers applied', fraction: 1 }, true);
      this.alignPyc(tree);

      const blob = await this.packTree(tree, scratch, progress, opts.compression);
      progress({ phase: 'register', message: `registering ${name}` }, true);
      return this.register({ name, kind, layers: [blob], source: `${image.format}-archive:${realpathSync(tarPath)}${image.names.length ? ` (${image.names[0]})` : ''}`, config: image.config });
    });
  }

  /**
   * Build a Debian base image with debootstrap (variant minbase). The node cache
   * (<cacheDir>/debian-<suite>-<sha256 of the options>.erofs) is used when
   * present and filled after a build, so a node debootstraps a given
   * configuration once.
   */
  async buildDebian(opts: DebianBuildOptions): Promise<ImageInfo> {
    const { name, kind, progress } = this.validateImport(opts);
    const o = normalizeDebianOptions({ ...opts, compression: opts.compression ?? this.compression });
    const cachePath = debianCachePath({ ...o, cacheDir: this.cacheDir });
    const source = `debootstrap:${o.suite} minbase +${o.include.join(',')} (${o.mirror})`;
    if (!opts.refresh && existsSync(cachePath)) {
      progress({ phase: 'fetch', message: `using the cached image ${cachePath}` }, true);
      return this.importErofsFile(cachePath, { name, kind, onProgress: opts.onProgress, source: `${source} [cached ${cachePath}]` });
    }
    // One build per cache entry on this machine: other processes (another node, a test) wait for it.
    const unlock = await this.lockCacheEntry(cachePath, (m) => progress({ phase: 'fetch', message: m }, true));
    try {
      if (!opts.refresh && existsSync(cachePath)) {
        progress({ phase: 'fetch', message: `using the cached image ${cachePath} (built meanwhile)` }, true);
        return await this.importErofsFile(cachePath, { name, kind, onProgress: opts.onProgress, source: `${source} [cached ${cachePath}]` });
      }
      return await this.buildDebianUncached(opts, o, name, kind, progress, cachePath, source);
    } finally {
      unlock();
    }
  }

  /**
   * An exclusive lock on a cache entry across processes: a lock file holding the owner's pid,
   * created with O_EXCL; a lock whose owner is dead is taken over. Returns the unlock function.
   */
  private async lockCacheEntry(cachePath: string, notify: (m: string) => void): Promise<() => void> {
    const lockPath = `${cachePath}.lock`;
    try {
      mkdirSync(this.cacheDir, { recursive: true, mode: 0o755 });
    } catch {
      return () => undefined; // no usable cache: nothing to share, nothing to lock
    }
    let waited = false;
    for (;;) {
      try {
        writeFileSync(lockPath, `${process.pid}\n`, { flag: 'wx', mode: 0o644 });
        return () => {
          try {
            unlinkSync(lockPath);
          } catch {
            /* gone */
          }
        };
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') return () => undefined;
      }
      let owner = NaN;
      try {
        owner = Number(readFileSync(lockPath, 'utf8').trim());
      } catch {
        continue; // released meanwhile
      }
      if (!Number.isInteger(owner) || !pidAlive(owner)) {
        try {
          unlinkSync(lockPath);
        } catch {
          /* another waiter took it over */
        }
        continue;
      }
      if (!waited) notify(`waiting for process ${owner}, which is building ${cachePath}`);
      waited = true;
      await new Promise((r) => setTimeout(r, 500));
    }
  }

  private buildDebianUncached(
    opts: DebianBuildOptions,
    o: ReturnType<typeof normalizeDebianOptions>,
    name: string,
    kind: ImageKind,
    progress: (p: ImportProgress, force?: boolean) => void,
    cachePath: string,
    source: string,
  ): Promise<ImageInfo> {
    return this.withScratch('debian', async (scratch) => {
      const tree = join(scratch, 'rootfs');
      const started = Date.now();
      progress({ phase: 'fetch', message: `debootstrap ${o.suite} from ${o.mirror}`, fraction: 0 }, true);
      await runDebootstrap(tree, o, (p) => progress(p));
      scrubDebianRoot(tree);
      this.alignPyc(tree);
      progress({ phase: 'fetch', message: `debootstrap done in ${((Date.now() - started) / 1000).toFixed(1)} s`, fraction: 1 }, true);
      // Into the node cache (atomically), then into the store from there.
      let cacheOk = true;
      try {
        mkdirSync(this.cacheDir, { recursive: true, mode: 0o755 });
        this.sweepCacheTemps();
      } catch (err) {
        cacheOk = false;
        this.log(`layers: node cache ${this.cacheDir} unusable: ${asWarrenError(err).message}`);
      }
      if (!cacheOk) {
        const blob = await this.packTree(tree, scratch, progress, o.compression);
        progress({ phase: 'register', message: `registering ${name}` }, true);
        return this.register({ name, kind, layers: [blob], source, config: null });
      }
      const tmp = join(this.cacheDir, `.tmp-${process.pid}-${randomBytes(6).toString('hex')}.erofs`);
      try {
        progress({ phase: 'mkfs', message: 'packing the layer with mkfs.erofs', fraction: 0 }, true);
        await mkfsErofs(tmp, tree, { compression: o.compression, log: (l) => this.log(`mkfs.erofs: ${l}`) });
        chmodSync(tmp, 0o444);
        renameSync(tmp, cachePath);
      } catch (err) {
        try {
          unlinkSync(tmp);
        } catch {
          /* not created */
        }
        throw err;
      }
      progress({ phase: 'mkfs', message: `cached as ${cachePath}`, fraction: 1 }, true);
      return this.importErofsFile(cachePath, { name, kind, onProgress: opts.onProgress, source });
    });
  }

  /**
   * A toolkit layer of Debian packages installed over existing layers (`below`, top-most first:
   * e.g. the judge image's layers). Kept in the node cache
   * (<cacheDir>/layer-<name>-<sha256 of below, packages, recipe>.erofs) with the same lock as
   * images, so a machine builds each layer once; adding or upgrading one toolkit rebuilds only it.
   */
  async buildDebianLayer(opts: { name: string; packages: string[]; below: string[]; mirror?: string; onProgress?: (p: ImportProgress) => void; refresh?: boolean }): Promise<ImageInfo & { cached: boolean; buildMs: number }> {
    const { name, progress } = this.validateImport({ name: opts.name, kind: 'toolkit', onProgress: opts.onProgress });
    const compression: ErofsCompression = 'lz4';
    const cachePath = debianLayerCachePath(name, { packages: opts.packages, below: opts.below, compression, cacheDir: this.cacheDir });
    const source = `debian-layer:${[...new Set(opts.packages)].sort().join(',')} over ${opts.below.length} layer(s)`;
    const started = Date.now();
    const take = async (cached: boolean) => ({ ...(await this.importErofsFile(cachePath, { name, kind: 'toolkit', onProgress: opts.onProgress, source: `${source} [cached ${cachePath}]` })), cached, buildMs: Date.now() - started });
    if (!opts.refresh && existsSync(cachePath)) return take(true);
    const unlock = await this.lockCacheEntry(cachePath, (m) => progress({ phase: 'fetch', message: m }, true));
    try {
      if (!opts.refresh && existsSync(cachePath)) return await take(true);
      const lowers = await this.acquire(opts.below);
      try {
        await this.withScratch('apt', async (scratch) => {
          // The package lists are fetched by the first build of this process and reused for an hour.
          const aptLists = join(this.tmpDir, `aptlists-${process.pid}-shared`);
          const fresh = this.aptListsAt !== 0 && Date.now() - this.aptListsAt < 3600_000 && existsSync(aptLists);
          mkdirSync(aptLists, { recursive: true, mode: 0o755 });
          const dirs = { lowers: lowers.map((l) => l.path), upper: join(scratch, 'upper'), work: join(scratch, 'work'), merged: join(scratch, 'merged'), aptLists };
          for (const d of [dirs.upper, dirs.work, dirs.merged]) mkdirSync(d, { mode: 0o755 });
          progress({ phase: 'fetch', message: `apt-get install ${opts.packages.join(' ')}`, fraction: 0 }, true);
          await runAptLayer(dirs, opts.packages, { ...(opts.mirror ? { mirror: opts.mirror } : {}), update: !fresh, onLine: (l) => progress({ phase: 'fetch', message: l.slice(0, 200) }) });
          this.aptListsAt = fresh ? this.aptListsAt : Date.now();
          scrubLayerUpper(dirs.upper);
          this.alignPyc(dirs.upper);
          progress({ phase: 'mkfs', message: 'packing the layer with mkfs.erofs', fraction: 0 }, true);
          const tmp = join(this.cacheDir, `.tmp-${process.pid}-${randomBytes(6).toString('hex')}.erofs`);
          try {
            this.sweepCacheTemps();
            await mkfsErofs(tmp, dirs.upper, { compression, log: (l) => this.log(`mkfs.erofs: ${l}`) });
            chmodSync(tmp, 0o444);
            renameSync(tmp, cachePath);
          } catch (err) {
            try {
              unlinkSync(tmp);
            } catch {
              /* not created */
            }
            throw err;
          }
        });
      } finally {
        this.release(opts.below);
      }
      return await take(false);
    } finally {
      unlock();
    }
  }

  private sweepCacheTemps(): void {
    for (const f of readdirSync(this.cacheDir)) {
      const pid = Number(/^\.tmp-(\d+)-/.exec(f)?.[1] ?? NaN);
      if (Number.isInteger(pid) && pid !== process.pid && !pidAlive(pid)) {
        try {
          unlinkSync(join(this.cacheDir, f));
        } catch {
          /* raced */
        }
      }
    }
  }

  /**
   * Register an image made of existing layers (top-most first), e.g. a packed
   * sandbox diff over its base image.
   */
  composeImage(opts: { name: string; layers: string[]; kind?: ImageKind; source?: string }): ImageInfo {
    const { name, kind } = this.validateImport(opts);
    if (!Array.isArray(opts.layers) || opts.layers.length === 0) throw new WarrenError('INVALID_ARGUMENT', 'an image needs at least one layer');
    const layers = opts.layers.map((d) => {
      assertDigest(d);
      const row = this.layerRow(d);
      if (!row) throw new WarrenError('LAYER_NOT_FOUND', `layer ${d} not found`, { digest: d });
      return { digest: d, size: row.size_bytes, created: false };
    });
    return this.register({ name, kind, layers, source: opts.source ?? `composed:${opts.layers.length} layers`, config: null });
  }
}

export type { ArchiveImage };

/** Whether an EROFS file system is mounted at `path`: the mount directory lies on the node's writable data file system, never EROFS itself. */
function isErofsMountPoint(path: string): boolean {
  try {
    return statfsSync(path).type === EROFS_MAGIC;
  } catch {
    return false;
  }
}
