/**
 * A client of the OCI distribution API (the CNCF distribution registry, Debian's
 * docker-registry, and anything that speaks the same protocol): blobs (HEAD, GET,
 * Range GET, monolithic upload, cross-repository mount) and manifests.
 *
 * References name a registry host, a repository and a tag or digest:
 *   [http://|https://]host[:port]/repo/path[:tag|@sha256:<hex>]
 * Without a scheme, loopback hosts (localhost, 127.x, [::1]) are spoken to in
 * plain HTTP and every other host in HTTPS; a registry's config can say otherwise.
 *
 * Auth is optional, per registry host: HTTP basic (username/password), a static
 * bearer token, or the registry token flow (a 401 with `WWW-Authenticate: Bearer
 * realm=…` is answered by asking the realm for a token, with the basic
 * credentials when there are some).
 */
import { readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import { Agent, request, type Dispatcher } from 'undici';
import { WarrenError } from '../../errors';
import { assertDigest } from './refs';

export interface RegistryAuth {
  username?: string;
  password?: string;
  /** A bearer token sent as is. */
  token?: string;
  /** PEM CA bundle for a registry whose certificate is not from a system CA. */
  caFile?: string;
  /** Speak plain HTTP to this host (default: only for loopback hosts). */
  insecure?: boolean;
}

/** Registry settings by host[:port]. */
export type RegistryConfig = Record<string, RegistryAuth>;

export interface RegistryRef {
  /** scheme://host[:port] */
  base: string;
  /** host[:port], the key of RegistryConfig */
  host: string;
  repository: string;
  tag: string | null;
  digest: string | null;
  /** host/repository[:tag|@digest], without a scheme */
  text: string;
}

const REPO_COMPONENT = '[a-z0-9]+(?:(?:\\.|_|__|-+)[a-z0-9]+)*';
const REPO_RE = new RegExp(`^${REPO_COMPONENT}(?:/${REPO_COMPONENT})*$`);
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const HOST_RE = /^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*|\[[0-9a-fA-F:.]+\])(?::\d{1,5})?$/;

function badRef(ref: unknown, why: string): WarrenError {
  const shown = typeof ref === 'string' ? JSON.stringify(ref.slice(0, 120)) : String(ref);
  return new WarrenError('INVALID_ARGUMENT', `invalid registry reference ${shown}: ${why}`);
}

export function isLoopbackHost(host: string): boolean {
  const h = host.replace(/:\d+$/, '').replace(/^\[|\]$/g, '');
  return h === 'localhost' || /^127\.\d+\.\d+\.\d+$/.test(h) || h === '::1';
}

/** Parse `[scheme://]host[:port]/repo[:tag|@digest]`. Throws INVALID_ARGUMENT. */
export function parseRegistryRef(ref: unknown, config: RegistryConfig = {}): RegistryRef {
  if (typeof ref !== 'string' || ref.length === 0) throw badRef(ref, 'not a string');
  if (ref.length > 512) throw badRef(ref, 'longer than 512 characters');
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u0020\u007f]/.test(ref)) throw badRef(ref, 'contains spaces or control characters');
  let rest = ref;
  let scheme: 'http' | 'https' | null = null;
  const m = /^(https?):\/\//.exec(rest);
  if (m) {
    scheme = m[1] as 'http' | 'https';
    rest = rest.slice(m[0].length);
  }
  const slash = rest.indexOf('/');
  if (slash <= 0) throw badRef(ref, 'it names no registry host (host[:port]/repository[:tag])');
  const host = rest.slice(0, slash);
  if (!HOST_RE.test(host)) throw badRef(ref, `${JSON.stringify(host)} is not a host[:port]`);
  let path = rest.slice(slash + 1);
  let digest: string | null = null;
  let tag: string | null = null;
  const at = path.indexOf('@');
  if (at >= 0) {
    digest = path.slice(at + 1);
    path = path.slice(0, at);
    if (!/^sha256:[a-f0-9]{64}$/.test(digest)) throw badRef(ref, 'a digest is "sha256:" and 64 lower-case hex digits');
  }
  const colon = path.lastIndexOf(':');
  if (colon >= 0) {
    tag = path.slice(colon + 1);
    path = path.slice(0, colon);
    if (!TAG_RE.test(tag)) throw badRef(ref, 'a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}');
  }
  if (!REPO_RE.test(path) || path.length > 255) throw badRef(ref, 'a repository is lower-case [a-z0-9] words joined by ".", "_", "__" or "-", with "/" between components');
  const insecure = config[host]?.insecure ?? isLoopbackHost(host);
  const sch = scheme ?? (insecure ? 'http' : 'https');
  return { base: `${sch}://${host}`, host, repository: path, tag, digest, text: `${host}/${path}${digest ? `@${digest}` : tag ? `:${tag}` : ''}` };
}

