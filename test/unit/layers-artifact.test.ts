/**
 * Registry references and the Warren image artifact: parsing, refusals, and the
 * checks a pulled manifest and config must pass before anything is fetched.
 */
import test from 'ava';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CHUNKS_MEDIA_TYPE, LAYER_MEDIA_TYPE, buildManifest, chunkIndex, parseConfig, parseManifest } from '../../src/shim/layers/artifact';
import { RegistryClient, parseRegistryRef, parseRegistryRepository } from '../../src/shim/layers/distribution';

const D = 'sha256:' + 'a'.repeat(64);
const E = 'sha256:' + 'b'.repeat(64);

test('registry references: host, repository, tag or digest; loopback speaks HTTP, others HTTPS unless configured', (t) => {
  t.like(parseRegistryRef('127.0.0.1:5000/warren/default:v1'), { base: 'http://127.0.0.1:5000', host: '127.0.0.1:5000', repository: 'warren/default', tag: 'v1', digest: null });
  t.like(parseRegistryRef('localhost/x'), { base: 'http://localhost', tag: null });
  t.like(parseRegistryRef('registry.example.org/a/b@' + D), { base: 'https://registry.example.org', repository: 'a/b', digest: D, tag: null });
  t.like(parseRegistryRef('https://127.0.0.1:5000/x:y'), { base: 'https://127.0.0.1:5000' });
  t.like(parseRegistryRef('reg.lan:5000/x', { 'reg.lan:5000': { insecure: true } }), { base: 'http://reg.lan:5000' });
  t.like(parseRegistryRef('[::1]:5000/x'), { base: 'http://[::1]:5000', host: '[::1]:5000' });
  for (const bad of ['', 'x', '/x', 'host/Upper', 'host/a//b', 'host/a:b:c', 'host/a@sha256:12', 'ho st/x', 'host/x\n', 'host/' + 'a'.repeat(300), 'ftp://host/x', 'host:99999999/x']) {
    t.throws(() => parseRegistryRef(bad), { code: 'INVALID_ARGUMENT' }, JSON.stringify(bad));
  }
  t.throws(() => parseRegistryRepository('host/x:tag'), { code: 'INVALID_ARGUMENT' });
  t.is(parseRegistryRepository('host:1/x/y').repository, 'x/y');
});

test('registry auth: basic credentials and static bearer tokens become the Authorization value', (t) => {
  const ref = parseRegistryRef('127.0.0.1:5000/x');
  t.is(new RegistryClient(ref, {}).staticAuthorization(), undefined);
  t.is(new RegistryClient(ref, { '127.0.0.1:5000': { username: 'u', password: 'p' } }).staticAuthorization(), `Basic ${Buffer.from('u:p').toString('base64')}`);
  t.is(new RegistryClient(ref, { '127.0.0.1:5000': { token: 'tok' } }).staticAuthorization(), 'Bearer tok');
  t.throws(() => new RegistryClient(ref, { '127.0.0.1:5000': { caFile: '/nonexistent/ca.pem' } }), { code: 'INVALID_ARGUMENT' });
});

test('chunk index: sha256 per chunk, the last one short; chunk sizes are powers of two', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-chunks-'));
  try {
    const data = Buffer.alloc(10000, 7);
    writeFileSync(join(dir, 'f'), data);
    const idx = await chunkIndex(join(dir, 'f'), 4096);
    t.is(idx.size, 10000);
    t.is(idx.digest, 'sha256:' + createHash('sha256').update(data).digest('hex'));
    t.is(idx.index.length, 3 * 32);
    t.deepEqual(idx.index.subarray(64), createHash('sha256').update(data.subarray(8192)).digest());
    await t.throwsAsync(chunkIndex(join(dir, 'f'), 5000), { code: 'INVALID_ARGUMENT' });
    await t.throwsAsync(chunkIndex(join(dir, 'f'), 1024), { code: 'INVALID_ARGUMENT' });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

function artifact(overrides: Record<string, unknown> = {}): { manifest: Buffer; config: Buffer } {
  const config = Buffer.from(JSON.stringify({ schemaVersion: 1, name: 'x', kind: 'base', layers: [{ digest: D, size: 10000, chunkSize: 4096, chunks: E }], runtime: null, source: 's', ...overrides }));
  const manifest = buildManifest(config, [{ layer: { digest: D, size: 10000, chunkSize: 4096, chunks: E }, indexSize: 96 }], {});
  return { manifest, config };
}

test('artifact: a manifest built for an image parses back; its layers carry the Warren media types', (t) => {
  const { manifest, config } = artifact();
  const m = parseManifest(manifest);
  t.deepEqual(m.layers.map((l) => l.mediaType), [LAYER_MEDIA_TYPE, CHUNKS_MEDIA_TYPE]);
  const c = parseConfig(config, m);
  t.is(c.layers[0]!.digest, D);
});

test('artifact: foreign or inconsistent manifests and configs are refused before anything is fetched', (t) => {
  t.throws(() => parseManifest(Buffer.from('nope')), { code: 'INVALID_ARCHIVE' });
  t.throws(() => parseManifest(Buffer.from(JSON.stringify({ schemaVersion: 2, config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: D, size: 2 }, layers: [] }))), {
    code: 'INVALID_ARCHIVE',
    message: /config media type/,
  });
  const { manifest } = artifact();
  const m = parseManifest(manifest);
  const cfg = (o: Record<string, unknown>) => artifact(o).config;
  t.throws(() => parseConfig(cfg({ kind: 'evil' }), m), { code: 'INVALID_ARCHIVE' });
  t.throws(() => parseConfig(cfg({ layers: [] }), m), { code: 'INVALID_ARCHIVE' });
  // A layer size or chunk index that does not match the manifest's descriptors.
  t.throws(() => parseConfig(cfg({ layers: [{ digest: D, size: 20000, chunkSize: 4096, chunks: E }] }), m), { code: 'INVALID_ARCHIVE', message: /not in the manifest/ });
  t.throws(() => parseConfig(cfg({ layers: [{ digest: D, size: 10000, chunkSize: 8192, chunks: E }] }), m), { code: 'INVALID_ARCHIVE', message: /chunk index/ });
  t.throws(() => parseConfig(cfg({ layers: [{ digest: D, size: 10000, chunkSize: 3000, chunks: E }] }), m), { code: 'INVALID_ARCHIVE', message: /chunk size/ });
  t.throws(() => parseConfig(cfg({ layers: [{ digest: 'sha256:zz', size: 10000, chunkSize: 4096, chunks: E }] }), m), { code: 'INVALID_ARGUMENT' });
});
