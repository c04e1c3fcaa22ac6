/**
 * The one loader of the native helper.
 *
 * Loads build/Release/warren_native.node (node-gyp output of binding.gyp),
 * hands it the WarrenError class so C++ throws `new WarrenError(code, message,
 * details, errno)`, and exposes it as `native` (loaded on first use). Also
 * locates the static helper binaries in native/helper/out/.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';

import { WarrenError } from '../errors';
import type { ConfineSpec, NativeAddon } from './types';

export type HelperBinary = 'warren-init' | 'warren-nsexec' | 'warren-session' | 'warren_zygote.so';

interface RawAddon extends NativeAddon {
  init(errorClass: typeof WarrenError): void;
}

/** The repository root: the nearest ancestor of this file holding binding.gyp (works from src/ and dist/src/). */
function findRepoRoot(): string {
  let dir = __dirname;
  for (;;) {
    if (fs.existsSync(path.join(dir, 'binding.gyp'))) return dir;
    const parent = path.dirname(dir);
    if (parent === dir) return path.resolve(__dirname, '..', '..');
    dir = parent;
  }
}

let repoRoot: string | undefined;
function root(): string {
  repoRoot ??= findRepoRoot();
  return repoRoot;
}

let loaded: RawAddon | undefined;

/** Load the addon now (idempotent). Throws NATIVE_ERROR listing every path tried. */
export function loadNative(): NativeAddon {
  if (loaded) return loaded;
  const candidates: string[] = [];
  if (process.env.WARREN_NATIVE_ADDON) candidates.push(path.resolve(process.env.WARREN_NATIVE_ADDON));
  candidates.push(
    path.join(root(), 'build', 'Release', 'warren_native.node'),
    path.join(root(), 'build', 'Debug', 'warren_native.node'),
  );
  const failures: string[] = [];
  for (const file of candidates) {
    if (!fs.existsSync(file)) {
      failures.push(`${file}: not found`);
      continue;
    }
    try {
      // eslint-disable-next-line @typescript-eslint/no-var-requires
      const addon = require(file) as RawAddon;
      addon.init(WarrenError);
      loaded = addon;
      return addon;
    } catch (err) {
      failures.push(`${file}: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  throw new WarrenError(
    'NATIVE_ERROR',
    `cannot load the native addon warren_native (build it with "npx node-gyp rebuild"); tried: ${failures.join('; ')}`,
    { tried: candidates },
  );
}

/** Whether the addon can be loaded here (never throws). */
export function nativeAvailable(): boolean {
  try {
    loadNative();
    return true;
  } catch {
    return false;
  }
}

/**
 * who decides the confinement of spawnSandbox / exec calls that do not say
 * (`confine` absent). src/security/confinement.ts installs itself here, so every
 * sandbox process started through the shim (container backend, FnCall, lifecycle
 * resume, ...) is confined by the policy; `confine: null` opts out explicitly.
 */
export type ConfinementProvider = (sandboxId: string) => ConfineSpec | null;
let confinementProvider: ConfinementProvider | null = null;
export function setConfinementProvider(p: ConfinementProvider | null): void {
  confinementProvider = p;
}
function withConfine<T extends { confine?: ConfineSpec | null }>(spec: T, id: unknown): T {
  if (spec === null || typeof spec !== 'object') return spec;
  if ('confine' in spec && spec.confine !== undefined) {
    if (spec.confine !== null) return spec;
    const { confine: _none, ...rest } = spec;
    return rest as T;
  }
  if (confinementProvider === null || typeof id !== 'string') return spec;
  const c = confinementProvider(id);
  return c === null ? spec : { ...spec, confine: c };
}

/** The confinement the provider gives the processes of sandbox `id` (null: none). */
export function confinementOf(id: string): ConfineSpec | null {
  return confinementProvider === null ? null : confinementProvider(id);
}

/** The native addon, loaded on first property access. */
export const native: NativeAddon = new Proxy({} as NativeAddon, {
  get(_target, prop) {
    const addon = loadNative() as unknown as Record<string | symbol, unknown>;
    if (prop === 'spawnSandbox' || prop === 'exec' || prop === 'spawnSandboxAsync' || prop === 'execAsync') {
      const fn = addon[prop] as (s: unknown) => unknown;
      const isExec = prop === 'exec' || prop === 'execAsync';
      return (spec: { id?: unknown; cgroup?: unknown; confine?: ConfineSpec | null }) =>
        fn.call(addon, withConfine(spec, isExec ? spec?.cgroup : spec?.id));
    }
    const value = addon[prop];
    return typeof value === 'function' ? (value as (...a: unknown[]) => unknown).bind(addon) : value;
  },
  has(_target, prop) {
    return prop in (loadNative() as object);
  },
});

/** Absolute path of a static helper binary in native/helper/out (override the folder with WARREN_HELPER_DIR). */
/** A compiled BPF object of bpf/ (bpf/out/<name>.bpf.o), built by `npm run build:bpf`. */
export function bpfObject(name: 'sandbox_egress'): string {
  const file = path.join(root(), 'bpf', 'out', `${name}.bpf.o`);
  if (!fs.existsSync(file)) throw new WarrenError('NOT_SUPPORTED', `BPF object ${file} is missing: run \`npm run build:bpf\``, { feature: 'egress-bpf' });
  return file;
}

export function helperBinary(name: HelperBinary): string {
  if (name !== 'warren-init' && name !== 'warren-nsexec' && name !== 'warren-session' && name !== 'warren_zygote.so') {
    throw new WarrenError('INVALID_ARGUMENT', `unknown helper binary ${String(name)}`);
  }
  const dir = process.env.WARREN_HELPER_DIR
    ? path.resolve(process.env.WARREN_HELPER_DIR)
    : path.join(root(), 'native', 'helper', 'out');
  const file = path.join(dir, name);
  try {
    fs.accessSync(file, fs.constants.X_OK);
  } catch {
    throw new WarrenError(
      'NATIVE_ERROR',
      `helper binary ${name} is missing or not executable at ${file} (build it with "make -C native/helper")`,
      { path: file },
    );
  }
  return file;
}