/** A registry's host[:port]/repository without tag (for staging: `warren image stage IMG --registry host/repo`). */
export function parseRegistryRepository(ref: unknown, config: RegistryConfig = {}): RegistryRef {
  const r = parseRegistryRef(ref, config);
  if (r.tag !== null || r.digest !== null) throw badRef(ref, 'give a repository without a tag or digest');
  return r;
}

function parseChallenge(h: string): Record<string, string> | null {
  const m = /^Bearer\s+(.*)$/i.exec(h.trim());
  if (!m) return null;
  const out: Record<string, string> = {};
  for (const p of m[1]!.matchAll(/([a-zA-Z_]+)="([^"]*)"/g)) out[p[1]!.toLowerCase()] = p[2]!;
  return out.realm ? out : null;
}

export interface BlobInfo {
  size: number;
}

/** One registry host. */
export class RegistryClient {
  readonly base: string;
  readonly host: string;
  private readonly auth: RegistryAuth;
  private readonly dispatcher: Dispatcher | undefined;
  /** Bearer tokens from the token flow, by scope. */
  private readonly tokens = new Map<string, string>();

  constructor(ref: RegistryRef, config: RegistryConfig = {}) {
    this.base = ref.base;
    this.host = ref.host;
    this.auth = config[ref.host] ?? {};
    if (this.auth.caFile) {
      let ca: Buffer;
      try {
        ca = readFileSync(this.auth.caFile);
      } catch (err) {
        throw new WarrenError('INVALID_ARGUMENT', `registry ${ref.host}: cannot read CA file ${this.auth.caFile}: ${(err as Error).message}`);
      }
      this.dispatcher = new Agent({ connect: { ca } });
    }
  }

  /** The static Authorization header value, if the config gives one (for the lazy file server). */
  staticAuthorization(scope?: string): string | undefined {
    if (scope && this.tokens.has(scope)) return `Bearer ${this.tokens.get(scope)}`;
    if (this.auth.token) return `Bearer ${this.auth.token}`;
    if (this.auth.username !== undefined) return `Basic ${Buffer.from(`${this.auth.username}:${this.auth.password ?? ''}`).toString('base64')}`;
    return undefined;
  }

  /** What the lazy file server needs to read a blob: its URL and an Authorization value (a token fetched now, if the registry asks for one). */
  async blobAccess(repository: string, digest: string): Promise<{ url: string; authorization?: string; caFile?: string }> {
    const scope = `repository:${repository}:pull`;
    await this.call('HEAD', `/v2/${repository}/blobs/${digest}`, { scope, ok: [200, 307, 404] });
    const authorization = this.staticAuthorization(scope);
    return { url: `${this.base}/v2/${repository}/blobs/${digest}`, ...(authorization ? { authorization } : {}), ...(this.auth.caFile ? { caFile: this.auth.caFile } : {}) };
  }

  close(): void {
    void (this.dispatcher as Agent | undefined)?.close();
  }

