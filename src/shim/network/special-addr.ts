/**
 * Which destinations a DNS answer may never open, and the node-wide deny ranges the egress
 * programs check before any allow entry.
 *
 * Three kinds of range, checked in this order:
 *
 *  - special-use ranges, the same everywhere (also compiled into bpf/sandbox_egress.bpf.c):
 *    unspecified, loopback, link-local (with the cloud metadata addresses singled out),
 *    multicast, broadcast and reserved, and IPv6 forms that a translator turns into an IPv4
 *    address (IPv4-mapped, -translated and -compatible, NAT64, 6to4, Teredo);
 *  - the node's own: every address of the host's interfaces (bridges, the host side of veths,
 *    the uplink) and the sandbox subnet (other sandboxes);
 *  - operator-listed ranges (`denied_ranges` in services.yaml, private networks by default).
 *    A DNS answer never opens them; a service's `cidrs` or an account's rule can (the programs
 *    consult only the sandbox's CIDR entries for them, never its DNS bindings).
 *
 * The first two are never allowed for a sandbox, whatever its policy says; the responder
 * refuses all three in answers.
 */
import { readFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { isIPv4, isIPv6 } from 'node:net';
import {
  EGRESS_REASON_BROADCAST,
  EGRESS_REASON_CNAME,
  EGRESS_REASON_EMBEDDED_IPV4,
  EGRESS_REASON_LINK_LOCAL,
  EGRESS_REASON_LOOPBACK,
  EGRESS_REASON_METADATA,
  EGRESS_REASON_MULTICAST,
  EGRESS_REASON_NODE,
  EGRESS_REASON_NOT_ALLOWED,
  EGRESS_REASON_OPERATOR,
  EGRESS_REASON_SANDBOX_SUBNET,
  EGRESS_REASON_UNSPECIFIED,
} from '../../native/bpf-layouts';
import { bytesToIp, canonicalIpv6, ipToBytes, parseCidr } from './addr';

export type RefusalReason =
  | 'not-allowed'
  | 'unspecified'
  | 'loopback'
  | 'link-local'
  | 'metadata'
  | 'multicast'
  | 'broadcast'
  | 'embedded-ipv4'
  | 'node'
  | 'sandbox-subnet'
  | 'operator'
  | 'cname';

/** The reason codes of bpf/layouts.json, both ways. */
export const REASON_CODES: Record<RefusalReason, number> = {
  'not-allowed': EGRESS_REASON_NOT_ALLOWED,
  unspecified: EGRESS_REASON_UNSPECIFIED,
  loopback: EGRESS_REASON_LOOPBACK,
  'link-local': EGRESS_REASON_LINK_LOCAL,
  metadata: EGRESS_REASON_METADATA,
  multicast: EGRESS_REASON_MULTICAST,
  broadcast: EGRESS_REASON_BROADCAST,
  'embedded-ipv4': EGRESS_REASON_EMBEDDED_IPV4,
  node: EGRESS_REASON_NODE,
  'sandbox-subnet': EGRESS_REASON_SANDBOX_SUBNET,
  operator: EGRESS_REASON_OPERATOR,
  cname: EGRESS_REASON_CNAME,
};
const REASON_NAMES = new Map(Object.entries(REASON_CODES).map(([name, code]) => [code, name as RefusalReason]));

export function reasonName(code: number): RefusalReason | `reason-${number}` {
  return REASON_NAMES.get(code) ?? `reason-${code}`;
}

/** How an IPv6 address embeds an IPv4 one, if it does. */
export type Embedding = 'mapped' | 'translated' | 'compatible' | 'nat64' | '6to4' | 'teredo';

export interface NormalizedAddress {
  /** Canonical text: dotted quad for IPv4, RFC 5952 for IPv6. */
  address: string;
  family: 4 | 6;
  /** For IPv6 that carries an IPv4 address: which form, and that address. */
  embedded?: { form: Embedding; ipv4: string };
}

function v4At(b: Buffer, at: number): string {
  return `${b[at]}.${b[at + 1]}.${b[at + 2]}.${b[at + 3]}`;
}

/** The IPv4 address an IPv6 address stands for after translation, if any. */
export function embeddedIpv4(b: Buffer): { form: Embedding; ipv4: string } | undefined {
  const zero = (from: number, to: number) => b.subarray(from, to).every((x) => x === 0);
  if (zero(0, 10) && b[10] === 0xff && b[11] === 0xff) return { form: 'mapped', ipv4: v4At(b, 12) };
  if (zero(0, 8) && b[8] === 0xff && b[9] === 0xff && b[10] === 0 && b[11] === 0) return { form: 'translated', ipv4: v4At(b, 12) };
  if (zero(0, 12) && !zero(12, 16) && !(zero(12, 15) && b[15] === 1)) return { form: 'compatible', ipv4: v4At(b, 12) };
  if (b[0] === 0x00 && b[1] === 0x64 && b[2] === 0xff && b[3] === 0x9b) {
    if (zero(4, 12)) return { form: 'nat64', ipv4: v4At(b, 12) }; // 64:ff9b::/96
    // 64:ff9b:1::/48 (local-use); operators pick the prefix length, the address sits in bits 96..127 for /96 only
    if (b[4] === 0 && b[5] === 1) return { form: 'nat64', ipv4: v4At(b, 12) };
  }
  if (b[0] === 0x20 && b[1] === 0x02) return { form: '6to4', ipv4: v4At(b, 2) };
  if (b[0] === 0x20 && b[1] === 0x01 && b[2] === 0 && b[3] === 0) {
    // Teredo: the client's address is stored inverted in the last 32 bits
    return { form: 'teredo', ipv4: [b[12]! ^ 0xff, b[13]! ^ 0xff, b[14]! ^ 0xff, b[15]! ^ 0xff].join('.') };
  }
  return undefined;
}

/** An answered address in canonical form, with the IPv4 address it embeds. Throws INVALID_ARGUMENT on a non-address. */
export function normalizeAddress(address: string): NormalizedAddress {
  const bytes = ipToBytes(address.split('%')[0]!);
  if (isIPv4(address)) return { address: bytesToIp(bytes), family: 4 };
  const embedded = embeddedIpv4(bytes);
  return { address: canonicalIpv6(bytes), family: 6, ...(embedded ? { embedded } : {}) };
}

/** The special-use reason of an IPv4 address, or undefined. */
function ipv4Reason(ip: string): RefusalReason | undefined {
  const o = ip.split('.').map(Number) as [number, number, number, number];
  if (o[0] === 0) return 'unspecified';
  if (o[0] === 127) return 'loopback';
  if (o[0] === 169 && o[1] === 254) return o[2] === 169 && o[3] === 254 ? 'metadata' : 'link-local';
  if (ip === '100.100.100.200') return 'metadata';
  if (o[0] >= 224 && o[0] < 240) return 'multicast';
  if (o[0] >= 240) return 'broadcast';
  return undefined;
}

/**
 * The special-use reason of an address (IPv4 or IPv6 text), or undefined: what the programs
 * compile in, plus loopback (which they allow as the sandbox's own). An IPv6 address that embeds
 * an IPv4 one gets that IPv4's reason, else 'embedded-ipv4' (except ::ffff:a.b.c.d, which the
 * programs treat as the IPv4 address itself).
 */
export function specialReason(address: string): RefusalReason | undefined {
  const n = normalizeAddress(address);
  if (n.family === 4) return ipv4Reason(n.address);
  const b = ipToBytes(n.address);
  if (b.every((x) => x === 0)) return 'unspecified';
  if (b.subarray(0, 15).every((x) => x === 0) && b[15] === 1) return 'loopback';
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0x80) return 'link-local';
  if (b[0] === 0xff) return 'multicast';
  if (n.address === 'fd00:ec2::254') return 'metadata';
  if (n.embedded) return ipv4Reason(n.embedded.ipv4) ?? (n.embedded.form === 'mapped' ? undefined : 'embedded-ipv4');
  return undefined;
}

