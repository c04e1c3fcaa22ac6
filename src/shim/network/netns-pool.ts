/**
 * A warm pool of named network namespaces (bind mounts under /run/netns), each
 * with a veth pair: the host end on the HostNetwork bridge, the other end
 * `eth0` inside with an address from the subnet and a default route via the
 * gateway. A sandbox's init joins one with setns() on `path`.
 *
 * One namespace costs one spawned process: a single `ip -batch -` creates the
 * namespace and the veth pair, and its `netns exec` child (already inside the
 * namespace) writes the IPv6 sysctls with shell builtins and pipes the in-netns
 * configuration into `ip -batch -`. Node cannot write another namespace's
 * /proc/sys (that needs a thread inside it, and setns() is not available to JS
 * threads), and `ip` has no sysctl command, so some process must run inside;
 * this way it is a fork of the one we already pay for rather than another spawn.
 *
 * Addresses are allocated in memory; one pool per HostNetwork (subnet). Entries
 * are never reused: release() destroys the namespace.
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { WarrenError } from '../../errors';
import { type HostNetwork, runTool } from './host-net';

export interface NetnsLease {
  name: string;
  path: string;
  address: string;
  hostVeth: string;
}

export interface NetnsPoolOptions {
  host: HostNetwork;
  /** Unique per node; every namespace this pool creates is named `${prefix}-<n>`. */
  prefix: string;
  /** Target number of idle namespaces. */
  warm: number;
  /** How many namespaces the background refill creates at once. Default 2. */
  refillParallelism?: number;
  log?(line: string): void;
}

export interface NetnsPoolStats {
  idle: number;
  leased: number;
  creating: number;
}

export const NETNS_DIR = '/run/netns';
const PREFIX_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,47}$/;
const VETH_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$/;
const REFILL_RETRY_MIN_MS = 500;
const REFILL_RETRY_MAX_MS = 30_000;

/**
 * The host end's name, derived from the namespace name (unique per machine, as
 * prefixes are unique per node): 'wv' + 13 hex digits of its SHA-256, 15 characters.
 * Deterministic so a namespace can be cleaned up knowing only its name.
 */
export function hostVethName(netnsName: string): string {
  return 'wv' + createHash('sha256').update(netnsName).digest('hex').slice(0, 13);
}

interface Entry extends NetnsLease {
  addressIndex: number;
}

type PoolState = 'new' | 'running' | 'closed';

export class NetnsPool {
  private readonly host: HostNetwork;
  private readonly prefix: string;
  private readonly warm: number;
  private readonly refillParallelism: number;
  private readonly log: (line: string) => void;
  private readonly namePattern: RegExp;

  private state: PoolState = 'new';
  private readonly idle: Entry[] = [];
  private readonly leased = new Map<string, Entry>();
  /** Address indexes held by idle, leased, creating and not-yet-destroyed entries. */
  private readonly addressesInUse = new Set<number>();
  private readonly releasing = new Map<string, Promise<void>>();
  private readonly inFlight = new Set<Promise<unknown>>();
  private creating = 0;
  private refillCreating = 0;
  private nextSerial = 0;
  private addressCursor = 0;
  private refillRetryMs = REFILL_RETRY_MIN_MS;
  private refillRetryTimer: NodeJS.Timeout | null = null;

  constructor(opts: NetnsPoolOptions) {
    this.host = opts.host;
    this.prefix = opts.prefix;
    this.warm = opts.warm;
    this.refillParallelism = opts.refillParallelism ?? 2;
    this.log = opts.log ?? (() => undefined);
    if (typeof this.prefix !== 'string' || !PREFIX_PATTERN.test(this.prefix)) {
      throw new WarrenError(
        'INVALID_ARGUMENT',
        `netns prefix ${JSON.stringify(this.prefix)} is invalid: 1 to 48 characters from [A-Za-z0-9_.-], starting with a letter or digit`,
        { field: 'prefix' },
      );
    }
    if (!Number.isInteger(this.warm) || this.warm < 0 || this.warm > 1024) {
      throw new WarrenError('INVALID_ARGUMENT', `warm pool size must be an integer between 0 and 1024, not ${this.warm}`, { field: 'warm' });
    }
    if (!Number.isInteger(this.refillParallelism) || this.refillParallelism < 1 || this.refillParallelism > 64) {
      throw new WarrenError('INVALID_ARGUMENT', `refillParallelism must be an integer between 1 and 64`, { field: 'refillParallelism' });
    }
    this.namePattern = new RegExp(`^${this.prefix.replace(/[.]/g, '\\.')}-(0|[1-9][0-9]{0,9})$`);
  }

