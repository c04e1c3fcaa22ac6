/**
 * npm run bench:python: the Python SDK (python/) against the TypeScript SDK (src/sdk) in the
 * same run, on the same node, sandbox and pool:
 *
 *   - exec round trip through a command-mode shell session (`run("true")`, sequential): p50 and
 *     mean latency;
 *   - FnCall invocations/s at concurrency 64 (`cmd: ["true"]`, the cheapest invocation, so the
 *     client's own cost weighs most).
 *
 * The machine is shared (other work runs beside the benchmark), so the two clients run in short
 * alternating blocks (BENCH_BLOCKS, default 8; order A-B, B-A, ...) against the same warm node:
 * load swings then hit both alike. Reported: percentiles over all samples per client, and the
 * median over blocks of the per-block ratio Python/TypeScript. The Python half is one long-lived
 * bench/python-sdk.py under /usr/bin/python3 (Debian's httpx and websockets), driven over stdin,
 * so interpreter start-up is not measured. AsyncClient is the comparison; the sync Client
 * (threads for concurrency) is printed beside it.
 * Also reported: the client's own CPU per operation (process CPU time over the block), which
 * the machine's load does not change much.
 * Target: Python within 20% of TypeScript on both. JSON goes to bench/results/python-sdk.json.
 */
import { execFile, spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os, { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type ShellClient, WarrenClient } from '../src/sdk';
import { conditions, percentile, printTable } from './stats';
import { startGateway } from './gateway';

const SHELL_N = Number(process.env.BENCH_SHELL_ITERATIONS ?? 300);
const FN_N = Number(process.env.BENCH_ITERATIONS ?? 512);
const CONC = Number(process.env.BENCH_CONCURRENCY ?? 64);
const BLOCKS = Number(process.env.BENCH_BLOCKS ?? 8);
const POOL_SIZE = Number(process.env.BENCH_POOL_SIZE ?? 8);
const PYTHON = process.env.BENCH_PYTHON ?? '/usr/bin/python3';

interface Block {
  lat: number[];
  wall: number;
  /** CPU time of the client process during the block (user + system), ms. */
  cpu: number;
}

interface Summary {
  /** Client CPU per operation, ms. */
  cpuPerOp: number;
  n: number;
  p50: number;
  p99: number;
  mean: number;
  throughput: number;
}

function summary(blocks: Block[]): Summary {
  const lat = blocks.flatMap((b) => b.lat);
  const wall = blocks.reduce((a, b) => a + b.wall, 0);
  return { cpuPerOp: blocks.reduce((a, b) => a + b.cpu, 0) / lat.length, n: lat.length, p50: percentile(lat, 50), p99: percentile(lat, 99), mean: lat.reduce((a, b) => a + b, 0) / lat.length, throughput: lat.length / (wall / 1000) };
}

function medianOf(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
}

const blockP50 = (b: Block) => percentile(b.lat, 50);
const blockRate = (b: Block) => b.lat.length / (b.wall / 1000);

async function tsShellBlock(sh: ShellClient, n: number): Promise<Block> {
  const lat: number[] = [];
  const u0 = process.cpuUsage();
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    const s = performance.now();
    const r = await sh.run('true');
    lat.push(performance.now() - s);
    if (r.exitCode !== 0) throw new Error(`run true: ${JSON.stringify(r)}`);
  }
  return { lat, wall: performance.now() - t0, cpu: cpuMs(u0) };
}

async function tsFncallBlock(client: WarrenClient, pool: string, n: number): Promise<Block> {
  const lat: number[] = [];
  let left = n;
  const u0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: CONC }, async () => {
      while (left-- > 0) {
        const s = performance.now();
        const r = await client.functions.invoke(pool, { cmd: ['true'] });
        lat.push(performance.now() - s);
        if (r.status !== 'ok') throw new Error(`invoke: ${JSON.stringify(r)}`);
      }
    }),
  );
  return { lat, wall: performance.now() - t0, cpu: cpuMs(u0) };
}

function cpuMs(since: NodeJS.CpuUsage): number {
  const u = process.cpuUsage(since);
  return (u.user + u.system) / 1000;
}

/** bench/python-sdk.py as a long-lived worker: one command line in, one JSON line out. */
class PythonWorker {
  readonly child: ChildProcessWithoutNullStreams;
  private buf = '';
  private waiting: Array<(line: string) => void> = [];
  private stderr = '';

