/**
 * npm run bench:fncall: FnCall invocations/s and p50/p99 latency at concurrency
 * 1, 8 and 64 for two workloads, side by side in one run with
 *   (a) the same command as a plain host process (the physical floor), and
 *   (b) `runc run` per invocation (Debian runc, same read-only rootfs).
 *
 * Workloads: hello-world python3 (`code` + `language`, the source sent with
 * every call: forked from the pool container's python3 zygote), the same program
 * started fresh in the pool (`cmd`, no zygote), and a compiled C program (built
 * once on the host, imported as a toolkit layer stacked on the pool's image, run
 * with `cmd`).
 *
 * Warren is measured end to end as a user sees it: the gateway in its own
 * process (`warren up`), the SDK over HTTP on loopback, one warm pool.
 * Conditions and ratios are printed; JSON goes to bench/results/fncall.json.
 * Targets: >= 70% of host throughput, >= 10x runc, p99 at c=64 <= 5x p50.
 */
import { execFile, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, writeFileSync, chmodSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { startGateway } from './gateway';
import { WarrenClient } from '../src/sdk';
import type { InvokeOptions } from '../src/sdk/functions';
import { conditions, percentile, printTable } from './stats';
import { native } from '../src/native';

const ITER = Number(process.env.BENCH_ITERATIONS ?? 400);
const RUNC_ITER = Number(process.env.BENCH_RUNC_ITERATIONS ?? 64);
const POOL_SIZE = Number(process.env.BENCH_POOL_SIZE ?? 8);
const LEVELS = (process.env.BENCH_CONCURRENCY ?? '1,8,64').split(',').map(Number);

interface Sample {
  throughput: number;
  p50: number;
  p99: number;
  n: number;
  /** CPU per invocation (ms) of everything it took, when measured (see cpuMeter). */
  cpuMs?: number;
}

const TICK_MS = 1000 / 100;
/** utime+stime (and with `children`, cutime+cstime of waited-for descendants) of a process, in ms. */
function procCpuMs(pid: number | 'self', children: boolean): number {
  const f = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = f.slice(f.lastIndexOf(')') + 2).split(' ');
  // fields[11..14] = utime stime cutime cstime (stat fields 14..17)
  const ticks = Number(fields[11]) + Number(fields[12]) + (children ? Number(fields[13]) + Number(fields[14]) : 0);
  return ticks * TICK_MS;
}
/** CPU (ms) of the pool containers of the bench gateway (their cgroups). */
let poolCgroups: string[] = [];
function poolCpuMs(): number {
  let us = 0;
  for (const id of poolCgroups) {
    try {
      us += native.cgroupStats(id).cpuUsageUs;
    } catch {
      /* replaced */
    }
  }
  return us / 1000;
}
/**
 * Total CPU of a run: this process and its waited-for children (host processes, runc and its
 * containers), the gateway process, and the pool containers. On a machine shared with other
 * work, CPU per invocation is the load-independent measure of what these cores can sustain.
 */
function cpuMeter(gatewayPid: number | null): () => number {
  const read = () => procCpuMs('self', true) + (gatewayPid !== null ? procCpuMs(gatewayPid, false) + poolCpuMs() : 0);
  const t0 = read();
  return () => read() - t0;
}

async function measure(n: number, concurrency: number, fn: () => Promise<void>, cpu?: () => () => number): Promise<Sample> {
  const lat: number[] = [];
  let next = 0;
  const meter = cpu?.();
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
  const out: Sample = { throughput: n / wall, p50: percentile(lat, 50), p99: percentile(lat, 99), n };
  if (meter) out.cpuMs = meter() / n;
  return out;
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

/** Hello world per language; host and runc where the host has the toolchain (compiled once, on the host). */
const LANG_HELLO: Array<{ lang: string; code: string; file: string; hostBuild?: string[]; run: string[] }> = [
  { lang: 'python3', code: 'print("hello")', file: 'main.py', run: ['python3', '-B', 'main.py'] },
  { lang: 'cpp', code: '#include <cstdio>\nint main(){ puts("hello"); }', file: 'main.cpp', hostBuild: ['g++', '-O2', '-o', 'main-cpp', 'main.cpp'], run: ['./main-cpp'] },
  { lang: 'java', code: 'public class Main { public static void main(String[] a) { System.out.println("hello"); } }', file: 'Main.java', hostBuild: ['javac', 'Main.java'], run: ['java', '-XX:+UseSerialGC', '-XX:-UsePerfData', '-XX:TieredStopAtLevel=1', '-cp', '.', 'Main'] },
  { lang: 'nodejs', code: 'console.log("hello")', file: 'main.js', run: ['node', 'main.js'] },
  { lang: 'rust', code: 'fn main() { println!("hello"); }', file: 'main.rs', hostBuild: ['rustc', '-O', '-o', 'main-rs', 'main.rs'], run: ['./main-rs'] },
  { lang: 'perl', code: 'print "hello\n";', file: 'main.pl', run: ['perl', 'main.pl'] },
  { lang: 'go', code: 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }', file: 'main.go', run: [] },
  { lang: 'php', code: '<?php echo "hello\n";', file: 'main.php', run: [] },
  { lang: 'ruby', code: 'puts "hello"', file: 'main.rb', run: [] },
  { lang: 'lua', code: 'print("hello")', file: 'main.lua', run: [] },
  { lang: 'R', code: 'cat("hello\n")', file: 'main.R', run: [] },
  { lang: 'typescript', code: 'const s: string = "hello"; console.log(s)', file: 'main.ts', run: [] },
  { lang: 'scala', code: 'object Main { def main(a: Array[String]): Unit = println("hello") }', file: 'Main.scala', run: [] },
  { lang: 'csharp', code: 'class P { static void Main() { System.Console.WriteLine("hello"); } }', file: 'main.cs', run: [] },
  { lang: 'd', code: 'import std.stdio; void main() { writeln("hello"); }', file: 'main.d', run: [] },
  { lang: 'verilog', code: 'module main; initial begin $display("hello"); $finish; end endmodule', file: 'main.v', run: [] },
];

function hostHas(cmd: string): boolean {
  try {
    execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

async function benchLanguages(client: WarrenClient, dataDir: string, work: string): Promise<unknown> {
  const n = Number(process.env.BENCH_LANG_ITERATIONS ?? 32);
  const t0 = Date.now();
  const info0 = await client.functions.languages();
  const kits = info0.toolkits.filter((t) => !t.lazy && t.name !== 'python').map((t) => t.name);
  await client.functions.create({ name: 'bench-langs', layers: kits, min: POOL_SIZE, max: POOL_SIZE, maxQueue: 10_000, limits: { memoryMb: 512, maxTimeoutMs: 120_000 } }, { wait: true });
  const info = await client.functions.languages();
  console.log(`\n# toolkit layers (pool with ${kits.length} toolkits warm in ${((Date.now() - t0) / 1000).toFixed(1)} s): build (cold: apt-get + mkfs.erofs) or node-cache time`);
  printTable(
    info.toolkits
      .filter((t) => t.build !== null)
      .map((t) => ({ toolkit: t.name, packages: t.packages.join(' '), from: t.build!.cached ? 'node cache' : 'built', seconds: (t.build!.buildMs / 1000).toFixed(1), MiB: (t.build!.sizeBytes / 1048576).toFixed(0) })),
  );
  // runc: the pool's own layer stack as one read-only overlay
  const pool = await client.functions.get('bench-langs');
  const images = await client.images.list();
  const judge = images.find((i) => i.name === 'judge')!;
  const kitDigests = [...pool.layers.filter((l) => l !== 'python'), 'python'].map((k) => images.find((i) => i.name === `fncall-${k}`)?.layers[0]).filter((d): d is string => d !== undefined);
  const lowers = [...kitDigests, ...judge.layers].map((d) => join(dataDir, 'layers', 'mnt', d.replace(/^sha256:/, '')));
  const rootfs = mkdtempSync(join(os.tmpdir(), 'warren-bench-fn-rootfs-'));
  const haveRunc = hostHas('runc') && lowers.every((l) => existsSync(l));
  if (haveRunc) execFileSync('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lowers.join(':')}`, rootfs]);
  const rows: Array<Record<string, string>> = [];
  const out: Record<string, unknown> = { toolkits: info.toolkits };
  try {
    for (const l of LANG_HELLO) {
      writeFileSync(join(work, l.file), `${l.code}\n`);
      const invoke = async () => {
        const r = await client.functions.invoke('bench-langs', { code: l.code, language: l.lang, timeoutMs: 60_000, compileTimeoutMs: 120_000 });
        if (r.status !== 'ok' || !r.stdout.startsWith('hello')) throw new Error(`${l.lang}: ${JSON.stringify(r).slice(0, 500)}`);
      };
      let wr: Sample;
      try {
        await measure(8, 8, invoke);
        wr = await measure(n, 8, invoke);
      } catch (err) {
        console.log(`${l.lang}: failed: ${(err as Error).message.slice(0, 300)}`);
        rows.push({ language: l.lang, 'warren inv/s': 'failed', 'warren p50 ms': '-', 'host inv/s': '-', 'host p50 ms': '-', 'runc inv/s': '-', 'runc p50 ms': '-' });
        continue;
      }
      let hr: Sample | null = null;
      let rr: Sample | null = null;
      const onHost = l.run.length > 0 && (l.hostBuild !== undefined ? hostHas(l.hostBuild[0]!) : hostHas(l.run[0]!));
      if (onHost) {
        if (l.hostBuild) execFileSync(l.hostBuild[0]!, l.hostBuild.slice(1), { cwd: work, stdio: 'ignore' });
        const cmd = l.run[0]!.startsWith('./') ? join(work, l.run[0]!) : l.run[0]!;
        await measure(4, 4, () => run(cmd, l.run.slice(1), { cwd: work }));
        hr = await measure(n, 8, () => run(cmd, l.run.slice(1), { cwd: work }));
        if (haveRunc) {
          const bundle = runcBundle(rootfs, work, l.run[0]!.startsWith('./') ? [`/mnt/${l.run[0]!.slice(2)}`, ...l.run.slice(1)] : l.run);
          let seq = 0;
          rr = await measure(Math.max(16, Math.floor(n / 3)), 8, () => run('runc', ['run', '--bundle', bundle, `wfl-${process.pid}-${seq++}`]));
          await rm(bundle, { recursive: true, force: true });
        }
      }
      out[l.lang] = { warren: wr, host: hr, runc: rr };
      console.log(`${l.lang}: warren ${wr.throughput.toFixed(1)}/s p50 ${wr.p50.toFixed(0)} ms; host ${hr ? `${hr.throughput.toFixed(1)}/s p50 ${hr.p50.toFixed(0)} ms` : 'n/a'}; runc ${rr ? `${rr.throughput.toFixed(1)}/s p50 ${rr.p50.toFixed(0)} ms` : 'n/a'}`);
      rows.push({
        language: l.lang,
        'warren inv/s': wr.throughput.toFixed(1),
        'warren p50 ms': wr.p50.toFixed(0),
        'host inv/s': hr ? hr.throughput.toFixed(1) : 'n/a',
        'host p50 ms': hr ? hr.p50.toFixed(0) : 'n/a',
        'runc inv/s': rr ? rr.throughput.toFixed(1) : 'n/a',
        'runc p50 ms': rr ? rr.p50.toFixed(0) : 'n/a',
      });
    }
  } finally {
    if (haveRunc) execFileSync('umount', [rootfs]);
    await rm(rootfs, { recursive: true, force: true });
    await client.functions.delete('bench-langs');
  }
  console.log(`\n# hello world per language at c=8 (${n} invocations each; Warren compiles in every invocation, host and runc run an artifact compiled once on the host; n/a: the host has no such toolchain)`);
  printTable(rows);
  return out;
}

/**
 * The cost of a fresh network namespace per invocation: the same python3 hello at c=8 in a
 * second gateway whose invocations share their container's namespace (WARREN_FNCALL_NETNS=0).
 */
async function benchNetns(main: WarrenClient, py: string, mainDataDir: string): Promise<unknown> {
  // a persistent data dir of its own (layers stay mounted after the gateway stops: node state)
  const dir = `${mainDataDir}-nonet`;
  mkdirSync(dir, { recursive: true });
  const gw = await startGateway(dir, { args: ['--no-default-image'], env: { WARREN_FNCALL_NETNS: '0' } });
  const client = new WarrenClient({ url: gw.url, token: readFileSync(join(dir, 'admin.token'), 'utf8').trim(), connections: 128 });
  try {
    await client.functions.create({ name: 'nonet', min: POOL_SIZE, max: POOL_SIZE, maxQueue: 10_000 }, { wait: true });
    const invoke = async () => {
      const r = await client.functions.invoke('nonet', { code: py, language: 'python3' });
      if (r.status !== 'ok') throw new Error(JSON.stringify(r).slice(0, 300));
    };
    const mainInvoke = async () => {
      const r = await main.functions.invoke('bench', { code: py, language: 'python3' });
      if (r.status !== 'ok') throw new Error(JSON.stringify(r).slice(0, 300));
    };
    await measure(40, 8, invoke);
    await measure(40, 8, mainInvoke);
    // alternated, so both see the same machine
    const without = await measure(ITER, 8, invoke);
    const w = await measure(ITER, 8, mainInvoke);
    console.log('\n# fresh network namespace per invocation (python3 hello, c=8)');
    printTable([
      { netns: 'fresh per invocation (default)', 'inv/s': w.throughput.toFixed(0), 'p50 ms': w.p50.toFixed(1) },
      { netns: "shared (the container's)", 'inv/s': without.throughput.toFixed(0), 'p50 ms': without.p50.toFixed(1) },
    ]);
    return { fresh: w, shared: without };
  } finally {
    await client.close();
    gw.child.kill('SIGTERM');
    await new Promise((r) => gw.child.once('exit', r));
  }
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

  const gw = await startGateway(dataDir, { args: ['--no-default-image'] });
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url: gw.url, token, connections: 128 });
  const results: Record<string, unknown> = { conditions: conditions() };
  try {
    const t0 = Date.now();
    const cpuRoot = native.cgroupLayout().roots.cpuacct ?? native.cgroupLayout().roots.cpu ?? native.cgroupLayout().roots.unified ?? '';
    const fnGroups = () => new Set(readdirSync(cpuRoot).filter((d) => d.startsWith('fn-')));
    const before = fnGroups();
    if (!(await client.images.list()).some((i) => i.name === 'bench-hello')) await client.images.import('bench-hello', toolkit, { kind: 'toolkit', type: 'directory' });
    await client.functions.create({ name: 'bench', layers: ['bench-hello'], min: POOL_SIZE, max: POOL_SIZE, maxQueue: 10_000 }, { wait: true });
    console.log(`pool warm in ${((Date.now() - t0) / 1000).toFixed(1)} s (includes the judge image on first use)`);
    poolCgroups = [...fnGroups()].filter((d) => !before.has(d));
    const judge = (await client.images.list()).find((i) => i.name === 'judge')!;
    const rootfs = join(dataDir, 'layers', 'mnt', judge.layers[judge.layers.length - 1]!.replace(/^sha256:/, ''));
    const haveRunc = existsSync('/usr/sbin/runc') || existsSync('/usr/bin/runc');

    const workloads: Array<{ name: string; warren: InvokeOptions; host: () => Promise<void>; runcArgs: string[] }> = [
      { name: 'python3 hello', warren: { code: py, language: 'python3' }, host: () => run(hostPython, ['-B', 'main.py'], { cwd: work }), runcArgs: ['python3', '-B', 'main.py'] },
      // the same program started fresh in the pool (cmd never forks from the zygote): what the zygote saves
      { name: 'python3 hello, fresh exec', warren: { cmd: ['python3', '-B', 'main.py'], files: { 'main.py': py } }, host: () => run(hostPython, ['-B', 'main.py'], { cwd: work }), runcArgs: ['python3', '-B', 'main.py'] },
      {
        name: 'C hello (compiled)',
        warren: { cmd: ['hello-c'] },
        host: () => run(join(work, 'hello'), []),
        runcArgs: ['/mnt/hello'],
      },
    ];
    const rows: Array<Record<string, string>> = [];
    for (const w of process.env.BENCH_MAIN === '0' ? [] : workloads) {
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
        const wr = await measure(ITER, c, invoke, () => cpuMeter(gw.child.pid ?? null));
        const hr = await measure(ITER, c, w.host, () => cpuMeter(null));
        const rr = bundle ? await measure(Math.max(RUNC_ITER, c), c, runcOnce, () => cpuMeter(null)) : null;
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
          'CPU ms/inv warren / host / runc': `${wr.cpuMs!.toFixed(1)} / ${hr.cpuMs!.toFixed(1)} / ${rr ? rr.cpuMs!.toFixed(1) : 'n/a'}`,
          'by CPU: ÷host, ÷runc': `${(hr.cpuMs! / wr.cpuMs!).toFixed(1)}×, ${rr ? `${(rr.cpuMs! / wr.cpuMs!).toFixed(1)}×` : 'n/a'}`,
        });
      }
      if (bundle) await rm(bundle, { recursive: true, force: true });
    }
    console.log('\n# FnCall invocations (targets: python3 via the zygote >= 3x host and >= 10x runc, C >= 10x runc, p99/p50 at c=64 <= 5)');
    printTable(rows);
    if (process.env.BENCH_LANGUAGES !== '0') results.languages = await benchLanguages(client, dataDir, work);
    if (process.env.BENCH_NETNS !== '0') results.netns = await benchNetns(client, py, dataDir);
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
