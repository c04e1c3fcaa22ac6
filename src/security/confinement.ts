/**
 * From policy to the native helper.
 *
 * - PolicyStore: the policy in force. `apply()` loads the directory again and swaps it in
 *   atomically; on any error the last good policy stays and the rejection is audited.
 *   Every apply (accepted or rejected) is one JSON line in the audit log.
 * - confineFor(profile): the native ConfineSpec (seccomp mask, Landlock paths/scopes,
 *   AppArmor profile where AppArmor is enabled, rlimits).
 * - The per-sandbox registry: which profile each sandbox runs under, so every process
 *   started in it later (exec, shells, FnCall invocations, resume) gets the same
 *   confinement. It is installed as the native confinement provider: a spawn or exec
 *   that does not say otherwise is confined; an unknown sandbox gets the default profile.
 * - assertConfinable(): with no LSM enforcer (AppArmor, Landlock) or no seccomp, creation
 *   fails with CONFINEMENT_UNAVAILABLE unless the policy sets enforcement.allowUnconfined
 *   (or the operator sets WARREN_ALLOW_UNCONFINED=1).
 */
import { execFileSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { activeEnforcer, has } from '../features';
import { WarrenError } from '../errors';
import { native, setConfinementProvider } from '../native';
import type { ConfineSpec } from '../native/types';
import { type Policy, PolicyError, type Profile, diffPolicy, loadPolicy } from './policy';
import { ownValue } from '../validation';

const MIB = 1024 * 1024;
export const DEFAULT_PROFILE = 'warren-default';

/** The repository's policies/ and apparmor/ (works from src/ and dist/src/). */
function repoDir(name: string): string {
  let dir = __dirname;
  for (;;) {
    if (existsSync(join(dir, 'binding.gyp'))) return join(dir, name);
    const parent = dirname(dir);
    if (parent === dir) return resolve(__dirname, '..', '..', name);
    dir = parent;
  }
}
export const BUNDLED_POLICY_DIR = repoDir('policies');
export const APPARMOR_DIR = repoDir('apparmor');

export interface ApplyResult {
  ok: boolean;
  changes: string[];
  digests: Policy['digests'];
  issues?: PolicyError['issues'];
}

export class PolicyStore {
  private policy: Policy;
  private loadedAt = new Date().toISOString();

  constructor(
    readonly dir: string,
    readonly auditLog: string | null = null,
  ) {
    this.policy = loadPolicy(dir);
    this.audit({ event: 'load', dir, digests: this.policy.digests });
  }

  get current(): Policy {
    return this.policy;
  }

  get since(): string {
    return this.loadedAt;
  }

  /** Re-read the directory; swap in the new policy only when all of it is valid. */
  apply(): ApplyResult {
    let next: Policy;
    try {
      next = loadPolicy(this.dir);
    } catch (err) {
      const issues = err instanceof PolicyError ? err.issues : [{ file: this.dir, line: 0, message: (err as Error).message }];
      this.audit({ event: 'rejected', dir: this.dir, issues, kept: this.policy.digests });
      if (err instanceof PolicyError) throw err;
      throw new PolicyError(issues);
    }
    const changes = diffPolicy(this.policy, next);
    this.policy = next; // one assignment: readers see the old or the new policy, never a mix
    this.loadedAt = new Date().toISOString();
    this.audit({ event: 'applied', dir: this.dir, digests: next.digests, changes });
    for (const fn of appliedListeners) {
      try {
        fn(next);
      } catch {
        /* a listener's failure is its own to report */
      }
    }
    return { ok: true, changes, digests: next.digests };
  }

  private audit(entry: Record<string, unknown>): void {
    if (this.auditLog === null) return;
    mkdirSync(dirname(this.auditLog), { recursive: true, mode: 0o700 });
    appendFileSync(this.auditLog, `${JSON.stringify({ at: new Date().toISOString(), ...entry })}\n`, { mode: 0o600 });
  }
}

const appliedListeners = new Set<(p: Policy) => void>();

/** Called after every accepted apply (the network re-computes allowlists); returns an unsubscribe. */
export function onPolicyApplied(fn: (p: Policy) => void): () => void {
  appliedListeners.add(fn);
  return () => appliedListeners.delete(fn);
}

let store: PolicyStore | null = null;

/** The policy store in force (the bundled policies/ unless `usePolicyStore` installed another). */
export function policyStore(): PolicyStore {
  store ??= new PolicyStore(BUNDLED_POLICY_DIR);
  return store;
}

export function usePolicyStore(s: PolicyStore): void {
  store = s;
}

export function profile(name: string): Profile {
  const p = ownValue(policyStore().current.profiles, name);
  if (p === undefined) throw new WarrenError('INVALID_ARGUMENT', `no confinement profile "${name}" in the policy`);
  return p;
}

/** Profile for a sandbox owned by `owner` (an account id), from accounts.yaml. */
export function profileForOwner(owner: string | undefined): string {
  const a = policyStore().current.accounts;
  return (owner !== undefined ? ownValue(a.accounts, owner)?.profile : undefined) ?? a.defaultProfile;
}

export function unconfinedAllowed(): boolean {
  return policyStore().current.enforcement.allowUnconfined || process.env.WARREN_ALLOW_UNCONFINED === '1';
}

/** Throws CONFINEMENT_UNAVAILABLE when sandboxes would run without an LSM enforcer or seccomp. */
export function assertConfinable(): void {
  const e = activeEnforcer();
  if ((e.lsm !== 'none' && e.seccomp) || unconfinedAllowed()) return;
  const missing = [e.lsm === 'none' ? 'an LSM enforcer (AppArmor or Landlock)' : null, e.seccomp ? null : 'seccomp'].filter(Boolean).join(' and ');
  throw new WarrenError(
    'CONFINEMENT_UNAVAILABLE',
    `this node has no ${missing}; sandboxes would run unconfined. Set enforcement.allowUnconfined: true in policies/profiles.yaml to allow that explicitly`,
    { enforcer: e.description },
  );
}

function seccompMask(p: Policy, filter: string): number {
  const a = ownValue(p.seccomp, filter)?.allow;
  if (a === undefined) return 0;
  return (a.ptrace ? 1 : 0) | (a.ioUring ? 2 : 0) | (a.userfaultfd ? 4 : 0) | (a.perfEvents ? 8 : 0);
}

/** The native confinement of a profile on this node (what the kernel supports). */
export function confineFor(profileName: string): ConfineSpec {
  const pol = policyStore().current;
  const p = ownValue(pol.profiles, profileName) ?? pol.profiles[DEFAULT_PROFILE]!;
  const e = activeEnforcer();
  const c: ConfineSpec = { nofile: p.limits.openFiles };
  if (p.limits.fileSizeMb !== null) c.fsizeBytes = p.limits.fileSizeMb * MIB;
  if (e.seccomp) c.seccomp = { allow: seccompMask(pol, p.seccomp) };
  if (e.landlockAbi >= 1) {
    c.landlockAbi = e.landlockAbi;
    c.readOnly = p.landlock.readOnly;
    c.writable = p.landlock.writable.filter((w) => w !== '/*');
    if (p.landlock.writable.includes('/*')) {
      c.writableTopLevel = true;
      c.protected = p.landlock.protected;
    }
    if (e.landlockAbi >= 6) c.scope = (p.landlock.scope.abstractUnix ? 1 : 0) | (p.landlock.scope.signals ? 2 : 0);
  }
  if (has('apparmor') && appArmorLoaded(p.apparmor)) c.apparmorProfile = p.apparmor;
  return c;
}

/** warren-nsexec arguments for the same confinement (shell-session holders). */
export function nsexecConfineArgs(c: ConfineSpec): string[] {
  const a: string[] = [];
  if (c.seccomp) a.push('--seccomp', String(c.seccomp.allow));
  if (c.landlockAbi) {
    a.push('--landlock', String(c.landlockAbi));
    for (const p of c.readOnly ?? []) a.push('--ro', p);
    for (const p of c.writable ?? []) a.push('--rw', p);
    if (c.writableTopLevel) a.push('--rw-top', '1');
    for (const p of c.protected ?? []) a.push('--protect', p);
    if (c.scope) a.push('--scope', String(c.scope));
  }
  if (c.apparmorProfile) a.push('--apparmor', c.apparmorProfile);
  if (c.fsizeBytes !== undefined) a.push('--fsize', String(c.fsizeBytes));
  if (c.nofile !== undefined) a.push('--nofile', String(c.nofile));
  return a;
}

// ---- per-sandbox registry -------------------------------------------------------

const sandboxProfiles = new Map<string, string>();

export function registerSandbox(id: string, profileName: string): void {
  sandboxProfiles.set(id, profileName);
}

export function forgetSandbox(id: string): void {
  sandboxProfiles.delete(id);
  try {
    native.landlockCacheDrop(id);
  } catch {
    /* addon without the cache (or not loaded): nothing cached */
  }
}

export function sandboxProfile(id: string): string {
  return sandboxProfiles.get(id) ?? DEFAULT_PROFILE;
}

/** Confinement of every process of sandbox `id` (fail closed: unknown sandboxes get the default profile). */
export function confineForSandbox(id: string): ConfineSpec {
  return confineFor(sandboxProfile(id));
}

setConfinementProvider((id) => confineForSandbox(id));

// ---- AppArmor -----------------------------------------------------------------

const aaLoaded = new Map<string, boolean>();

/** Load apparmor/<name> into the kernel once (apparmor_parser -r); false where that fails. */
export function appArmorLoaded(name: string): boolean {
  let ok = aaLoaded.get(name);
  if (ok !== undefined) return ok;
  ok = false;
  try {
    const file = join(APPARMOR_DIR, name);
    if (existsSync(file)) {
      execFileSync('apparmor_parser', ['-r', '-W', file], { stdio: 'pipe', timeout: 30_000 });
      ok = true;
    }
  } catch {
    ok = false;
  }
  aaLoaded.set(name, ok);
  return ok;
}
