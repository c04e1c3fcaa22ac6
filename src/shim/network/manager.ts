/**
 * Per-service egress for sandboxes: the one place that ties the parts together.
 *
 *   HostNetwork     the bridge, its gateway address and the nftables NAT table
 *   NetnsPool       pre-created network namespaces with a veth on the bridge
 *   EgressEnforcer  the eBPF programs on each sandbox's cgroup and their maps
 *   DnsResponder    the node's resolver on the gateway address: it answers only
 *                   names of services the asking sandbox may reach, and binds the
 *                   answered addresses into that sandbox's allow map first
 *
 * The services catalog and per-account defaults come from the policy directory
 * (services.yaml, accounts.yaml); a policy apply re-computes every sandbox's
 * allowlist. A sandbox's services are a map {name: boolean}; the sandbox may
 * reach exactly the enabled services' hosts (once resolved through the node's
 * DNS), their CIDRs, and its account's raw rules.
 */
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { WarrenError } from '../../errors';
import type { NativeAddon } from '../../native/types';
import type { AccountNetwork, Policy, Service } from '../../security/policy';
import { EGRESS_SERVICE_NONE, EGRESS_SERVICE_RULE } from '../../native/bpf-layouts';
import { DnsResponder, type DnsAnswerAddress, type DnsEndpoint } from './dns-responder';
import { EgressEnforcer, type EgressBinding, type EgressDenial, type EgressRange, type SandboxEgressPolicy } from './egress';
import { HostNetwork, runTool } from './host-net';
import { NetnsPool, type NetnsLease } from './netns-pool';
import { parseCidr } from './addr';
import { SpecialAddresses, specialReason, type RefusalReason } from './special-addr';
import type { SandboxNetworkInfo } from '../types';
import { instruments } from '../../telemetry';
import { ownValue } from '../../validation';

export interface NetworkOptions {
  native: NativeAddon;
  nodeId: string;
  /** The policy in force (read on every decision, so an apply takes effect at once). */
  policy(): Policy;
  /** Host bridge (default warren0) and the sandboxes' subnet (default 10.88.0.0/16). */
  bridge?: string;
  subnet?: string;
  nftTable?: string;
  /** Idle namespaces kept ready (default 8). */
  warm?: number;
  /** Upstream resolvers of the DNS responder (default: /etc/resolv.conf). */
  upstreams?: DnsEndpoint[];
  /** Pin directory root (default /sys/fs/bpf/warren); the node pins under <root>/<nodeId>. */
  pinRoot?: string;
  objectPath: string;
  /** The tap programs for microVMs (default: tap_egress.bpf.o next to objectPath). */
  tapObjectPath?: string;
  log(line: string): void;
}

/** What a sandbox's record keeps so a restarted node can take its network over. */
export interface SandboxNetworkRuntime {
  lease: NetnsLease;
  cgroupId: string;
  services: Record<string, boolean>;
  owner: string;
  /** A microVM's tap in the namespace (its traffic judged by the tap programs, not by sockets). */
  tap?: SandboxTap;
}

/** What a VMM needs to put a guest NIC on a sandbox's tap, and what the guest configures. */
export interface SandboxTap {
  /** Interface in the sandbox's namespace, created owned by `owner` so an unprivileged VMM may open it. */
  name: string;
  /** The guest NIC's MAC: the uplink's, which the bridge knows for the sandbox's port. */
  mac: string;
  /** `address/prefix` and the gateway (also the resolver). */
  cidr: string;
  gateway: string;
}

/** Name of the tap in a microVM sandbox's namespace (each namespace is one sandbox's). */
const TAP_NAME = 'wtap0';

interface Binding {
  service: string;
  name: string;
  address: string;
  expiresNs: bigint;
}

interface Attached {
  id: string;
  owner: string;
  cgroupId: bigint;
  lease: NetnsLease;
  services: Record<string, boolean>;
  tap?: SandboxTap;
  /** address -> binding, for the services the sandbox has now. */
  bindings: Map<string, Binding>;
  denials: SandboxNetworkInfo['denials'];
  logged: { second: number; count: number; suppressed: number };
}

const DENIALS_KEPT = 50;
/** How often the host's addresses are re-read for the programs' deny trie. */
const DENY_REFRESH_MS = 2000;
const DENIAL_LOGS_PER_SECOND = 20;