/** One entry of the node-wide deny trie. */
export interface DenyRange {
  cidr: string;
  reason: RefusalReason;
  /** A sandbox's CIDR entries may still allow it (operator-listed ranges). */
  overridable: boolean;
}

export interface SpecialAddressOptions {
  /** The sandbox subnet of this node (other sandboxes). */
  subnet: string;
  /** Operator-listed ranges (IPv4 or IPv6 CIDRs). */
  deniedRanges(): readonly string[];
  /** The host's own addresses; default: the kernel's local addresses ({@link localAddresses}). */
  nodeAddresses?(): string[];
  /** How long a read of the host's addresses is reused (default 1000 ms). */
  maxAgeMs?: number;
  /**
   * Called after any read that found the addresses changed, whoever asked for the read: the
   * DNS path re-reads too, and a change it saw first must still reach the programs' trie.
   */
  onChange?(): void;
}

function cidrContains(range: { bytes: Buffer; prefix: number }, b: Buffer): boolean {
  for (let bit = 0; bit < range.prefix; bit++) if ((range.bytes[bit >> 3]! ^ b[bit >> 3]!) & (0x80 >> (bit & 7))) return false;
  return true;
}

/**
 * Every address this network namespace delivers locally. os.networkInterfaces() is not that
 * list: libuv leaves out interfaces without carrier, and a bridge loses carrier whenever its
 * last port goes, while the kernel still accepts packets for its address. The kernel's own
 * tables are read instead: the LOCAL /32 entries of /proc/net/fib_trie and every address of
 * /proc/net/if_inet6. Without /proc, the interfaces are the best there is.
 */