  private async token(challenge: Record<string, string>, scope: string): Promise<string> {
    const u = new URL(challenge.realm!);
    if (challenge.service) u.searchParams.set('service', challenge.service);
    u.searchParams.set('scope', challenge.scope ?? scope);
    const headers: Record<string, string> = {};
    if (this.auth.username !== undefined) headers.authorization = `Basic ${Buffer.from(`${this.auth.username}:${this.auth.password ?? ''}`).toString('base64')}`;
    let res: Dispatcher.ResponseData;
    try {
      res = await request(u, { headers, dispatcher: this.dispatcher, headersTimeout: 15_000, bodyTimeout: 15_000 });
    } catch (err) {
      throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: token service ${u.origin} unreachable: ${(err as Error).message}`);
    }
    const text = await res.body.text();
    if (res.statusCode !== 200) throw new WarrenError('UNAUTHENTICATED', `registry ${this.host}: token service answered ${res.statusCode}`, { registry: this.host });
    let body: { token?: string; access_token?: string };
    try {
      body = JSON.parse(text) as typeof body;
    } catch {
      throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: token service answered no JSON`);
    }
    const t = body.token ?? body.access_token;
    if (typeof t !== 'string' || t === '') throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: token service answered no token`);
    this.tokens.set(scope, t);
    return t;
  }

  /**
   * One request; a 401 with a bearer challenge is answered once with a token.
   * Statuses outside `ok` become REGISTRY_ERROR (UNAUTHENTICATED/FORBIDDEN for 401/403).
   */
  async call(
    method: 'GET' | 'HEAD' | 'PUT' | 'POST' | 'PATCH' | 'DELETE',
    pathOrUrl: string,
    opts: { scope: string; ok: number[]; headers?: Record<string, string>; body?: Buffer | Readable | (() => Buffer | Readable); timeoutMs?: number },
  ): Promise<Dispatcher.ResponseData> {
    const url = pathOrUrl.startsWith('http://') || pathOrUrl.startsWith('https://') ? pathOrUrl : `${this.base}${pathOrUrl}`;
    if (!url.startsWith(this.base + '/')) throw new WarrenError('REGISTRY_ERROR', `registry ${this.host} sent us to another host (${new URL(url).host})`);
    for (let attempt = 0; ; attempt++) {
      const headers: Record<string, string> = { ...(opts.headers ?? {}) };
      const authz = this.staticAuthorization(opts.scope);
      if (authz) headers.authorization = authz;
      let res: Dispatcher.ResponseData;
      const body = typeof opts.body === 'function' ? opts.body() : opts.body;
      try {
        res = await request(url, {
          method,
          headers,
          body,
          dispatcher: this.dispatcher,
          headersTimeout: opts.timeoutMs ?? 30_000,
          bodyTimeout: opts.timeoutMs ?? 300_000,
        });
      } catch (err) {
        // A kept-alive connection the registry closed meanwhile: retry once what can be repeated.
        if (attempt === 0 && typeof opts.body !== 'object') continue;
        throw new WarrenError('REGISTRY_ERROR', `registry ${this.host} unreachable (${method} ${new URL(url).pathname}): ${(err as Error).message}`, { registry: this.host });
      }
      if (res.statusCode === 401 && attempt === 0) {
        const ch = parseChallenge(String(res.headers['www-authenticate'] ?? ''));
        if (ch && typeof opts.body !== 'object') {
          await res.body.dump();
          await this.token(ch, opts.scope);
          continue;
        }
      }
      if (opts.ok.includes(res.statusCode)) return res;
      const text = method === 'HEAD' ? '' : (await res.body.text().catch(() => '')).slice(0, 500);
      if (method === 'HEAD') await res.body.dump().catch(() => undefined);
      let detail = text;
      try {
        const j = JSON.parse(text) as { errors?: Array<{ code?: string; message?: string }> };
        if (Array.isArray(j.errors)) detail = j.errors.map((e) => `${e.code ?? ''}: ${e.message ?? ''}`).join('; ');
      } catch {
        /* not JSON */
      }
      const what = `registry ${this.host}: ${method} ${new URL(url).pathname} answered ${res.statusCode}${detail ? ` (${detail})` : ''}`;
      if (res.statusCode === 401) throw new WarrenError('UNAUTHENTICATED', what, { registry: this.host });
      if (res.statusCode === 403) throw new WarrenError('FORBIDDEN', what, { registry: this.host });
      throw new WarrenError('REGISTRY_ERROR', what, { registry: this.host, status: res.statusCode });
    }
  }

  /** The blob's size, or null when the repository does not have it. */
  async headBlob(repository: string, digest: string): Promise<BlobInfo | null> {
    assertDigest(digest);
    const res = await this.call('HEAD', `/v2/${repository}/blobs/${digest}`, { scope: `repository:${repository}:pull`, ok: [200, 404] });
    await res.body.dump();
    if (res.statusCode === 404) return null;
    return { size: Number(res.headers['content-length'] ?? NaN) };
  }

  /** A whole blob as a stream (the caller verifies it). */
  async getBlob(repository: string, digest: string): Promise<{ size: number; body: Readable }> {
    assertDigest(digest);
    const res = await this.call('GET', `/v2/${repository}/blobs/${digest}`, { scope: `repository:${repository}:pull`, ok: [200], timeoutMs: 600_000 });
    return { size: Number(res.headers['content-length'] ?? NaN), body: res.body };
  }

  /** A small blob in memory, verified against its digest. */
  async getBlobBuffer(repository: string, digest: string, maxBytes: number): Promise<Buffer> {
    const { size, body } = await this.getBlob(repository, digest);
    if (Number.isFinite(size) && size > maxBytes) {
      body.destroy();
      throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: blob ${digest} is ${size} bytes, more than the ${maxBytes} expected`);
    }
    const parts: Buffer[] = [];
    let n = 0;
    for await (const c of body as AsyncIterable<Buffer>) {
      n += c.length;
      if (n > maxBytes) {
        body.destroy();
        throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: blob ${digest} is larger than the ${maxBytes} bytes expected`);
      }
      parts.push(c);
    }
    const buf = Buffer.concat(parts);
    const got = 'sha256:' + createHash('sha256').update(buf).digest('hex');
    if (got !== digest) throw new WarrenError('LAYER_CORRUPT', `registry ${this.host}: blob ${digest} has digest ${got}`, { digest, got });
    return buf;
  }

  /**
   * Upload a blob unless the repository has it: a cross-repository mount from
   * `mountFrom` first (no data moves when the registry has the blob elsewhere),
   * then one monolithic PUT. Returns whether bytes were sent.
   */
  async uploadBlob(repository: string, digest: string, size: number, body: () => Buffer | Readable, mountFrom?: string): Promise<boolean> {
    assertDigest(digest);
    if (await this.headBlob(repository, digest)) return false;
    const scope = `repository:${repository}:pull,push`;
    const start = await this.call('POST', `/v2/${repository}/blobs/uploads/${mountFrom ? `?mount=${digest}&from=${encodeURIComponent(mountFrom)}` : ''}`, { scope, ok: [201, 202] });
    await start.body.dump();
    if (start.statusCode === 201) return false;
    const loc = String(start.headers.location ?? '');
    if (loc === '') throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: upload started without a Location`);
    const u = new URL(loc, this.base + '/');
    u.searchParams.set('digest', digest);
    const put = await this.call('PUT', u.toString(), {
      scope,
      ok: [201, 204],
      headers: { 'content-type': 'application/octet-stream', 'content-length': String(size) },
      body,
      timeoutMs: 600_000,
    });
    await put.body.dump();
    return true;
  }

  async putManifest(repository: string, reference: string, mediaType: string, body: Buffer): Promise<string> {
    const res = await this.call('PUT', `/v2/${repository}/manifests/${reference}`, {
      scope: `repository:${repository}:pull,push`,
      ok: [201, 200],
      headers: { 'content-type': mediaType },
      body,
    });
    await res.body.dump();
    return 'sha256:' + createHash('sha256').update(body).digest('hex');
  }

  /** A manifest by tag or digest; by digest it is verified. Null when absent. */
  async getManifest(repository: string, reference: string, accept: string[], maxBytes = 4 << 20): Promise<{ body: Buffer; digest: string; mediaType: string } | null> {
    const res = await this.call('GET', `/v2/${repository}/manifests/${reference}`, { scope: `repository:${repository}:pull`, ok: [200, 404], headers: { accept: accept.join(', ') } });
    if (res.statusCode === 404) {
      await res.body.dump();
      return null;
    }
    const parts: Buffer[] = [];
    let n = 0;
    for await (const c of res.body as AsyncIterable<Buffer>) {
      n += c.length;
      if (n > maxBytes) {
        res.body.destroy();
        throw new WarrenError('REGISTRY_ERROR', `registry ${this.host}: manifest ${repository}:${reference} is larger than ${maxBytes} bytes`);
      }
      parts.push(c);
    }
    const body = Buffer.concat(parts);
    const digest = 'sha256:' + createHash('sha256').update(body).digest('hex');
    if (reference.startsWith('sha256:') && digest !== reference) throw new WarrenError('LAYER_CORRUPT', `registry ${this.host}: manifest ${reference} has digest ${digest}`);
    return { body, digest, mediaType: String(res.headers['content-type'] ?? '').split(';')[0]!.trim() };
  }
}