  constructor(url: string, token: string, sandbox: string, pool: string) {
    const script = join(__dirname, '..', '..', 'bench', 'python-sdk.py');
    this.child = spawn(PYTHON, [script, url, token, sandbox, pool, String(CONC)], { stdio: ['pipe', 'pipe', 'pipe'] });
    this.child.stdout.on('data', (c: Buffer) => {
      this.buf += c.toString();
      let nl: number;
      while ((nl = this.buf.indexOf('\n')) !== -1) {
        const line = this.buf.slice(0, nl);
        this.buf = this.buf.slice(nl + 1);
        this.waiting.shift()?.(line);
      }
    });
    this.child.stderr.on('data', (c: Buffer) => (this.stderr += c.toString()));
    this.child.on('exit', (code) => {
      for (const w of this.waiting.splice(0)) w(JSON.stringify({ error: `python exited ${code}: ${this.stderr}` }));
    });
  }

  next(): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) =>
      this.waiting.push((line) => {
        const v = JSON.parse(line) as Record<string, unknown>;
        if (v.error) reject(new Error(String(v.error)));
        else resolve(v);
      }),
    );
  }

  async run(cmd: string, n: number): Promise<Block> {
    const p = this.next();
    this.child.stdin.write(`${cmd} ${n}\n`);
    return (await p) as unknown as Block;
  }

  close(): void {
    this.child.stdin.end('quit\n');
  }
}


async function unmountUnder(dir: string): Promise<void> {
  const points = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ')[4] ?? '')
    .filter((p) => p.startsWith(dir + '/'))
    .sort((a, b) => b.length - a.length);
  for (const p of points) await new Promise<void>((r) => execFile('umount', [p], () => r()));
}