export function localAddresses(): string[] {
  let trie: string;
  try {
    trie = readFileSync('/proc/net/fib_trie', 'utf8');
  } catch {
    return Object.values(networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address.split('%')[0]!));
  }
  const out = new Set<string>();
  let last: string | undefined;
  for (const line of trie.split('\n')) {
    const leaf = /^[\s|+`-]*-- (\d+\.\d+\.\d+\.\d+)$/.exec(line);
    if (leaf) last = leaf[1];
    else if (last !== undefined && /^\s*\/32 host LOCAL$/.test(line)) out.add(last);
  }
  let v6 = '';
  try {
    v6 = readFileSync('/proc/net/if_inet6', 'utf8'); // absent when IPv6 is disabled
  } catch {
    /* no IPv6 */
  }
  for (const line of v6.split('\n')) {
    const hex = line.split(/\s+/)[0];
    if (hex === undefined || !/^[0-9a-f]{32}$/.test(hex)) continue;
    out.add(canonicalIpv6(Buffer.from(hex, 'hex')));
  }
  return [...out];
}

/**
 * The node's view of special addresses: classifies DNS answers for the responder and lists the
 * deny trie's entries for the programs, from one set of rules.
 */
export class SpecialAddresses {
  private readonly subnet: { bytes: Buffer; prefix: number };
  private node: Set<string> = new Set();
  private readAt = -Infinity;
  private readonly maxAgeMs: number;

  constructor(private readonly opts: SpecialAddressOptions) {
    this.subnet = parseCidr(opts.subnet);
    this.maxAgeMs = opts.maxAgeMs ?? 1000;
  }

  /** Re-read the host's addresses now; true when they changed. */
  refresh(): boolean {
    const next = new Set<string>();
    for (const a of (this.opts.nodeAddresses ?? localAddresses)()) {
      try {
        next.add(normalizeAddress(a).address);
      } catch {
        /* not an address */
      }
    }
    this.readAt = Date.now();
    const changed = next.size !== this.node.size || [...next].some((a) => !this.node.has(a));
    this.node = next;
    if (changed) this.opts.onChange?.();
    return changed;
  }

  nodeAddresses(): string[] {
    if (Date.now() - this.readAt >= this.maxAgeMs) this.refresh();
    return [...this.node];
  }

  /**
   * Why a DNS answer may not open this address, or undefined when it may. IPv6 forms that embed
   * an IPv4 address are judged as that address and are never opened by an AAAA answer.
   */
  refusal(address: string): RefusalReason | undefined {
    const n = normalizeAddress(address);
    const special = specialReason(n.address);
    if (special) return special;
    if (n.embedded) return 'embedded-ipv4';
    return this.nodeReason(n.address);
  }

  /** The reason the node-wide trie gives an address (node, subnet, operator), or undefined. */
  nodeReason(address: string): RefusalReason | undefined {
    const n = normalizeAddress(address);
    const target = n.embedded?.form === 'mapped' ? n.embedded.ipv4 : n.address;
    this.nodeAddresses();
    if (this.node.has(target)) return 'node';
    const b = ipToBytes(target);
    if (cidrContains(this.subnet, b)) return 'sandbox-subnet';
    for (const cidr of this.opts.deniedRanges()) if (cidrContains(parseCidr(cidr), b)) return 'operator';
    return undefined;
  }

  /** The entries of the node-wide deny trie (special-use ranges are compiled into the programs). */
  denyRanges(): DenyRange[] {
    const out: DenyRange[] = [{ cidr: this.opts.subnet, reason: 'sandbox-subnet', overridable: false }];
    for (const a of this.nodeAddresses()) {
      if (specialReason(a) !== undefined) continue; // loopback, link-local: compiled in
      out.push({ cidr: isIPv6(a) ? `${a}/128` : `${a}/32`, reason: 'node', overridable: false });
    }
    for (const cidr of this.opts.deniedRanges()) {
      // A narrower operator range inside the subnet would win the longest-prefix match and
      // make part of it overridable: the subnet stays closed.
      const r = parseCidr(cidr);
      if (r.prefix >= this.subnet.prefix && cidrContains(this.subnet, r.bytes)) continue;
      out.push({ cidr, reason: 'operator', overridable: true });
    }
    return out;
  }
}
