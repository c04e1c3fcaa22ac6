/**
 * npm run bench: create -> first exec latency (concurrency 1 and 16), with prepared sandboxes
 * (the default) and with every create spawning (`--prepared 0`), against `runc run` of the same
 * rootfs in the same run, exec round trip through a
 * shell WebSocket, and idle density (host memory per idle sandbox, time to create and delete
 * them all, create latency with none and with all of them alive, list and exec at that size).
 * BENCH_DENSITY=10000 (any value from 2000 on) runs the density section alone.
 *
 * Everything goes through the real gateway on loopback with the SDK, as a user
 * would see it. Conditions are printed first; results are printed as a table
 * and written as JSON to bench/results/create-exec.json.
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { WarrenClient } from '../src/sdk';
import { percentile, printTable, conditions } from './stats';
import { startGateway } from './gateway';

const execFileP = promisify(execFile);

const ITERATIONS = Number(process.env.BENCH_ITERATIONS ?? 200);
const DENSITY = Number(process.env.BENCH_DENSITY ?? 500);
const RTT_ITERATIONS = Number(process.env.BENCH_RTT ?? 500);
const IMAGE = process.env.BENCH_IMAGE ?? 'default';

async function runPool<T>(count: number, concurrency: number, fn: (i: number) => Promise<T>): Promise<T[]> {
  const out: T[] = new Array(count);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(concurrency, count) }, async () => {
      for (;;) {
        const i = next++;
        if (i >= count) return;
        out[i] = await fn(i);
      }
    }),
  );
  return out;
}

async function warrenCreateExec(client: WarrenClient, concurrency: number, iterations = ITERATIONS) {
  const firstExec: number[] = [];
  const fullCycle: number[] = [];
  const began = performance.now();
  await runPool(iterations, concurrency, async () => {
    const t0 = performance.now();
    const sb = await client.createSandbox({ image: IMAGE, cpu: 1, memoryMb: 256 });
    const r = await sb.exec(['true']);
    const t1 = performance.now();
    if (r.exitCode !== 0) throw new Error(`exec failed: ${JSON.stringify(r)}`);
    await client.deleteSandbox(sb.id);
    firstExec.push(t1 - t0);
    fullCycle.push(performance.now() - t0);
  });
  return { firstExec, fullCycle, perSecond: (iterations * 1000) / (performance.now() - began) };
}

/** An OCI bundle over the same (read-only) rootfs the Warren image uses. */
function prepareRuncBundle(rootfs: string): string {
  const bundle = mkdtempSync(join(os.tmpdir(), 'warren-bench-runc-'));
  execFileSync('runc', ['spec', '--bundle', bundle]);
  const config = JSON.parse(readFileSync(join(bundle, 'config.json'), 'utf8'));
  config.root = { path: rootfs, readonly: true };
  config.process.terminal = false;
  config.process.args = ['true'];
  config.linux.resources = { memory: { limit: 256 * 1024 * 1024 }, cpu: { quota: 100000, period: 100000 }, pids: { limit: 1024 } };
  writeFileSync(join(bundle, 'config.json'), JSON.stringify(config));
  return bundle;
}

async function runcRun(bundle: string, concurrency: number) {
  const samples: number[] = [];
  await runPool(ITERATIONS, concurrency, async (i) => {
    const id = `wbench-${process.pid}-${i}`;
    const t0 = performance.now();
    await execFileP('runc', ['run', '--bundle', bundle, id], { timeout: 60_000 });
    samples.push(performance.now() - t0);
  });
  return samples;
}

async function shellRoundTrip(client: WarrenClient) {
  const sb = await client.createSandbox({ image: IMAGE });
  const shell = await sb.shell({ mode: 'command' });
  for (let i = 0; i < 20; i++) await shell.run('true');
  const samples: number[] = [];
  for (let i = 0; i < RTT_ITERATIONS; i++) {
    const t0 = performance.now();
    const r = await shell.run('true');
    samples.push(performance.now() - t0);
    if (r.exitCode !== 0) throw new Error('true failed');
  }
  await shell.close();
  await client.deleteSandbox(sb.id);
  return samples;
}

function memAvailableBytes(): number {
  const m = /MemAvailable:\s+(\d+) kB/.exec(readFileSync('/proc/meminfo', 'utf8'));
  return Number(m![1]) * 1024;
}

function rssBytes(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

const IDLE_SPEC = { image: IMAGE, cpu: 0.1, memoryMb: 64, priority: 'idle' as const };

/** create → delete cycles one at a time: the create latency at the node's current population. */
async function createLatency(client: WarrenClient, n: number): Promise<number[]> {
  const out: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const sb = await client.createSandbox(IDLE_SPEC);
    out.push(performance.now() - t0);
    await client.deleteSandbox(sb.id);
  }
  return out;
}

