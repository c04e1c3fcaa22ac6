/**
 * npm run bench:soak: create/delete cycles mixed with execs, shell sessions, pauses and kill -9
 * of the gateway at random points, against a real `warren up` in a child process, ending with
 * exact leak counts: sandbox processes, cgroups, mounts, network namespaces, veths, pinned BPF
 * links, and the gateway's descriptors and RSS.
 *
 * SOAK_CYCLES (10000), SOAK_CONCURRENCY (4), SOAK_KILLS (cycles / 1000, at least 1),
 * SOAK_NETWORK (1: every third sandbox has network, on a bridge of the soak's own),
 * SOAK_SEED (random). The suite runs it at a reduced size (test/integration/soak.test.ts).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { WarrenClient, type Sandbox } from '../src/sdk';
import { buildBusyboxRootfs } from '../test/helpers/images';
import { HostNetwork } from '../src/shim/network/host-net';
import { removeTree } from '../src/shim/layers/sys';
import { skipReason } from '../src/features';
import { conditions, printTable } from './stats';

const CLI = resolve(__dirname, '../src/cli/main.js');
const CGROUP_ROOTS = ['/sys/fs/cgroup/memory/warren', '/sys/fs/cgroup/pids/warren', '/sys/fs/cgroup/cpu/warren', '/sys/fs/cgroup/freezer/warren', '/sys/fs/cgroup/warren', '/sys/fs/cgroup/unified/warren'];

export interface SoakOptions {
  cycles: number;
  concurrency: number;
  kills: number;
  network: boolean;
  seed: number;
  log?: (line: string) => void;
}

/** What is left on the host, for the soak's own node only. */
export interface Leftovers {
  sandboxes: number;
  processes: number;
  cgroups: number;
  mounts: number;
  netns: number;
  veths: number;
  bpfLinks: number;
}

export interface SoakReport {
  cycles: number;
  completed: number;
  kills: number;
  /** Operations that failed because the gateway was killed under them (expected, retried or reconciled). */
  interrupted: number;
  /** Operations that failed for any other reason (a soak with any of these has found a bug). */
  errors: string[];
  seconds: number;
  /** After everything was deleted, with the gateway still running: what the idle node holds. */
  idle: Leftovers;
  /** The same at the start, once the node had warmed up (warm netns pool, layer mounts). */
  baseline: Leftovers;
  gatewayFds: { start: number; peak: number; end: number };
  gatewayRssMiB: { start: number; peak: number; end: number };
  /** Descriptors the final gateway process held per live sandbox at its busiest. */
  fdsPerSandbox: number;
  /** After the gateway's clean stop: sandbox processes, cgroups, mounts and links must all be 0 (the warm netns pool may stay for the next start). */
  afterStop: Leftovers;
}

interface Gateway {
  child: ChildProcess;
  url: string;
  client: WarrenClient;
}

/** A small deterministic PRNG, so a failing soak can be replayed with its seed. */
function rng(seed: number): () => number {
  let s = seed >>> 0 || 1;
  return () => {
    s ^= s << 13;
    s >>>= 0;
    s ^= s >>> 17;
    s ^= s << 5;
    s >>>= 0;
    return s / 2 ** 32;
  };
}

/** Socket inodes of TCP connections accepted on `port` (clients' connections, not the gateway's own state). */
function clientSocketInodes(port: number): Set<string> {
  const inodes = new Set<string>();
  const hexPort = port.toString(16).toUpperCase().padStart(4, '0');
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(table, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/);
      // local address, state (0A = LISTEN), inode
      if (f.length > 9 && f[1]!.endsWith(`:${hexPort}`) && f[3] !== '0A') inodes.add(f[9]!);
    }
  }
  return inodes;
}

/**
 * The gateway's descriptors, not counting connections its clients hold open: those come and go
 * with the SDK's keep-alive pool, and a leak count must be exact.
 */
