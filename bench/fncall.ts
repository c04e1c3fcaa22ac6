/**
 * npm run bench:fncall: FnCall invocations/s and p50/p99 latency at concurrency
 * 1, 8 and 64 for two workloads, side by side in one run with
 *   (a) the same command as a plain host process (the physical floor), and
 *   (b) `runc run` per invocation (Debian runc, same read-only rootfs).
 *
 * Workloads: hello-world python3 (`code` + `language`, the source sent with
 * every call), and a compiled C program (built once on the host, imported as a
 * toolkit layer stacked on the pool's image, run with `cmd`).
 *
 * Warren is measured end to end as a user sees it: the gateway in its own
 * process (`warren up`), the SDK over HTTP on loopback, one warm pool.
 * Conditions and ratios are printed; JSON goes to bench/results/fncall.json.
 * Targets: >= 70% of host throughput, >= 10x runc, p99 at c=64 <= 5x p50.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync, chmodSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { WarrenClient } from '../src/sdk';
import type { InvokeOptions } from '../src/sdk/functions';
import { conditions, percentile, printTable } from './stats';

const ITER = Number(process.env.BENCH_ITERATIONS ?? 400);
const RUNC_ITER = Number(process.env.BENCH_RUNC_ITERATIONS ?? 64);
const POOL_SIZE = Number(process.env.BENCH_POOL_SIZE ?? 8);
const LEVELS = (process.env.BENCH_CONCURRENCY ?? '1,8,64').split(',').map(Number);

interface Sample {
  throughput: number;
  p50: number;
  p99: number;
  n: number;
}

async function measure(n: number, concurrency: number, fn: () => Promise<void>): Promise<Sample> {
  const lat: number[] = [];
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(concurrency, n) }, async () => {
      while (next++ < n) {
        const s = performance.now();
        await fn();
        lat.push(performance.now() - s);
      }
    }),
  );
  const wall = (performance.now() - t0) / 1000;
  return { throughput: n / wall, p50: percentile(lat, 50), p99: percentile(lat, 99), n };
}

function run(cmd: string, args: string[], opts: { cwd?: string } = {}): Promise<void> {
  return new Promise((resolve, reject) => {
    execFile(cmd, args, { cwd: opts.cwd, timeout: 120_000 }, (err, stdout) => {
      if (err) reject(err);
      else if (!stdout.startsWith('hello')) reject(new Error(`unexpected output ${JSON.stringify(stdout)}`));
      else resolve();
    });
  });
}

function startGateway(dataDir: string): Promise<{ url: string; child: ChildProcess }> {
  const cli = join(__dirname, '..', 'src', 'cli', 'main.js');
  const child = spawn(process.execPath, [cli, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-default-image', '--no-network'], { stdio: ['ignore', 'pipe', 'pipe'] });
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
    child.once('exit', (code) => reject(new Error(`warren up exited with ${code}: ${out.slice(-2000)}`)));
  });
}

function runcBundle(rootfs: string, workDir: string, args: string[]): string {
  const bundle = mkdtempSync(join(os.tmpdir(), 'warren-bench-fn-runc-'));
  execFileSync('runc', ['spec', '--bundle', bundle]);
  const config = JSON.parse(readFileSync(join(bundle, 'config.json'), 'utf8'));
  config.root = { path: rootfs, readonly: true };
  config.process.terminal = false;
  config.process.args = args;
  config.process.cwd = '/mnt';
  config.process.user = { uid: 65534, gid: 65534 };
  config.mounts.push({ destination: '/mnt', type: 'bind', source: workDir, options: ['rbind', 'ro'] });
  config.linux.resources = { memory: { limit: 512 * 1024 * 1024 }, cpu: { quota: 100000, period: 100000 }, pids: { limit: 128 } };
  writeFileSync(join(bundle, 'config.json'), JSON.stringify(config));
  return bundle;
}

async function main() {
  // A persistent data dir (like bench/create-exec.ts): the judge image and the toolkit layer are reused across runs.
  const dataDir = process.env.BENCH_DATA_DIR ?? '/var/lib/warren-bench-fncall';
  mkdirSync(dataDir, { recursive: true });
  const work = mkdtempSync(join(os.tmpdir(), 'warren-bench-fn-work-'));
  chmodSync(work, 0o755);
  const py = 'print("hello")\n';
  writeFileSync(join(work, 'main.py'), py);
  writeFileSync(join(work, 'hello.c'), '#include <stdio.h>\nint main(void){ puts("hello"); return 0; }\n');
  execFileSync('gcc', ['-O2', '-o', join(work, 'hello'), join(work, 'hello.c')]);
  // The toolkit layer: /usr/local/bin/hello-c
  const toolkit = join(work, 'toolkit');
  mkdirSync(join(toolkit, 'usr', 'local', 'bin'), { recursive: true });
  execFileSync('cp', [join(work, 'hello'), join(toolkit, 'usr', 'local', 'bin', 'hello-c')]);
  const hostPython = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

  console.log('# conditions');
  for (const [k, v] of Object.entries(conditions())) console.log(`${k}: ${v}`);
  console.log(`iterations: ${ITER} (runc: ${RUNC_ITER}); concurrency: ${LEVELS.join(', ')}; pool: ${POOL_SIZE} warm containers, 1 CPU / 512 MiB / 128 pids each`);
  console.log(`warren: gateway in its own process, SDK over HTTP on loopback; host: ${hostPython} and the same C binary via child_process.execFile; runc: runc run per invocation, read-only judge rootfs, the work dir bind-mounted on /mnt`);

  const gw = await startGateway(dataDir);
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url: gw.url, token, connections: 128 });
  const results: Record<string, unknown> = { conditions: conditions() };
  try {
    const t0 = Date.now();
    if (!(await client.images.list()).some((i) => i.name === 'bench-hello')) await client.images.import('bench-hello', toolkit, { kind: 'toolkit', type: 'directory' });
    await client.functions.create({ name: 'bench', layers: ['bench-hello'], min: POOL_SIZE, max: POOL_SIZE, maxQueue: 10_000 }, { wait: true });
    console.log(`pool warm in ${((Date.now() - t0) / 1000).toFixed(1)} s (includes the judge image on first use)`);
    const judge = (await client.images.list()).find((i) => i.name === 'judge')!;
    const rootfs = join(dataDir, 'layers', 'mnt', judge.layers[judge.layers.length - 1]!.replace(/^sha256:/, ''));
    const haveRunc = existsSync('/usr/sbin/runc') || existsSync('/usr/bin/runc');

    const workloads: Array<{ name: string; warren: InvokeOptions; host: () => Promise<void>; runcArgs: string[] }> = [
      { name: 'python3 hello', warren: { code: py, language: 'python3' }, host: () => run(hostPython, ['-B', 'main.py'], { cwd: work }), runcArgs: ['python3', '-B', 'main.py'] },
      {
        name: 'C hello (compiled)',
        warren: { cmd: ['hello-c'] },
        host: () => run(join(work, 'hello'), []),
        runcArgs: ['/mnt/hello'],
      },
    ];
    const rows: Array<Record<string, string>> = [];
    for (const w of workloads) {
      const invoke = async () => {
        const r = await client.functions.invoke('bench', w.warren);
        if (r.status !== 'ok' || !r.stdout.startsWith('hello')) throw new Error(`invoke failed: ${JSON.stringify(r).slice(0, 500)}`);
      };
      await measure(40, 8, invoke); // warm up: JIT, page cache
      await measure(20, 4, w.host);
      const bundle = haveRunc ? runcBundle(rootfs, work, w.runcArgs) : null;
      let seq = 0;
      const runcOnce = () => run('runc', ['run', '--bundle', bundle!, `wfn-${process.pid}-${seq++}`]);
      for (const c of LEVELS) {
        const wr = await measure(ITER, c, invoke);
        const hr = await measure(ITER, c, w.host);
        const rr = bundle ? await measure(Math.max(RUNC_ITER, c), c, runcOnce) : null;
        results[`${w.name} c=${c}`] = { warren: wr, host: hr, runc: rr };
        rows.push({
          workload: w.name,
          c: String(c),
          'warren inv/s': wr.throughput.toFixed(0),
          'p50 ms': wr.p50.toFixed(1),
          'p99 ms': wr.p99.toFixed(1),
          'p99/p50': (wr.p99 / wr.p50).toFixed(1),
          'host inv/s': hr.throughput.toFixed(0),
          'host p50': hr.p50.toFixed(1),
          'runc inv/s': rr ? rr.throughput.toFixed(1) : 'n/a',
          'runc p50': rr ? rr.p50.toFixed(1) : 'n/a',
          'warren/host': `${((100 * wr.throughput) / hr.throughput).toFixed(0)}%`,
          'warren/runc': rr ? `${(wr.throughput / rr.throughput).toFixed(1)}×` : 'n/a',
        });
      }
      if (bundle) await rm(bundle, { recursive: true, force: true });
    }
    console.log('\n# FnCall invocations (targets: warren/host >= 70%, warren/runc >= 10x, p99/p50 at c=64 <= 5)');
    printTable(rows);
    const stats = await client.functions.get('bench');
    console.log(`\npool after the run: ${stats.invocations} invocations, ${stats.replaced} containers replaced, p50 ${stats.p50Ms} ms, p99 ${stats.p99Ms} ms`);
    mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
    writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'fncall.json'), JSON.stringify({ rows, results }, null, 2));
  } finally {
    await client.close();
    gw.child.kill('SIGTERM');
    await new Promise((r) => gw.child.once('exit', r));
    await rm(work, { recursive: true, force: true });
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
