/**
 * Image and layer references: `name`, `name:tag`, or `sha256:<64 hex>`.
 *
 * Names follow the OCI distribution grammar for repository paths, minus
 * registry hosts: lower-case alphanumeric components separated by one `.`, one
 * or two `_`, or dashes, and joined by single `/`. Tags are
 * `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`. A reference is at most 255 characters and
 * never contains `..`, NUL or control characters.
 */
import { WarrenError } from '../../errors';

export const MAX_REF_LENGTH = 255;

const COMPONENT = '[a-z0-9]+(?:(?:\\.|_|__|-+)[a-z0-9]+)*';
const NAME_RE = new RegExp(`^${COMPONENT}(?:/${COMPONENT})*$`);
const TAG_RE = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const DIGEST_RE = /^sha256:[a-f0-9]{64}$/;

export type ParsedRef = { type: 'digest'; digest: string } | { type: 'name'; name: string; repository: string; tag: string | null };

function bad(ref: unknown, why: string): WarrenError {
  const shown = typeof ref === 'string' ? JSON.stringify(ref.length > 80 ? ref.slice(0, 80) + '...' : ref) : String(ref);
  return new WarrenError('INVALID_ARGUMENT', `invalid image reference ${shown}: ${why}`, { ref: typeof ref === 'string' ? ref.slice(0, MAX_REF_LENGTH) : null });
}

export function isDigest(ref: string): boolean {
  return DIGEST_RE.test(ref);
}

/** Validate and split a reference. Throws INVALID_ARGUMENT. */
export function parseRef(ref: unknown): ParsedRef {
  if (typeof ref !== 'string') throw bad(ref, 'not a string');
  if (ref.length === 0) throw bad(ref, 'empty');
  if (ref.length > MAX_REF_LENGTH) throw bad(ref, `longer than ${MAX_REF_LENGTH} characters`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(ref)) throw bad(ref, 'contains control characters');
  if (ref.includes('..')) throw bad(ref, 'contains ".."');
  if (ref.startsWith('sha256:')) {
    if (!DIGEST_RE.test(ref)) throw bad(ref, 'a digest is "sha256:" and 64 lower-case hex digits');
    return { type: 'digest', digest: ref };
  }
  const slash = ref.lastIndexOf('/');
  const colon = ref.lastIndexOf(':');
  let repository = ref;
  let tag: string | null = null;
  if (colon > slash) {
    repository = ref.slice(0, colon);
    tag = ref.slice(colon + 1);
    if (!TAG_RE.test(tag)) throw bad(ref, 'a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}');
  }
  if (!NAME_RE.test(repository)) throw bad(ref, 'a name is lower-case [a-z0-9] words joined by ".", "_", "__" or "-", with "/" between path components');
  return { type: 'name', name: ref, repository, tag };
}

/** Validate a name to register an image under (a digest is not a name). */
export function parseName(name: unknown): { name: string; repository: string; tag: string | null } {
  const r = parseRef(name);
  if (r.type === 'digest') throw bad(name, 'a digest cannot be used as a name');
  return r;
}

/** Stored names a reference may denote: "x" and "x:latest" are the same image. */
export function nameCandidates(r: { name: string; repository: string; tag: string | null }): string[] {
  if (r.tag === null) return [r.name, `${r.name}:latest`];
  if (r.tag === 'latest') return [r.name, r.repository];
  return [r.name];
}

/** Throws INVALID_ARGUMENT unless `digest` is a well-formed sha256 digest. */
export function assertDigest(digest: unknown): string {
  if (typeof digest !== 'string' || !DIGEST_RE.test(digest)) throw bad(digest, 'a layer digest is "sha256:" and 64 lower-case hex digits');
  return digest;
}