export class NetworkManager {
  readonly host: HostNetwork;
  readonly pool: NetnsPool;
  readonly egress: EgressEnforcer;
  readonly dns: DnsResponder;
  /** What no DNS answer may open and what the programs deny node-wide (one set of rules for both). */
  readonly special: SpecialAddresses;
  private readonly byId = new Map<string, Attached>();
  private readonly byCgroup = new Map<bigint, Attached>();
  private readonly byAddress = new Map<string, Attached>();
  private timers: NodeJS.Timeout[] = [];
  private started = false;
  private readonly metrics = instruments();

  constructor(private readonly opts: NetworkOptions) {
    // one nftables table per bridge: two nodes on one host must not replace each other's rules
    const nftTable = opts.nftTable ?? (opts.bridge === undefined || opts.bridge === 'warren0' ? 'warren' : `warren_${opts.bridge.replace(/[^A-Za-z0-9_]/g, '_')}`);
    this.host = new HostNetwork({ bridge: opts.bridge, subnet: opts.subnet, nftTable, log: opts.log });
    this.pool = new NetnsPool({ host: this.host, prefix: `wn-${opts.nodeId}`.slice(0, 24), warm: opts.warm ?? 8, log: opts.log });
    // the tap programs (microVMs) are built next to the cgroup programs
    const tapObject = opts.tapObjectPath ?? join(dirname(opts.objectPath), 'tap_egress.bpf.o');
    this.egress = new EgressEnforcer({ native: opts.native, objectPath: opts.objectPath, ...(existsSync(tapObject) ? { tapObjectPath: tapObject } : {}), pinDir: join(opts.pinRoot ?? '/sys/fs/bpf/warren', opts.nodeId) });
    this.special = new SpecialAddresses({
      subnet: this.host.subnet,
      deniedRanges: () => this.opts.policy().deniedRanges,
      onChange: () => this.syncDenyRanges(),
    });
    this.dns = new DnsResponder({
      listen: [{ address: this.host.gatewayAddress, port: 53 }],
      upstreams: opts.upstreams,
      // a sandbox can ask for refused names in a loop: keep the log bounded
      log: rateLimited(opts.log, 50),
      refusal: (address) => this.special.nodeReason(address),
      clientFor: (source) => {
        const a = this.byAddress.get(source);
        if (a === undefined) return undefined;
        return {
          sandboxId: a.id,
          serviceFor: (name) => this.serviceFor(a, name),
          servicesOf: (name) => this.servicesOf(name),
          bind: (service, name, addrs) => this.bindAnswer(a, service, name, addrs),
          refused: (r) => this.recordDenial(a, { service: r.service, destination: r.address ?? r.name, proto: 'dns', hook: 'dns', reason: r.reason, detail: r.detail }),
        };
      },
    });
  }

  get gatewayAddress(): string {
    return this.host.gatewayAddress;
  }

  /** Bring up the bridge, NAT, pins, pool and resolver; `adopted` are sandboxes that survived a restart. */
  async start(adopted: SandboxNetworkRuntime[] = []): Promise<void> {
    await this.host.ensure();
    this.egress.open();
    try {
      this.special.refresh();
      this.syncDenyRanges();
      await this.pool.start(adopted.map((r) => r.lease));
      await this.dns.start(); // e.g. UNAVAILABLE when something else holds <gateway>:53
    } catch (err) {
      // nothing half-started stays behind (idle namespaces, open map fds); adopted sandboxes keep theirs
      await this.pool.close().catch(() => undefined);
      if (this.egress.pinnedSandboxes().length === 0) this.egress.unpinAll();
      else this.egress.close();
      throw err;
    }
    this.started = true;
    this.timers.push(setInterval(() => this.pollDenials(), 100).unref());
    this.timers.push(setInterval(() => this.egress.sweep(), 30_000).unref());
    // the host's addresses change (interfaces come and go): keep the programs' deny trie current
    this.timers.push(setInterval(() => this.special.refresh(), DENY_REFRESH_MS).unref());
  }

  /** Write the node-wide deny trie from the host's addresses, the subnet and the policy's denied ranges. */
  private syncDenyRanges(): void {
    try {
      this.egress.setDenyRanges(this.special.denyRanges());
    } catch (err) {
      this.opts.log(`network: updating the node's denied ranges failed: ${(err as Error).message}`);
    }
  }

