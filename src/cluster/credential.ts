/**
 * The cluster credential: one secret shared by the nodes and gateways of a
 * cluster (a file, 0600). With HMAC-SHA256 it
 *
 * - signs what nodes and gateways write to etcd (node records, job shares,
 *   the policy): a gateway routes only to nodes whose record carries a valid
 *   signature, so writing a key under /warren/nodes/ without the credential
 *   does not make a host reachable through the gateway;
 * - derives each node's shim protocol token: gateways call nodes with it, and
 *   a node's token opens no other node.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { WarrenError } from '../errors';

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

  /**
   * The shim protocol token of node `nodeId`: derived, so that every gateway
   * holding the credential can call every node, and a node's token opens no
   * other node.
   */
  shimToken(nodeId: string): string {
    return this.mac(`warren shim protocol token for node ${nodeId}`);
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
