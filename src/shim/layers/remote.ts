/**
 * Images to and from OCI registries (the artifact format is in artifact.ts).
 *
 * push   every layer's EROFS blob and chunk index, the image config, then the
 *        manifest under the tag. Blobs the repository has are not sent again.
 * pull   the manifest and config, then per layer either the whole blob (eager:
 *        downloaded, checked against the layer digest, kept as a local blob) or
 *        only its chunk index (lazy: the layer is mounted through warren-lazyfs
 *        and its bytes fetched when read). Layers the node has are not fetched.
 * staged whether a registry holds every blob an image needs (overflow pools read
 *        their layers from their own registry: only staged images go there).
 */
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, statSync } from 'node:fs';
import { join } from 'node:path';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { WarrenError } from '../../errors';
import type { ImageInfo, ImportProgress } from '../types';
import { ANNOTATION_LAYER, CHUNKS_MEDIA_TYPE, CONFIG_MEDIA_TYPE, DEFAULT_CHUNK_SIZE, MANIFEST_MEDIA_TYPE, buildManifest, chunkCount, chunkIndex, parseConfig, parseManifest, type ArtifactLayer, type ImageArtifactConfig } from './artifact';
import { RegistryClient, parseRegistryRef, parseRegistryRepository, type RegistryConfig, type RegistryRef } from './distribution';
import { parseName } from './refs';
import type { LayerStore, PullMode } from './store';
import { lazyUnavailableReason } from './lazy';

export interface PushOptions {
  chunkSize?: number;
  onProgress?: (p: ImportProgress) => void;
}

export interface PushResult {
  ref: string;
  /** Digest of the manifest. */
  manifestDigest: string;
  image: string;
  layers: Array<{ digest: string; size: number; uploaded: boolean }>;
  bytesUploaded: number;
}

export interface PullOptions {
  /** Name to register the image under (default: the reference's repository and tag). */
  name?: string;
  mode?: PullMode;
  onProgress?: (p: ImportProgress) => void;
}

export interface PullResult {
  image: ImageInfo;
  mode: PullMode;
  manifestDigest: string;
  layers: Array<{ digest: string; state: 'local' | 'lazy'; fetched: 'none' | 'blob' | 'index' }>;
  bytesFetched: number;
}

function progressOf(cb?: (p: ImportProgress) => void): (p: ImportProgress, force?: boolean) => void {
  let last = 0;
  return (p, force = false) => {
    const now = Date.now();
    if (!cb || (!force && p.fraction !== undefined && p.fraction < 1 && now - last < 200)) return;
    last = now;
    try {
      cb(p);
    } catch {
      /* a progress callback never breaks the work */
    }
  };
}

function counting(onBytes: (n: number) => void): Transform {
  return new Transform({
    transform(chunk: Buffer, _enc, done) {
      onBytes(chunk.length);
      done(null, chunk);
    },
  });
}

/** The default chunk size of a node's pushes ($WARREN_LAYER_CHUNK_SIZE or 64 KiB). */
function defaultChunkSize(): number {
  const env = Number(process.env.WARREN_LAYER_CHUNK_SIZE);
  return Number.isInteger(env) && env > 0 ? env : DEFAULT_CHUNK_SIZE;
}

/** Push `image` (a name or digest in `store`) to `registryRef` (host[:port]/repo[:tag]; tag default "latest"). */
export async function pushImage(store: LayerStore, image: string, registryRef: string, opts: PushOptions = {}): Promise<PushResult> {
  const ref = parseRegistryRef(registryRef, store.registries);
  if (ref.digest) throw new WarrenError('INVALID_ARGUMENT', 'push to a tag, not a digest (the manifest digest is the answer)');
  const tag = ref.tag ?? 'latest';
  const info = store.resolveImage(image);
  const progress = progressOf(opts.onProgress);
  const chunkSize = opts.chunkSize ?? defaultChunkSize();
  const client = new RegistryClient(ref, store.registries);
  try {
    const total = info.sizeBytes || 1;
    let sent = 0;
    let uploaded = 0;
    const layers: Array<{ layer: ArtifactLayer; indexSize: number; uploaded: boolean }> = [];
    for (const [i, digest] of info.layers.entries()) {
      progress({ phase: 'index', message: `layer ${i + 1}/${info.layers.length}: ${digest}` }, true);
      const file = await store.readableLayerFile(digest);
      const idx = await chunkIndex(file, chunkSize);
      if (idx.digest !== digest) throw new WarrenError('LAYER_CORRUPT', `layer ${digest} on this node has digest ${idx.digest}`, { digest });
      const indexDigest = 'sha256:' + createHash('sha256').update(idx.index).digest('hex');
      const base = sent;
      const didUpload = await client.uploadBlob(ref.repository, digest, idx.size, () =>
        createReadStream(file, { highWaterMark: 1 << 20 }).pipe(
          counting((n) => {
            sent += n;
            uploaded += n;
            progress({ phase: 'push', message: `uploading layer ${i + 1}/${info.layers.length}`, fraction: Math.min(1, sent / total) });
          }),
        ),
      );
      sent = base + idx.size;
      await client.uploadBlob(ref.repository, indexDigest, idx.index.length, () => idx.index);
      progress({ phase: 'push', message: `layer ${i + 1}/${info.layers.length} ${didUpload ? 'uploaded' : 'already in the registry'}`, fraction: Math.min(1, sent / total) }, true);
      layers.push({ layer: { digest, size: idx.size, chunkSize, chunks: indexDigest }, indexSize: idx.index.length, uploaded: didUpload });
    }
    let runtime: Record<string, unknown> | null = null;
    try {
      runtime = store.imageConfig(image) as Record<string, unknown> | null;
    } catch {
      /* a bare layer has no image config */
    }
    const config: ImageArtifactConfig = {
      schemaVersion: 1,
      name: info.name,
      kind: info.kind,
      layers: layers.map((l) => l.layer),
      runtime,
      source: info.source,
    };
    const configBuf = Buffer.from(JSON.stringify(config));
    const configDigest = 'sha256:' + createHash('sha256').update(configBuf).digest('hex');
    await client.uploadBlob(ref.repository, configDigest, configBuf.length, () => configBuf);
    const manifest = buildManifest(configBuf, layers, { 'org.opencontainers.image.title': info.name, 'org.warren.image.digest': info.digest });
    const manifestDigest = await client.putManifest(ref.repository, tag, MANIFEST_MEDIA_TYPE, manifest);
    progress({ phase: 'register', message: `${ref.host}/${ref.repository}:${tag}@${manifestDigest}` }, true);
    return {
      ref: `${ref.host}/${ref.repository}:${tag}`,
      manifestDigest,
      image: info.name,
      layers: layers.map((l) => ({ digest: l.layer.digest, size: l.layer.size, uploaded: l.uploaded })),
      bytesUploaded: uploaded,
    };
  } finally {
    client.close();
  }
}

