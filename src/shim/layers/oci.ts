/**
 * Reading image archives: `docker save` tars (manifest.json + layer tars) and
 * OCI image layout tars (oci-layout + index.json + blobs/sha256/...), with
 * nested indexes, and layers that are plain, gzip or zstd tars.
 *
 * The outer archive is never extracted: it is indexed (headers only) and its
 * members are read at their offsets, so member names are only lookup keys and
 * cannot write anywhere. Every blob is checked against its digest.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, createReadStream, openSync, readSync } from 'node:fs';
import { posix } from 'node:path';
import { Readable, pipeline } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { WarrenError } from '../../errors';
import { indexTarFile, type TarEntry } from './tar';

export type Compression = 'none' | 'gzip' | 'zstd';

export interface LayerRef {
  /** Member of the outer archive holding the layer blob. */
  member: string;
  /** Digest of the blob as stored (compressed), when known. */
  digest: string | null;
  /** Digest of the uncompressed tar (config rootfs.diff_ids), when known. */
  diffId: string | null;
  mediaType: string | null;
  size: number;
}

export interface ImageConfigSummary {
  env?: string[];
  cmd?: string[];
  entrypoint?: string[];
  workingDir?: string;
  user?: string;
}

export interface ArchiveImage {
  format: 'docker' | 'oci';
  /** Layers bottom-most first (application order). */
  layers: LayerRef[];
  config: ImageConfigSummary;
  /** Names the archive gives the image (RepoTags / ref.name annotations). */
  names: string[];
  platform: string | null;
}

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);
const MANIFEST_TYPES = new Set(['application/vnd.oci.image.manifest.v1+json', 'application/vnd.docker.distribution.manifest.v2+json']);

function invalid(message: string): WarrenError {
  return new WarrenError('INVALID_ARCHIVE', message);
}

