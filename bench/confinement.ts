/**
 * npm run bench:confinement — the cost of confinement (seccomp, Landlock, rlimits), side by side in one run.
 *
 * The same create and exec paths run with and without confinement, interleaved (A, B, A, B, ...)
 * so drift on a busy host hits both equally:
 *
 *   create: cgroup + sandbox dir (+ the tmpfs disk quota when confined) + spawnSandbox
 *           (+ seccomp, Landlock, rlimits on pid 1) + first exec of `true` + teardown timing excluded
 *   exec:   round trip of `true` in a running sandbox (+ seccomp, Landlock, rlimits on the child)
 *
 * Target: confinement adds at most 15% (median). Conditions are printed first; results go to
 * bench/results/confinement.json.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { activeEnforcer } from '../src/features';
import { helperBinary, native } from '../src/native';
import type { ConfineSpec } from '../src/native/types';
import { confineFor } from '../src/security/confinement';
import { ShimNode } from '../src/shim/node';
import { openDatabase } from '../src/state/db';
import { conditions, percentile, printTable } from './stats';

const ITER = Number(process.env.BENCH_ITERATIONS ?? 60);
const EXEC_ITER = Number(process.env.BENCH_EXEC ?? 400);
const IMAGE = process.env.BENCH_IMAGE ?? 'default';

function exitOf(pidfd: number): Promise<void> {
  return new Promise((res) => native.watchExit(pidfd, () => res()));
}

async function execTrue(id: string, pid: number, confine: ConfineSpec | null): Promise<number> {
  const t0 = performance.now();
  const p = native.exec({ initPid: pid, cgroup: id, argv: ['/bin/true'], env: ['PATH=/usr/bin:/bin'], cwd: '/', uid: 0, gid: 0, schedIdle: false, confine });
  await exitOf(p.pidfd);
  const dt = performance.now() - t0;
  native.close(p.pidfd);
  for (const fd of [p.stdin, p.stdout, p.stderr]) if (fd !== undefined) native.close(fd);
  return dt;
}

async function main(): Promise<void> {
  const dataDir = process.env.BENCH_DATA_DIR ?? '/var/tmp/warren-bench-confinement';
  mkdirSync(dataDir, { recursive: true });
  const shim = new ShimNode({ dataDir, db: openDatabase(join(dataDir, 'warren.db')), ensureDefaultImage: IMAGE === 'default', nodeId: 'bconf' });
  await shim.start();
  const image = shim.layers.resolveImage(IMAGE);
  const layers = await shim.layers.acquire(image.layers);
  const enforcer = activeEnforcer();
  const confine = confineFor('warren-default');
  const work = mkdtempSync(join(os.tmpdir(), 'warren-bench-conf-'));

  console.log('# confinement cost');
  for (const [k, v] of Object.entries({ ...conditions(), image: `${IMAGE} (${layers.length} layer(s))`, enforcer: enforcer.description, confine: JSON.stringify(confine), iterations: `${ITER} creates, ${EXEC_ITER} execs per mode` })) console.log(`- ${k}: ${v}`);

  let n = 0;
  async function create(confined: boolean): Promise<{ create: number; first: number }> {
    const id = `bconf-${process.pid}-${n++}`;
    const dir = join(work, id);
    const t0 = performance.now();
    mkdirSync(dir, { mode: 0o700 });
    if (confined) native.mount('tmpfs', dir, 'tmpfs', ['nosuid', 'nodev'], 'size=2048m,nr_inodes=524288,mode=0700');
    for (const d of ['upper', 'work', 'rootfs']) mkdirSync(join(dir, d));
    native.cgroupCreate(id, { cpuQuotaUs: 100_000, cpuPeriodUs: 100_000, memoryBytes: 256 << 20, memorySwapBytes: 256 << 20, pidsMax: 1024 });
    const proc = native.spawnSandbox({
      id, hostname: id, lowerDirs: layers.map((l) => l.path), upperDir: join(dir, 'upper'), workDir: join(dir, 'work'), rootfsDir: join(dir, 'rootfs'),
      initPath: helperBinary('warren-init'), network: 'loopback', schedIdle: false, coreSched: false, confine: confined ? confine : null,
    });
    const t1 = performance.now();
    await execTrue(id, proc.pid, confined ? confine : null);
    const t2 = performance.now();
    const ended = exitOf(proc.pidfd);
    native.cgroupKill(id);
    await ended;
    native.close(proc.pidfd);
    for (let i = 0; i < 500; i++) {
      try {
        native.cgroupDestroy(id);
        break;
      } catch {
        await new Promise((r) => setTimeout(r, 2));
      }
    }
    if (confined) native.umount(dir, true);
    await rm(dir, { recursive: true, force: true });
    return { create: t1 - t0, first: t2 - t0 };
  }

  // warm-up
  for (let i = 0; i < 5; i++) {
    await create(true);
    await create(false);
  }
  const res = { on: { create: [] as number[], first: [] as number[], exec: [] as number[] }, off: { create: [] as number[], first: [] as number[], exec: [] as number[] } };
  for (let i = 0; i < ITER; i++) {
    for (const mode of i % 2 === 0 ? (['on', 'off'] as const) : (['off', 'on'] as const)) {
      const r = await create(mode === 'on');
      res[mode].create.push(r.create);
      res[mode].first.push(r.first);
    }
  }

  // exec round trips in one running sandbox (pid 1 confined), children with and without
  const id = `bconf-${process.pid}-exec`;
  const dir = join(work, id);
  for (const d of ['upper', 'work', 'rootfs']) mkdirSync(join(dir, d), { recursive: true });
  native.cgroupCreate(id, { pidsMax: 1024 });
  const proc = native.spawnSandbox({ id, hostname: id, lowerDirs: layers.map((l) => l.path), upperDir: join(dir, 'upper'), workDir: join(dir, 'work'), rootfsDir: join(dir, 'rootfs'), initPath: helperBinary('warren-init'), network: 'loopback', schedIdle: false, coreSched: false, confine });
  for (let i = 0; i < 20; i++) await execTrue(id, proc.pid, i % 2 ? confine : null);
  for (let i = 0; i < EXEC_ITER; i++) {
    for (const mode of i % 2 === 0 ? (['on', 'off'] as const) : (['off', 'on'] as const)) res[mode].exec.push(await execTrue(id, proc.pid, mode === 'on' ? confine : null));
  }
  const ended = exitOf(proc.pidfd);
  native.cgroupKill(id);
  await ended;
  native.close(proc.pidfd);
  for (let i = 0; i < 500; i++) {
    try {
      native.cgroupDestroy(id);
      break;
    } catch {
      await new Promise((r) => setTimeout(r, 2));
    }
  }
  await rm(work, { recursive: true, force: true });
  shim.layers.release(image.layers);
  await shim.close();

  const rows: Array<Record<string, string>> = [];
  const out: Record<string, unknown> = {};
  for (const [metric, label] of [['create', 'create (spawn ready)'], ['first', 'create + first exec'], ['exec', 'exec round trip']] as const) {
    const on = res.on[metric];
    const off = res.off[metric];
    const p50on = percentile(on, 50);
    const p50off = percentile(off, 50);
    const added = (p50on / p50off - 1) * 100;
    rows.push({
      metric: label,
      'unconfined p50 ms': p50off.toFixed(2),
      'confined p50 ms': p50on.toFixed(2),
      'unconfined p99 ms': percentile(off, 99).toFixed(2),
      'confined p99 ms': percentile(on, 99).toFixed(2),
      'added (p50)': `${added >= 0 ? '+' : ''}${added.toFixed(1)}%`,
      'target ≤15%': added <= 15 ? 'met' : 'MISSED',
    });
    out[metric] = { unconfinedP50: p50off, confinedP50: p50on, unconfinedP99: percentile(off, 99), confinedP99: percentile(on, 99), addedPct: added, samples: on.length };
  }
  console.log('');
  printTable(rows);
  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'confinement.json'), JSON.stringify({ conditions: conditions(), enforcer: enforcer.description, confine, results: out }, null, 2));
}

main().then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