/** The reference an image is staged under in an overflow registry `repository` (host/repo): the image name as the tag's path. */
export function stagedRef(repository: string, image: ImageInfo, config: RegistryConfig = {}): string {
  const r = parseRegistryRepository(repository, config);
  // Tags cannot hold "/" or ":"; the image digest names the content exactly.
  return `${r.base}/${r.repository}:${image.digest.replace(':', '-')}`;
}

/** Stage `image` into an overflow pool's registry repository: a push under a tag derived from the image digest. */
export async function stageImage(store: LayerStore, image: string, repository: string, opts: PushOptions = {}): Promise<PushResult> {
  const info = store.resolveImage(image);
  return pushImage(store, image, stagedRef(repository, info, store.registries), opts);
}

async function fetchManifest(client: RegistryClient, ref: RegistryRef): Promise<{ manifest: ReturnType<typeof parseManifest>; digest: string }> {
  const reference = ref.digest ?? ref.tag ?? 'latest';
  const got = await client.getManifest(ref.repository, reference, [MANIFEST_MEDIA_TYPE]);
  if (!got) throw new WarrenError('IMAGE_NOT_FOUND', `${ref.text} not found in the registry`, { ref: ref.text });
  return { manifest: parseManifest(got.body), digest: got.digest };
}

/** Pull an image pushed by Warren. */
export async function pullImage(store: LayerStore, registryRef: string, opts: PullOptions = {}): Promise<PullResult> {
  const ref = parseRegistryRef(registryRef, store.registries);
  const name = opts.name ?? `${ref.repository}${ref.tag ? `:${ref.tag}` : ''}`;
  parseName(name);
  const mode: PullMode = opts.mode ?? store.pullMode ?? (lazyUnavailableReason() === null ? 'lazy' : 'eager');
  if (mode !== 'lazy' && mode !== 'eager') throw new WarrenError('INVALID_ARGUMENT', `pull mode must be "lazy" or "eager", not ${JSON.stringify(mode)}`);
  if (mode === 'lazy') {
    const why = lazyUnavailableReason();
    if (why) throw new WarrenError('NOT_SUPPORTED', `lazy pulls are not available here: ${why}; pull with mode "eager"`);
  }
  const progress = progressOf(opts.onProgress);
  const client = new RegistryClient(ref, store.registries);
  try {
    progress({ phase: 'fetch', message: `manifest of ${ref.text}` }, true);
    const { manifest, digest: manifestDigest } = await fetchManifest(client, ref);
    const configBuf = await client.getBlobBuffer(ref.repository, manifest.config.digest, 16 << 20);
    const config = parseConfig(configBuf, manifest);
    const states = new Map(store.layerStates(config.layers.map((l) => l.digest)).map((s) => [s.digest, s.state]));
    const total = config.layers.reduce((n, l) => n + (states.get(l.digest) === 'local' || mode === 'lazy' ? 0 : l.size), 0) || 1;
    let fetched = 0;
    const out: PullResult['layers'] = [];
    for (const [i, l] of config.layers.entries()) {
      const have = states.get(l.digest);
      const what = `layer ${i + 1}/${config.layers.length}`;
      if (have === 'local' || (have === 'lazy' && mode === 'lazy')) {
        progress({ phase: 'fetch', message: `${what}: ${l.digest} is already on this node (${have})` }, true);
        out.push({ digest: l.digest, state: have, fetched: 'none' });
        continue;
      }
      if (mode === 'lazy') {
        const index = await client.getBlobBuffer(ref.repository, l.chunks, chunkCount(l.size, l.chunkSize) * 32);
        if (index.length !== chunkCount(l.size, l.chunkSize) * 32) throw new WarrenError('INVALID_ARCHIVE', `chunk index of ${l.digest} has the wrong size`);
        fetched += index.length;
        store.addRemoteLayer({ digest: l.digest, base: ref.base, repository: ref.repository, size: l.size, chunkSize: l.chunkSize, chunks: index }, `registry:${ref.text} (lazy)`);
        progress({ phase: 'fetch', message: `${what}: ${l.digest} will be read from the registry on demand (${l.size} bytes, ${l.chunkSize}-byte chunks)` }, true);
        out.push({ digest: l.digest, state: 'lazy', fetched: 'index' });
        continue;
      }
      await store.scratch('pull', async (scratch) => {
        const tmp = join(scratch, `${randomBytes(4).toString('hex')}.erofs`);
        const { body } = await client.getBlob(ref.repository, l.digest);
        const h = createHash('sha256');
        let n = 0;
        await pipeline(
          body,
          new Transform({
            transform(chunk: Buffer, _enc, done) {
              n += chunk.length;
              if (n > l.size) {
                done(new WarrenError('LAYER_CORRUPT', `layer ${l.digest} from ${ref.host} is longer than its ${l.size} bytes`));
                return;
              }
              h.update(chunk);
              fetched += chunk.length;
              progress({ phase: 'fetch', message: `downloading ${what}`, fraction: Math.min(1, fetched / total) });
              done(null, chunk);
            },
          }),
          createWriteStream(tmp, { mode: 0o600 }),
        );
        const hex = h.digest('hex');
        if (`sha256:${hex}` !== l.digest || statSync(tmp).size !== l.size) {
          throw new WarrenError('LAYER_CORRUPT', `layer ${l.digest} from ${ref.host} has digest sha256:${hex} (${n} bytes): the registry's blob is corrupt`, { digest: l.digest });
        }
        progress({ phase: 'verify', message: `${what}: ${l.digest} verified`, fraction: Math.min(1, fetched / total) }, true);
        store.addDownloadedBlob(tmp, hex, `registry:${ref.text}`);
      });
      out.push({ digest: l.digest, state: 'local', fetched: 'blob' });
    }
    progress({ phase: 'register', message: `registering ${name}` }, true);
    const image = store.registerLayers({ name, kind: config.kind, layers: config.layers.map((l) => l.digest), source: `registry:${ref.text}@${manifestDigest}`, config: config.runtime });
    return { image, mode, manifestDigest, layers: out, bytesFetched: fetched + configBuf.length };
  } finally {
    client.close();
  }
}

