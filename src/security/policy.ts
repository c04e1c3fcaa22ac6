/**
 * The security team's policy: every file in one directory (default: policies/
 * at the repository root, or `warren up --policy-dir`).
 *
 *   profiles.yaml   confinement profiles (AppArmor name, Landlock paths and scopes, seccomp
 *                   filter, rlimits, default disk quota) and the enforcement switches
 *   seccomp.yaml    seccomp choices: named filters, each allowing optional syscall groups
 *   services.yaml   the services catalog (network egress): service name -> host names
 *                   (learned through the node's DNS responder), fixed CIDRs, ports, protocol
 *   accounts.yaml   per-account defaults: which profile an account's sandboxes get, which
 *                   services they get when a create request says nothing, which services
 *                   they may ask for, and raw CIDR/port rules
 *
 * Every file ends with the YAML document-end line `...`: a file cut short lacks it.
 * A policy is loaded as a whole: every file is read (never through a symlink),
 * parsed (YAML, duplicate keys are errors), checked against its schema (unknown
 * keys are errors) and cross-checked (references resolve, nothing contradicts).
 * Any error rejects the whole policy and names the file and line.
 */
import { createHash } from 'node:crypto';
import { lstatSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { isIPv4, isIPv6 } from 'node:net';
import { LineCounter, isMap, isSeq, parseDocument, type Document } from 'yaml';
import { WarrenError } from '../errors';

export const POLICY_FILES = ['profiles.yaml', 'seccomp.yaml', 'services.yaml', 'accounts.yaml'] as const;
export type PolicyFile = (typeof POLICY_FILES)[number];

export interface SeccompChoice {
  /** Optional groups let through; everything in the default denylist stays denied. */
  allow: { ptrace: boolean; ioUring: boolean; userfaultfd: boolean; perfEvents: boolean };
}

export interface Profile {
  name: string;
  /** AppArmor profile applied on exec where the kernel has AppArmor (apparmor/<name>). */
  apparmor: string;
  /** Name of a filter in seccomp.yaml. */
  seccomp: string;
  landlock: {
    /** Read + execute beneath these paths. */
    readOnly: string[];
    /** Full access beneath these paths (files: read/write). "/*": every top-level directory of the
     *  sandbox root (when the process starts) except `protected`. */
    writable: string[];
    /** Top-level directories "/*" leaves read-only (must include /proc and /sys when "/*" is used). */
    protected: string[];
    /** Landlock scopes (ABI 6): signals and abstract unix sockets stay inside the process's own domain. */
    scope: { signals: boolean; abstractUnix: boolean };
  };
  limits: {
    /** RLIMIT_FSIZE in MiB (null: unlimited). */
    fileSizeMb: number | null;
    /** RLIMIT_NOFILE. */
    openFiles: number;
    /** Size of the writable layer when the create request has no diskMb (null: no quota). */
    diskMb: number | null;
    /** pack_diff refuses a diff whose files add up to more (apparent sizes, holes included). */
    packMb: number;
    /** pack_diff stops (TIMEOUT) when it takes longer. */
    packSeconds: number;
  };
}

/** Pack budget of profiles that do not set one. */
export const DEFAULT_PACK_MB = 8192;
export const DEFAULT_PACK_SECONDS = 600;

export interface Service {
  name: string;
  /** Host names, or "*.domain" for every name under domain; learned through DNS. */
  hosts: string[];
  ports: number[];
  /** Fixed ranges, reachable without DNS. */
  cidrs: string[];
  protocol: 'tcp' | 'udp';
}

/** A raw rule written by an operator: a range and ports (empty: any port). */
export interface NetworkRule {
  cidr: string;
  ports: number[];
  protocol: 'tcp' | 'udp';
}

/** What an account's sandboxes get on the network. */
export interface AccountNetwork {
  /** Services enabled when a create request has no `network`. */
  default: Record<string, boolean>;
  /** Services the account may enable; null: every service in the catalog. */
  allow: string[] | null;
  /** Always reachable, for every sandbox of the account that has network. */
  rules: NetworkRule[];
}

export interface Policy {
  enforcement: { allowUnconfined: boolean };
  profiles: Record<string, Profile>;
  seccomp: Record<string, SeccompChoice>;
  services: Record<string, Service>;
  /**
   * Ranges (IPv4 or IPv6 CIDRs) a DNS answer never opens and the egress programs deny unless a
   * service's `cidrs` or an account rule names them (`denied_ranges` in services.yaml; absent:
   * private and shared address space).
   */
  deniedRanges: string[];
  accounts: {
    defaultProfile: string;
    defaultNetwork: AccountNetwork;
    accounts: Record<string, { profile: string; network: AccountNetwork }>;
  };
  /** sha256 of each file's bytes, for the audit log. */
  digests: Record<PolicyFile, string>;
}

export interface PolicyIssue {
  file: string;
  line: number;
  message: string;
}

export class PolicyError extends WarrenError {
  constructor(readonly issues: PolicyIssue[]) {
    super(
      'POLICY_INVALID',
      `policy rejected: ${issues.map((i) => `${i.file}:${i.line}: ${i.message}`).join('; ')}`,
      { issues },
    );
  }
}

const NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;
const HOST_RE = /^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$/;
const CIDR_RE = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/;
const MAX_FILE_BYTES = 256 * 1024;

/** A parsed file with the means to point at lines. */
class Source {
  readonly lines = new LineCounter();
  readonly doc: Document.Parsed;
  constructor(
    readonly file: string,
    readonly text: string,
    private readonly issues: PolicyIssue[],
  ) {
    this.doc = parseDocument(text, { lineCounter: this.lines, uniqueKeys: true, prettyErrors: false, strict: true });
    for (const e of this.doc.errors) this.issue(e.pos?.[0] ?? 0, e.message.split('\n')[0]!);
    for (const w of this.doc.warnings) this.issue(w.pos?.[0] ?? 0, w.message.split('\n')[0]!);
  }
  issue(offset: number, message: string): void {
    this.issues.push({ file: this.file, line: this.lines.linePos(offset).line, message });
  }
  /** Line-aware error at a path of keys. */
  at(path: (string | number)[], message: string): void {
    let node: unknown = this.doc.contents;
    let offset = 0;
    for (const key of path) {
      if (isMap(node)) {
        const pair = node.items.find((p) => (p.key as { value?: unknown } | null)?.value === key);
        if (!pair) break;
        const k = pair.key as { range?: [number, number, number] };
        if (k?.range) offset = k.range[0];
        node = pair.value;
      } else if (isSeq(node) && typeof key === 'number') {
        node = node.items[key];
      } else break;
      const r = (node as { range?: [number, number, number] } | null)?.range;
      if (r && typeof key === 'number') offset = r[0];
    }
    this.issue(offset, message);
  }
}

type Obj = Record<string, unknown>;

/** Schema checking with line-aware messages. */
class Checker {
  constructor(readonly src: Source) {}
  obj(v: unknown, path: (string | number)[], keys: { required: string[]; optional?: string[] }): Obj | null {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) {
      this.src.at(path, `${fmt(path)} must be a mapping`);
      return null;
    }
    const o = v as Obj;
    const allowed = new Set([...keys.required, ...(keys.optional ?? [])]);
    for (const k of Object.keys(o)) if (!allowed.has(k)) this.src.at([...path, k], `unknown key ${fmt([...path, k])}`);
    for (const k of keys.required) if (!(k in o)) this.src.at(path, `missing key ${fmt([...path, k])}`);
    return o;
  }
  bool(v: unknown, path: (string | number)[], dflt?: boolean): boolean {
    if (v === undefined && dflt !== undefined) return dflt;
    if (typeof v !== 'boolean') {
      this.src.at(path, `${fmt(path)} must be true or false`);
      return false;
    }
    return v;
  }
  int(v: unknown, path: (string | number)[], min: number, max: number, nullable = false): number | null {
    if (v === null && nullable) return null;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
      this.src.at(path, `${fmt(path)} must be an integer in ${min}..${max}${nullable ? ' or null' : ''}`);
      return nullable ? null : min;
    }
    return v;
  }
  name(v: unknown, path: (string | number)[]): string {
    if (typeof v !== 'string' || !NAME_RE.test(v)) {
      this.src.at(path, `${fmt(path)} must be a name matching ${NAME_RE.source}`);
      return '';
    }
    return v;
  }
  paths(v: unknown, path: (string | number)[]): string[] {
    if (!Array.isArray(v)) {
      this.src.at(path, `${fmt(path)} must be a list of absolute paths`);
      return [];
    }
    if (v.length > 32) this.src.at(path, `${fmt(path)} has more than 32 entries`);
    const out: string[] = [];
    v.forEach((p, i) => {
      if (typeof p !== 'string' || !(p === '/' || /^(\/[^/\0]+)+$/.test(p)) || p.split('/').some((c) => c === '.' || c === '..')) {
        this.src.at([...path, i], `${fmt([...path, i])} must be an absolute, normalized path`);
      } else if (out.includes(p)) {
        this.src.at([...path, i], `${fmt([...path, i])} is listed twice`);
      } else out.push(p);
    });
    return out;
  }
  strings(v: unknown, path: (string | number)[], re: RegExp, what: string): string[] {
    if (!Array.isArray(v)) {
      this.src.at(path, `${fmt(path)} must be a list`);
      return [];
    }
    return v.filter((s, i) => {
      const ok = typeof s === 'string' && re.test(s);
      if (!ok) this.src.at([...path, i], `${fmt([...path, i])} must be ${what}`);
      return ok;
    }) as string[];
  }
}