  /**
   * The services a new sandbox gets: the request's map, or the account's default when the
   * request has none. Null: no network at all (loopback only). Throws on unknown services
   * (INVALID_ARGUMENT) and on services the account may not use (FORBIDDEN).
   */
  resolve(requested: Record<string, boolean> | undefined, owner: string): Record<string, boolean> | null {
    const account = this.accountNetwork(owner);
    if (requested === undefined) {
      const enabled = Object.entries(account.default).filter(([, on]) => on);
      if (enabled.length === 0 && account.rules.length === 0) return null;
      return Object.fromEntries(enabled);
    }
    this.check(requested, owner);
    return { ...requested };
  }

  /**
   * Lease a namespace and put the sandbox's allowlist on its cgroup; before anything runs in it.
   * With `tap` (a microVM), the namespace also gets a tap for the guest's NIC, and the same
   * allowlist is enforced on the tap's frames (the guest's traffic passes no host socket).
   */
  async setUp(id: string, owner: string, cgroupDir: string, services: Record<string, boolean>, tap?: { uid: number; gid: number }): Promise<SandboxNetworkRuntime> {
    this.assertStarted();
    if (tap !== undefined && this.egress.tapUnavailable !== null) throw new WarrenError('NOT_SUPPORTED', `microVM networking is not available on this node: ${this.egress.tapUnavailable}`, { field: 'network' });
    const lease = await this.pool.acquire();
    let a: Attached | null = null;
    try {
      a = { id, owner, cgroupId: 0n, lease, services: { ...services }, bindings: new Map(), denials: [], logged: { second: 0, count: 0, suppressed: 0 } };
      a.cgroupId = this.egress.attach(id, cgroupDir, this.compile(a));
      this.track(a);
      const rt = this.runtimeOf(a);
      if (tap !== undefined) {
        rt.tap = await this.makeTap(lease, tap);
        this.egress.attachTap(id, a.cgroupId, { netnsPath: lease.path, tap: rt.tap.name, uplink: 'eth0', address: lease.address, mac: rt.tap.mac });
        a.tap = rt.tap;
      }
      return rt;
    } catch (err) {
      if (a !== null) {
        this.untrack(a);
        this.egress.detach(id, a.cgroupId || null);
      }
      await this.pool.release(lease).catch(() => undefined);
      throw err;
    }
  }

  /** Whether microVMs can have network here (null) or why not. */
  tapRefusal(): string | null {
    return this.started ? this.egress.tapUnavailable : null;
  }

  private async makeTap(lease: NetnsLease, owner: { uid: number; gid: number }): Promise<SandboxTap> {
    const ip = async (args: string[]) => {
      const r = await runTool('ip', ['-n', lease.name, ...args], { timeoutMs: 10_000 });
      if (r.code !== 0) throw new WarrenError('NATIVE_ERROR', `ip ${args.join(' ')} in ${lease.name}: ${r.stderr.trim()}`);
      return r.stdout;
    };
    await ip(['tuntap', 'add', 'dev', TAP_NAME, 'mode', 'tap', 'user', String(owner.uid), 'group', String(owner.gid)]);
    await ip(['link', 'set', 'dev', TAP_NAME, 'up']);
    const links = JSON.parse(await ip(['-j', 'link', 'show', 'dev', 'eth0'])) as Array<{ address?: string }>;
    const mac = links[0]?.address;
    if (mac === undefined || !/^([0-9a-f]{2}:){5}[0-9a-f]{2}$/.test(mac)) throw new WarrenError('NATIVE_ERROR', `no MAC for eth0 in ${lease.name}`);
    return { name: TAP_NAME, mac, cidr: `${lease.address}/${this.host.prefixLength}`, gateway: this.host.gatewayAddress };
  }

