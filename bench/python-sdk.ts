/**
 * npm run bench:python: the Python SDK (python/) against the TypeScript SDK (src/sdk) in the
 * same run, on the same node, sandbox and pool:
 *
 *   - exec round trip through a command-mode shell session (`run("true")`, sequential): p50 and
 *     mean latency;
 *   - FnCall invocations/s at concurrency 64 (`cmd: ["true"]`, the cheapest invocation, so the
 *     client's own cost weighs most).
 *
 * Rounds alternate TS, Python, TS, Python, ... (BENCH_ROUNDS, default 3) and the median round of
 * each is reported, so drift on the shared 2-core machine hits both alike. The Python half runs
 * bench/python-sdk.py with /usr/bin/python3 (Debian's httpx and websockets): AsyncClient is the
 * comparison; the sync Client (threads for concurrency) is printed beside it.
 * Target: Python within 20% of TypeScript on both. JSON goes to bench/results/python-sdk.json.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WarrenClient } from '../src/sdk';
import { conditions, percentile, printTable } from './stats';

const SHELL_N = Number(process.env.BENCH_SHELL_ITERATIONS ?? 1000);
const FN_N = Number(process.env.BENCH_ITERATIONS ?? 2000);
const CONC = Number(process.env.BENCH_CONCURRENCY ?? 64);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const POOL_SIZE = Number(process.env.BENCH_POOL_SIZE ?? 8);
const PYTHON = process.env.BENCH_PYTHON ?? '/usr/bin/python3';

interface Summary {
  n: number;
  p50: number;
  p99: number;
  mean: number;
  throughput: number;
}

function summary(lat: number[], wallMs: number): Summary {
  return { n: lat.length, p50: percentile(lat, 50), p99: percentile(lat, 99), mean: lat.reduce((a, b) => a + b, 0) / lat.length, throughput: lat.length / (wallMs / 1000) };
}

async function tsShell(client: WarrenClient, sandbox: string): Promise<Summary> {
  const sh = await client.sandbox(sandbox).shell();
  try {
    for (let i = 0; i < 20; i++) await sh.run('true');
    const lat: number[] = [];
    const t0 = performance.now();
    for (let i = 0; i < SHELL_N; i++) {
      const s = performance.now();
      const r = await sh.run('true');
      lat.push(performance.now() - s);
      if (r.exitCode !== 0) throw new Error(`run true: ${JSON.stringify(r)}`);
    }
    return summary(lat, performance.now() - t0);
  } finally {
    await sh.close();
  }
}

async function tsFncall(client: WarrenClient, pool: string): Promise<Summary> {
  await Promise.all(Array.from({ length: CONC }, () => client.functions.invoke(pool, { cmd: ['true'] })));
  const lat: number[] = [];
  let left = FN_N;
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
  return summary(lat, performance.now() - t0);
}

function python(url: string, token: string, sandbox: string, pool: string): Promise<Record<string, Summary | string>> {
  const script = join(__dirname, '..', '..', 'bench', 'python-sdk.py');
  return new Promise((resolve, reject) => {
    execFile(PYTHON, [script, url, token, sandbox, pool, String(SHELL_N), String(FN_N), String(CONC)], { timeout: 900_000, maxBuffer: 1 << 20 }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${PYTHON} ${script}: ${err.message}\n${stderr}`));
      else resolve(JSON.parse(stdout.trim().split('\n').pop()!));
    });
  });
}

function startGateway(dataDir: string): Promise<{ url: string; child: ChildProcess }> {
  const cli = join(__dirname, '..', 'src', 'cli', 'main.js');
  const child = spawn(process.execPath, [cli, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-network', '--node-id', `pb${process.pid.toString(36)}`], { stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let out = '';
    const onData = (c: Buffer) => {
      out += c.toString();
      const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        child.stdout!.off('data', onData);
        child.stderr!.off('data', onData);
        child.stdout!.resume();
        child.stderr!.resume();
        resolve({ url: m[1]!, child });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.on('exit', (code) => reject(new Error(`warren up exited ${code}: ${out}`)));
  });
}

function median<T>(xs: T[], key: (x: T) => number): T {
  return [...xs].sort((a, b) => key(a) - key(b))[Math.floor(xs.length / 2)]!;
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
  console.log(`shell: ${SHELL_N} sequential run("true") per round; fncall: ${FN_N} invocations of cmd ["true"] at concurrency ${CONC}, pool of ${POOL_SIZE} warm containers; ${ROUNDS} alternating rounds, median reported`);
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-bench-py-'));
  const gw = await startGateway(dataDir);
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url: gw.url, token, connections: CONC });
  let sandboxId: string | null = null;
  try {
    const sb = await client.createSandbox({ image: 'default', cpu: 1, memoryMb: 256 });
    sandboxId = sb.id;
    await client.functions.create({ name: 'pybench', min: POOL_SIZE, max: POOL_SIZE, maxQueue: 10_000 }, { wait: true });
    const ts: Array<{ shell: Summary; fncall: Summary }> = [];
    const py: Array<Record<string, Summary | string>> = [];
    for (let round = 0; round < ROUNDS; round++) {
      ts.push({ shell: await tsShell(client, sb.id), fncall: await tsFncall(client, 'pybench') });
      py.push(await python(gw.url, token, sb.id, 'pybench'));
      console.log(`round ${round + 1}: TS shell p50 ${ts[round]!.shell.p50.toFixed(3)} ms, fncall ${ts[round]!.fncall.throughput.toFixed(0)}/s; Python shell p50 ${(py[round]!.shell_async as Summary).p50.toFixed(3)} ms, fncall ${(py[round]!.fncall_async as Summary).throughput.toFixed(0)}/s`);
    }
    const tsShellM = median(ts.map((r) => r.shell), (s) => s.p50);
    const tsFnM = median(ts.map((r) => r.fncall), (s) => s.throughput);
    const pick = (k: string) => median(py.map((r) => r[k] as Summary), (s) => (k.startsWith('shell') ? s.p50 : s.throughput));
    const pyShell = pick('shell_async');
    const pySyncShell = pick('shell_sync');
    const pyFn = pick('fncall_async');
    const pyThreads = pick('fncall_threads');
    const f = (x: number, d = 3) => x.toFixed(d);
    console.log('\nshell session exec round trip (run "true"), ms:');
    printTable([
      { client: 'TypeScript SDK', p50: f(tsShellM.p50), mean: f(tsShellM.mean), p99: f(tsShellM.p99), 'vs TS (p50)': '1.00' },
      { client: 'Python AsyncClient', p50: f(pyShell.p50), mean: f(pyShell.mean), p99: f(pyShell.p99), 'vs TS (p50)': f(pyShell.p50 / tsShellM.p50, 2) },
      { client: 'Python Client (sync)', p50: f(pySyncShell.p50), mean: f(pySyncShell.mean), p99: f(pySyncShell.p99), 'vs TS (p50)': f(pySyncShell.p50 / tsShellM.p50, 2) },
    ]);
    console.log(`\nFnCall at concurrency ${CONC}:`);
    printTable([
      { client: 'TypeScript SDK', 'invocations/s': f(tsFnM.throughput, 0), 'p50 ms': f(tsFnM.p50, 2), 'p99 ms': f(tsFnM.p99, 2), 'vs TS': '1.00' },
      { client: 'Python AsyncClient', 'invocations/s': f(pyFn.throughput, 0), 'p50 ms': f(pyFn.p50, 2), 'p99 ms': f(pyFn.p99, 2), 'vs TS': f(pyFn.throughput / tsFnM.throughput, 2) },
      { client: `Python Client (sync, ${CONC} threads)`, 'invocations/s': f(pyThreads.throughput, 0), 'p50 ms': f(pyThreads.p50, 2), 'p99 ms': f(pyThreads.p99, 2), 'vs TS': f(pyThreads.throughput / tsFnM.throughput, 2) },
    ]);
    const shellOk = pyShell.p50 <= tsShellM.p50 * 1.2;
    const fnOk = pyFn.throughput >= tsFnM.throughput * 0.8;
    console.log(`\ntarget (AsyncClient within 20% of the TypeScript SDK): shell ${shellOk ? 'met' : 'MISSED'}, fncall ${fnOk ? 'met' : 'MISSED'}`);
    const resultsDir = join(__dirname, '..', '..', 'bench', 'results');
    mkdirSync(resultsDir, { recursive: true });
    writeFileSync(join(resultsDir, 'python-sdk.json'), JSON.stringify({ conditions: { ...cond, python: pyVersion }, ts, py }, null, 2));
  } finally {
    if (sandboxId) await client.deleteSandbox(sandboxId).catch(() => undefined);
    await client.functions.delete('pybench').catch(() => undefined);
    await client.close();
    await new Promise<void>((r) => {
      gw.child.once('exit', () => r());
      gw.child.kill('SIGTERM');
    });
    // the stopped node keeps its layers mounted; this data dir is the benchmark's alone
    await unmountUnder(dataDir);
    await rm(dataDir, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
