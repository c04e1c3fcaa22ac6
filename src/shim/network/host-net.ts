/**
 * The host side of sandbox networking: one bridge with the subnet's gateway
 * address, IPv4 forwarding, and an nftables table (family inet) that NATs the
 * subnet out of the host and keeps sandboxes away from each other and from the
 * host's own services. Every rule is qualified by the bridge's name, so other
 * host traffic is left alone.
 */
import { createHash } from 'node:crypto';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { WarrenError } from '../../errors';

export interface HostNetworkOptions {
  /** Bridge interface name (at most 15 characters). Default 'warren0'. */
  bridge?: string;
  /** IPv4 CIDR in a private range, prefix /8 to /28. Default '10.88.0.0/16'. */
  subnet?: string;
  /** Name of the nftables table (family inet) this network owns. Default 'warren'. */
  nftTable?: string;
  log?(line: string): void;
}

const BRIDGE_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$/;
const NFT_TABLE_NAME = /^[A-Za-z][A-Za-z0-9_]{0,31}$/;
const PRIVATE_RANGES: ReadonlyArray<{ cidr: string; network: number; prefix: number }> = [
  { cidr: '10.0.0.0/8', network: 0x0a000000, prefix: 8 },
  { cidr: '172.16.0.0/12', network: 0xac100000, prefix: 12 },
  { cidr: '192.168.0.0/16', network: 0xc0a80000, prefix: 16 },
];
/**
 * Per-sandbox DNS budgets in the kernel: queries per second over UDP (with a burst for a
 * resolver's retries), and TCP connections at once (the responder keeps fewer: see its
 * maxTcpConnectionsPerClient). A package install resolves a few names a second.
 */
const DNS_UDP_RATE = 500;
const DNS_UDP_BURST = 1000;
const DNS_TCP_CONNS = 16;
/** Tools are on these paths on Debian; the PATH of the calling process may lack the sbin dirs. */
export const TOOL_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
const DEFAULT_TOOL_TIMEOUT_MS = 15_000;

export interface ToolResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

/** Runs a tool with optional stdin; never rejects for a non-zero exit (the caller decides), only for a failed spawn. */
export function runTool(
  file: string,
  args: readonly string[],
  opts: { input?: string; env?: Record<string, string>; timeoutMs?: number } = {},
): Promise<ToolResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { PATH: TOOL_PATH, ...opts.env },
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? DEFAULT_TOOL_TIMEOUT_MS);
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new WarrenError('SPAWN_ERROR', `cannot run ${file}: ${err.message}`, { command: file }));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
    // A tool that exits early closes its stdin; the EPIPE is reported through its exit status instead.
    child.stdin.on('error', () => undefined);
    child.stdin.end(opts.input ?? '');
  });
}

/** runTool, throwing an INTERNAL WarrenError (with the tool's stderr) unless it exits 0. */
export async function runToolChecked(
  file: string,
  args: readonly string[],
  opts: { input?: string; env?: Record<string, string>; timeoutMs?: number; what?: string } = {},
): Promise<ToolResult> {
  const result = await runTool(file, args, opts);
  if (result.code !== 0) {
    const how = result.signal !== null ? `was killed by ${result.signal}` : `exited with status ${result.code}`;
    throw new WarrenError('INTERNAL', `${opts.what ?? file} failed: ${file} ${how}: ${result.stderr.trim() || result.stdout.trim()}`, {
      command: [file, ...args].join(' '),
      exitCode: result.code,
      stderr: result.stderr.trim(),
    });
  }
  return result;
}

export function parseIpv4(text: string): number | null {
  const parts = text.split('.');
  if (parts.length !== 4) return null;
  let value = 0;
  for (const part of parts) {
    if (!/^(0|[1-9][0-9]{0,2})$/.test(part)) return null;
    const octet = Number(part);
    if (octet > 255) return null;
    value = value * 256 + octet;
  }
  return value;
}

export function formatIpv4(value: number): string {
  return [value >>> 24, (value >>> 16) & 255, (value >>> 8) & 255, value & 255].join('.');
}