  /** Take over a sandbox's network after a restart (its pins kept enforcing meanwhile). */
  adopt(id: string, cgroupDir: string, rt: SandboxNetworkRuntime): boolean {
    const cgroupId = this.egress.adopt(id, cgroupDir);
    if (cgroupId === null || String(cgroupId) !== rt.cgroupId) return false;
    const a: Attached = { id, owner: rt.owner, cgroupId, lease: rt.lease, services: { ...rt.services }, ...(rt.tap ? { tap: rt.tap } : {}), bindings: new Map(), denials: [], logged: { second: 0, count: 0, suppressed: 0 } };
    // DNS bindings live in the map: take them back (with their TTLs) for services still enabled
    const byId = new Map(Object.keys(this.catalog()).map((name) => [serviceId(name), name]));
    for (const b of this.egress.bindingsOf(cgroupId)) {
      const service = byId.get(b.serviceId);
      if (service === undefined || a.services[service] !== true || b.expiresNs === 0n) continue;
      a.bindings.set(b.address, { service, name: '(learned before a restart)', address: b.address, expiresNs: b.expiresNs });
    }
    this.track(a);
    // the catalog may have changed while no gateway ran: re-derive the allowlist from it
    this.egress.update(cgroupId, this.compile(a));
    return true;
  }

  /** Change a running sandbox's services (merge: true enables, false disables); atomic in the kernel. */
  async update(id: string, change: Record<string, boolean>): Promise<Record<string, boolean>> {
    const a = this.attached(id);
    this.check(change, a.owner);
    const services = { ...a.services, ...change };
    const next: Attached = { ...a, services, bindings: new Map(a.bindings) };
    for (const [addr, b] of a.bindings) if (services[b.service] !== true) next.bindings.delete(addr);
    const policy = this.compile(next);
    this.egress.update(a.cgroupId, policy);
    a.services = services;
    a.bindings = next.bindings;
    this.opts.log(`network: sandbox ${id} services now ${describeServices(services)}`);
    await this.abortRevoked(a, policy);
    return { ...services };
  }

  /** After a policy apply: recompute every sandbox's allowlist from the new catalog. */
  reapply(): void {
    if (this.started) this.syncDenyRanges();
    for (const a of this.byId.values()) {
      try {
        for (const [addr, b] of a.bindings) if (this.service(b.service) === undefined) a.bindings.delete(addr);
        const policy = this.compile(a);
        this.egress.update(a.cgroupId, policy);
        void this.abortRevoked(a, policy);
      } catch (err) {
        this.opts.log(`network: re-applying the policy to ${a.id} failed: ${(err as Error).message}`);
      }
    }
  }

  /**
   * Open TCP connections the new policy no longer allows are aborted (SOCK_DESTROY through
   * `ss -K` in the sandbox's namespace): the program gets ECONNABORTED at once instead of a
   * connection whose packets the skb program now drops. Best effort; failures are logged.
   */
  private async abortRevoked(a: Attached, policy: SandboxEgressPolicy): Promise<void> {
    const inNetns = (args: string[]) => runTool('ip', ['netns', 'exec', a.lease.name, 'ss', ...args], { timeoutMs: 5000 });
    try {
      const listed = await inNetns(['-tnH', 'state', 'established', 'state', 'syn-sent']);
      if (listed.code !== 0) throw new Error(listed.stderr.trim() || `ss exited ${listed.code}`);
      const revoked = new Set<string>();
      for (const line of listed.stdout.split('\n')) {
        // columns: [State] Recv-Q Send-Q Local:Port Peer:Port [Process]; the peer is the last address
        const endpoints = line.trim().split(/\s+/).filter((f) => /^\[?[0-9a-f.:]+\]?:\d+$/i.test(f));
        const m = endpoints.length < 2 ? null : /^\[?([0-9a-f.:]+?)\]?:(\d+)$/i.exec(endpoints[endpoints.length - 1]!);
        if (m && !policyAllows(policy, m[1]!.replace(/^::ffff:/i, ''), Number(m[2]), 'tcp', this.special)) revoked.add(`${m[1]}:${m[2]}`);
      }
      for (const dst of revoked) {
        const r = await inNetns(['-K', '-tn', 'dst', dst]);
        if (r.code !== 0) throw new Error(r.stderr.trim() || `ss -K exited ${r.code}`);
      }
      if (revoked.size > 0) this.opts.log(`network: sandbox ${a.id}: aborted connections to ${[...revoked].join(', ')} (no longer allowed)`);
    } catch (err) {
      this.opts.log(`network: sandbox ${a.id}: could not abort revoked connections: ${(err as Error).message}`);
    }
  }

