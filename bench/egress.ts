/**
 * npm run bench:egress — the cost of per-service egress allowlists, side by side in one run.
 *
 *  1. connect() overhead of the eBPF programs on the allowed path. bench/connect-loop.c (built
 *     here with cc -O2) runs socket() + connect() + close() in a loop, moving itself every 1000
 *     connects between a cgroup2 group with the programs attached (EgressEnforcer, as a sandbox
 *     gets them) and a sibling group with nothing attached, so both sides are measured
 *     milliseconds apart under the same host load; several rounds, one process each.
 *     Destinations are test addresses on lo (10.251.250.x/32: the programs only treat 127/8 as
 *     loopback, so these take the full path with map lookups), allowed by a DNS-style exact
 *     binding (hash map) or by a CIDR range (the LPM trie, after two hash misses); a denied
 *     destination (EPERM) is shown for information. UDP connect() sends nothing, so it
 *     isolates the connect4 hook; TCP adds the cgroup_skb egress backstop on the SYN, ACK and
 *     RST. Target: at most 5 µs added per connect (median).
 *
 *     Also timed: EgressEnforcer.attach and detach alone, what each networked create and
 *     delete pay for the programs.
 *
 *  2. create → first exec of `true` on a real node (ShimNode with a bridge, netns pool and the
 *     programs), c=1: no `network` (loopback only) vs `network: {}` (pooled netns + eBPF attach,
 *     everything denied) vs `network: {pypi: true}`, taking every order of the three in turn
 *     (a networked delete leaves the kernel destroying a namespace in the background, which
 *     slows the next create, whatever it is). The pool is back at its warm size before every
 *     create; a second node with warm: 0 shows a pool miss against loopback-only creates
 *     interleaved on that node.
 *
 *  3. DNS lookup latency of a victim sandbox through the node's resolver, with and without a
 *     hostile neighbour flooding it (UDP at full speed from two threads, 150 TCP connections
 *     kept alive by a byte trickle, pipelined queries over others: test/helpers/dns-flood.ts),
 *     on the same node in the same run, quiet and flooded rounds alternating. The victim
 *     resolves one name of its service with getaddrinfo(), one lookup after another; the
 *     upstream is a test zone on 127.0.0.1.
 *
 * Needs root. Conditions first; tables at the end (markdown, for the README); JSON goes to
 * bench/results/egress.json. Everything it creates on the host is removed and checked for.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { bpfObject, native } from '../src/native';
import { EgressEnforcer, type SandboxEgressPolicy } from '../src/shim/network/egress';
import { SpecialAddresses } from '../src/shim/network/special-addr';
import type { NetworkConfig, ShimNode } from '../src/shim/node';
import { openTestShim, spec } from '../test/helpers/warren';
import { startDnsZone } from '../test/helpers/dns-zone';
import { HOSTILE_DNS_SCRIPT, VICTIM_DNS_SCRIPT } from '../test/helpers/dns-flood';
import { BUNDLED_POLICY_DIR, PolicyStore, policyStore, usePolicyStore } from '../src/security/confinement';
import { conditions, percentile, printTable } from './stats';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 5);
const CONNECTS = Number(process.env.BENCH_CONNECTS ?? 20_000);
const CREATES = Number(process.env.BENCH_CREATES ?? 42); // 7 × each of the 6 orders of the 3 modes
const POOL_MISS_CREATES = Number(process.env.BENCH_POOL_MISS ?? 10); // pairs: loopback only + pool miss
const ATTACHES = Number(process.env.BENCH_ATTACHES ?? 50);
const DNS_ROUNDS = Number(process.env.BENCH_DNS_ROUNDS ?? 4); // quiet + flooded each
const DNS_LOOKUPS = Number(process.env.BENCH_DNS_LOOKUPS ?? 200); // per round
const TARGET_ADDED_US = 5;

// Outside the 10.251.10-209.x of test/integration/network-egress.test.ts, which may run meanwhile.
const TEST_NET = '10.251.250';
const EXACT_HOST = `${TEST_NET}.1`;
const DENIED_HOST = `${TEST_NET}.2`;
const RESOLVER = `${TEST_NET}.3`;
const RANGE = `${TEST_NET}.128/25`;
const RANGE_HOST = `${TEST_NET}.130`;
const LO_ADDRESSES = [EXACT_HOST, DENIED_HOST, RANGE_HOST];

const PIN_ROOT = '/sys/fs/bpf/warren-bench';
/** The default operator list but 10.0.0.0/8, which holds the test addresses. */
const BENCH_DENIED_RANGES = ['172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', 'fc00::/7'];
const NODE_ID = 'wbench';
const NETWORK: NetworkConfig = { bridge: 'wbench0', subnet: '10.199.0.0/24', nftTable: 'wbench', warm: 8, pinRoot: PIN_ROOT, upstreams: [{ address: '127.0.0.1', port: 53 }] };

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const median = (xs: number[]) => percentile(xs, 50);
const us = (ns: number) => (ns / 1000).toFixed(2);
const ms = (x: number) => x.toFixed(1);
const signed = (x: number, digits: number) => `${x >= 0 ? '+' : ''}${x.toFixed(digits)}`;