  /**
   * Adopts `leased` (in use by sandboxes that survived a restart: kept, their
   * addresses never handed out), deletes every other namespace with this
   * prefix, then fills the pool in the background.
   */
  async start(leased: NetnsLease[] = []): Promise<void> {
    if (this.state !== 'new') throw new WarrenError('INTERNAL', `netns pool ${this.prefix} was already started`);
    try {
      for (const lease of leased) this.adopt(lease);
      const stale: Array<{ name: string; hostVeth: string }> = [];
      for (const name of existsSync(NETNS_DIR) ? readdirSync(NETNS_DIR) : []) {
        const serial = this.serialOf(name);
        if (serial === null) continue;
        this.nextSerial = Math.max(this.nextSerial, serial + 1);
        if (!this.leased.has(name)) stale.push({ name, hostVeth: hostVethName(name) });
      }
      if (stale.length > 0) {
        this.log(`deleting ${stale.length} stale netns: ${stale.map((s) => s.name).join(' ')}`);
        await this.destroy(stale);
      }
    } catch (err) {
      // Left as new, so start() can be called again.
      this.leased.clear();
      this.addressesInUse.clear();
      throw err;
    }
    this.state = 'running';
    this.refill();
  }

  private adopt(lease: NetnsLease): void {
    const serial = this.serialOf(lease.name);
    if (serial === null) {
      throw new WarrenError('INVALID_ARGUMENT', `leased netns ${JSON.stringify(lease.name)} is not named ${this.prefix}-<n>`, { name: lease.name });
    }
    const addressIndex = this.host.sandboxAddressIndex(lease.address);
    if (addressIndex < 0) {
      throw new WarrenError('INVALID_ARGUMENT', `leased netns ${lease.name} has address ${lease.address}, not a sandbox address of ${this.host.subnet}`, {
        name: lease.name,
      });
    }
    if (this.leased.has(lease.name) || this.addressesInUse.has(addressIndex)) {
      throw new WarrenError('INVALID_ARGUMENT', `leased netns ${lease.name} (${lease.address}) is listed twice or shares its address`, { name: lease.name });
    }
    if (typeof lease.hostVeth !== 'string' || !VETH_NAME.test(lease.hostVeth)) {
      throw new WarrenError('INVALID_ARGUMENT', `leased netns ${lease.name} has an invalid host veth name`, { name: lease.name });
    }
    if (!existsSync(`${NETNS_DIR}/${lease.name}`)) {
      this.log(`leased netns ${lease.name} does not exist any more; its address stays reserved until release`);
    }
    this.leased.set(lease.name, { name: lease.name, path: `${NETNS_DIR}/${lease.name}`, address: lease.address, hostVeth: lease.hostVeth, addressIndex });
    this.addressesInUse.add(addressIndex);
    this.nextSerial = Math.max(this.nextSerial, serial + 1);
  }

  /** An idle namespace when there is one (no process spawned), else a new one. */
  async acquire(): Promise<NetnsLease> {
    this.assertRunning();
    const entry = this.idle.shift() ?? (await this.track(this.createForAcquire()));
    this.leased.set(entry.name, entry);
    // Spawning is synchronous; do it after the caller has its lease.
    setImmediate(() => this.refill());
    return toLease(entry);
  }

  /** Destroys a namespace of this pool (leased, idle or left over); it is never handed out again. Idempotent. */
  release(lease: NetnsLease | string): Promise<void> {
    const name = typeof lease === 'string' ? lease : lease?.name;
    if (typeof name !== 'string' || this.serialOf(name) === null) {
      return Promise.reject(new WarrenError('INVALID_ARGUMENT', `${JSON.stringify(name)} is not a netns of pool ${this.prefix}`, { name }));
    }
    const pending = this.releasing.get(name);
    if (pending !== undefined) return pending;

    let entry: Entry | undefined = this.leased.get(name);
    const idleAt = entry === undefined ? this.idle.findIndex((e) => e.name === name) : -1;
    if (idleAt >= 0) entry = this.idle.splice(idleAt, 1)[0];
    this.leased.delete(name);
    let hostVeth = entry?.hostVeth ?? hostVethName(name);
    if (entry === undefined && typeof lease !== 'string' && typeof lease.hostVeth === 'string' && VETH_NAME.test(lease.hostVeth)) {
      hostVeth = lease.hostVeth;
    }
    const done = this.destroy([{ name, hostVeth }])
      .then(
        () => {
          // Only once the namespace is gone may its address go to another one.
          if (entry !== undefined) this.addressesInUse.delete(entry.addressIndex);
        },
        (err: unknown) => {
          // Still there: keep it leased (address reserved) so that a retry can finish the job.
          if (entry !== undefined) this.leased.set(name, entry);
          throw err;
        },
      )
      .finally(() => this.releasing.delete(name));
    this.releasing.set(name, done);
    if (idleAt >= 0) this.refill();
    return done;
  }

