/**
 * Reaching a backend's facet: the implementation when the sandbox has it,
 * else NOT_SUPPORTED with the reason from the backend's facet table.
 */
import { WarrenError } from '../../errors';
import type { Backend, BackendSandbox, FacetName } from '../types';

type SandboxFacet = 'files' | 'sessions' | 'freeze' | 'snapshot' | 'export';

export function offers(backend: Backend, name: FacetName): boolean {
  return backend.facets[name].offered;
}

export function refusal(backend: Backend, name: FacetName): WarrenError {
  const f = backend.facets[name];
  const why = f.offered ? 'not available for this sandbox right now' : f.reason;
  return new WarrenError('NOT_SUPPORTED', `the ${backend.name} backend does not offer ${name}: ${why}`, { backend: backend.name, facet: name });
}

/** The facet `name` of `box`, or NOT_SUPPORTED (with the backend's reason). */
export function facet<K extends SandboxFacet>(backend: Backend, box: BackendSandbox, name: K): NonNullable<BackendSandbox[K]> {
  const impl = box[name];
  if (impl === undefined || !backend.facets[name].offered) throw refusal(backend, name);
  return impl as NonNullable<BackendSandbox[K]>;
}

/** NOT_SUPPORTED unless the backend offers `name` (for facets used before a sandbox exists, like network). */
export function requireOffered(backend: Backend, name: FacetName): void {
  if (!backend.facets[name].offered) throw refusal(backend, name);
}