async function idleDensity(client: WarrenClient, gatewayPid: number) {
  const atZero = await createLatency(client, 30);
  execFileSync('sync');
  writeFileSync('/proc/sys/vm/drop_caches', '3');
  await new Promise((r) => setTimeout(r, 500));
  const before = memAvailableBytes();
  const rssBefore = rssBytes(gatewayPid);
  const ids: string[] = [];
  const t0 = performance.now();
  let lastReport = t0;
  await runPool(DENSITY, 8, async () => {
    const sb = await client.createSandbox(IDLE_SPEC);
    ids.push(sb.id);
    if (performance.now() - lastReport > 10_000) {
      lastReport = performance.now();
      console.error(`  ${ids.length} sandboxes alive after ${((lastReport - t0) / 1000).toFixed(0)} s`);
    }
  });
  const createS = (performance.now() - t0) / 1000;
  await new Promise((r) => setTimeout(r, 1000));
  writeFileSync('/proc/sys/vm/drop_caches', '3');
  await new Promise((r) => setTimeout(r, 500));
  const after = memAvailableBytes();
  const rssAfter = rssBytes(gatewayPid);
  const sample = await client.getSandbox(ids[0]!);
  const alive = (await client.listSandboxes()).filter((s) => s.state === 'running').length;
  // per-node calls at this population (p50 of 10, after one warm-up: drop_caches above evicted
  // the gateway's own pages): a page of the list, the whole list, an exec
  const timed = async (fn: () => Promise<unknown>): Promise<number> => {
    await fn();
    const s: number[] = [];
    for (let i = 0; i < 10; i++) {
      const t = performance.now();
      await fn();
      s.push(performance.now() - t);
    }
    return percentile(s, 50);
  };
  const pageMs = await timed(() => client.listSandboxesPage({ limit: 100 }));
  const listMs = await timed(() => client.listSandboxes());
  const execMs = await timed(() => client.sandbox(ids[ids.length - 1]!).exec(['true']));
  const atN = await createLatency(client, 30);
  const td = performance.now();
  await runPool(ids.length, 8, (i) => client.deleteSandbox(ids[i]!));
  const deleteS = (performance.now() - td) / 1000;
  return {
    count: ids.length,
    alive,
    perSandboxBytes: (before - after) / ids.length,
    gatewayRssPerSandboxBytes: (rssAfter - rssBefore) / ids.length,
    createS,
    deleteS,
    createP50AtZero: percentile(atZero, 50),
    createP50AtN: percentile(atN, 50),
    listPageMs: pageMs,
    listAllMs: listMs,
    execAtNMs: execMs,
    sampleState: sample.state,
  };
}

