/**
 * The cluster credential: one secret shared by the nodes and gateways of a
 * cluster (a file, 0600). It signs two things with HMAC-SHA256:
 *
 * - node records in etcd: a gateway routes only to nodes whose record carries
 *   a valid signature, so writing a key under /warren/nodes/ without the
 *   credential does not make a host reachable through the gateway;
 * - account assertions: the gateway authenticates the caller (tokens live in
 *   etcd) and calls the node as that account with a short-lived signed
 *   assertion (`wrc_<payload>.<mac>`) in place of a bearer token. A node
 *   accepts it only with the same credential.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { WarrenError } from '../errors';
import type { Role } from '../validation';

export const ASSERTION_PREFIX = 'wrc_';
/** How long an assertion is valid: long enough for one request or the opening of a shell. */
const ASSERTION_TTL_MS = 5 * 60_000;

export interface AssertedAccount {
  id: string;
  name: string;
  role: Role;
  createdAt: string;
}

export class ClusterCredential {
  private constructor(private readonly key: Buffer) {}

  static fromSecret(secret: string): ClusterCredential {
    const s = secret.trim();
    if (s.length < 32) throw new WarrenError('INVALID_ARGUMENT', 'the cluster credential must be at least 32 characters');
    return new ClusterCredential(Buffer.from(s, 'utf8'));
  }

  static readFile(path: string): ClusterCredential {
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (err) {
      throw new WarrenError('INVALID_ARGUMENT', `cannot read the cluster credential ${path}: ${(err as Error).message}`);
    }
    return ClusterCredential.fromSecret(text);
  }

  /** Write a new random credential to `path` (created 0600, refused when it exists). */
  static generate(path: string): ClusterCredential {
    const secret = randomBytes(32).toString('base64url');
    const fd = openSync(path, 'wx', 0o600);
    try {
      writeSync(fd, `${secret}\n`);
    } finally {
      closeSync(fd);
    }
    return ClusterCredential.fromSecret(secret);
  }

  mac(text: string): string {
    return createHmac('sha256', this.key).update(text, 'utf8').digest('base64url');
  }

  verifyMac(text: string, mac: unknown): boolean {
    if (typeof mac !== 'string') return false;
    const want = Buffer.from(this.mac(text), 'utf8');
    const got = Buffer.from(mac, 'utf8');
    return want.length === got.length && timingSafeEqual(want, got);
  }

  /** A signed record: the JSON of `body` with `sig` over it. */
  sign<T extends object>(body: T): T & { sig: string } {
    return { ...body, sig: this.mac(canonical(body)) };
  }

  /** The record without its signature when it verifies, else null. */
  verify<T extends object>(rec: (T & { sig?: unknown }) | null): T | null {
    if (rec === null || typeof rec !== 'object') return null;
    const { sig, ...body } = rec;
    return this.verifyMac(canonical(body), sig) ? (body as unknown as T) : null;
  }

  assertion(account: AssertedAccount, now = Date.now()): string {
    const payload = Buffer.from(JSON.stringify({ id: account.id, name: account.name, role: account.role, createdAt: account.createdAt, exp: now + ASSERTION_TTL_MS }), 'utf8').toString('base64url');
    return `${ASSERTION_PREFIX}${payload}.${this.mac(payload)}`;
  }

  /** The account an assertion names, or null (bad signature, expired, malformed). */
  checkAssertion(token: string, now = Date.now()): AssertedAccount | null {
    if (!token.startsWith(ASSERTION_PREFIX) || token.length > 4096) return null;
    const dot = token.lastIndexOf('.');
    if (dot < 0) return null;
    const payload = token.slice(ASSERTION_PREFIX.length, dot);
    if (!this.verifyMac(payload, token.slice(dot + 1))) return null;
    let body: { id?: unknown; name?: unknown; role?: unknown; createdAt?: unknown; exp?: unknown };
    try {
      body = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as typeof body;
    } catch {
      return null;
    }
    if (typeof body.exp !== 'number' || body.exp < now) return null;
    if (typeof body.id !== 'string' || typeof body.name !== 'string' || typeof body.createdAt !== 'string') return null;
    if (body.role !== 'admin' && body.role !== 'builder' && body.role !== 'runtime') return null;
    return { id: body.id, name: body.name, role: body.role, createdAt: body.createdAt };
  }
}

/** JSON with sorted keys, so that a signature does not depend on key order. */
export function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v !== null && typeof v === 'object') {
    const o = v as Record<string, unknown>;
    return `{${Object.keys(o)
      .filter((k) => o[k] !== undefined)
      .sort()
      .map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`)
      .join(',')}}`;
  }
  return JSON.stringify(v);
}
