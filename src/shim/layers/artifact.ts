/**
 * How a Warren image is stored in an OCI registry: one OCI image manifest per
 * image (an OCI artifact), whose config is Warren's image config and whose
 * layers are, per Warren layer, the EROFS file itself and its chunk index.
 *
 *   manifest  application/vnd.oci.image.manifest.v1+json, artifactType application/vnd.warren.image.v1
 *   config    application/vnd.warren.image.config.v1+json   (ImageArtifactConfig below)
 *   layers    application/vnd.warren.erofs.layer.v1          the layer's EROFS image, byte for byte:
 *                                                            its blob digest IS the Warren layer digest
 *             application/vnd.warren.erofs.chunks.v1         sha256 of every chunkSize bytes of that
 *                                                            blob, 32 raw bytes each, in order
 *
 * Both blobs of every layer are manifest layers so that generic tools copy
 * everything an image needs (`skopeo copy`/`sync` stage an image into another
 * registry); the chunk index is what lets a node read a layer it has not
 * downloaded and still check every byte before serving it.
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { WarrenError } from '../../errors';
import type { ImageInfo } from '../types';
import { assertDigest } from './refs';

export const MANIFEST_MEDIA_TYPE = 'application/vnd.oci.image.manifest.v1+json';
export const ARTIFACT_TYPE = 'application/vnd.warren.image.v1';
export const CONFIG_MEDIA_TYPE = 'application/vnd.warren.image.config.v1+json';
export const LAYER_MEDIA_TYPE = 'application/vnd.warren.erofs.layer.v1';
export const CHUNKS_MEDIA_TYPE = 'application/vnd.warren.erofs.chunks.v1';
export const ANNOTATION_LAYER = 'org.warren.layer.digest';

/** Default chunk of lazy reads and of the chunk index: small reads stay small, one registry round trip per 64 KiB. */
export const DEFAULT_CHUNK_SIZE = 64 * 1024;
export const MIN_CHUNK_SIZE = 4096;
export const MAX_CHUNK_SIZE = 16 << 20;

export interface ArtifactLayer {
  /** The Warren layer digest = the registry blob digest of the EROFS file. */
  digest: string;
  size: number;
  chunkSize: number;
  /** Digest of the chunk index blob. */
  chunks: string;
}

export interface ImageArtifactConfig {
  schemaVersion: 1;
  name: string;
  kind: ImageInfo['kind'];
  /** Top-most first, as in Warren images. */
  layers: ArtifactLayer[];
  /** Env, cmd etc. of imported OCI images (ImageRuntimeConfig), or null. */
  runtime: Record<string, unknown> | null;
  source: string;
}

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  annotations?: Record<string, string>;
}

export interface ImageManifest {
  schemaVersion: 2;
  mediaType: string;
  artifactType: string;
  config: Descriptor;
  layers: Descriptor[];
  annotations?: Record<string, string>;
}

/** sha256 of every `chunkSize` bytes of `file`, concatenated (32 bytes per chunk). */
export async function chunkIndex(file: string, chunkSize = DEFAULT_CHUNK_SIZE): Promise<{ index: Buffer; size: number; digest: string }> {
  if (!Number.isInteger(chunkSize) || chunkSize < MIN_CHUNK_SIZE || chunkSize > MAX_CHUNK_SIZE || (chunkSize & (chunkSize - 1)) !== 0) {
    throw new WarrenError('INVALID_ARGUMENT', `chunk size must be a power of two between ${MIN_CHUNK_SIZE} and ${MAX_CHUNK_SIZE}`);
  }
  const out: Buffer[] = [];
  const whole = createHash('sha256');
  let h = createHash('sha256');
  let inChunk = 0;
  let size = 0;
  for await (const data of createReadStream(file, { highWaterMark: 1 << 20 })) {
    const buf = data as Buffer;
    whole.update(buf);
    size += buf.length;
    let off = 0;
    while (off < buf.length) {
      const take = Math.min(chunkSize - inChunk, buf.length - off);
      h.update(buf.subarray(off, off + take));
      inChunk += take;
      off += take;
      if (inChunk === chunkSize) {
        out.push(h.digest());
        h = createHash('sha256');
        inChunk = 0;
      }
    }
  }
  if (inChunk > 0) out.push(h.digest());
  return { index: Buffer.concat(out), size, digest: 'sha256:' + whole.digest('hex') };
}

export function chunkCount(size: number, chunkSize: number): number {
  return Math.ceil(size / chunkSize);
}

