/**
 * The kernel side of per-sandbox egress allowlists: the programs of
 * bpf/sandbox_egress.bpf.c pinned under one directory per node, a pinned link
 * per (sandbox cgroup, hook), the three per-sandbox maps they read and the node-wide deny trie.
 *
 * Everything that enforces lives in bpffs, so enforcement outlives this process:
 * a dead gateway leaves each sandbox with exactly the allowlist it had. A new
 * process reopens the pins and rebuilds its bookkeeping from the maps.
 *
 * Policy changes are atomic for the sandbox: entries of the next generation are
 * written first, then the sandbox's policy flips to that generation in a single
 * map update, then the previous generation's entries are deleted.
 */
import { existsSync, mkdirSync, readdirSync, rmdirSync, statSync, unlinkSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { WarrenError } from '../../errors';
import type { BpfCgroupAttach, NativeAddon } from '../../native/types';
import {
  EGRESS_EVENT_SIZE,
  decodeEgressCidrKey,
  decodeEgressEvent,
  decodeEgressKey,
  decodeEgressValue,
  encodeEgressCidrKey,
  encodeEgressCidrValue,
  encodeEgressKey,
  encodeEgressValue,
  encodeSandboxPolicy,
  decodeSandboxPolicy,
  encodeEgressDenyKey,
  encodeEgressDenyValue,
  EGRESS_DENY_OVERRIDABLE,
  encodeTapPort,
  type EgressEvent,
} from '../../native/bpf-layouts';
import { bytesToIp, ipv4ToMapped, ipToBytes, parseCidr } from './addr';

export { bytesToIp };
import { REASON_CODES, reasonName, type DenyRange } from './special-addr';

export const PROGRAMS: Record<BpfCgroupAttach, string> = {
  connect4: 'egress_connect4',
  connect6: 'egress_connect6',
  sendmsg4: 'egress_sendmsg4',
  sendmsg6: 'egress_sendmsg6',
  egress: 'egress_skb',
};
const MAPS = { policies: 'sandbox_policies', allow: 'egress_allow', cidrs: 'egress_cidrs', deny: 'egress_deny', events: 'egress_events' } as const;
const CIDR_FIXED_BITS = 96;
export const IPPROTO_TCP = 6;
export const IPPROTO_UDP = 17;

/** One address range a sandbox may reach (a service's CIDRs, an operator's raw rule). */
export interface EgressRange {
  cidr: string;
  /** Empty: any port. */
  ports: number[];
  proto: 'tcp' | 'udp';
  serviceId: number;
}

/** An address learned from DNS for an allowed service. */
export interface EgressBinding {
  address: string;
  ports: number[];
  proto: 'tcp' | 'udp';
  serviceId: number;
  /** process.hrtime.bigint() clock (CLOCK_MONOTONIC, as bpf_ktime_get_ns); 0n = never. */
  expiresNs: bigint;
}

export interface SandboxEgressPolicy {
  /** Network byte order IPv4 of the node's DNS responder; 53/udp+tcp there is allowed. */
  resolverV4: string | null;
  ranges: EgressRange[];
  bindings: EgressBinding[];
}

export interface EgressDenial {
  cgroupId: bigint;
  address: string;
  port: number;
  proto: number;
  hook: 'connect4' | 'connect6' | 'sendmsg4' | 'sendmsg6' | 'skb' | 'tap';
  pid: number;
  timestampNs: bigint;
  /** Why: 'not-allowed', or the special range that denied it ('metadata', 'node', 'operator', ...). */
  reason: string;
}

interface SandboxState {
  cgroupId: bigint;
  generation: number;
  resolverV4: string | null;
  /** hex of exact keys (current generation) -> expiry. */
  exact: Map<string, bigint>;
  /** hex of CIDR keys (current generation). */
  cidrs: Set<string>;
}

export interface EgressOptions {
  native: NativeAddon;
  /** The compiled object (bpf/out/sandbox_egress.bpf.o). */
  objectPath: string;
  /** This node's pin directory, e.g. /sys/fs/bpf/warren/<node>. */
  pinDir: string;
  /** The tap programs' object (bpf/out/tap_egress.bpf.o); absent: microVM taps are not offered. */
  tapObjectPath?: string;
  /** Expired DNS bindings stay this long for connections already open (the skb backstop ignores expiry). */
  expiredGraceMs?: number;
}

const HOOKS: BpfCgroupAttach[] = ['connect4', 'connect6', 'sendmsg4', 'sendmsg6', 'egress'];
const KIND_HOOK: Record<number, EgressDenial['hook']> = { 1: 'connect4', 2: 'connect6', 3: 'sendmsg4', 4: 'sendmsg6', 5: 'skb', 6: 'tap' };
/** Pinned names of a microVM's tap links (bpf/tap_egress.bpf.c: egress_tap on the tap, egress_tap_return on the uplink). */
const TAP_LINKS = ['tap', 'tapret'] as const;

/** A microVM's tap in its sandbox's namespace, next to the veth to the bridge. */
export interface TapAttachment {
  netnsPath: string;
  tap: string;
  uplink: string;
  /** The sandbox's address and the uplink's MAC: the only sources the guest may use. */
  address: string;
  mac: string;
}

export class EgressEnforcer {
  private readonly n: NativeAddon;
  private fds: { policies: number; allow: number; cidrs: number; deny: number; events: number } | null = null;
  /** hex key -> hex value of the node-wide deny trie as written. */
  private deny = new Map<string, string>();
  private ringbuf = 0;
  /** Why taps cannot be enforced here (null: they can). */
  private tapRefusal: string | null = 'the tap programs are not loaded';
  private readonly sandboxes = new Map<bigint, SandboxState>();
  private readonly linkDir: string;
  private readonly graceNs: bigint;

  constructor(private readonly opts: EgressOptions) {
    this.n = opts.native;
    this.linkDir = join(opts.pinDir, 'links');
    this.graceNs = BigInt(opts.expiredGraceMs ?? 10 * 60_000) * 1_000_000n;
  }

  /** Load (or reopen) the pinned programs and maps. */
  open(): void {
    if (this.fds !== null) return;
    mountBpffs(this.n, this.opts.pinDir);
    mkdirSync(this.opts.pinDir, { recursive: true, mode: 0o700 });
    mkdirSync(this.linkDir, { recursive: true, mode: 0o700 });
    this.n.bpfLoadPinned(this.opts.objectPath, this.opts.pinDir);
    const fds = { policies: -1, allow: -1, cidrs: -1, deny: -1, events: -1 };
    try {
      for (const k of Object.keys(MAPS) as (keyof typeof MAPS)[]) {
        const pin = join(this.opts.pinDir, MAPS[k]);
        if (!existsSync(pin)) {
          // programs pinned by an older build whose object had no such map: they would not consult it
          throw new WarrenError('INTERNAL', `${pin} is missing: the programs under ${this.opts.pinDir} come from another build; delete the node's sandboxes with network and remove the directory`);
        }
        fds[k] = this.n.bpfObjGet(pin);
      }
      this.ringbuf = this.n.bpfRingbufOpen(fds.events);
    } catch (err) {
      for (const fd of Object.values(fds)) if (fd >= 0) this.n.close(fd);
      throw err;
    }
    this.fds = fds;
    this.openTap();
    this.deny = new Map(this.keys(fds.deny).map((k) => [k.toString('hex'), this.n.bpfMapLookup(fds.deny, k)?.toString('hex') ?? '']));
  }

  /** The tap programs (a copy per microVM, reading the same pinned maps) need tcx links (Linux 6.6);
   *  an old kernel refuses them at the first attach, which fails that create only. */
  private openTap(): void {
    if (this.opts.tapObjectPath === undefined) return;
    this.tapRefusal = existsSync(this.opts.tapObjectPath) ? null : `${this.opts.tapObjectPath} is not built (npm run build:bpf)`;
  }

  /** Null when microVM taps can be enforced; else why not. */
  get tapUnavailable(): string | null {
    return this.tapRefusal;
  }

  /**
   * Enforce the sandbox's policy (already attached to its cgroup with `attach`) on the frames of
   * a tap: the sandbox's own copy of the tap programs, with its cgroup id, address and MAC as
   * constants, goes on the tap's and the uplink's tcx ingress (links pinned with the sandbox's).
   */
  attachTap(sandboxId: string, cgroupId: bigint, t: TapAttachment): void {
    if (this.tapRefusal !== null || this.opts.tapObjectPath === undefined) throw new WarrenError('NOT_SUPPORTED', this.tapRefusal ?? 'no tap programs');
    this.state(cgroupId);
    const links = { tap: join(this.linkDir, `${sandboxId}_tap`), tapret: join(this.linkDir, `${sandboxId}_tapret`) };
    for (const l of Object.values(links)) if (existsSync(l)) unlinkSync(l);
    const mac = Buffer.from(t.mac.split(':').map((h) => parseInt(h, 16)));
    const addr = ipv4ToMapped(t.address).subarray(12, 16);
    // the interface indexes are filled in by the loader, in the namespace that numbers them
    const settings = encodeTapPort({ cgroupId, uplinkIfindex: 0, tapIfindex: 0, addrV4: addr, mac });
    try {
      this.n.bpfAttachTap(this.opts.tapObjectPath, this.opts.pinDir, t.netnsPath, t.tap, t.uplink, settings, links.tap, links.tapret);
    } catch (err) {
      this.detachTap(sandboxId);
      throw err;
    }
  }

  /** Unpin a sandbox's tap links (its programs go with them). Idempotent. */
  private detachTap(sandboxId: string): void {
    for (const name of TAP_LINKS) {
      try {
        unlinkSync(join(this.linkDir, `${sandboxId}_${name}`));
      } catch {
        /* not attached */
      }
    }
  }

  /**
   * Make the node-wide deny trie exactly `ranges` (the node's own addresses, the sandbox subnet,
   * operator-listed ranges). Writes only what changed; new entries go in before old ones leave.
   */
  setDenyRanges(ranges: DenyRange[]): { added: number; removed: number } {
    const m = this.maps;
    const want = new Map<string, Buffer>();
    const keys = new Map<string, Buffer>();
    for (const r of ranges) {
      const { bytes, prefix } = parseCidr(r.cidr);
      const key = encodeEgressDenyKey({ prefixlen: prefix, addr: bytes });
      const hex = key.toString('hex');
      // two entries for one range: the non-overridable one wins
      const prev = want.get(hex);
      if (prev !== undefined && (prev[1]! & EGRESS_DENY_OVERRIDABLE) === 0) continue;
      want.set(hex, encodeEgressDenyValue({ reason: REASON_CODES[r.reason], flags: r.overridable ? EGRESS_DENY_OVERRIDABLE : 0 }));
      keys.set(hex, key);
    }
    let added = 0;
    let removed = 0;
    for (const [hex, value] of want) {
      if (this.deny.get(hex) === value.toString('hex')) continue;
      this.n.bpfMapUpdate(m.deny, keys.get(hex)!, value);
      this.deny.set(hex, value.toString('hex'));
      added++;
    }
    for (const hex of [...this.deny.keys()]) {
      if (want.has(hex)) continue;
      this.n.bpfMapDelete(m.deny, Buffer.from(hex, 'hex'));
      this.deny.delete(hex);
      removed++;
    }
    return { added, removed };
  }

  /** Entries of the node-wide deny trie now. */
  denyEntries(): number {
    return this.deny.size;
  }

  private get maps() {
    if (this.fds === null) throw new WarrenError('INTERNAL', 'egress enforcer is not open');
    return this.fds;
  }

  /** The cgroup id BPF sees for a cgroup2 directory (its kernfs inode). */
  static cgroupId(cgroupDir: string): bigint {
    return statSync(cgroupDir, { bigint: true }).ino;
  }

  /**
   * Attach every hook to the sandbox's cgroup and start enforcing `policy` there. Until this
   * returns nothing of the sandbox may run: call it between cgroup creation and spawn.
   */
  attach(sandboxId: string, cgroupDir: string, policy: SandboxEgressPolicy): bigint {
    const m = this.maps;
    if (!existsSync(cgroupDir)) throw new WarrenError('NOT_FOUND', `cgroup ${cgroupDir} does not exist`);
    const cgroupId = EgressEnforcer.cgroupId(cgroupDir);
    const state: SandboxState = { cgroupId, generation: 0, resolverV4: policy.resolverV4, exact: new Map(), cidrs: new Set() };
    this.sandboxes.set(cgroupId, state);
    try {
      this.writeEntries(state, 0, policy);
      this.n.bpfMapUpdate(m.policies, u64(cgroupId), encodeSandboxPolicy({ enforce: 1, allowDns: policy.resolverV4 ? 1 : 0, generation: 0, resolverV4: v4be(policy.resolverV4) }));
      for (const hook of HOOKS) {
        const link = this.linkPath(sandboxId, hook);
        if (existsSync(link)) unlinkSync(link); // a stale pin of a dead sandbox with a reused id
        this.n.bpfAttachCgroup(join(this.opts.pinDir, PROGRAMS[hook]), cgroupDir, hook, link);
      }
    } catch (err) {
      this.detach(sandboxId, cgroupId);
      throw err;
    }
    return cgroupId;
  }

  /** Replace a sandbox's policy atomically (next generation, flip, delete the old one). */
  update(cgroupId: bigint, policy: SandboxEgressPolicy): void {
    const m = this.maps;
    const state = this.state(cgroupId);
    const next = (state.generation + 1) & 0xff;
    const old = { exact: state.exact, cidrs: state.cidrs, generation: state.generation };
    const fresh: SandboxState = { ...state, generation: next, resolverV4: policy.resolverV4, exact: new Map(), cidrs: new Set() };
    try {
      this.writeEntries(fresh, next, policy);
    } catch (err) {
      this.deleteEntries(fresh);
      throw err;
    }
    this.n.bpfMapUpdate(m.policies, u64(cgroupId), encodeSandboxPolicy({ enforce: 1, allowDns: policy.resolverV4 ? 1 : 0, generation: next, resolverV4: v4be(policy.resolverV4) }));
    this.sandboxes.set(cgroupId, fresh);
    this.deleteEntries({ ...state, ...old });
  }

  /** Add DNS-learned addresses to the sandbox's current generation. */
  bind(cgroupId: bigint, bindings: EgressBinding[]): void {
    const state = this.state(cgroupId);
    for (const b of bindings) this.putExact(state, state.generation, b);
  }

  /** Stop enforcing and forget the sandbox: links unpinned (detached), entries deleted. Idempotent. */
  detach(sandboxId: string, cgroupId: bigint | null): void {
    this.detachTap(sandboxId);
    for (const hook of HOOKS) {
      try {
        unlinkSync(this.linkPath(sandboxId, hook));
      } catch {
        /* not attached */
      }
    }
    if (cgroupId === null || this.fds === null) return;
    const state = this.sandboxes.get(cgroupId);
    // known state: exactly its entries (adopt already dropped other generations); unknown: scan
    if (state) this.deleteEntries(state);
    else this.sweepCgroup(cgroupId);
    this.n.bpfMapDelete(this.fds.policies, u64(cgroupId));
    this.sandboxes.delete(cgroupId);
  }

  /** After a restart: take over a sandbox whose pins survived; its entries are read back from the maps. */
  adopt(sandboxId: string, cgroupDir: string): bigint | null {
    const m = this.maps;
    if (!existsSync(cgroupDir)) return null;
    const cgroupId = EgressEnforcer.cgroupId(cgroupDir);
    const raw = this.n.bpfMapLookup(m.policies, u64(cgroupId));
    if (raw === null || !HOOKS.every((h) => existsSync(this.linkPath(sandboxId, h)))) return null;
    const policy = decodeSandboxPolicy(raw);
    const state: SandboxState = { cgroupId, generation: policy.generation, resolverV4: policy.allowDns ? v4str(policy.resolverV4) : null, exact: new Map(), cidrs: new Set() };
    // entries of another generation are what a crash in the middle of an update left behind
    for (const key of this.keys(m.allow)) {
      const k = decodeEgressKey(key);
      if (k.cgroupId !== cgroupId) continue;
      if (k.generation !== state.generation) {
        this.n.bpfMapDelete(m.allow, key);
        continue;
      }
      const v = this.n.bpfMapLookup(m.allow, key);
      if (v) state.exact.set(key.toString('hex'), decodeEgressValue(v).expiresNs);
    }
    for (const key of this.keys(m.cidrs)) {
      const k = decodeEgressCidrKey(key);
      if (k.cgroupId !== cgroupId) continue;
      if (k.generation === state.generation) state.cidrs.add(key.toString('hex'));
      else this.n.bpfMapDelete(m.cidrs, key);
    }
    this.sandboxes.set(cgroupId, state);
    return cgroupId;
  }

  /** The exact (DNS-learned) entries a sandbox has now, one per address+port. */
  bindingsOf(cgroupId: bigint): { address: string; port: number; proto: number; expiresNs: bigint; serviceId: number }[] {
    const m = this.maps;
    return [...this.state(cgroupId).exact.keys()].flatMap((hex) => {
      const key = Buffer.from(hex, 'hex');
      const v = this.n.bpfMapLookup(m.allow, key);
      if (v === null) return [];
      const k = decodeEgressKey(key);
      const val = decodeEgressValue(v);
      return [{ address: bytesToIp(k.addr), port: k.port, proto: k.proto, expiresNs: val.expiresNs, serviceId: val.serviceId }];
    });
  }

  /** Delete DNS bindings whose TTL ended more than the grace period ago; returns how many. */
  sweep(nowNs = process.hrtime.bigint()): number {
    const m = this.maps;
    let removed = 0;
    for (const state of this.sandboxes.values()) {
      for (const [hex, expires] of state.exact) {
        if (expires !== 0n && expires + this.graceNs < nowNs) {
          this.n.bpfMapDelete(m.allow, Buffer.from(hex, 'hex'));
          state.exact.delete(hex);
          removed++;
        }
      }
    }
    return removed;
  }

  /** Denials reported by the programs since the last call. */
  drainDenials(): EgressDenial[] {
    if (this.fds === null) return [];
    return this.n.bpfRingbufDrain(this.ringbuf).flatMap((rec) => {
      if (rec.length < EGRESS_EVENT_SIZE) return [];
      const e: EgressEvent = decodeEgressEvent(rec);
      return [{ cgroupId: e.cgroupId, address: bytesToIp(e.addr), port: e.port, proto: e.proto, hook: KIND_HOOK[e.kind] ?? 'skb', pid: e.pid, timestampNs: e.timestampNs, reason: reasonName(e.reason) }];
    });
  }

  /** Entries a sandbox has now (for tests and `warren doctor`). */
  entries(cgroupId: bigint): { exact: number; cidrs: number; generation: number } {
    const s = this.state(cgroupId);
    return { exact: s.exact.size, cidrs: s.cidrs.size, generation: s.generation };
  }

  /** Sandbox ids with pinned links (to find leftovers of deleted sandboxes). */
  pinnedSandboxes(): string[] {
    if (!existsSync(this.linkDir)) return [];
    return [...new Set(readdirSync(this.linkDir).map((f) => f.slice(0, f.lastIndexOf('_'))))];
  }

  close(): void {
    if (this.fds === null) return;
    this.n.bpfRingbufClose(this.ringbuf);
    for (const fd of Object.values(this.fds)) this.n.close(fd);
    this.tapRefusal = 'the tap programs are not loaded';
    this.fds = null;
    this.sandboxes.clear();
    this.deny.clear();
  }

  /** Remove the node's programs and maps (only when no sandbox is attached any more). */
  unpinAll(): void {
    this.close();
    if (this.pinnedSandboxes().length > 0) throw new WarrenError('INTERNAL', 'egress programs are still attached to sandboxes');
    for (const f of existsSync(this.opts.pinDir) ? readdirSync(this.opts.pinDir) : []) {
      if (f !== 'links') unlinkSync(join(this.opts.pinDir, f));
    }
    for (const d of [this.linkDir, this.opts.pinDir, dirname(this.opts.pinDir)]) {
      try {
        rmdirSync(d);
      } catch {
        /* not empty or gone */
      }
    }
  }

  /** bpffs refuses names with a dot; sandbox ids have no underscore. */
  private linkPath(sandboxId: string, hook: BpfCgroupAttach): string {
    return join(this.linkDir, `${sandboxId}_${hook}`);
  }

  private state(cgroupId: bigint): SandboxState {
    const s = this.sandboxes.get(cgroupId);
    if (!s) throw new WarrenError('NOT_FOUND', `no egress policy for cgroup ${cgroupId}`);
    return s;
  }

  private writeEntries(state: SandboxState, generation: number, policy: SandboxEgressPolicy): void {
    const m = this.maps;
    for (const r of policy.ranges) {
      const { bytes, prefix } = parseCidr(r.cidr);
      for (const port of r.ports.length ? r.ports : [0]) {
        const key = encodeEgressCidrKey({ prefixlen: CIDR_FIXED_BITS + prefix, port, proto: protoNumber(r.proto), generation, cgroupId: state.cgroupId, addr: bytes });
        this.n.bpfMapUpdate(m.cidrs, key, encodeEgressCidrValue({ serviceId: r.serviceId }));
        state.cidrs.add(key.toString('hex'));
      }
    }
    for (const b of policy.bindings) this.putExact(state, generation, b);
  }

  private putExact(state: SandboxState, generation: number, b: EgressBinding): void {
    const addr = ipToBytes(b.address);
    for (const port of b.ports.length ? b.ports : [0]) {
      const key = encodeEgressKey({ cgroupId: state.cgroupId, addr, port, proto: protoNumber(b.proto), generation });
      const hex = key.toString('hex');
      const prev = state.exact.get(hex);
      // a longer TTL wins; an entry that never expires stays so
      const expires = prev === 0n || b.expiresNs === 0n ? 0n : prev !== undefined && prev > b.expiresNs ? prev : b.expiresNs;
      this.n.bpfMapUpdate(this.maps.allow, key, encodeEgressValue({ expiresNs: expires, serviceId: b.serviceId }));
      state.exact.set(hex, expires);
    }
  }

  private deleteEntries(state: Pick<SandboxState, 'exact' | 'cidrs'>): void {
    const m = this.maps;
    for (const hex of state.exact.keys()) this.n.bpfMapDelete(m.allow, Buffer.from(hex, 'hex'));
    for (const hex of state.cidrs) this.n.bpfMapDelete(m.cidrs, Buffer.from(hex, 'hex'));
  }

  /** Entries of a cgroup this process does not know about (another generation, a crash mid-update). */
  private sweepCgroup(cgroupId: bigint): void {
    const m = this.maps;
    for (const key of this.keys(m.allow)) if (decodeEgressKey(key).cgroupId === cgroupId) this.n.bpfMapDelete(m.allow, key);
    for (const key of this.keys(m.cidrs)) if (decodeEgressCidrKey(key).cgroupId === cgroupId) this.n.bpfMapDelete(m.cidrs, key);
  }

  private keys(fd: number): Buffer[] {
    const out: Buffer[] = [];
    for (let k = this.n.bpfMapNextKey(fd, null); k !== null; k = this.n.bpfMapNextKey(fd, k)) out.push(k);
    return out;
  }
}

/** Load the egress object into a scratch pin directory and remove it again (feature detection). */
export function probeEgressPrograms(): void {
  const { native, bpfObject } = require('../../native') as typeof import('../../native');
  const dir = `/sys/fs/bpf/warren-probe-${process.pid}`; // bpffs refuses names with a dot
  mountBpffs(native, `${dir}/x`);
  try {
    native.bpfLoadPinned(bpfObject('sandbox_egress'), dir);
  } finally {
    for (const f of existsSync(dir) ? readdirSync(dir) : []) {
      try {
        unlinkSync(join(dir, f));
      } catch {
        /* gone */
      }
    }
    try {
      rmdirSync(dir);
    } catch {
      /* never made */
    }
  }
}

/** Mount bpffs at /sys/fs/bpf when the host has not. */
function mountBpffs(n: NativeAddon, pinDir: string): void {
  if (!pinDir.startsWith('/sys/fs/bpf/')) return;
  try {
    if (statSync('/sys/fs/bpf/').dev !== statSync('/sys/fs/').dev) return; // something is mounted there
  } catch {
    return;
  }
  n.mount('bpf', '/sys/fs/bpf', 'bpf', [], 'mode=0700');
}

function protoNumber(p: 'tcp' | 'udp'): number {
  return p === 'udp' ? IPPROTO_UDP : IPPROTO_TCP;
}

function u64(v: bigint): Buffer {
  const b = Buffer.alloc(8);
  b.writeBigUInt64LE(v);
  return b;
}

/** The u32 the program compares with the address bytes (network order in memory). */
function v4be(ip: string | null): number {
  if (ip === null) return 0;
  return ipv4ToMapped(ip).readUInt32LE(12);
}

function v4str(v: number): string {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(v);
  return [...b].join('.');
}