// ---------------------------------------------------------------- 1. connect() overhead

interface ConnectCase {
  label: string;
  proto: 'tcp' | 'udp';
  host: string;
  /** Denied in the filtered group: for information, not held to the target. */
  denied: boolean;
  /** Both sides in the unfiltered group: the noise floor of the comparison. */
  control?: boolean;
}

const CONNECT_CASES: ConnectCase[] = [
  { label: 'TCP, exact binding (hash)', proto: 'tcp', host: EXACT_HOST, denied: false },
  { label: 'TCP, CIDR range (LPM)', proto: 'tcp', host: RANGE_HOST, denied: false },
  { label: 'UDP, exact binding (hash)', proto: 'udp', host: EXACT_HOST, denied: false },
  { label: 'UDP, CIDR range (LPM)', proto: 'udp', host: RANGE_HOST, denied: false },
  { label: 'TCP, denied (EPERM)', proto: 'tcp', host: DENIED_HOST, denied: true },
  { label: 'UDP, denied (EPERM)', proto: 'udp', host: DENIED_HOST, denied: true },
  { label: 'UDP, control: unfiltered vs unfiltered', proto: 'udp', host: EXACT_HOST, denied: false, control: true },
];

interface LoopResult {
  count: number;
  p50_ns: number;
  p99_ns: number;
  mean_ns: number;
}

type Group = 'filtered' | 'unfiltered';

function buildConnectLoop(workDir: string): string {
  const source = join(__dirname, '..', '..', 'bench', 'connect-loop.c');
  const binary = join(workDir, 'connect-loop');
  execFileSync('cc', ['-O2', '-Wall', '-o', binary, source]);
  return binary;
}

/** Run the loop to its end; it prints one JSON line. */
function runConnectLoop(binary: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`connect-loop ${args.join(' ')} exited ${code}: ${err.trim()}`))));
  });
}

/** The TCP listener, in the bench's own cgroup: its SYN-ACKs pass no egress program in either group. */
function startListener(binary: string): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(binary, ['listen', '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d) => {
      out += d;
      const m = /listening (\d+)/.exec(out);
      if (m) resolve({ child, port: Number(m[1]) });
    });
    child.once('exit', (code) => reject(new Error(`listener exited ${code}`)));
  });
}

function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