  async tearDown(id: string, rt?: SandboxNetworkRuntime): Promise<void> {
    if (this.started) this.pollDenials(); // its last denials, while they can still be attributed
    const a = this.byId.get(id);
    const lease = a?.lease ?? rt?.lease;
    const cgroupId = a?.cgroupId ?? (rt ? BigInt(rt.cgroupId) : null);
    if (a) this.untrack(a);
    if (this.started) this.egress.detach(id, cgroupId);
    // the tap goes with its namespace; deleting it first does not wait for the namespace's teardown
    if (lease && (a?.tap ?? rt?.tap)) await runTool('ip', ['-n', lease.name, 'link', 'del', 'dev', TAP_NAME], { timeoutMs: 10_000 }).catch(() => undefined);
    if (lease) await this.pool.release(lease);
  }

  info(id: string): SandboxNetworkInfo {
    const a = this.attached(id);
    if (this.started) this.pollDenials();
    const now = process.hrtime.bigint();
    return {
      services: { ...a.services },
      address: a.lease.address,
      resolver: this.host.gatewayAddress,
      rules: this.accountNetwork(a.owner).rules.length,
      bindings: [...a.bindings.values()].map((b) => ({ service: b.service, name: b.name, address: b.address, expiresInS: Math.max(0, Number((b.expiresNs - now) / 1_000_000_000n)) })),
      denials: [...a.denials],
    };
  }

  has(id: string): boolean {
    return this.byId.has(id);
  }

  stats() {
    return { sandboxes: this.byId.size, pool: this.pool.stats(), dns: this.dns.stats() };
  }

  /** Stop serving; sandboxes keep their namespaces and their pinned enforcement. */
  async close(): Promise<void> {
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
    if (!this.started) return;
    this.started = false;
    this.pollDenials();
    await this.dns.close();
    await this.pool.close();
    this.egress.close();
  }

  /** Remove everything node-wide (bridge, NAT table, pins); only once no sandbox has network. */
  async teardownHost(): Promise<void> {
    await this.close();
    if (this.egress.pinnedSandboxes().length === 0) this.egress.unpinAll();
    await this.host.teardown();
  }

  // ---- policy ----------------------------------------------------------------------

  private catalog(): Record<string, Service> {
    return this.opts.policy().services;
  }

  /** The catalog's service `name`, if it has one (a name such as "constructor" is not one). */
  private service(name: string): Service | undefined {
    return ownValue(this.catalog(), name);
  }

  private accountNetwork(owner: string): AccountNetwork {
    const accounts = this.opts.policy().accounts;
    return ownValue(accounts.accounts, owner)?.network ?? accounts.defaultNetwork;
  }

  private check(services: Record<string, boolean>, owner: string): void {
    const catalog = this.catalog();
    const allow = this.accountNetwork(owner).allow;
    for (const [name, on] of Object.entries(services)) {
      if (typeof on !== 'boolean') throw new WarrenError('INVALID_ARGUMENT', `network.${name} must be true or false`, { field: `network.${name}` });
      if (this.service(name) === undefined) {
        throw new WarrenError('INVALID_ARGUMENT', `network.${name}: no service "${name}" in the services catalog (known: ${Object.keys(catalog).sort().join(', ')})`, { field: `network.${name}` });
      }
      if (on && allow !== null && !allow.includes(name)) {
        throw new WarrenError('FORBIDDEN', `network.${name}: this account may not enable "${name}" (accounts.yaml allows: ${allow.join(', ') || 'nothing'})`, { field: `network.${name}` });
      }
    }
  }

  private compile(a: Attached): SandboxEgressPolicy {
    const ranges: EgressRange[] = [];
    for (const [name, on] of Object.entries(a.services)) {
      const s = this.service(name);
      if (!on || s === undefined) continue;
      for (const cidr of s.cidrs) ranges.push({ cidr, ports: s.ports, proto: s.protocol, serviceId: serviceId(name) });
    }
    for (const r of this.accountNetwork(a.owner).rules) ranges.push({ cidr: r.cidr, ports: r.ports, proto: r.protocol, serviceId: EGRESS_SERVICE_RULE });
    const bindings: EgressBinding[] = [];
    for (const b of a.bindings.values()) {
      const s = this.service(b.service);
      if (s) bindings.push({ address: b.address, ports: s.ports, proto: s.protocol, serviceId: serviceId(b.service), expiresNs: b.expiresNs });
    }
    return { resolverV4: this.host.gatewayAddress, ranges, bindings };
  }