function fdCount(pid: number, url: string): number {
  try {
    const clients = clientSocketInodes(Number(new URL(url).port));
    let n = 0;
    for (const fd of readdirSync(`/proc/${pid}/fd`)) {
      let target = '';
      try {
        target = readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        continue;
      }
      const m = /^socket:\[(\d+)\]$/.exec(target);
      if (m && clients.has(m[1]!)) continue;
      n++;
    }
    return n;
  } catch {
    return 0;
  }
}

/** The descriptor count once it stops moving (work that just ended lets go of its descriptors), within 5 s. */
async function settledFdCount(pid: number, url: string): Promise<number> {
  const deadline = Date.now() + 5000;
  let last = fdCount(pid, url);
  while (Date.now() < deadline) {
    await new Promise((r) => setTimeout(r, 200));
    const now = fdCount(pid, url);
    if (now === last) return now;
    last = now;
  }
  return last;
}

function rssMiB(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : 0;
  } catch {
    return 0;
  }
}

function isTransient(err: unknown): boolean {
  const e = err as { code?: string; message?: string; cause?: { code?: string } };
  const text = `${e?.code ?? ''} ${e?.cause?.code ?? ''} ${e?.message ?? ''}`;
  return /ECONNREFUSED|ECONNRESET|EPIPE|socket hang up|other side closed|UND_ERR|closed before|ended|terminated|fetch failed|WebSocket|UNAVAILABLE/i.test(text);
}