function loAddresses(): string[] {
  return execFileSync('ip', ['-o', '-4', 'addr', 'show', 'dev', 'lo'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => /inet ([\d.]+)\//.exec(l)?.[1])
    .filter((a): a is string => a !== undefined);
}

/** The programs in effect for a cgroup (attached to it or inherited), from bpftool. */
function effectivePrograms(cgroupDir: string): string[] {
  try {
    const out = JSON.parse(execFileSync('bpftool', ['-j', 'cgroup', 'show', cgroupDir, 'effective'], { encoding: 'utf8' }).trim() || '[]');
    return (out as Array<{ attach_type: string; name: string }>).map((p) => `${p.attach_type}:${p.name}`);
  } catch {
    return ['(bpftool unavailable)'];
  }
}

async function measureConnectOverhead(cgroupRoot: string, pinDir: string) {
  const workDir = mkdtempSync(join(os.tmpdir(), 'warren-bench-egress-'));
  const groups: Record<Group, string> = { filtered: join(cgroupRoot, 'filtered'), unfiltered: join(cgroupRoot, 'unfiltered') };
  const taken = loAddresses().filter((a) => LO_ADDRESSES.includes(a));
  if (taken.length > 0) throw new Error(`${taken.join(', ')} already on lo: another bench:egress running, or a leftover`);
  const enforcer = new EgressEnforcer({ native, objectPath: bpfObject('sandbox_egress'), pinDir });
  const added: string[] = [];
  let listener: ChildProcess | null = null;
  let cgroupId: bigint | null = null;
  try {
    const binary = buildConnectLoop(workDir);
    for (const dir of Object.values(groups)) mkdirSync(dir, { recursive: true });
    for (const ip of LO_ADDRESSES) {
      execFileSync('ip', ['addr', 'add', `${ip}/32`, 'dev', 'lo']);
      added.push(ip);
    }
    const started = await startListener(binary);
    listener = started.child;
    const port = started.port;

    // What a sandbox with one resolved service and one CIDR service gets: a DNS answer bound
    // with a TTL (so the expiry check runs too) and a range, each for TCP and UDP.
    const expiresNs = process.hrtime.bigint() + 3_600_000_000_000n;
    const policy: SandboxEgressPolicy = {
      resolverV4: RESOLVER,
      bindings: (['tcp', 'udp'] as const).map((proto) => ({ address: EXACT_HOST, ports: [port], proto, serviceId: 1, expiresNs })),
      ranges: (['tcp', 'udp'] as const).map((proto) => ({ cidr: RANGE, ports: [port], proto, serviceId: 2 })),
    };
    enforcer.open();
    // the node-wide deny trie as a node fills it (its own addresses, a subnet, operator ranges):
    // every allowed connect looks its destination up there first
    // (but the bench's destinations, which it put on lo itself)
    const hostAddresses = () => Object.values(os.networkInterfaces()).flatMap((l) => (l ?? []).map((i) => i.address)).filter((a) => !LO_ADDRESSES.includes(a));
    const deny = new SpecialAddresses({ subnet: NETWORK.subnet!, deniedRanges: () => BENCH_DENIED_RANGES, nodeAddresses: hostAddresses }).denyRanges();
    enforcer.setDenyRanges(deny);
    console.log(`- deny trie: ${deny.length} entries (the host's addresses, ${NETWORK.subnet}, ${BENCH_DENIED_RANGES.join(', ')})`);
    cgroupId = enforcer.attach('bench-connect', groups.filtered, policy);
    const programs = { filtered: effectivePrograms(groups.filtered), unfiltered: effectivePrograms(groups.unfiltered) };
    console.log(`- filtered group: ${groups.filtered} (effective programs: ${programs.filtered.join(', ') || 'none'})`);
    console.log(`- unfiltered group: ${groups.unfiltered} (effective programs: ${programs.unfiltered.join(', ') || 'none'})`);
    console.log(`- listener: 0.0.0.0:${port} in the bench's own cgroup; per round, case and group ${CONNECTS} timed connects (+10% untimed warm-up) in batches of 1000 alternating between the groups`);

    const results = new Map<ConnectCase, Record<Group, LoopResult[]>>(CONNECT_CASES.map((c) => [c, { filtered: [], unfiltered: [] }]));
    let denialEvents = 0;
    for (let round = 0; round < ROUNDS; round++) {
      for (const c of CONNECT_CASES) {
        const args = ['compare', c.control ? groups.unfiltered : groups.filtered, groups.unfiltered, c.proto, c.host, String(port), String(CONNECTS), c.denied ? 'eperm' : 'ok'];
        const out = JSON.parse(await runConnectLoop(binary, args)) as Record<Group, LoopResult>;
        for (const group of ['filtered', 'unfiltered'] as const) results.get(c)![group].push(out[group]);
        if (c.denied) denialEvents += enforcer.drainDenials().filter((d) => d.cgroupId === cgroupId).length;
      }
      process.stderr.write(`connect: round ${round + 1}/${ROUNDS} done\n`);
    }

    // What each networked sandbox's create and delete pay for the programs: 5 pinned links + entries, and back.
    const attachMs: number[] = [];
    const detachMs: number[] = [];
    for (let i = 0; i < ATTACHES; i++) {
      const sandboxId = `bench-attach-${i}`;
      const dir = join(cgroupRoot, sandboxId);
      mkdirSync(dir);
      try {
        const t0 = performance.now();
        const id = enforcer.attach(sandboxId, dir, policy);
        const t1 = performance.now();
        enforcer.detach(sandboxId, id);
        attachMs.push(t1 - t0);
        detachMs.push(performance.now() - t1);
      } finally {
        rmdirSync(dir);
      }
    }
    const timingRow = (what: string, xs: number[]) => ({ 'per sandbox': what, n: String(xs.length), 'p50 ms': percentile(xs, 50).toFixed(2), 'p99 ms': percentile(xs, 99).toFixed(2) });
    const attachRows = [
      timingRow('EgressEnforcer.attach: 5 pinned links, policy, 2 bindings, 2 ranges', attachMs),
      timingRow('EgressEnforcer.detach: unpin links, delete entries, sweep the maps', detachMs),
    ];

    const rows: Array<Record<string, string>> = [];
    const json: Record<string, unknown> = {};
    for (const [c, r] of results) {
      const base = median(r.unfiltered.map((x) => x.p50_ns));
      const filtered = median(r.filtered.map((x) => x.p50_ns));
      const addedNs = filtered - base;
      const roundDiffs = r.filtered.map((x, i) => (x.p50_ns - r.unfiltered[i]!.p50_ns) / 1000);
      rows.push({
        'socket+connect+close': c.label,
        'unfiltered p50 µs': us(base),
        'filtered p50 µs': us(filtered),
        'added p50 µs': signed(addedNs / 1000, 2),
        'added per round µs (min…max)': `${signed(Math.min(...roundDiffs), 2)}…${signed(Math.max(...roundDiffs), 2)}`,
        'unfiltered p99 µs': us(median(r.unfiltered.map((x) => x.p99_ns))),
        'filtered p99 µs': us(median(r.filtered.map((x) => x.p99_ns))),
        ratio: `${(filtered / base).toFixed(2)}×`,
        [`target ≤${TARGET_ADDED_US} µs`]: c.control ? 'n/a (noise floor)' : c.denied ? 'n/a (denied)' : addedNs / 1000 <= TARGET_ADDED_US ? 'PASS' : 'FAIL',
      });
      json[c.label] = { unfilteredP50Ns: base, filteredP50Ns: filtered, addedP50Ns: addedNs, rounds: r };
    }
    const notes = [`denied connects reported on the ring buffer and read: ${denialEvents} (it holds 256 KiB; while full, further denials are not reported)`];
    return { rows, attachRows, notes, json: { programs, port, connectsPerRound: CONNECTS, rounds: ROUNDS, denialEventsRead: denialEvents, cases: json, attachMs, detachMs } };
  } finally {
    if (cgroupId !== null) enforcer.detach('bench-connect', cgroupId);
    enforcer.close();
    if (existsSync(pinDir)) enforcer.unpinAll();
    if (listener) await stopProcess(listener);
    for (const ip of added) execFileSync('ip', ['addr', 'del', `${ip}/32`, 'dev', 'lo']);
    for (const dir of [...Object.values(groups), cgroupRoot]) if (existsSync(dir)) rmdirSync(dir);
    await rm(workDir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- 2. create latency

interface CreateMode {
  label: string;
  network: Record<string, boolean> | undefined;
}

const CREATE_MODES: CreateMode[] = [
  { label: 'no network (loopback only)', network: undefined },
  { label: 'network: {} (netns + eBPF, all denied)', network: {} },
  { label: 'network: {pypi: true}', network: { pypi: true } },
];

/**
 * Every order of the modes in turn: each mode follows each other mode equally often. Order
 * matters: deleting a sandbox with network destroys its namespace, and the kernel finishes
 * that asynchronously (cleanup_net), slowing whatever create comes next.
 */
const CREATE_ORDERS: CreateMode[][] = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]].map((order) => order.map((m) => CREATE_MODES[m]!));

interface CreateSample {
  firstExecMs: number;
  deleteMs: number;
}

/** Until the node's netns pool is back at its warm size with nothing being created. */
async function waitForWarmPool(shim: ShimNode, warm: number): Promise<void> {
  const deadline = Date.now() + 30_000;
  for (;;) {
    const s = shim.network!.pool.stats();
    if (s.idle >= warm && s.creating === 0) return;
    if (Date.now() > deadline) throw new Error(`netns pool did not refill to ${warm} within 30 s: ${JSON.stringify(s)}`);
    await sleep(5);
  }
}

async function createFirstExec(shim: ShimNode, mode: CreateMode): Promise<CreateSample> {
  const t0 = performance.now();
  const sb = await shim.createSandbox(spec({ owner: 'bench', ...(mode.network ? { network: mode.network } : {}) }));
  const r = await shim.exec(sb.id, { cmd: ['true'] });
  const firstExecMs = performance.now() - t0;
  const t1 = performance.now();
  await shim.deleteSandbox(sb.id);
  const deleteMs = performance.now() - t1;
  if (r.exitCode !== 0) throw new Error(`exec in ${sb.id} (${mode.label}) failed: ${JSON.stringify(r)}`);
  return { firstExecMs, deleteMs };
}

/** The node's log, printed only when the bench fails. */
const nodeLogLines: string[] = [];
function nodeLog(line: string): void {
  nodeLogLines.push(`${new Date().toISOString()} ${line}`);
  if (nodeLogLines.length > 200) nodeLogLines.shift();
}

async function closeNode(shim: ShimNode): Promise<void> {
  for (const s of shim.listSandboxes()) await shim.deleteSandbox(s.id).catch((e) => console.error(`delete ${s.id}: ${e}`));
  await shim.network?.teardownHost();
  await shim.close();
  shim.layers.unmountUnused();
}

/**
 * Create → first exec for each mode, `iterations` times, taking the orders in turn; before each
 * create the node's pool is back at `warm`. Two untimed creates per mode first.
 */
async function sampleCreates(shim: ShimNode, warm: number, orders: CreateMode[][], iterations: number): Promise<Map<CreateMode, CreateSample[]>> {
  const samples = new Map<CreateMode, CreateSample[]>();
  for (const mode of orders[0]!) {
    samples.set(mode, []);
    for (let i = 0; i < 2; i++) await createFirstExec(shim, mode); // layer mount, page cache, JIT
  }
  for (let i = 0; i < iterations; i++) {
    for (const mode of orders[i % orders.length]!) {
      await waitForWarmPool(shim, warm);
      samples.get(mode)!.push(await createFirstExec(shim, mode));
    }
    if ((i + 1) % 10 === 0) process.stderr.write(`create (pool warm ${warm}): ${i + 1}/${iterations} done\n`);
  }
  return samples;
}

async function measureCreateLatency(dataDir: string) {
  const warmNode = (await openTestShim({ dataDir, nodeId: NODE_ID, network: NETWORK, log: nodeLog })).shim;
  let warmSamples: Map<CreateMode, CreateSample[]>;
  try {
    warmSamples = await sampleCreates(warmNode, NETWORK.warm!, CREATE_ORDERS, CREATES);
  } finally {
    await closeNode(warmNode);
  }

  // Pool miss: on a node with warm: 0 every create makes its namespace (one `ip -batch` process)
  // itself. Interleaved with loopback-only creates on the same node, for a baseline of its own.
  const [loopbackOnly, denyAll] = [CREATE_MODES[0]!, CREATE_MODES[1]!];
  const coldNode = (await openTestShim({ dataDir, nodeId: NODE_ID, network: { ...NETWORK, warm: 0 }, log: nodeLog })).shim;
  let missSamples: Map<CreateMode, CreateSample[]>;
  try {
    missSamples = await sampleCreates(coldNode, 0, [[loopbackOnly, denyAll], [denyAll, loopbackOnly]], POOL_MISS_CREATES);
  } finally {
    await closeNode(coldNode);
  }

  const rows: Array<Record<string, string>> = [];
  const json: Record<string, unknown> = {};
  const addRows = (samples: Map<CreateMode, CreateSample[]>, pool: (m: CreateMode) => string) => {
    const baseP50 = percentile(samples.get(loopbackOnly)!.map((s) => s.firstExecMs), 50);
    for (const [mode, xs] of samples) {
      const firstExec = xs.map((s) => s.firstExecMs);
      const p50 = percentile(firstExec, 50);
      rows.push({
        'create → first exec (c=1)': mode.label,
        'netns pool': pool(mode),
        n: String(xs.length),
        'p50 ms': ms(p50),
        'p99 ms': ms(percentile(firstExec, 99)),
        'added p50 ms': signed(p50 - baseP50, 1),
        'ratio p50': `${(p50 / baseP50).toFixed(2)}×`,
        'delete p50 ms': ms(percentile(xs.map((s) => s.deleteMs), 50)),
      });
      json[`${mode.label} [${pool(mode)}]`] = { firstExecMs: firstExec, deleteMs: xs.map((s) => s.deleteMs) };
    }
  };
  addRows(warmSamples, (m) => (m.network ? `hit (warm ${NETWORK.warm})` : `- (warm ${NETWORK.warm} node)`));
  addRows(missSamples, (m) => (m.network ? 'miss (warm 0)' : '- (warm 0 node)'));
  return { rows, json };
}

// ---------------------------------------------------------------- 3. DNS under a hostile neighbour

async function measureDnsStarvation(dataDir: string) {
  const zone = await startDnsZone({ records: { 'victim.bench.test': [{ type: 'A', value: '198.51.100.7', ttl: 300 }] } });
  const policyDir = mkdtempSync(join(os.tmpdir(), 'warren-bench-dnspolicy-'));
  const previous = policyStore();
  let node: ShimNode | null = null;
  try {
    execFileSync('cp', ['-r', `${BUNDLED_POLICY_DIR}/.`, policyDir]);
    writeFileSync(join(policyDir, 'services.yaml'), 'version: 1\nservices:\n  bench:\n    hosts: [victim.bench.test]\n    ports: [443]\n...\n');
    usePolicyStore(new PolicyStore(policyDir, join(policyDir, 'audit.log')));
    node = (await openTestShim({ dataDir, nodeId: NODE_ID, network: { ...NETWORK, warm: 2, upstreams: [{ address: zone.address, port: zone.port }] }, log: nodeLog })).shim;
    await node.functions.ensureJudgeImage(); // python3 for the resolver clients
    const victim = await node.createSandbox(spec({ owner: 'bench', image: 'judge', memoryMb: 512, network: { bench: true } }));
    const hostile = await node.createSandbox(spec({ owner: 'bench', image: 'judge', memoryMb: 512, network: {} }));
    const gw = node.network!.gatewayAddress;
    const lookups = async (): Promise<number[]> => {
      const r = await node!.exec(victim.id, { cmd: ['python3', '-c', VICTIM_DNS_SCRIPT, gw, 'victim.bench.test', String(DNS_LOOKUPS)], timeoutMs: 300_000 });
      if (r.exitCode !== 0) throw new Error(`victim lookups failed: ${r.stderr}`);
      const v = JSON.parse(r.stdout.trim().split('\n').pop()!) as { lat: number[]; fails: number; tcp: string };
      if (v.fails > 0 || v.tcp !== 'ok') throw new Error(`victim: ${v.fails} failed lookups, TCP ${v.tcp}`);
      return v.lat;
    };
    await lookups(); // warm-up: python, the resolver path
    const quiet: number[] = [];
    const flooded: number[] = [];
    const responder: Array<{ queries: number; dropped: number; tcpClosed: number; seconds: number }> = [];
    for (let round = 0; round < DNS_ROUNDS; round++) {
      quiet.push(...(await lookups()));
      const flood = await node.execStream(hostile.id, { cmd: ['python3', '-c', HOSTILE_DNS_SCRIPT, gw, '600'] });
      let out = '';
      flood.stdout.on('data', (d: Buffer) => (out += d));
      const deadline = Date.now() + 30_000;
      while (!out.includes('flooding') && Date.now() < deadline) await sleep(20);
      await sleep(1000); // the TCP connections it may hold are held
      const before = node.network!.dns.stats();
      const t0 = performance.now();
      flooded.push(...(await lookups()));
      const after = node.network!.dns.stats();
      responder.push({ queries: after.queries - before.queries, dropped: after.dropped - before.dropped, tcpClosed: after.tcpClosed - before.tcpClosed, seconds: (performance.now() - t0) / 1000 });
      flood.kill(9);
      await flood.exited;
      process.stderr.write(`dns: round ${round + 1}/${DNS_ROUNDS} done\n`);
    }
    await node.deleteSandbox(victim.id);
    await node.deleteSandbox(hostile.id);
    const row = (label: string, xs: number[]) => ({
      'victim getaddrinfo()': label,
      n: String(xs.length),
      'p50 ms': percentile(xs, 50).toFixed(2),
      'p99 ms': percentile(xs, 99).toFixed(2),
      'max ms': Math.max(...xs).toFixed(1),
      'p50 ratio': `${(percentile(xs, 50) / percentile(quiet, 50)).toFixed(2)}×`,
      'p99 ratio': `${(percentile(xs, 99) / percentile(quiet, 99)).toFixed(2)}×`,
    });
    const seconds = responder.reduce((a, r) => a + r.seconds, 0);
    const notes = [
      `while flooded the responder answered ${(responder.reduce((a, r) => a + r.queries, 0) / seconds).toFixed(0)} queries/s in all (the hostile sandbox's UDP is held to its nftables budget before the socket), dropped ${responder.reduce((a, r) => a + r.dropped, 0)} at the hostile sandbox's queue, and closed ${responder.reduce((a, r) => a + r.tcpClosed, 0)} of its TCP connections`,
    ];
    return { rows: [row('quiet neighbour', quiet), row('hostile neighbour flooding', flooded)], notes, json: { quietMs: quiet, floodedMs: flooded, responder } };
  } finally {
    if (node) await closeNode(node);
    usePolicyStore(previous);
    await zone.close();
    await rm(policyDir, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------- leftovers

/** Everything this bench may have created on the host, and whether any of it is still there. */
function leftovers(cgroupRoot: string, dataDir: string): Array<Record<string, string>> {
  const run = (cmd: string, args: string[]) => {
    try {
      execFileSync(cmd, args, { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  };
  const netns = existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => n.startsWith(`wn-${NODE_ID}`)) : [];
  const sandboxCgroups = Object.values(native.cgroupLayout().roots).flatMap((root) =>
    root && existsSync(root) ? readdirSync(root).filter((d) => d.startsWith(`${NODE_ID}-`)).map((d) => join(root, d)) : [],
  );
  const checks: Array<[string, string[]]> = [
    [`netns /run/netns/wn-${NODE_ID}-*`, netns],
    [`bridge ${NETWORK.bridge}`, existsSync(`/sys/class/net/${NETWORK.bridge}`) ? [NETWORK.bridge!] : []],
    [`nft table inet ${NETWORK.nftTable}`, run('nft', ['list', 'table', 'inet', NETWORK.nftTable!]) ? [NETWORK.nftTable!] : []],
    [`pins ${PIN_ROOT}`, existsSync(PIN_ROOT) ? [PIN_ROOT] : []],
    ['cgroups (connect groups, sandboxes)', [...(existsSync(cgroupRoot) ? [cgroupRoot] : []), ...sandboxCgroups]],
    [`addresses on lo (${TEST_NET}.x)`, loAddresses().filter((a) => a.startsWith(`${TEST_NET}.`))],
    ['mounts under the data dir', readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(dataDir))],
    ['data dir', existsSync(dataDir) ? [dataDir] : []],
  ];
  return checks.map(([what, found]) => ({ 'left behind': what, found: found.length === 0 ? 'none' : found.join(' ') }));
}

// ---------------------------------------------------------------- main

async function main(): Promise<void> {
  if (process.getuid?.() !== 0) throw new Error('bench:egress needs root (cgroups, eBPF, netns)');
  const unifiedRoot = native.cgroupLayout().roots.unified;
  if (unifiedRoot === undefined) throw new Error('no cgroup2 hierarchy: the egress programs attach there');
  const cgroupRoot = join(dirname(unifiedRoot), `warren-bench-egress-${process.pid}`);
  const pinDir = join(PIN_ROOT, `connect-${process.pid}`);
  const dataDir = mkdtempSync(join(os.tmpdir(), 'warren-bench-egress-node-'));

  const cond: Record<string, string> = {
    ...conditions(),
    cores: String(os.cpus().length),
    'cgroup2 hierarchy': dirname(unifiedRoot),
    'egress object': bpfObject('sandbox_egress'),
    connects: `${ROUNDS} rounds × ${CONNECTS} per case and group, alternating filtered/unfiltered every 1000`,
    dns: `${DNS_ROUNDS} rounds × ${DNS_LOOKUPS} sequential getaddrinfo() per condition, flood: 2 UDP threads + 150 slow-loris + 2 pipelining TCP threads`,
    creates: `${CREATES} per mode (c=1, busybox, interleaved in every order of the modes) + ${POOL_MISS_CREATES} pool misses`,
    network: JSON.stringify(NETWORK),
  };
  console.log('# egress allowlist cost');
  for (const [k, v] of Object.entries(cond)) console.log(`- ${k}: ${v}`);

  const results: Record<string, unknown> = {};
  let connectRows: Array<Record<string, string>> = [];
  let attachRows: Array<Record<string, string>> = [];
  let connectNotes: string[] = [];
  let createRows: Array<Record<string, string>> = [];
  let dnsRows: Array<Record<string, string>> = [];
  let dnsNotes: string[] = [];
  let failed = false;
  try {
    const connect = await measureConnectOverhead(cgroupRoot, pinDir);
    connectRows = connect.rows;
    attachRows = connect.attachRows;
    connectNotes = connect.notes;
    results.connect = connect.json;
    const create = await measureCreateLatency(dataDir);
    createRows = create.rows;
    results.create = create.json;
    const dns = await measureDnsStarvation(dataDir);
    dnsRows = dns.rows;
    dnsNotes = dns.notes;
    results.dns = dns.json;
  } finally {
    await rm(dataDir, { recursive: true, force: true });
    const left = leftovers(cgroupRoot, dataDir);
    failed = left.some((r) => r.found !== 'none');
    console.log('\n# cleanup check');
    printTable(left);
    results.leftovers = left;
  }

  console.log(`\n# connect() with the egress programs vs an unfiltered cgroup (median of ${ROUNDS} per-round medians, ${CONNECTS} connects each; target: ≤${TARGET_ADDED_US} µs added on allowed connects)`);
  printTable(connectRows);
  for (const note of connectNotes) console.log(`- ${note}`);
  console.log('\n# the programs on and off a sandbox cgroup (part of create and delete with network)');
  printTable(attachRows);
  console.log('\n# create → first exec of `true`, network off vs on (c=1, interleaved; pool back at warm before each create)');
  printTable(createRows);
  console.log(`\n# DNS lookups of a victim sandbox, quiet vs a hostile neighbour flooding the resolver (${DNS_ROUNDS} alternating rounds × ${DNS_LOOKUPS} lookups)`);
  printTable(dnsRows);
  for (const note of dnsNotes) console.log(`- ${note}`);

  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'egress.json'), JSON.stringify({ conditions: cond, results }, (_k, v) => (typeof v === 'bigint' ? String(v) : v), 2));
  if (failed) throw new Error('bench:egress left something behind (see the cleanup check)');
}

main().then(
  () => process.exit(0),
  (err) => {
    if (nodeLogLines.length > 0) console.error(`# node log (last ${nodeLogLines.length} lines)\n${nodeLogLines.join('\n')}`);
    console.error(err);
    process.exit(1);
  },
);