export function buildManifest(config: Buffer, layers: Array<{ layer: ArtifactLayer; indexSize: number }>, annotations: Record<string, string>): Buffer {
  const m: ImageManifest = {
    schemaVersion: 2,
    mediaType: MANIFEST_MEDIA_TYPE,
    artifactType: ARTIFACT_TYPE,
    config: { mediaType: CONFIG_MEDIA_TYPE, digest: 'sha256:' + createHash('sha256').update(config).digest('hex'), size: config.length },
    layers: layers.flatMap(({ layer, indexSize }) => [
      { mediaType: LAYER_MEDIA_TYPE, digest: layer.digest, size: layer.size },
      { mediaType: CHUNKS_MEDIA_TYPE, digest: layer.chunks, size: indexSize, annotations: { [ANNOTATION_LAYER]: layer.digest } },
    ]),
    annotations,
  };
  return Buffer.from(JSON.stringify(m));
}

function bad(what: string): WarrenError {
  return new WarrenError('INVALID_ARCHIVE', `not a Warren image artifact: ${what}`);
}

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Parse and check a manifest; returns its config descriptor. */
export function parseManifest(body: Buffer): ImageManifest {
  let m: unknown;
  try {
    m = JSON.parse(body.toString('utf8'));
  } catch {
    throw bad('the manifest is not JSON');
  }
  if (!isObj(m) || m.schemaVersion !== 2) throw bad('schemaVersion is not 2');
  if (m.mediaType !== undefined && m.mediaType !== MANIFEST_MEDIA_TYPE) throw bad(`manifest media type ${JSON.stringify(m.mediaType)}`);
  const cfg = m.config;
  if (!isObj(cfg) || cfg.mediaType !== CONFIG_MEDIA_TYPE) throw bad(`config media type ${JSON.stringify(isObj(cfg) ? cfg.mediaType : null)} (expected ${CONFIG_MEDIA_TYPE})`);
  if (typeof cfg.digest !== 'string' || !/^sha256:[a-f0-9]{64}$/.test(cfg.digest) || typeof cfg.size !== 'number') throw bad('config descriptor');
  if (!Array.isArray(m.layers)) throw bad('no layers');
  for (const l of m.layers) {
    if (!isObj(l) || typeof l.digest !== 'string' || !/^sha256:[a-f0-9]{64}$/.test(l.digest) || typeof l.size !== 'number' || typeof l.mediaType !== 'string') throw bad('layer descriptor');
  }
  return m as unknown as ImageManifest;
}

/** Parse and check the image config against its manifest. */
export function parseConfig(body: Buffer, manifest: ImageManifest): ImageArtifactConfig {
  let c: unknown;
  try {
    c = JSON.parse(body.toString('utf8'));
  } catch {
    throw bad('the config is not JSON');
  }
  if (!isObj(c) || c.schemaVersion !== 1) throw bad('config schemaVersion is not 1');
  if (!['base', 'workspace', 'toolkit'].includes(c.kind as string)) throw bad('config kind');
  if (!Array.isArray(c.layers) || c.layers.length === 0 || c.layers.length > 128) throw bad('config layers');
  const inManifest = new Map(manifest.layers.map((d) => [d.digest, d]));
  for (const l of c.layers as unknown[]) {
    if (!isObj(l)) throw bad('config layer');
    assertDigest(l.digest);
    assertDigest(l.chunks);
    if (!Number.isSafeInteger(l.size) || (l.size as number) <= 0) throw bad('layer size');
    const cs = l.chunkSize as number;
    if (!Number.isInteger(cs) || cs < MIN_CHUNK_SIZE || cs > MAX_CHUNK_SIZE || (cs & (cs - 1)) !== 0) throw bad('chunk size');
    const d = inManifest.get(l.digest as string);
    if (!d || d.mediaType !== LAYER_MEDIA_TYPE || d.size !== l.size) throw bad(`layer ${String(l.digest)} is not in the manifest as ${LAYER_MEDIA_TYPE} of ${String(l.size)} bytes`);
    const x = inManifest.get(l.chunks as string);
    if (!x || x.mediaType !== CHUNKS_MEDIA_TYPE || x.size !== chunkCount(l.size as number, cs) * 32) throw bad(`chunk index of ${String(l.digest)} is missing or has the wrong size`);
  }
  if (typeof c.name !== 'string') throw bad('config name');
  return c as unknown as ImageArtifactConfig;
}