export function detectCompression(head: Buffer): Compression {
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  if (head.length >= 4 && head.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
  return 'none';
}

export function hostPlatform(): { os: string; architecture: string; variant?: string } {
  const arch: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64' };
  return { os: 'linux', architecture: arch[process.arch] ?? process.arch, ...(process.arch === 'arm64' ? { variant: 'v8' } : {}) };
}

/** Decompress a byte stream; `done` rejects if the decompressor failed. */
export function decompress(source: Readable, compression: Compression): { stream: Readable; done: Promise<void> } {
  if (compression === 'none') return { stream: source, done: Promise.resolve() };
  if (compression === 'gzip') {
    const gunzip = createGunzip();
    const done = new Promise<void>((resolve, reject) =>
      pipeline(source, gunzip, (err) => (err ? reject(new WarrenError('INVALID_ARCHIVE', `gzip: ${err.message}`)) : resolve())),
    );
    done.catch(() => undefined);
    return { stream: gunzip, done };
  }
  const child = spawn('zstd', ['-d', '-c', '-q'], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
  child.stdin.on('error', () => undefined); // EPIPE when zstd gives up early; reported through its exit status
  source.on('error', (err) => child.stdout.destroy(err));
  source.pipe(child.stdin);
  const done = new Promise<void>((resolve, reject) => {
    child.on('error', (err) => reject(new WarrenError('NOT_SUPPORTED', `zstd layers need the zstd program: ${err.message}`)));
    child.on('close', (code, signal) => (code === 0 ? resolve() : reject(new WarrenError('INVALID_ARCHIVE', `zstd: ${stderr.trim() || signal || `exit ${code}`}`))));
  });
  done.catch(() => undefined);
  child.on('close', () => source.destroy());
  child.stdout.on('close', () => {
    if (child.exitCode === null && child.signalCode === null) setTimeout(() => child.kill('SIGKILL'), 1000).unref();
  });
  return { stream: child.stdout, done };
}

/** Passes chunks through, hashing them. */
export async function* hashing(source: AsyncIterable<Buffer>, hash: ReturnType<typeof createHash>, count?: (n: number) => void): AsyncGenerator<Buffer> {
  for await (const chunk of source) {
    hash.update(chunk);
    count?.(chunk.length);
    yield chunk;
  }
}

/** An uncompressed outer archive, indexed by member name. */
export class ArchiveReader {
  private readonly members = new Map<string, TarEntry>();

  constructor(readonly path: string) {
    for (const e of indexTarFile(path)) {
      const name = posix.normalize(e.path).replace(/^(\.\/)+/, '').replace(/\/+$/, '');
      this.members.set(name, e);
    }
  }

  has(name: string): boolean {
    return this.lookup(name) !== null;
  }

  /** A member, following symlinks and hard links inside the archive (docker save dedups layers that way). */
  lookup(name: string, depth = 0): TarEntry | null {
    if (depth > 16) throw invalid(`archive member ${name}: too many links`);
    const key = posix.normalize(name).replace(/^(\.\/)+/, '').replace(/\/+$/, '');
    if (key.startsWith('../') || key.startsWith('/') || key === '..') return null;
    const e = this.members.get(key);
    if (e === undefined) return null;
    if (e.type === 'symlink') return this.lookup(posix.join(posix.dirname(key), e.linkpath), depth + 1);
    if (e.type === 'hardlink') return this.lookup(e.linkpath, depth + 1);
    return e.type === 'file' ? e : null;
  }

  private need(name: string, what: string): TarEntry {
    const e = this.lookup(name);
    if (e === null) throw invalid(`archive has no ${what} (${name})`);
    return e;
  }

  readBytes(name: string, what: string, max = 64 << 20): Buffer {
    const e = this.need(name, what);
    if (e.size > max) throw invalid(`${what} (${name}) is too large (${e.size} bytes)`);
    const buf = Buffer.alloc(e.size);
    const fd = openSync(this.path, 'r');
    try {
      let got = 0;
      while (got < e.size) {
        const n = readSync(fd, buf, got, e.size - got, e.offset + got);
        if (n === 0) throw invalid(`archive truncated in ${name}`);
        got += n;
      }
    } finally {
      closeSync(fd);
    }
    return buf;
  }

  readJson(name: string, what: string, digest?: string): unknown {
    const buf = this.readBytes(name, what);
    if (digest !== undefined) verifyDigest(buf, digest, what);
    try {
      return JSON.parse(buf.toString('utf8'));
    } catch {
      throw invalid(`${what} (${name}) is not valid JSON`);
    }
  }

  size(name: string): number {
    return this.need(name, 'layer').size;
  }

  /** The raw bytes of a member as a stream. */
  open(name: string): Readable {
    const e = this.need(name, 'layer');
    if (e.size === 0) return Readable.from([]);
    return createReadStream(this.path, { start: e.offset, end: e.offset + e.size - 1, highWaterMark: 1 << 20 });
  }

  /** First bytes of a member (compression sniffing). */
  head(name: string, n = 8): Buffer {
    const e = this.need(name, 'layer');
    const buf = Buffer.alloc(Math.min(n, e.size));
    const fd = openSync(this.path, 'r');
    try {
      readSync(fd, buf, 0, buf.length, e.offset);
    } finally {
      closeSync(fd);
    }
    return buf;
  }
}

function verifyDigest(buf: Buffer, digest: string, what: string): void {
  const [alg, hex] = digest.split(':');
  if (alg !== 'sha256' || !/^[a-f0-9]{64}$/.test(hex ?? '')) throw invalid(`${what}: unsupported digest ${digest}`);
  if (createHash('sha256').update(buf).digest('hex') !== hex) throw invalid(`${what}: content does not match its digest ${digest}`);
}

function blobPath(digest: unknown): string {
  if (typeof digest !== 'string' || !/^sha256:[a-f0-9]{64}$/.test(digest)) throw invalid(`unsupported or malformed digest ${String(digest)}`);
  return `blobs/sha256/${digest.slice('sha256:'.length)}`;
}

type Json = Record<string, unknown>;
const obj = (v: unknown, what: string): Json => {
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw invalid(`${what} is not a JSON object`);
  return v as Json;
};
const arr = (v: unknown, what: string): unknown[] => {
  if (!Array.isArray(v)) throw invalid(`${what} is not a JSON array`);
  return v;
};

function summarizeConfig(cfg: Json): ImageConfigSummary {
  const c = (typeof cfg.config === 'object' && cfg.config !== null ? cfg.config : {}) as Json;
  const strs = (v: unknown) => (Array.isArray(v) && v.every((x) => typeof x === 'string') ? (v as string[]) : undefined);
  const out: ImageConfigSummary = {};
  const env = strs(c.Env);
  if (env) out.env = env;
  const cmd = strs(c.Cmd);
  if (cmd) out.cmd = cmd;
  const ep = strs(c.Entrypoint);
  if (ep) out.entrypoint = ep;
  if (typeof c.WorkingDir === 'string' && c.WorkingDir !== '') out.workingDir = c.WorkingDir;
  if (typeof c.User === 'string' && c.User !== '') out.user = c.User;
  return out;
}

function diffIds(cfg: Json): string[] | null {
  const rootfs = cfg.rootfs as Json | undefined;
  if (!rootfs || !Array.isArray(rootfs.diff_ids)) return null;
  return rootfs.diff_ids.map(String);
}

function platformOf(p: unknown): string | null {
  if (typeof p !== 'object' || p === null) return null;
  const { os, architecture, variant } = p as Json;
  if (typeof os !== 'string' || typeof architecture !== 'string') return null;
  return `${os}/${architecture}${typeof variant === 'string' ? '/' + variant : ''}`;
}

function matchesHost(platform: string | null): boolean {
  if (platform === null) return true;
  const h = hostPlatform();
  const [os, arch] = platform.split('/');
  return os === h.os && arch === h.architecture;
}

/**
 * Find the image in an archive. `ref` picks one of several (matched against
 * RepoTags, `org.opencontainers.image.ref.name` and `io.containerd.image.name`);
 * indexes are followed to the manifest for this host's platform.
 */
export function readArchiveImage(ar: ArchiveReader, ref?: string): ArchiveImage {
  if (ar.has('oci-layout') && ar.has('index.json')) return readOci(ar, ref);
  if (ar.has('manifest.json')) return readDocker(ar, ref);
  throw invalid('neither a docker save archive (manifest.json) nor an OCI image layout (oci-layout, index.json)');
}

function readDocker(ar: ArchiveReader, ref?: string): ArchiveImage {
  const manifests = arr(ar.readJson('manifest.json', 'manifest.json'), 'manifest.json').map((m, i) => obj(m, `manifest.json[${i}]`));
  if (manifests.length === 0) throw invalid('manifest.json lists no image');
  let m: Json;
  if (ref !== undefined) {
    const hit = manifests.filter((x) => Array.isArray(x.RepoTags) && x.RepoTags.some((t) => t === ref || String(t).endsWith('/' + ref)));
    if (hit.length !== 1) throw new WarrenError('INVALID_ARGUMENT', `archive has ${hit.length === 0 ? 'no' : 'several'} image(s) tagged ${ref}`);
    m = hit[0]!;
  } else if (manifests.length === 1) {
    m = manifests[0]!;
  } else {
    const tags = manifests.flatMap((x) => (Array.isArray(x.RepoTags) ? x.RepoTags.map(String) : []));
    throw new WarrenError('INVALID_ARGUMENT', `archive holds ${manifests.length} images; pick one with ref (${tags.join(', ') || 'untagged'})`);
  }
  if (typeof m.Config !== 'string') throw invalid('manifest.json: Config missing');
  const configName = m.Config;
  // Legacy archives name the config "<sha256>.json"; newer ones "blobs/sha256/<hex>".
  const hexMatch = /(?:^|\/)([a-f0-9]{64})(?:\.json)?$/.exec(configName);
  const cfg = obj(ar.readJson(configName, 'image config', hexMatch ? `sha256:${hexMatch[1]}` : undefined), 'image config');
  const layers = arr(m.Layers, 'manifest.json Layers').map(String);
  const ids = diffIds(cfg);
  if (ids !== null && ids.length !== layers.length) throw invalid(`image config lists ${ids.length} layers, manifest ${layers.length}`);
  const platform = typeof cfg.os === 'string' && typeof cfg.architecture === 'string' ? `${cfg.os}/${cfg.architecture}` : null;
  return {
    format: 'docker',
    layers: layers.map((member, i) => {
      const blobHex = /^blobs\/sha256\/([a-f0-9]{64})$/.exec(member);
      return { member, digest: blobHex ? `sha256:${blobHex[1]}` : null, diffId: ids?.[i] ?? null, mediaType: null, size: ar.size(member) };
    }),
    config: summarizeConfig(cfg),
    names: Array.isArray(m.RepoTags) ? m.RepoTags.map(String) : [],
    platform,
  };
}

function readOci(ar: ArchiveReader, ref?: string): ArchiveImage {
  const layout = obj(ar.readJson('oci-layout', 'oci-layout'), 'oci-layout');
  if (typeof layout.imageLayoutVersion !== 'string') throw invalid('oci-layout has no imageLayoutVersion');
  const index = obj(ar.readJson('index.json', 'index.json'), 'index.json');
  type Desc = { desc: Json; names: string[] };
  let candidates: Desc[] = arr(index.manifests, 'index.json manifests').map((d, i) => {
    const desc = obj(d, `index.json manifests[${i}]`);
    const ann = (desc.annotations ?? {}) as Json;
    const names = [ann['org.opencontainers.image.ref.name'], ann['io.containerd.image.name']].filter((x): x is string => typeof x === 'string');
    return { desc, names };
  });
  if (ref !== undefined) {
    candidates = candidates.filter((c) => c.names.some((n) => n === ref || n.endsWith(':' + ref) || n.endsWith('/' + ref)));
    if (candidates.length !== 1) throw new WarrenError('INVALID_ARGUMENT', `archive has ${candidates.length === 0 ? 'no' : 'several'} image(s) named ${ref}`);
  }
  const names = candidates.length === 1 ? candidates[0]!.names : [];
  // Walk down through indexes to exactly one manifest.
  let level = candidates.map((c) => c.desc);
  for (let depth = 0; depth < 8; depth++) {
    const manifests = level.filter((d) => d.mediaType === undefined || MANIFEST_TYPES.has(String(d.mediaType)) || INDEX_TYPES.has(String(d.mediaType)));
    if (manifests.length === 0) throw invalid('index lists no image manifest');
    let pick: Json[] = manifests;
    if (pick.length > 1) {
      const forHost = pick.filter((d) => platformOf(d.platform) !== null && matchesHost(platformOf(d.platform)));
      if (forHost.length >= 1) pick = [forHost[0]!];
      else if (pick.every((d) => platformOf(d.platform) !== null)) {
        throw new WarrenError('NOT_SUPPORTED', `archive has no image for ${hostPlatform().os}/${hostPlatform().architecture} (has ${pick.map((d) => platformOf(d.platform)).join(', ')})`);
      } else throw new WarrenError('INVALID_ARGUMENT', `archive holds ${pick.length} images; pick one with ref`);
    }
    const desc = pick[0]!;
    const body = obj(ar.readJson(blobPath(desc.digest), 'manifest', String(desc.digest)), `blob ${String(desc.digest)}`);
    const mediaType = String(body.mediaType ?? desc.mediaType ?? '');
    if (INDEX_TYPES.has(mediaType) || (Array.isArray(body.manifests) && !Array.isArray(body.layers))) {
      level = arr(body.manifests, 'image index manifests').map((d, i) => obj(d, `image index manifests[${i}]`));
      continue;
    }
    const cfgDesc = obj(body.config, 'manifest config');
    const cfg = obj(ar.readJson(blobPath(cfgDesc.digest), 'image config', String(cfgDesc.digest)), 'image config');
    const layerDescs = arr(body.layers, 'manifest layers').map((d, i) => obj(d, `manifest layers[${i}]`));
    const ids = diffIds(cfg);
    if (ids !== null && ids.length !== layerDescs.length) throw invalid(`image config lists ${ids.length} layers, manifest ${layerDescs.length}`);
    return {
      format: 'oci',
      layers: layerDescs.map((d, i) => {
        const mt = typeof d.mediaType === 'string' ? d.mediaType : null;
        if (mt !== null && /encrypted|foreign|nondistributable/.test(mt) && !ar.has(blobPath(d.digest))) {
          throw new WarrenError('NOT_SUPPORTED', `layer ${String(d.digest)} (${mt}) is not in the archive`);
        }
        if (mt !== null && mt.includes('+encrypted')) throw new WarrenError('NOT_SUPPORTED', `encrypted layers are not supported (${mt})`);
        const member = blobPath(d.digest);
        return { member, digest: String(d.digest), diffId: ids?.[i] ?? null, mediaType: mt, size: ar.size(member) };
      }),
      config: summarizeConfig(cfg),
      names,
      platform: platformOf(body.platform) ?? platformOf(desc.platform) ?? (typeof cfg.os === 'string' ? `${cfg.os}/${String(cfg.architecture)}` : null),
    };
  }
  throw invalid('image indexes nested too deeply');
}

/**
 * The uncompressed tar stream of a layer, hashing the blob and the tar as they
 * pass. `finish()` drains nothing; call it after the stream was fully read: it
 * waits for the decompressor and checks both digests.
 */
export function openLayer(ar: ArchiveReader, layer: LayerRef, onBytes?: (n: number) => void): { stream: AsyncIterable<Buffer>; finish: () => Promise<void> } {
  const compression = detectCompression(ar.head(layer.member));
  const blobHash = createHash('sha256');
  const diffHash = createHash('sha256');
  const raw = Readable.from(hashing(ar.open(layer.member), blobHash, onBytes));
  const { stream, done } = decompress(raw, compression);
  return {
    stream: hashing(stream, diffHash),
    async finish() {
      await done;
      const blob = `sha256:${blobHash.digest('hex')}`;
      const diff = `sha256:${diffHash.digest('hex')}`;
      if (layer.digest !== null && layer.digest !== blob) throw invalid(`layer ${layer.member}: content does not match its digest ${layer.digest}`);
      if (layer.diffId !== null && layer.diffId !== diff) throw invalid(`layer ${layer.member}: uncompressed content does not match diff_id ${layer.diffId}`);
    },
  };
}
