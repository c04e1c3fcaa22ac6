/**
 * The one place backends are built. Every backend name has an entry: either a
 * working backend, or the reason it is disabled on this node (answered as
 * NOT_SUPPORTED when a request names it). The node holds backends by name
 * through this registry and never constructs one itself.
 */
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { WarrenError } from '../../errors';
import { containerBackendStatus, microvmBackendStatus, vmBackendStatus } from '../../features';
import type { NetworkManager } from '../network/manager';
import { BACKEND_NAMES, type Backend, type BackendName, type BackendStatus, type HostProcessBackend } from '../types';
import { ContainerBackend, DEFAULT_PATH } from './container';
import { MicroVMBackend } from './microvm/backend';
import { VmBackend } from './vm';

export { DEFAULT_PATH };

export interface BackendRegistryOptions {
  dataDir: string;
  network: NetworkManager | null;
  log: (line: string) => void;
  /** How long a VM backend waits for a guest to come up before the create fails with its console (default: theirs). */
  bootTimeoutMs?: number;
}

interface Entry {
  backend: Backend | null;
  status: BackendStatus;
}

export class BackendRegistry {
  private constructor(private readonly entries: Map<BackendName, Entry>) {}

  static build(opts: BackendRegistryOptions): BackendRegistry {
    const entries = new Map<BackendName, Entry>();
    const container = containerBackendStatus();
    if (container.available) mkdirSync(join(opts.dataDir, 'sandboxes'), { recursive: true, mode: 0o700 });
    entries.set('container', {
      backend: container.available ? new ContainerBackend(join(opts.dataDir, 'sandboxes'), undefined, opts.network) : null,
      status: container,
    });
    const microvm = microvmBackendStatus();
    entries.set('microvm', { backend: microvm.available ? new MicroVMBackend({ dataDir: opts.dataDir, log: opts.log, network: opts.network, ...(opts.bootTimeoutMs ? { bootTimeoutMs: opts.bootTimeoutMs } : {}) }) : null, status: microvm });
    const vm = vmBackendStatus();
    entries.set('vm', { backend: vm.available ? new VmBackend({ dataDir: opts.dataDir, log: opts.log, ...(opts.bootTimeoutMs ? { bootTimeoutMs: opts.bootTimeoutMs } : {}) }) : null, status: vm });
    for (const e of entries.values()) if (e.backend !== null) e.status = { ...e.status, facets: e.backend.facets };
    return new BackendRegistry(entries);
  }

  /** The backend `name`, or NOT_SUPPORTED with the reason it is disabled here. */
  get(name: BackendName): Backend {
    const e = this.entries.get(name);
    if (e === undefined) throw new WarrenError('INVALID_ARGUMENT', `unknown backend ${JSON.stringify(name)}`, { backend: name });
    if (e.backend === null) throw new WarrenError('NOT_SUPPORTED', `backend "${name}" is not available on this node: ${e.status.reason ?? 'disabled'}`, { backend: name });
    return e.backend;
  }

  has(name: BackendName): boolean {
    return this.entries.get(name)?.backend != null;
  }

  /** Enabled backends. */
  all(): Backend[] {
    return [...this.entries.values()].flatMap((e) => (e.backend === null ? [] : [e.backend]));
  }

  status(): Record<BackendName, BackendStatus> {
    const out = {} as Record<BackendName, BackendStatus>;
    for (const name of BACKEND_NAMES) {
      const e = this.entries.get(name)!;
      out[name] = e.backend === null ? e.status : { ...e.status, facets: e.backend.facets };
    }
    return out;
  }
}

/**
 * The backend FnCall pools run on: containers under the warren-fncall
 * confinement profile, in the pools' own directory. FnCall needs host process
 * trees (its verified reset works on pid 1, the cgroup and the upper dir).
 */
export function fnCallBackend(dir: string): HostProcessBackend {
  return new ContainerBackend(dir, 'warren-fncall');
}