  stats(): NetnsPoolStats {
    return { idle: this.idle.length, leased: this.leased.size, creating: this.creating };
  }

  /** Leases handed out (or adopted) and not released, e.g. to persist across a restart. */
  leases(): NetnsLease[] {
    return [...this.leased.values()].map(toLease);
  }

  /** Stops refilling and destroys idle namespaces; leased ones are left to their sandboxes. */
  async close(): Promise<void> {
    if (this.state === 'closed') return;
    this.state = 'closed';
    if (this.refillRetryTimer !== null) clearTimeout(this.refillRetryTimer);
    this.refillRetryTimer = null;
    // In-flight creations notice the state and destroy what they made.
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
    const idle = this.idle.splice(0);
    await this.destroyEntries(idle);
    await Promise.allSettled([...this.releasing.values()]);
  }

  private refill(): void {
    if (this.state !== 'running' || this.refillRetryTimer !== null) return;
    while (this.idle.length + this.refillCreating < this.warm && this.refillCreating < this.refillParallelism) {
      this.refillCreating++;
      const job = this.create()
        .then(
          async (entry) => {
            if (this.state !== 'running') {
              await this.destroyEntries([entry]);
              return;
            }
            this.idle.push(entry);
            this.refillRetryMs = REFILL_RETRY_MIN_MS;
          },
          (err: unknown) => {
            if (this.state !== 'running') return;
            this.log(`netns pool ${this.prefix}: refill failed, retrying in ${this.refillRetryMs} ms: ${err instanceof Error ? err.message : String(err)}`);
            if (this.refillRetryTimer === null) {
              this.refillRetryTimer = setTimeout(() => {
                this.refillRetryTimer = null;
                this.refill();
              }, this.refillRetryMs);
              this.refillRetryTimer.unref();
              this.refillRetryMs = Math.min(this.refillRetryMs * 2, REFILL_RETRY_MAX_MS);
            }
          },
        )
        .catch((err: unknown) => this.log(`netns pool ${this.prefix}: ${err instanceof Error ? err.message : String(err)}`))
        .finally(() => {
          this.refillCreating--;
          this.refill();
        });
      void this.track(job);
    }
  }

  private async createForAcquire(): Promise<Entry> {
    const created = await this.create();
    if (this.state === 'running') return created;
    await this.destroyEntries([created]);
    throw new WarrenError('UNAVAILABLE', `netns pool ${this.prefix} was closed`);
  }

  private async create(): Promise<Entry> {
    const addressIndex = this.allocateAddress();
    const name = `${this.prefix}-${this.nextSerial++}`;
    const entry: Entry = {
      name,
      path: `${NETNS_DIR}/${name}`,
      address: this.host.sandboxAddressAt(addressIndex),
      hostVeth: hostVethName(name),
      addressIndex,
    };
    const { bridge, gatewayAddress, prefixLength } = this.host;
    const insideCommands = [
      'link set dev lo up',
      `address add ${entry.address}/${prefixLength} dev eth0`,
      'link set dev eth0 up',
      `route add default via ${gatewayAddress} dev eth0`,
      '',
    ].join('\n');
    // IPv6 goes off before any interface inside is up, so no link-local address ever exists
    // (a kernel booted with ipv6.disable=1 has no such sysctls, and nothing to turn off).
    const insideScript = [
      '{ [ ! -d /proc/sys/net/ipv6 ] || { echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6 && echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6; }; }',
      'printf %s "$WARREN_NETNS_COMMANDS" | ip -batch -',
    ].join(' && ');
    const hostCommands = [
      `netns add ${name}`,
      `link add ${entry.hostVeth} master ${bridge} up type veth peer name eth0 netns ${name}`,
      // Ports of one bridge cannot reach each other at L2; the gateway (the bridge itself) stays reachable.
      `link set dev ${entry.hostVeth} type bridge_slave isolated on`,
      `netns exec ${name} /bin/sh -c '${insideScript}'`,
      '',
    ].join('\n');

    this.creating++;
    try {
      const result = await runTool('ip', ['-batch', '-'], { input: hostCommands, env: { WARREN_NETNS_COMMANDS: insideCommands } });
      if (result.code === 0) return entry;
      // `ip -batch` stops at the first failing line: roll back only what the lines before it created,
      // never a namespace or interface that was there already (and so is not ours).
      const failedLine = Number(/Command failed -:(\d+)/.exec(result.stderr)?.[1] ?? 0);
      const rollback = failedLine === 1 ? null : failedLine === 2 ? { name, hostVeth: '' } : entry;
      const rolledBack =
        rollback === null ||
        (await this.destroy([rollback]).then(
          () => true,
          (cleanupErr: unknown) => {
            this.log(`rolling back netns ${name} failed (address ${entry.address} stays reserved): ${String(cleanupErr)}`);
            return false;
          },
        ));
      if (rolledBack) this.addressesInUse.delete(addressIndex);
      const how = result.signal !== null ? `was killed by ${result.signal}` : `exited with status ${result.code}`;
      throw new WarrenError('INTERNAL', `creating netns ${name} failed: ip ${how}: ${result.stderr.trim()}`, {
        name,
        exitCode: result.code,
        stderr: result.stderr.trim(),
      });
    } finally {
      this.creating--;
    }
  }