async function main(): Promise<void> {
  const cond = conditions();
  const pyVersion = await new Promise<string>((r) => execFile(PYTHON, ['-c', 'import sys, httpx, websockets; print(sys.version.split()[0], "httpx", httpx.__version__, "websockets", websockets.__version__)'], (e, out) => r(e ? `unavailable: ${e.message}` : out.trim())));
  console.log('Python SDK vs TypeScript SDK');
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
  console.log(`python: ${PYTHON} ${pyVersion}`);
  console.log(`${BLOCKS} alternating blocks per measurement; shell: ${SHELL_N} sequential run("true") per block; fncall: ${FN_N} invocations of cmd ["true"] per block at concurrency ${CONC}, pool of ${POOL_SIZE} warm containers`);
  console.log(`load average at start: ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`);
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-bench-py-'));
  const gw = await startGateway(dataDir, { args: ['--node-id', `pb${process.pid.toString(36)}`] });
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url: gw.url, token, connections: CONC });
  let sandboxId: string | null = null;
  let py: PythonWorker | null = null;
  let cleaning: Promise<void> | null = null;
  const cleanup = () =>
    (cleaning ??= (async () => {
      py?.close();
      if (sandboxId) await client.deleteSandbox(sandboxId).catch(() => undefined);
      await client.functions.delete('pybench').catch(() => undefined);
      await client.close();
      await new Promise<void>((r) => {
        if (gw.child.exitCode !== null) return r();
        gw.child.once('exit', () => r());
        gw.child.kill('SIGTERM');
      });
      // the stopped node keeps its layers mounted; this data dir is the benchmark's alone
      await unmountUnder(dataDir);
      await rm(dataDir, { recursive: true, force: true });
    })());
  // An interrupted run cleans up too (sandbox, pool, node, mounts, Python worker).
  const onSignal = () => {
    void cleanup().finally(() => process.exit(130));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const sb = await client.createSandbox({ image: 'default', cpu: 1, memoryMb: 256 });
    sandboxId = sb.id;
    await client.functions.create({ name: 'pybench', min: POOL_SIZE, max: POOL_SIZE, maxQueue: 10_000 }, { wait: true });
    const sh = await sb.shell();
    for (let i = 0; i < 20; i++) await sh.run('true');
    await Promise.all(Array.from({ length: CONC }, () => client.functions.invoke('pybench', { cmd: ['true'] })));
    py = new PythonWorker(gw.url, token, sb.id, 'pybench');
    const ready = await py.next();
    await py.run('fncall', CONC); // warm its connection pool
    const m: Record<string, Block[]> = { tsShell: [], pyShell: [], pySyncShell: [], tsFn: [], pyFn: [], pyThreads: [] };
    const pair = async (tsFirst: boolean, ts: () => Promise<Block>, pys: () => Promise<Block>, tk: string, pk: string) => {
      if (tsFirst) {
        m[tk]!.push(await ts());
        m[pk]!.push(await pys());
      } else {
        m[pk]!.push(await pys());
        m[tk]!.push(await ts());
      }
    };
    // Phases by kind of work: a process that has just burnt CPU (a throughput block) is woken
    // later by the scheduler for a while, which would tax whichever latency block follows it.
    for (let b = 0; b < BLOCKS; b++) {
      await pair(b % 2 === 0, () => tsShellBlock(sh, SHELL_N), () => py!.run('shell', SHELL_N), 'tsShell', 'pyShell');
      m.pySyncShell!.push(await py.run('shell_sync', SHELL_N));
      console.log(`shell block ${b + 1}: p50 TS ${blockP50(m.tsShell![b]!).toFixed(3)} / Py ${blockP50(m.pyShell![b]!).toFixed(3)} / Py sync ${blockP50(m.pySyncShell![b]!).toFixed(3)} ms; load ${os.loadavg()[0]!.toFixed(1)}`);
    }
    for (let b = 0; b < BLOCKS; b++) {
      await pair(b % 2 === 0, () => tsFncallBlock(client, 'pybench', FN_N), () => py!.run('fncall', FN_N), 'tsFn', 'pyFn');
      console.log(`fncall block ${b + 1}: TS ${blockRate(m.tsFn![b]!).toFixed(0)} / Py ${blockRate(m.pyFn![b]!).toFixed(0)} per s; load ${os.loadavg()[0]!.toFixed(1)}`);
    }
    for (let b = 0; b < Math.max(1, BLOCKS >> 1); b++) {
      m.pyThreads!.push(await py.run('fncall_threads', FN_N));
    }
    await sh.close();
    const ratio = (pk: string, tk: string, f: (b: Block) => number) => medianOf(m[pk]!.map((b, i) => f(b) / f(m[tk]![i]!)));
    const S = Object.fromEntries(Object.entries(m).map(([k, v]) => [k, summary(v)])) as Record<string, Summary>;
    const f = (x: number, d = 3) => x.toFixed(d);
    console.log(`\nshell session exec round trip (run "true"), ms, ${BLOCKS * SHELL_N} samples each:`);
    const shellRatio = ratio('pyShell', 'tsShell', blockP50);
    printTable([
      { client: 'TypeScript SDK', p50: f(S.tsShell!.p50), mean: f(S.tsShell!.mean), p99: f(S.tsShell!.p99), 'client CPU/op': f(S.tsShell!.cpuPerOp), 'Py/TS p50 (median of blocks)': '1.00' },
      { client: 'Python AsyncClient', p50: f(S.pyShell!.p50), mean: f(S.pyShell!.mean), p99: f(S.pyShell!.p99), 'client CPU/op': f(S.pyShell!.cpuPerOp), 'Py/TS p50 (median of blocks)': f(shellRatio, 2) },
      { client: 'Python Client (sync)', p50: f(S.pySyncShell!.p50), mean: f(S.pySyncShell!.mean), p99: f(S.pySyncShell!.p99), 'client CPU/op': f(S.pySyncShell!.cpuPerOp), 'Py/TS p50 (median of blocks)': f(ratio('pySyncShell', 'tsShell', blockP50), 2) },
    ]);
    console.log(`\nFnCall at concurrency ${CONC}, ${BLOCKS * FN_N} invocations each:`);
    const fnRatio = ratio('pyFn', 'tsFn', blockRate);
    printTable([
      { client: 'TypeScript SDK', 'invocations/s': f(S.tsFn!.throughput, 0), 'p50 ms': f(S.tsFn!.p50, 1), 'p99 ms': f(S.tsFn!.p99, 1), 'client CPU/op ms': f(S.tsFn!.cpuPerOp), 'Py/TS rate (median of blocks)': '1.00' },
      { client: 'Python AsyncClient', 'invocations/s': f(S.pyFn!.throughput, 0), 'p50 ms': f(S.pyFn!.p50, 1), 'p99 ms': f(S.pyFn!.p99, 1), 'client CPU/op ms': f(S.pyFn!.cpuPerOp), 'Py/TS rate (median of blocks)': f(fnRatio, 2) },
      { client: `Python Client (sync, ${CONC} threads)`, 'invocations/s': f(S.pyThreads!.throughput, 0), 'p50 ms': f(S.pyThreads!.p50, 1), 'p99 ms': f(S.pyThreads!.p99, 1), 'client CPU/op ms': f(S.pyThreads!.cpuPerOp), 'Py/TS rate (median of blocks)': f(S.pyThreads!.throughput / S.tsFn!.throughput, 2) + ' (pooled)' },
    ]);
    const shellOk = shellRatio <= 1.2;
    const fnOk = fnRatio >= 0.8;
    console.log(`\ntarget (AsyncClient within 20% of the TypeScript SDK): shell ${shellOk ? 'met' : 'MISSED'} (${f(shellRatio, 2)}), fncall ${fnOk ? 'met' : 'MISSED'} (${f(fnRatio, 2)}); load average at end: ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}`);
    const results = { conditions: { ...cond, python: pyVersion, ready }, summary: S, ratios: { shellP50: shellRatio, fncallRate: fnRatio } };
    const resultsDir = join(__dirname, '..', '..', 'bench', 'results');
    mkdirSync(resultsDir, { recursive: true });
    writeFileSync(join(resultsDir, 'python-sdk.json'), JSON.stringify(results, null, 2));
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await cleanup();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