  private serviceFor(a: Attached, name: string): string | undefined {
    for (const [svc, on] of Object.entries(a.services)) {
      if (!on) continue;
      const s = this.service(svc);
      if (s && s.hosts.some((h) => hostMatches(h, name))) return svc;
    }
    return undefined;
  }

  /** Every catalog service whose hosts match a name, enabled or not. */
  private servicesOf(name: string): string[] {
    return Object.values(this.catalog())
      .filter((s) => s.hosts.some((h) => hostMatches(h, name)))
      .map((s) => s.name);
  }

  private bindAnswer(a: Attached, service: string, name: string, addrs: DnsAnswerAddress[]): void {
    if (!this.byId.has(a.id) || a.services[service] !== true) throw new WarrenError('FORBIDDEN', `${service} is no longer enabled for ${a.id}`);
    const s = this.catalog()[service];
    if (s === undefined) throw new WarrenError('FORBIDDEN', `no service ${service}`);
    const now = process.hrtime.bigint();
    const bindings: EgressBinding[] = [];
    for (const addr of addrs) {
      const expiresNs = now + BigInt(addr.ttl) * 1_000_000_000n;
      const prev = a.bindings.get(addr.address);
      a.bindings.set(addr.address, { service, name, address: addr.address, expiresNs: prev && prev.expiresNs > expiresNs ? prev.expiresNs : expiresNs });
      bindings.push({ address: addr.address, ports: s.ports, proto: s.protocol, serviceId: serviceId(service), expiresNs });
    }
    this.egress.bind(a.cgroupId, bindings);
    this.metrics.dnsAnswers.add(bindings.length, { service });
  }

  // ---- denials -------------------------------------------------------------------------

  private pollDenials(): void {
    let denials: EgressDenial[];
    try {
      denials = this.egress.drainDenials();
    } catch (err) {
      this.opts.log(`network: reading denials failed: ${(err as Error).message}`);
      return;
    }
    for (const d of denials) {
      const a = this.byCgroup.get(d.cgroupId);
      const service = this.serviceOf(d.address);
      const proto = d.proto === 6 ? 'tcp' : d.proto === 17 ? 'udp' : d.proto === 1 ? 'icmp' : `proto-${d.proto}`;
      const destination = d.address.includes(':') ? `[${d.address}]:${d.port}` : `${d.address}:${d.port}`;
      const entry = { service, destination, proto, hook: d.hook, reason: d.reason };
      if (a) this.recordDenial(a, entry, d.pid);
      else {
        this.metrics.egressDenials.add(1, { service, hook: d.hook, proto, reason: d.reason });
        this.opts.log(`egress denied: sandbox=cgroup-${d.cgroupId} service=${service} dest=${destination}/${proto} hook=${d.hook} reason=${d.reason} pid=${d.pid}`);
      }
    }
  }

  /** One denial of a sandbox (from the programs, or an answer the DNS responder would not open): kept, counted, logged (rate-limited). */
  private recordDenial(a: Attached, d: { service: string; destination: string; proto: string; hook: string; reason: string; detail?: string }, pid?: number): void {
    this.metrics.egressDenials.add(1, { service: d.service, hook: d.hook, proto: d.proto, reason: d.reason });
    a.denials.push({ at: new Date().toISOString(), service: d.service, destination: d.destination, proto: d.proto, hook: d.hook, reason: d.reason });
    if (a.denials.length > DENIALS_KEPT) a.denials.shift();
    if (!this.rateOk(a)) return;
    const dest = d.hook === 'dns' ? `dest=${d.destination}` : `dest=${d.destination}/${d.proto}`;
    this.opts.log(`egress denied: sandbox=${a.id} service=${d.service} ${dest} hook=${d.hook} reason=${d.reason}${d.detail ? ` (${d.detail})` : ''}${pid !== undefined ? ` pid=${pid}` : ''}`);
  }

  private rateOk(a: Attached): boolean {
    const second = Math.floor(Date.now() / 1000);
    if (a.logged.second !== second) {
      if (a.logged.suppressed > 0) this.opts.log(`egress denied: sandbox=${a.id}: ${a.logged.suppressed} more denials not logged`);
      a.logged = { second, count: 0, suppressed: 0 };
    }
    if (a.logged.count >= DENIAL_LOGS_PER_SECOND) {
      a.logged.suppressed++;
      return false;
    }
    a.logged.count++;
    return true;
  }