  private allocateAddress(): number {
    const count = this.host.sandboxAddressCount;
    if (this.addressesInUse.size >= count) {
      throw new WarrenError('RESOURCE_EXHAUSTED', `no free address left in ${this.host.subnet} (${count} sandbox addresses in use)`);
    }
    // Round robin, so a just-released address is not reused while neighbours may still cache its MAC.
    for (let step = 0; step < count; step++) {
      const index = (this.addressCursor + step) % count;
      if (!this.addressesInUse.has(index)) {
        this.addressesInUse.add(index);
        this.addressCursor = (index + 1) % count;
        return index;
      }
    }
    throw new WarrenError('RESOURCE_EXHAUSTED', `no free address left in ${this.host.subnet}`);
  }

  private async destroyEntries(entries: Entry[]): Promise<void> {
    if (entries.length === 0) return;
    try {
      await this.destroy(entries);
      for (const e of entries) this.addressesInUse.delete(e.addressIndex);
    } catch (err) {
      this.log(`netns pool ${this.prefix}: ${err instanceof Error ? err.message : String(err)}`);
      throw err;
    }
  }

  /** Deletes host veths and namespaces in one `ip` process; succeeds when none of them exists afterwards. */
  private async destroy(targets: ReadonlyArray<{ name: string; hostVeth: string }>): Promise<void> {
    const commands: string[] = [];
    for (const { name, hostVeth } of targets) {
      // Deleting one end removes both; deleting it explicitly avoids waiting for the kernel's asynchronous netns cleanup.
      if (hostVeth !== '' && existsSync(`/sys/class/net/${hostVeth}`)) commands.push(`link delete dev ${hostVeth}`);
      if (existsSync(`${NETNS_DIR}/${name}`)) commands.push(`netns delete ${name}`);
    }
    if (commands.length === 0) return;
    const result = await runTool('ip', ['-force', '-batch', '-'], { input: commands.join('\n') + '\n' });
    const left = targets.flatMap(({ name, hostVeth }) => [
      ...(hostVeth !== '' && existsSync(`/sys/class/net/${hostVeth}`) ? [`veth ${hostVeth}`] : []),
      ...(existsSync(`${NETNS_DIR}/${name}`) ? [`netns ${name}`] : []),
    ]);
    if (left.length > 0) {
      throw new WarrenError('INTERNAL', `could not delete ${left.join(', ')}: ${result.stderr.trim()}`, { left, stderr: result.stderr.trim() });
    }
  }

  private serialOf(name: string): number | null {
    const match = this.namePattern.exec(name);
    return match ? Number(match[1]) : null;
  }

  private assertRunning(): void {
    if (this.state === 'new') throw new WarrenError('INTERNAL', `netns pool ${this.prefix} is not started`);
    if (this.state === 'closed') throw new WarrenError('UNAVAILABLE', `netns pool ${this.prefix} is closed`);
  }

  private track<T>(promise: Promise<T>): Promise<T> {
    this.inFlight.add(promise);
    void promise.then(
      () => this.inFlight.delete(promise),
      () => this.inFlight.delete(promise),
    );
    return promise;
  }
}

function toLease(entry: Entry): NetnsLease {
  return { name: entry.name, path: entry.path, address: entry.address, hostVeth: entry.hostVeth };
}