function prefixMask(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

export class HostNetwork {
  readonly bridge: string;
  /** Normalized subnet CIDR, e.g. '10.88.0.0/16'. */
  readonly subnet: string;
  readonly nftTable: string;
  readonly prefixLength: number;
  /** The bridge's address: the first host address of the subnet. */
  readonly gatewayAddress: string;
  /**
   * How many addresses sandboxes can get: every host address of the subnet
   * except the gateway (network and broadcast addresses are never host addresses).
   */
  readonly sandboxAddressCount: number;
  private readonly networkValue: number;
  private readonly log: (line: string) => void;
  private serialized: Promise<unknown> = Promise.resolve();

  constructor(opts: HostNetworkOptions = {}) {
    this.bridge = opts.bridge ?? 'warren0';
    this.nftTable = opts.nftTable ?? 'warren';
    this.log = opts.log ?? (() => undefined);
    if (typeof this.bridge !== 'string' || !BRIDGE_NAME.test(this.bridge)) {
      throw new WarrenError(
        'INVALID_ARGUMENT',
        `bridge name ${JSON.stringify(this.bridge)} is invalid: 1 to 15 characters from [A-Za-z0-9_.-], starting with a letter or digit`,
        { field: 'bridge' },
      );
    }
    if (typeof this.nftTable !== 'string' || !NFT_TABLE_NAME.test(this.nftTable)) {
      throw new WarrenError(
        'INVALID_ARGUMENT',
        `nftables table name ${JSON.stringify(this.nftTable)} is invalid: 1 to 32 characters from [A-Za-z0-9_], starting with a letter`,
        { field: 'nftTable' },
      );
    }
    const { network, prefix } = HostNetwork.parseSubnet(opts.subnet ?? '10.88.0.0/16');
    this.networkValue = network;
    this.prefixLength = prefix;
    this.subnet = `${formatIpv4(network)}/${prefix}`;
    this.gatewayAddress = formatIpv4(network + 1);
    this.sandboxAddressCount = 2 ** (32 - prefix) - 3;
  }

  private static parseSubnet(subnet: string): { network: number; prefix: number } {
    const invalid = (why: string): WarrenError =>
      new WarrenError('INVALID_ARGUMENT', `subnet ${JSON.stringify(subnet)} is invalid: ${why}`, { field: 'subnet' });
    if (typeof subnet !== 'string') throw invalid('expected an IPv4 CIDR such as 10.88.0.0/16');
    const match = /^([0-9.]+)\/([0-9]{1,2})$/.exec(subnet);
    const address = match ? parseIpv4(match[1]!) : null;
    if (!match || address === null) throw invalid('expected an IPv4 CIDR such as 10.88.0.0/16');
    const prefix = Number(match[2]);
    if (prefix < 8 || prefix > 28) throw invalid(`the prefix length must be between /8 and /28, not /${prefix}`);
    const network = (address & prefixMask(prefix)) >>> 0;
    if (network !== address) throw invalid(`host bits are set; the network address is ${formatIpv4(network)}/${prefix}`);
    const inPrivateRange = PRIVATE_RANGES.some((r) => prefix >= r.prefix && ((network & prefixMask(r.prefix)) >>> 0) === r.network);
    if (!inPrivateRange) {
      throw invalid(`it must lie inside a private range (${PRIVATE_RANGES.map((r) => r.cidr).join(', ')})`);
    }
    return { network, prefix };
  }

  /** The sandbox address with this index, 0 <= index < sandboxAddressCount (network + 2 upwards). */
  sandboxAddressAt(index: number): string {
    if (!Number.isInteger(index) || index < 0 || index >= this.sandboxAddressCount) {
      throw new WarrenError('INVALID_ARGUMENT', `sandbox address index ${index} is outside 0..${this.sandboxAddressCount - 1}`);
    }
    return formatIpv4(this.networkValue + 2 + index);
  }

  /** The index of a sandbox address, or -1 when it is not one (outside the subnet, network, gateway, broadcast). */
  sandboxAddressIndex(address: string): number {
    const value = parseIpv4(address);
    if (value === null) return -1;
    const index = value - this.networkValue - 2;
    return index >= 0 && index < this.sandboxAddressCount ? index : -1;
  }

  /** Every address a sandbox can be given, in order. */
  *sandboxAddresses(): Generator<string> {
    for (let i = 0; i < this.sandboxAddressCount; i++) yield formatIpv4(this.networkValue + 2 + i);
  }

  /** Bridge up with the gateway address, IPv4 forwarding on, the nftables table (re)loaded. Idempotent. */
  ensure(): Promise<void> {
    return this.serialize(() => this.ensureNow());
  }

  /** Removes the nftables table and the bridge. Idempotent. IPv4 forwarding is left on (other users may need it). */
  teardown(): Promise<void> {
    return this.serialize(() => this.teardownNow());
  }

  /** The nftables ruleset ensure() loads; replaces the whole table in one transaction. */
  nftRuleset(): string {
    const br = JSON.stringify(this.bridge);
    const table = `inet ${this.nftTable}`;
    const subnet = this.subnet;
    const gateway = this.gatewayAddress;
    return [
      // Declaring the table first makes the delete valid when it does not exist yet.
      `table ${table}`,
      `delete table ${table}`,
      `table ${table} {`,
      // Per-sandbox budgets at the resolver, enforced before a packet reaches its socket: one
      // sandbox's UDP flood is dropped here instead of filling the socket buffer all share, and
      // no sandbox holds more than its share of TCP connections.
      `  set dns_udp_rate { type ipv4_addr; size 65535; flags dynamic; timeout 10s; }`,
      `  set dns_tcp_conns { type ipv4_addr; size 65535; flags dynamic; }`,
      `  chain forward {`,
      `    type filter hook forward priority filter; policy accept;`,
      // Sandboxes have no IPv6; nothing but IPv4 crosses the bridge through L3.
      `    iifname ${br} meta nfproto != ipv4 drop`,
      `    oifname ${br} meta nfproto != ipv4 drop`,
      `    iifname ${br} ip saddr != ${subnet} drop`,
      // Sandbox to sandbox through the host (also what bridged IPv4 looks like with br_netfilter on).
      `    iifname ${br} oifname ${br} drop`,
      `    iifname ${br} ct state invalid drop`,
      `    iifname ${br} ct state established,related accept`,
      `    oifname ${br} ct state established,related accept`,
      `    iifname ${br} ct state new accept`,
      `    iifname ${br} drop`,
      // Nothing from outside opens connections to sandboxes.
      `    oifname ${br} drop`,
      `  }`,
      `  chain input {`,
      `    type filter hook input priority filter; policy accept;`,
      `    iifname ${br} meta nfproto != ipv4 drop`,
      `    iifname ${br} ip saddr != ${subnet} drop`,
      // before the conntrack accept: a flooding socket's later queries are "established"
      `    iifname ${br} ip daddr ${gateway} udp dport 53 update @dns_udp_rate { ip saddr limit rate over ${DNS_UDP_RATE}/second burst ${DNS_UDP_BURST} packets } drop`,
      `    iifname ${br} ct state established,related accept`,
      `    iifname ${br} ip daddr ${gateway} udp dport 53 accept`,
      `    iifname ${br} ip daddr ${gateway} tcp dport 53 ct state new add @dns_tcp_conns { ip saddr ct count over ${DNS_TCP_CONNS} } reject with tcp reset`,
      `    iifname ${br} ip daddr ${gateway} tcp dport 53 accept`,
      `    iifname ${br} drop`,
      `  }`,
      `  chain postrouting {`,
      `    type nat hook postrouting priority srcnat; policy accept;`,
      `    ip saddr ${subnet} oifname != ${br} masquerade`,
      `  }`,
      `}`,
      '',
    ].join('\n');
  }

  private async ensureNow(): Promise<void> {
    const sysDir = `/sys/class/net/${this.bridge}`;
    const batch: string[] = [];
    if (existsSync(sysDir)) {
      if (!existsSync(`${sysDir}/bridge`)) {
        throw new WarrenError('ALREADY_EXISTS', `interface ${this.bridge} exists and is not a bridge`, { bridge: this.bridge });
      }
    } else {
      batch.push(`link add name ${this.bridge} type bridge`);
      this.log(`creating bridge ${this.bridge}`);
    }
    // A bridge without its own address takes the lowest MAC of its ports, so it would change
    // whenever a veth comes or goes, and sandboxes would keep ARP entries for a MAC that is no
    // longer the gateway's. A fixed, locally administered address per bridge name avoids that.
    batch.push(`link set dev ${this.bridge} address ${bridgeMac(this.bridge)}`);
    batch.push(`address replace ${this.gatewayAddress}/${this.prefixLength} dev ${this.bridge}`);
    batch.push(`link set dev ${this.bridge} up`);
    await runToolChecked('ip', ['-batch', '-'], { input: batch.join('\n') + '\n', what: `setting up bridge ${this.bridge}` });

    const forwardingFile = '/proc/sys/net/ipv4/ip_forward';
    if (readFileSync(forwardingFile, 'utf8').trim() !== '1') {
      writeFileSync(forwardingFile, '1\n');
      this.log('enabled net.ipv4.ip_forward');
    }

    await runToolChecked('nft', ['-f', '-'], { input: this.nftRuleset(), what: `loading nftables table inet ${this.nftTable}` });
  }

  private async teardownNow(): Promise<void> {
    const deleted = await runTool('nft', ['delete', 'table', 'inet', this.nftTable]);
    if (deleted.code !== 0 && !/No such file or directory/i.test(deleted.stderr)) {
      throw new WarrenError('INTERNAL', `deleting nftables table inet ${this.nftTable} failed: ${deleted.stderr.trim()}`, {
        stderr: deleted.stderr.trim(),
      });
    }
    if (existsSync(`/sys/class/net/${this.bridge}/bridge`)) {
      const removed = await runTool('ip', ['link', 'delete', 'dev', this.bridge, 'type', 'bridge']);
      if (removed.code !== 0 && existsSync(`/sys/class/net/${this.bridge}`)) {
        throw new WarrenError('INTERNAL', `deleting bridge ${this.bridge} failed: ${removed.stderr.trim()}`, { stderr: removed.stderr.trim() });
      }
      this.log(`deleted bridge ${this.bridge}`);
    }
  }

  private serialize<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.serialized.then(fn, fn);
    this.serialized = next.catch(() => undefined);
    return next;
  }
}

/** A stable, locally administered unicast MAC for a bridge name. */
export function bridgeMac(bridge: string): string {
  const h = createHash('sha256').update(`warren-bridge:${bridge}`).digest();
  return ['02', ...[...h.subarray(0, 5)].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}