/** Which of `digests` the registry repository holds as complete layers (blob and, when `chunks` are given, chunk index). */
export async function stagedLayers(registryRepository: string, digests: string[], config: RegistryConfig = {}): Promise<Array<{ digest: string; staged: boolean }>> {
  const ref = parseRegistryRef(registryRepository, config);
  const client = new RegistryClient(ref, config);
  try {
    const out: Array<{ digest: string; staged: boolean }> = [];
    for (const d of digests) out.push({ digest: d, staged: (await client.headBlob(ref.repository, d)) !== null });
    return out;
  } finally {
    client.close();
  }
}

/**
 * Whether the registry holds everything a node needs to run `image` from it:
 * the manifest staged for it (stagedRef) and, for every layer, the EROFS blob
 * and its chunk index. For placement on an overflow pool.
 */
export async function isImageStaged(image: Pick<ImageInfo, 'digest' | 'layers'>, registryRepository: string, config: RegistryConfig = {}): Promise<boolean> {
  const repo = parseRegistryRepository(registryRepository, config);
  const client = new RegistryClient(repo, config);
  try {
    const got = await client.getManifest(repo.repository, image.digest.replace(':', '-'), [MANIFEST_MEDIA_TYPE]);
    if (!got) return false;
    const manifest = parseManifest(got.body);
    if (manifest.config.mediaType !== CONFIG_MEDIA_TYPE) return false;
    const layerDigests = new Set(manifest.layers.filter((l) => l.mediaType !== CHUNKS_MEDIA_TYPE).map((l) => l.digest));
    if (!image.layers.every((d) => layerDigests.has(d))) return false;
    for (const d of manifest.layers) {
      if (d.mediaType === CHUNKS_MEDIA_TYPE && !image.layers.includes(d.annotations?.[ANNOTATION_LAYER] ?? '')) continue;
      if ((await client.headBlob(repo.repository, d.digest)) === null) return false;
    }
    return (await client.headBlob(repo.repository, manifest.config.digest)) !== null;
  } catch (err) {
    if (err instanceof WarrenError && (err.code === 'IMAGE_NOT_FOUND' || err.code === 'INVALID_ARCHIVE')) return false;
    throw err;
  } finally {
    client.close();
  }
}