  /** Which service an address belongs to, as far as this node knows (DNS answers, catalog CIDRs). */
  private serviceOf(address: string): string {
    for (const a of this.byId.values()) {
      const b = a.bindings.get(address);
      if (b) return b.service;
    }
    for (const s of Object.values(this.catalog())) if (s.cidrs.some((c) => cidrContains(c, address))) return s.name;
    return 'unknown';
  }

  // ---- bookkeeping -----------------------------------------------------------------------

  private track(a: Attached): void {
    this.byId.set(a.id, a);
    this.byCgroup.set(a.cgroupId, a);
    this.byAddress.set(a.lease.address, a);
  }

  private untrack(a: Attached): void {
    this.byId.delete(a.id);
    this.byCgroup.delete(a.cgroupId);
    if (this.byAddress.get(a.lease.address) === a) this.byAddress.delete(a.lease.address);
  }

  private attached(id: string): Attached {
    const a = this.byId.get(id);
    if (a === undefined) throw new WarrenError('NOT_SUPPORTED', `sandbox ${id} has no network (it was created without \`network\`; create it with "network": {} to change services later)`);
    return a;
  }

  private runtimeOf(a: Attached): SandboxNetworkRuntime {
    return { lease: a.lease, cgroupId: String(a.cgroupId), services: { ...a.services }, owner: a.owner, ...(a.tap ? { tap: { ...a.tap } } : {}) };
  }

  private assertStarted(): void {
    if (!this.started) throw new WarrenError('NOT_SUPPORTED', 'networking is not running on this node');
  }
}

/** At most `perSecond` lines a second; the rest are counted and summarized. */
function rateLimited(log: (line: string) => void, perSecond: number): (line: string) => void {
  let second = 0;
  let count = 0;
  let dropped = 0;
  return (line) => {
    const now = Math.floor(Date.now() / 1000);
    if (now !== second) {
      if (dropped > 0) log(`dns: ${dropped} more log lines not shown`);
      second = now;
      count = 0;
      dropped = 0;
    }
    if (count++ < perSecond) log(line);
    else dropped++;
  };
}

/** The decision the programs make for a destination (expiry ignored, like the skb backstop). */
export function policyAllows(policy: SandboxEgressPolicy, address: string, port: number, proto: 'tcp' | 'udp', special?: SpecialAddresses): boolean {
  if (address.startsWith('127.') || address === '::1') return true;
  if (policy.resolverV4 !== null && address === policy.resolverV4 && port === 53) return true;
  if (specialReason(address) !== undefined) return false;
  const portOk = (ports: number[]) => ports.length === 0 || ports.includes(port);
  const inRanges = () => policy.ranges.some((r) => r.proto === proto && portOk(r.ports) && cidrContains(r.cidr, address));
  const denied: RefusalReason | undefined = special?.nodeReason(address);
  if (denied !== undefined) return denied === 'operator' && inRanges();
  if (policy.bindings.some((b) => b.address === address && b.proto === proto && portOk(b.ports))) return true;
  return inRanges();
}

export function hostMatches(pattern: string, name: string): boolean {
  if (pattern.startsWith('*.')) return name.endsWith(pattern.slice(1)) && name.length > pattern.length - 1;
  return pattern === name;
}

/** A stable small id per service name, carried in map entries (0 and 65535 are reserved). */
export function serviceId(name: string): number {
  let h = 5381;
  for (let i = 0; i < name.length; i++) h = ((h * 33) ^ name.charCodeAt(i)) >>> 0;
  const id = h % 65533;
  return id + 1 === EGRESS_SERVICE_NONE ? 1 : id + 1;
}

function cidrContains(cidr: string, address: string): boolean {
  try {
    const { bytes, prefix } = parseCidr(cidr);
    const a = parseCidr(address).bytes;
    for (let bit = 0; bit < prefix; bit++) if ((bytes[bit >> 3]! ^ a[bit >> 3]!) & (0x80 >> (bit & 7))) return false;
    return true;
  } catch {
    return false;
  }
}

function describeServices(s: Record<string, boolean>): string {
  const on = Object.entries(s).filter(([, v]) => v).map(([k]) => k);
  return on.length ? on.join(', ') : '(none)';
}