function fmt(path: (string | number)[]): string {
  return path.map((p) => (typeof p === 'number' ? `[${p}]` : p)).join('.').replace(/\.\[/g, '[') || '(top level)';
}

function version(c: Checker, doc: Obj): void {
  if (doc.version !== 1) c.src.at(['version'], 'version must be 1');
}

function readPolicyFile(dir: string, file: PolicyFile, issues: PolicyIssue[]): Source | null {
  const p = join(dir, file);
  let st;
  try {
    st = lstatSync(p);
  } catch {
    issues.push({ file, line: 0, message: `${file} is missing` });
    return null;
  }
  if (st.isSymbolicLink()) {
    issues.push({ file, line: 0, message: `${file} is a symbolic link (refused: policy files must be regular files in the policy directory)` });
    return null;
  }
  if (!st.isFile()) {
    issues.push({ file, line: 0, message: `${file} is not a regular file` });
    return null;
  }
  if (st.size > MAX_FILE_BYTES) {
    issues.push({ file, line: 0, message: `${file} is larger than ${MAX_FILE_BYTES} bytes` });
    return null;
  }
  const text = readFileSync(p, 'utf8');
  // A file cut short (an editor or copy that died half-way) lacks the YAML document-end marker.
  if (!/(^|\n)\.\.\.\n$/.test(text)) {
    issues.push({ file, line: text.split('\n').length, message: `${file} does not end with the document-end line "..." (half-written?)` });
  }
  return new Source(file, text, issues);
}

/** Load and validate the policy in `dir`. Throws PolicyError listing every problem (file and line). */
export function loadPolicy(dir: string): Policy {
  const issues: PolicyIssue[] = [];
  let dst;
  try {
    dst = lstatSync(dir);
  } catch {
    throw new PolicyError([{ file: dir, line: 0, message: 'policy directory does not exist' }]);
  }
  if (dst.isSymbolicLink()) throw new PolicyError([{ file: dir, line: 0, message: 'policy directory is a symbolic link (refused)' }]);
  if (!dst.isDirectory()) throw new PolicyError([{ file: dir, line: 0, message: 'not a directory' }]);
  for (const name of readdirSync(dir)) {
    if (/\.ya?ml$/.test(name) && !(POLICY_FILES as readonly string[]).includes(name)) {
      issues.push({ file: name, line: 0, message: `unknown policy file ${name} (expected: ${POLICY_FILES.join(', ')})` });
    }
  }
  const sources = {} as Record<PolicyFile, Source | null>;
  for (const f of POLICY_FILES) sources[f] = readPolicyFile(dir, f, issues);
  if (issues.length > 0) throw new PolicyError(issues);

  const digests = {} as Record<PolicyFile, string>;
  for (const f of POLICY_FILES) digests[f] = createHash('sha256').update(sources[f]!.text).digest('hex').slice(0, 16);

  // seccomp.yaml
  const seccomp: Record<string, SeccompChoice> = {};
  {
    const c = new Checker(sources['seccomp.yaml']!);
    const top = c.obj(c.src.doc.toJS(), [], { required: ['version', 'filters'] });
    if (top) {
      version(c, top);
      const filters = c.obj(top.filters, ['filters'], { required: [], optional: Object.keys((top.filters as Obj) ?? {}) });
      for (const [name, v] of Object.entries(filters ?? {})) {
        c.name(name, ['filters', name]);
        const f = c.obj(v, ['filters', name], { required: ['allow'] });
        const a = f ? c.obj(f.allow, ['filters', name, 'allow'], { required: [], optional: ['ptrace', 'ioUring', 'userfaultfd', 'perfEvents'] }) : null;
        const p = ['filters', name, 'allow'];
        seccomp[name] = {
          allow: {
            ptrace: c.bool(a?.ptrace, [...p, 'ptrace'], false),
            ioUring: c.bool(a?.ioUring, [...p, 'ioUring'], false),
            userfaultfd: c.bool(a?.userfaultfd, [...p, 'userfaultfd'], false),
            perfEvents: c.bool(a?.perfEvents, [...p, 'perfEvents'], false),
          },
        };
      }
      if (Object.keys(seccomp).length === 0) c.src.at(['filters'], 'at least one filter is needed');
    }
  }

  // profiles.yaml
  const profiles: Record<string, Profile> = {};
  let allowUnconfined = false;
  {
    const c = new Checker(sources['profiles.yaml']!);
    const top = c.obj(c.src.doc.toJS(), [], { required: ['version', 'enforcement', 'profiles'] });
    if (top) {
      version(c, top);
      const enf = c.obj(top.enforcement, ['enforcement'], { required: ['allowUnconfined'] });
      allowUnconfined = c.bool(enf?.allowUnconfined, ['enforcement', 'allowUnconfined']);
      const ps = c.obj(top.profiles, ['profiles'], { required: ['warren-default'], optional: Object.keys((top.profiles as Obj) ?? {}) });
      for (const [name, v] of Object.entries(ps ?? {})) {
        const base = ['profiles', name];
        c.name(name, base);
        const p = c.obj(v, base, { required: ['apparmor', 'seccomp', 'landlock', 'limits'] });
        if (!p) continue;
        const apparmor = c.name(p.apparmor, [...base, 'apparmor']);
        const sc = typeof p.seccomp === 'string' ? p.seccomp : '';
        if (!Object.hasOwn(seccomp, sc)) c.src.at([...base, 'seccomp'], `${fmt([...base, 'seccomp'])}: no filter "${String(p.seccomp)}" in seccomp.yaml`);
        const ll = c.obj(p.landlock, [...base, 'landlock'], { required: ['readOnly', 'writable', 'scope'], optional: ['protected'] });
        const readOnly = c.paths(ll?.readOnly, [...base, 'landlock', 'readOnly']);
        const writableRaw = Array.isArray(ll?.writable) ? (ll!.writable as unknown[]) : [];
        const topLevel = writableRaw.includes('/*');
        const writable = c.paths(Array.isArray(ll?.writable) ? writableRaw.map((w) => (w === '/*' ? '/' : w)) : ll?.writable, [...base, 'landlock', 'writable']).map((w, i) => (writableRaw[i] === '/*' ? '/*' : w));
        const prot = ll?.protected === undefined ? [] : c.paths(ll.protected, [...base, 'landlock', 'protected']);
        prot.forEach((pp, i) => {
          if (pp.split('/').length !== 2 || pp === '/') c.src.at([...base, 'landlock', 'protected', i], `${pp}: protected entries must be top-level directories`);
          if (writable.includes(pp)) c.src.at([...base, 'landlock', 'protected', i], `${pp} is both protected and writable (contradiction)`);
        });
        if (topLevel) {
          for (const must of ['/proc', '/sys']) if (!prot.includes(must)) c.src.at([...base, 'landlock', 'writable'], `"/*" needs ${must} in landlock.protected (AppArmor intent: no writes there)`);
        } else if (prot.length > 0) {
          c.src.at([...base, 'landlock', 'protected'], 'landlock.protected only makes sense with "/*" in writable');
        }
        if (writable.includes('/') ) c.src.at([...base, 'landlock', 'writable'], '"/" may not be writable (use "/*" with protected system directories)');
        for (const [i, w] of writable.entries()) {
          if (readOnly.includes(w)) c.src.at([...base, 'landlock', 'writable', i], `${w} is both read-only and writable (contradiction)`);
          if (w === '/proc' || w.startsWith('/proc/') || w === '/sys' || w.startsWith('/sys/')) {
            c.src.at([...base, 'landlock', 'writable', i], `${w}: /proc and /sys may not be writable (AppArmor intent: deny writes there)`);
          }
        }
        const scope = c.obj(ll?.scope, [...base, 'landlock', 'scope'], { required: ['signals', 'abstractUnix'] });
        const lim = c.obj(p.limits, [...base, 'limits'], { required: ['fileSizeMb', 'openFiles', 'diskMb'], optional: ['packMb', 'packSeconds'] });
        profiles[name] = {
          name,
          apparmor,
          seccomp: sc,
          landlock: {
            readOnly,
            writable,
            protected: prot,
            scope: { signals: c.bool(scope?.signals, [...base, 'landlock', 'scope', 'signals']), abstractUnix: c.bool(scope?.abstractUnix, [...base, 'landlock', 'scope', 'abstractUnix']) },
          },
          limits: {
            fileSizeMb: c.int(lim?.fileSizeMb, [...base, 'limits', 'fileSizeMb'], 1, 1_048_576, true),
            openFiles: c.int(lim?.openFiles, [...base, 'limits', 'openFiles'], 64, 1_048_576) ?? 1024,
            diskMb: c.int(lim?.diskMb, [...base, 'limits', 'diskMb'], 16, 1_048_576, true),
            packMb: (lim?.packMb === undefined ? null : c.int(lim.packMb, [...base, 'limits', 'packMb'], 1, 16_777_216)) ?? DEFAULT_PACK_MB,
            packSeconds: (lim?.packSeconds === undefined ? null : c.int(lim.packSeconds, [...base, 'limits', 'packSeconds'], 1, 86_400)) ?? DEFAULT_PACK_SECONDS,
          },
        };
      }
    }
  }

  // services.yaml
  const services: Record<string, Service> = {};
  let deniedRanges: string[] = [...DEFAULT_DENIED_RANGES];
  {
    const c = new Checker(sources['services.yaml']!);
    const top = c.obj(c.src.doc.toJS(), [], { required: ['version', 'services'], optional: ['denied_ranges'] });
    if (top) {
      version(c, top);
      if (top.denied_ranges !== undefined) {
        deniedRanges = top.denied_ranges === null ? [] : c.strings(top.denied_ranges, ['denied_ranges'], ANY_CIDR_RE, 'an IPv4 or IPv6 CIDR');
        deniedRanges.forEach((cidr, i) => {
          if (!anyCidrOk(cidr)) c.src.at(['denied_ranges', i], `${JSON.stringify(cidr)} is not an IPv4 or IPv6 CIDR`);
        });
      }
      const ss = top.services === null ? {} : c.obj(top.services, ['services'], { required: [], optional: Object.keys((top.services as Obj) ?? {}) });
      for (const [name, v] of Object.entries(ss ?? {})) {
        const base = ['services', name];
        c.name(name, base);
        const s = c.obj(v, base, { required: [], optional: ['hosts', 'ports', 'cidrs', 'protocol'] });
        if (!s) continue;
        if (s.hosts === undefined && s.cidrs === undefined) c.src.at(base, `service "${name}" needs hosts or cidrs`);
        const hosts = s.hosts === undefined ? [] : c.strings(s.hosts, [...base, 'hosts'], HOST_RE, 'a lower-case host name (optionally *.domain)');
        const ports = Array.isArray(s.ports) ? (s.ports as unknown[]).map((p, i) => c.int(p, [...base, 'ports', i], 1, 65535) ?? 0) : s.ports === undefined ? [443] : (c.src.at([...base, 'ports'], 'ports must be a list'), []);
        const cidrs = s.cidrs === undefined ? [] : c.strings(s.cidrs, [...base, 'cidrs'], CIDR_RE, 'an IPv4 CIDR');
        cidrs.forEach((cidr, i) => {
          const m = CIDR_RE.exec(cidr)!;
          if (Number(m[5]) < 8 || m.slice(1, 5).some((o) => Number(o) > 255)) c.src.at([...base, 'cidrs', i], `${cidr} is too broad or malformed (prefix must be /8 or longer)`);
        });
        const protocol = s.protocol === undefined ? 'tcp' : s.protocol === 'tcp' || s.protocol === 'udp' ? s.protocol : (c.src.at([...base, 'protocol'], 'protocol must be tcp or udp'), 'tcp');
        if (protocol === 'udp' && ports.includes(53)) c.src.at([...base, 'ports'], 'DNS goes through the node resolver only; a service cannot open 53/udp');
        services[name] = { name, hosts, ports, cidrs, protocol };
      }
      // contradictions: one host claimed by two services
      const owner = new Map<string, string>();
      for (const s of Object.values(services))
        for (const h of s.hosts) {
          const o = owner.get(h);
          if (o !== undefined && o !== s.name) c.src.at(['services', s.name, 'hosts'], `host ${h} is in both "${o}" and "${s.name}" (contradiction)`);
          owner.set(h, s.name);
        }
    }
  }

  // accounts.yaml
  const noNetwork: AccountNetwork = { default: {}, allow: null, rules: [] };
  const accounts: Policy['accounts'] = { defaultProfile: 'warren-default', defaultNetwork: noNetwork, accounts: {} };
  {
    const c = new Checker(sources['accounts.yaml']!);
    const top = c.obj(c.src.doc.toJS(), [], { required: ['version', 'defaults'], optional: ['accounts'] });
    if (top) {
      version(c, top);
      const d = c.obj(top.defaults, ['defaults'], { required: ['profile'], optional: ['network'] });
      accounts.defaultProfile = typeof d?.profile === 'string' ? d.profile : '';
      accounts.defaultNetwork = d?.network === undefined ? noNetwork : accountNetwork(c, d.network, ['defaults', 'network'], services);
      if (!Object.hasOwn(profiles, accounts.defaultProfile)) c.src.at(['defaults', 'profile'], `defaults.profile: no profile "${String(d?.profile)}" in profiles.yaml`);
      const as = top.accounts === undefined || top.accounts === null ? {} : c.obj(top.accounts, ['accounts'], { required: [], optional: Object.keys((top.accounts as Obj) ?? {}) });
      for (const [name, v] of Object.entries(as ?? {})) {
        const a = c.obj(v, ['accounts', name], { required: ['profile'], optional: ['network'] });
        const prof = typeof a?.profile === 'string' ? a.profile : '';
        if (!Object.hasOwn(profiles, prof)) c.src.at(['accounts', name, 'profile'], `accounts.${name}.profile: no profile "${String(a?.profile)}" in profiles.yaml`);
        accounts.accounts[name] = { profile: prof, network: a?.network === undefined ? accounts.defaultNetwork : accountNetwork(c, a.network, ['accounts', name, 'network'], services) };
      }
    }
  }
  if (issues.length > 0) throw new PolicyError(issues);
  return { enforcement: { allowUnconfined }, profiles, seccomp, services, deniedRanges, accounts, digests };
}

/** Operator-listed ranges when services.yaml has no `denied_ranges`: private and shared address space. */
export const DEFAULT_DENIED_RANGES: readonly string[] = ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', 'fc00::/7'];

const ANY_CIDR_RE = /^[0-9a-f.:]+\/\d{1,3}$/;

function anyCidrOk(cidr: string): boolean {
  const slash = cidr.indexOf('/');
  const ip = cidr.slice(0, slash);
  const len = Number(cidr.slice(slash + 1));
  return (isIPv4(ip) && len <= 32) || (isIPv6(ip) && len <= 128);
}

function cidrOk(cidr: string): boolean {
  const m = CIDR_RE.exec(cidr);
  return m !== null && Number(m[5]) >= 8 && Number(m[5]) <= 32 && m.slice(1, 5).every((o) => Number(o) <= 255);
}

function accountNetwork(c: Checker, v: unknown, base: (string | number)[], services: Record<string, Service>): AccountNetwork {
  const o = c.obj(v, base, { required: [], optional: ['default', 'allow', 'rules'] });
  const out: AccountNetwork = { default: {}, allow: null, rules: [] };
  if (!o) return out;
  if (o.allow !== undefined) {
    out.allow = c.strings(o.allow, [...base, 'allow'], NAME_RE, 'a service name');
    out.allow.forEach((s, i) => {
      if (!Object.hasOwn(services, s)) c.src.at([...base, 'allow', i], `no service "${s}" in services.yaml`);
    });
  }
  if (o.default !== undefined) {
    const d = c.obj(o.default, [...base, 'default'], { required: [], optional: Object.keys((o.default as Obj) ?? {}) });
    for (const [name, on] of Object.entries(d ?? {})) {
      if (!Object.hasOwn(services, name)) c.src.at([...base, 'default', name], `no service "${name}" in services.yaml`);
      else if (on === true && out.allow !== null && !out.allow.includes(name)) c.src.at([...base, 'default', name], `"${name}" is enabled by default but not in allow (contradiction)`);
      out.default[name] = c.bool(on, [...base, 'default', name]);
    }
  }
  if (o.rules !== undefined) {
    if (!Array.isArray(o.rules)) c.src.at([...base, 'rules'], 'rules must be a list');
    else
      (o.rules as unknown[]).forEach((r, i) => {
        const at = [...base, 'rules', i];
        const rule = c.obj(r, at, { required: ['cidr'], optional: ['ports', 'protocol'] });
        if (!rule) return;
        const cidr = typeof rule.cidr === 'string' ? rule.cidr : '';
        if (!cidrOk(cidr)) c.src.at([...at, 'cidr'], `${JSON.stringify(rule.cidr)} is not an IPv4 CIDR of /8 or longer`);
        const ports = rule.ports === undefined ? [] : Array.isArray(rule.ports) ? (rule.ports as unknown[]).map((p, j) => c.int(p, [...at, 'ports', j], 1, 65535) ?? 0) : (c.src.at([...at, 'ports'], 'ports must be a list'), []);
        const protocol = rule.protocol === undefined || rule.protocol === 'tcp' ? 'tcp' : rule.protocol === 'udp' ? 'udp' : (c.src.at([...at, 'protocol'], 'protocol must be tcp or udp'), 'tcp');
        out.rules.push({ cidr, ports, protocol });
      });
  }
  return out;
}

/** Human-readable list of what differs between two policies (for the audit log). */
export function diffPolicy(a: Policy | null, b: Policy): string[] {
  const out: string[] = [];
  const walk = (x: unknown, y: unknown, path: string) => {
    if (JSON.stringify(x) === JSON.stringify(y)) return;
    if (x && y && typeof x === 'object' && typeof y === 'object' && !Array.isArray(x) && !Array.isArray(y)) {
      for (const k of new Set([...Object.keys(x as Obj), ...Object.keys(y as Obj)])) walk((x as Obj)[k], (y as Obj)[k], path ? `${path}.${k}` : k);
      return;
    }
    out.push(`${path}: ${JSON.stringify(x ?? null)} -> ${JSON.stringify(y ?? null)}`);
  };
  const strip = (p: Policy | null) => (p === null ? null : { ...p, digests: undefined });
  walk(strip(a), strip(b), '');
  return out;
}