/** SIGTERM, and the gateway's exit (it gives its prepared sandboxes back on the way out). */
function stopGateway(child: import('node:child_process').ChildProcess): Promise<void> {
  if (child.exitCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}

async function main() {
  const dataDir = process.env.BENCH_DATA_DIR ?? '/var/lib/warren-bench';
  mkdirSync(dataDir, { recursive: true });
  console.log('# conditions');
  for (const [k, v] of Object.entries(conditions())) console.log(`${k}: ${v}`);
  console.log(`image: ${IMAGE}; iterations: ${ITERATIONS}; density: ${DENSITY}; rtt iterations: ${RTT_ITERATIONS}`);

  // density mode (BENCH_DENSITY >= 2000): only the density section, the others would take as long again
  const densityOnly = DENSITY >= 2000;
  const rows: Array<Record<string, string>> = [];
  const results: Record<string, unknown> = {};
  if (!densityOnly) {
    // Prepared sandboxes (the default) against every create spawning (--prepared 0), one gateway
    // after the other on the same data dir, and runc once per concurrency.
    const runc: Record<number, number[]> = {};
    for (const mode of ['prepared', 'fresh'] as const) {
      const g = await startGateway(dataDir, { echo: true, args: mode === 'fresh' ? ['--prepared', '0'] : [] });
      const c = new WarrenClient({ url: g.url, token: readFileSync(join(dataDir, 'admin.token'), 'utf8').trim() });
      try {
        const image = (await c.images.list()).find((i) => i.name === IMAGE);
        if (!image) throw new Error(`image ${IMAGE} not found`);
        // warm up: layer mount, page cache, JIT (and the prepared pool's first shape)
        await warrenCreateExec(c, 1, 10);
        const rootfs = join(dataDir, 'layers', 'mnt', image.layers[image.layers.length - 1]!.replace(/^sha256:/, ''));
        if (!existsSync(join(rootfs, 'bin'))) throw new Error(`expected the mounted base layer at ${rootfs}`);
        const bundle = mode === 'fresh' && (existsSync('/usr/sbin/runc') || existsSync('/usr/bin/runc')) ? prepareRuncBundle(rootfs) : null;
        for (const concurrency of [1, 16]) {
          const w = await warrenCreateExec(c, concurrency);
          if (bundle) runc[concurrency] = await runcRun(bundle, concurrency);
          results[`${mode}-c${concurrency}`] = w;
        }
        if (bundle) await rm(bundle, { recursive: true, force: true });
      } finally {
        await c.close();
        await stopGateway(g.child);
      }
    }
    for (const concurrency of [1, 16]) {
      const r = runc[concurrency] ?? [];
      const rp50 = r.length ? percentile(r, 50) : NaN;
      for (const mode of ['prepared', 'fresh'] as const) {
        const w = results[`${mode}-c${concurrency}`] as { firstExec: number[]; fullCycle: number[]; perSecond: number };
        const wp50 = percentile(w.firstExec, 50);
        const fp50 = percentile(w.fullCycle, 50);
        rows.push({
          concurrency: String(concurrency),
          create: mode === 'prepared' ? 'prepared (default)' : 'fresh (--prepared 0)',
          'warren create→exec p50': `${wp50.toFixed(1)} ms`,
          'p99': `${percentile(w.firstExec, 99).toFixed(1)} ms`,
          'warren +delete p50': `${fp50.toFixed(1)} ms`,
          'runc run p50': `${rp50.toFixed(1)} ms`,
          'runc p99': r.length ? `${percentile(r, 99).toFixed(1)} ms` : 'n/a',
          'runc/warren (create→exec)': (rp50 / wp50).toFixed(1) + '×',
          'runc/warren (full cycle)': (rp50 / fp50).toFixed(1) + '×',
          'full cycles/s': w.perSecond.toFixed(0),
        });
        results[`${mode}-c${concurrency}`] = {
          warrenFirstExecP50: wp50,
          warrenFirstExecP99: percentile(w.firstExec, 99),
          warrenFullCycleP50: fp50,
          runcP50: rp50,
          runcP99: r.length ? percentile(r, 99) : null,
          fullCyclesPerSecond: w.perSecond,
        };
      }
    }
  }

  // The gateway runs in its own process, as in production: the client's work does not share its event loop.
  const warren = await startGateway(dataDir, { echo: true });
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url: warren.url, token });
  try {
    if (!densityOnly) {
      console.log('\n# create → first exec (through the REST API, SDK on loopback)');
      printTable(rows);

      const rtt = await shellRoundTrip(client);
      console.log('\n# exec round trip of `true` through a shell WebSocket (command mode)');
      printTable([{ iterations: String(rtt.length), p50: `${percentile(rtt, 50).toFixed(2)} ms`, p99: `${percentile(rtt, 99).toFixed(2)} ms` }]);
      results.shellRtt = { p50: percentile(rtt, 50), p99: percentile(rtt, 99) };
    }

    const d = await idleDensity(client, warren.child.pid!);
    console.log(`\n# idle density (${d.count} idle \`${IMAGE}\` sandboxes, memoryMb 64, priority idle, alive at once; created 8 at a time)`);
    printTable([
      {
        sandboxes: String(d.alive),
        'host memory per sandbox': `${(d.perSandboxBytes / 1024 / 1024).toFixed(2)} MiB`,
        'of it gateway RSS': `${(d.gatewayRssPerSandboxBytes / 1024).toFixed(1)} KiB`,
        'time to create all': `${d.createS.toFixed(1)} s`,
        'create p50 at 0 alive': `${d.createP50AtZero.toFixed(1)} ms`,
        [`create p50 at ${d.count} alive`]: `${d.createP50AtN.toFixed(1)} ms`,
        'list page (100)': `${d.listPageMs.toFixed(1)} ms`,
        'list all': `${d.listAllMs.toFixed(0)} ms`,
        'exec at N': `${d.execAtNMs.toFixed(1)} ms`,
        'delete all': `${d.deleteS.toFixed(1)} s`,
      },
    ]);
    results.density = d;

    mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
    const name = densityOnly ? `create-exec-density-${DENSITY}.json` : 'create-exec.json';
    writeFileSync(join(__dirname, '..', '..', 'bench', 'results', name), JSON.stringify({ conditions: conditions(), results }, null, 2));
  } finally {
    for (const s of await client.listSandboxes().catch(() => [])) await client.deleteSandbox(s.id).catch(() => undefined);
    await client.close();
    warren.child.kill('SIGTERM');
  }
}


main().catch((err) => {
  console.error(err);
  process.exit(1);
});