export async function runSoak(opts: SoakOptions): Promise<SoakReport> {
  const log = opts.log ?? (() => undefined);
  const random = rng(opts.seed);
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-soak-'));
  const rootfs = mkdtempSync(join(tmpdir(), 'warren-soak-rootfs-'));
  const tag = `${process.pid % 10000}`;
  const nodeId = `soak${tag}`;
  const net = opts.network ? { bridge: `wsk${tag}`, subnet: `10.250.${process.pid % 250}.0/24`, nftTable: `wsk${tag}` } : null;
  const netArgs = net ? ['--bridge', net.bridge, '--subnet', net.subnet, '--nft-table', net.nftTable, '--dns-upstream', '127.0.0.1:9', '--netns-warm', '2'] : ['--no-network'];
  const pinDir = `/sys/fs/bpf/warren/${nodeId}`;
  // the node id is new to this run's fresh data dir; pins under it are an older run's
  rmSync(pinDir, { recursive: true, force: true });

  const leftovers = async (client: WarrenClient | null): Promise<Leftovers> => {
    let cgroups = 0;
    for (const root of CGROUP_ROOTS) if (existsSync(root)) cgroups += readdirSync(root).filter((d) => d.startsWith(`${nodeId}-`)).length;
    let processes = 0;
    for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
      try {
        if (/^\d+ \(.*\) Z /.test(readFileSync(`/proc/${pid}/stat`, 'utf8'))) continue;
        if (readFileSync(`/proc/${pid}/cgroup`, 'utf8').includes(`/warren/${nodeId}-`)) processes++;
      } catch {
        /* gone meanwhile */
      }
    }
    const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .filter((l) => l.includes(`${dataDir}/sandboxes`) || l.includes(`${nodeId}-`)).length;
    const netns = existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => n.startsWith(`wn-${nodeId}`)).length : 0;
    const veths = net && existsSync(`/sys/class/net/${net.bridge}/brif`) ? readdirSync(`/sys/class/net/${net.bridge}/brif`).length : 0;
    const bpfLinks = existsSync(join(pinDir, 'links')) ? readdirSync(join(pinDir, 'links')).length : 0;
    const sandboxes = client ? (await client.listSandboxes({ labels: { soak: tag } })).length : 0;
    return { sandboxes, processes, cgroups, mounts, netns, veths, bpfLinks };
  };

  const start = (): Promise<Gateway> =>
    new Promise((resolveGw, reject) => {
      const child = spawn(process.execPath, [CLI, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-default-image', '--node-id', nodeId, ...netArgs], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      const timer = setTimeout(() => reject(new Error(`warren up did not start: ${out}`)), 60_000);
      const onData = (c: Buffer) => {
        out += c.toString();
        const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
        if (m) {
          clearTimeout(timer);
          child.stdout!.off('data', onData);
          child.stderr!.off('data', onData);
          child.stdout!.resume();
          child.stderr!.resume();
          const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
          resolveGw({ child, url: m[1]!, client: new WarrenClient({ url: m[1]!, token }) });
        }
      };
      child.stdout!.on('data', onData);
      child.stderr!.on('data', onData);
      child.once('exit', (code) => reject(new Error(`warren up exited ${code}: ${out}`)));
    });
  const exited = (child: ChildProcess) => new Promise<void>((r) => (child.exitCode !== null || child.signalCode !== null ? r() : child.once('exit', () => r())));

  const t0 = performance.now();
  const errors: string[] = [];
  let interrupted = 0;
  let completed = 0;
  let gw: Gateway | null = null;
  try {
    await buildBusyboxRootfs(rootfs);
    gw = await start();
    await gw.client.images.import('soak', rootfs);
    // Warm up before a baseline: the layer is mounted, the netns pool filled, and the descriptor a
    // gateway opens on its first create (the mount template, one per backend: docs/density.md)
    // exists. A restarted gateway is warmed up the same way before its descriptors are counted
    // again; counted before its first create, it showed one descriptor more at the end.
    const warmUp = async (client: WarrenClient) => {
      const warm = await client.createSandbox({ image: 'soak', memoryMb: 64, labels: { soak: tag } });
      await warm.exec(['true']);
      await warm.delete();
    };
    await warmUp(gw.client);
    const baseline = await settle(() => leftovers(gw!.client), null);
    let fdStart = await settledFdCount(gw.child.pid!, gw.url);
    const fds = { start: fdStart, peak: fdStart, end: 0 };
    const rss = { start: rssMiB(gw.child.pid!), peak: 0, end: 0 };
    let fdsPerSandbox = 0;

    // kill -9 at these cycle numbers; operations in flight then fail and are reconciled below
    const killAt = new Set(Array.from({ length: opts.kills }, () => 1 + Math.floor(random() * Math.max(1, opts.cycles - 1))));
    let gate: Promise<void> = Promise.resolve();
    let next = 0;
    const alive = new Set<string>();
    const orphans = new Set<string>();

    const cycle = async (i: number): Promise<void> => {
      const client = gw!.client;
      let sb: Sandbox | null = null;
      try {
        const withNet = net !== null && i % 3 === 0;
        sb = await client.createSandbox({ image: 'soak', memoryMb: 64, labels: { soak: tag }, ...(withNet ? { network: { pypi: true } } : {}) });
        alive.add(sb.id);
        const r = await sb.exec(['sh', '-c', 'echo $((6*7)); ls /proc | wc -l']);
        if (r.exitCode !== 0 || !r.stdout.startsWith('42\n')) errors.push(`cycle ${i}: exec gave ${JSON.stringify(r).slice(0, 200)}`);
        const roll = random();
        if (roll < 0.25) {
          const shell = await sb.shell({ mode: 'command' });
          const out = await shell.run('cd /tmp && X=7 && echo $X');
          if (out.exitCode !== 0 || out.stdout !== '7\n') errors.push(`cycle ${i}: shell gave ${JSON.stringify(out).slice(0, 200)}`);
          await shell.close();
        } else if (roll < 0.4) {
          await sb.exec(['sh', '-c', '(sleep 60 &) ; head -c 4000000 /dev/zero > /tmp/f']);
          await sb.pause();
          const after = await sb.exec(['sh', '-c', 'wc -c < /tmp/f']);
          if (after.stdout.trim() !== '4000000') errors.push(`cycle ${i}: after resume ${JSON.stringify(after).slice(0, 200)}`);
        }
        await sb.delete();
        alive.delete(sb.id);
        completed++;
      } catch (err) {
        if (isTransient(err) || gw === null || gw.child.exitCode !== null || gw.child.signalCode !== null) {
          interrupted++;
          if (sb) orphans.add(sb.id);
        } else {
          errors.push(`cycle ${i}: ${(err as Error).message}`);
          if (sb) orphans.add(sb.id);
        }
      } finally {
        if (sb) alive.delete(sb.id);
      }
    };

    const worker = async (): Promise<void> => {
      for (;;) {
        await gate;
        const i = next++;
        if (i >= opts.cycles) return;
        if (killAt.has(i)) {
          killAt.delete(i);
          const dying = gw!;
          let reopen!: () => void;
          gate = new Promise((r) => (reopen = r));
          dying.child.kill('SIGKILL');
          await exited(dying.child);
          await dying.client.close().catch(() => undefined);
          log(`cycle ${i}: gateway killed (-9); restarting on the same data dir`);
          gw = await start();
          await warmUp(gw.client);
          fdStart = await settledFdCount(gw.child.pid!, gw.url);
          fds.start = fdStart;
          fds.peak = fdStart;
          reopen();
        }
        await cycle(i);
        const pid = gw!.child.pid!;
        const f = fdCount(pid, gw!.url);
        if (f > fds.peak) {
          fds.peak = f;
          fdsPerSandbox = Math.max(fdsPerSandbox, (f - fdStart) / Math.max(1, alive.size));
        }
        rss.peak = Math.max(rss.peak, rssMiB(pid));
        if (i > 0 && i % 1000 === 0) log(`${i} cycles, ${completed} completed, ${interrupted} interrupted, ${errors.length} errors`);
      }
    };
    await Promise.all(Array.from({ length: opts.concurrency }, worker));

    // reconcile: whatever a kill left behind (creates whose answer was lost included) is deleted
    for (const s of await gw.client.listSandboxes({ labels: { soak: tag } })) {
      await gw.client.deleteSandbox(s.id).catch((err: Error) => errors.push(`reconcile ${s.id}: ${err.message}`));
    }
    orphans.clear();
    const idle = await settle(() => leftovers(gw!.client), baseline);
    // Descriptors of work that just ended (a closing session connection) may take a moment to go.
    const fdDeadline = Date.now() + 10_000;
    while ((fds.end = fdCount(gw.child.pid!, gw.url)) > fdStart && Date.now() < fdDeadline) await new Promise((r) => setTimeout(r, 100));
    rss.end = rssMiB(gw.child.pid!);

    const stopping = gw;
    gw = null;
    stopping.child.kill('SIGTERM');
    await exited(stopping.child);
    await stopping.client.close().catch(() => undefined);
    const afterStop = await leftovers(null);
    return {
      cycles: opts.cycles,
      completed,
      kills: opts.kills,
      interrupted,
      errors,
      seconds: (performance.now() - t0) / 1000,
      idle,
      baseline,
      gatewayFds: fds,
      gatewayRssMiB: { start: round(rss.start), peak: round(rss.peak), end: round(rss.end) },
      fdsPerSandbox: round(fdsPerSandbox),
      afterStop,
    };
  } finally {
    if (gw) {
      gw.child.kill('SIGKILL');
      await exited(gw.child);
      await gw.client.close().catch(() => undefined);
    }
    if (net) await new HostNetwork({ bridge: net.bridge, subnet: net.subnet, nftTable: net.nftTable }).teardown().catch(() => undefined);
    rmSync(pinDir, { recursive: true, force: true });
    // layers stay mounted as the node's cache after a clean stop
    removeTree(dataDir);
    rmSync(rootfs, { recursive: true, force: true });
  }
}

const round = (n: number) => Math.round(n * 10) / 10;

/** What a soak report shows leaked; empty when nothing did. */
export function soakLeaks(r: SoakReport): string[] {
  const out: string[] = [];
  for (const k of Object.keys(r.baseline) as Array<keyof Leftovers>) if (r.idle[k] !== r.baseline[k]) out.push(`${k}: ${r.baseline[k]} when idle at the start, ${r.idle[k]} at the end`);
  for (const k of ['processes', 'cgroups', 'mounts', 'bpfLinks', 'sandboxes'] as const) if (r.afterStop[k] !== 0) out.push(`${k} after the clean stop: ${r.afterStop[k]}`);
  if (r.gatewayFds.end > r.gatewayFds.start) out.push(`gateway descriptors: ${r.gatewayFds.start} at its start, ${r.gatewayFds.end} at the end`);
  return out;
}

/**
 * Leftovers once the node is quiet: the netns pool refills and deletions finish in the
 * background, so this polls (bounded) until the counts match `want` or stop changing.
 */
async function settle(read: () => Promise<Leftovers>, want: Leftovers | null): Promise<Leftovers> {
  const deadline = Date.now() + 15_000;
  let last = await read();
  for (;;) {
    if (Date.now() > deadline) return last;
    await new Promise((r) => setTimeout(r, 100));
    const now = await read();
    const same = JSON.stringify(now) === JSON.stringify(want ?? last);
    last = now;
    if (same) return now;
  }
}

async function main(): Promise<void> {
  const cycles = Number(process.env.SOAK_CYCLES ?? 10_000);
  const networkReady = skipReason('egress-bpf', 'sandbox-network') === null;
  const opts: SoakOptions = {
    cycles,
    concurrency: Number(process.env.SOAK_CONCURRENCY ?? 4),
    kills: Number(process.env.SOAK_KILLS ?? Math.max(1, Math.floor(cycles / 1000))),
    network: process.env.SOAK_NETWORK !== '0' && networkReady,
    seed: Number(process.env.SOAK_SEED ?? Math.floor(Math.random() * 2 ** 31)),
    log: (l) => console.log(`  ${l}`),
  };
  console.log('# soak: conditions');
  printTable([{ ...conditions(), cycles: String(opts.cycles), concurrency: String(opts.concurrency), kills: String(opts.kills), network: String(opts.network), seed: String(opts.seed) }]);
  const r = await runSoak(opts);
  console.log('\n# soak: results');
  printTable([
    {
      cycles: String(r.cycles),
      completed: String(r.completed),
      'interrupted by kill -9': String(r.interrupted),
      errors: String(r.errors.length),
      seconds: r.seconds.toFixed(0),
      'cycles/s': (r.cycles / r.seconds).toFixed(1),
    },
  ]);
  console.log('\n# leak counts (baseline = warmed-up idle node; idle = after all deleted; after stop = after SIGTERM)');
  printTable(
    (['baseline', 'idle', 'afterStop'] as const).map((k) => ({ when: k, ...Object.fromEntries(Object.entries(r[k]).map(([a, b]) => [a, String(b)])) })),
  );
  console.log(`\ngateway fds: start ${r.gatewayFds.start}, peak ${r.gatewayFds.peak}, end ${r.gatewayFds.end} (${r.fdsPerSandbox} per live sandbox at the peak)`);
  console.log(`gateway RSS MiB: start ${r.gatewayRssMiB.start}, peak ${r.gatewayRssMiB.peak}, end ${r.gatewayRssMiB.end}`);
  for (const e of r.errors.slice(0, 20)) console.log(`error: ${e}`);
  const leaked = soakLeaks(r).length > 0;
  for (const l of soakLeaks(r)) console.log(`leak: ${l}`);
  if (leaked || r.errors.length > 0) process.exitCode = 1;
}

if (require.main === module) {
  main().catch((err) => {
    console.error(err);
    process.exit(1);
  });
}

