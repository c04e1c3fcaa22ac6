/**
 * npm run bench:microvm — microVM sandboxes against container sandboxes, in one run:
 *
 *  1. create -> first exec (p50/p99), interleaved: container, microvm restored
 *     from its template snapshot (the default), microvm booted (templates off,
 *     a second node in the same process); the template's one-time build is
 *     reported apart;
 *  2. exec round trip: one-shot exec and a command in a shell session;
 *  3. host memory per idle microVM, restored and booted: the VMM's cgroup and
 *     the host's MemAvailable drop per VM (shared pages counted once) for N
 *     microVMs on the same layer files (read-only virtio-blk; pmem/DAX is not
 *     available on QEMU 7.2's microvm machine, so there is no DAX column);
 *  4. pause (snapshot to disk + end the VMM) / resume latency and bytes with
 *     256 MiB of guest memory touched.
 *
 * Conditions (accelerator, load) are printed first; JSON to bench/results/microvm.json.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { microvmAccelerator, microvmBackendStatus } from '../src/features';
import { native } from '../src/native';
import { openTestShim, spec } from '../test/helpers/warren';
import { conditions, percentile, printTable } from './stats';

const MIB = 1024 * 1024;
const STARTS = Number(process.env.BENCH_STARTS ?? 5);
const IDLE_VMS = Number(process.env.BENCH_IDLE_VMS ?? 3);
const EXECS = Number(process.env.BENCH_EXECS ?? 20);
const ms = (x: number) => x.toFixed(0);
const mib = (x: number) => (x / MIB).toFixed(1);

async function main(): Promise<void> {
  const status = microvmBackendStatus();
  if (!status.available) {
    console.log(`microvm backend unavailable: ${status.reason}`);
    process.exitCode = 1;
    return;
  }
  const accel = microvmAccelerator();
  const cond: Record<string, string> = { ...conditions(), accelerator: `${accel.accel} (${accel.why})`, guest: '192 MiB, 1 vCPU, busybox image', loadavg: require('node:os').loadavg().map((x: number) => x.toFixed(1)).join(' ') };
  console.log('# conditions');
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
  const results: Record<string, unknown> = { conditions: cond };
  const builds: string[] = [];
  const { shim } = await openTestShim({ nodeId: `m${process.pid.toString(36)}`, log: (l) => void (/template \S+ built/.test(l) && builds.push(l)) });
  process.env.WARREN_MICROVM_TEMPLATES = '0';
  const { shim: booting } = await openTestShim({ nodeId: `b${process.pid.toString(36)}` });
  delete process.env.WARREN_MICROVM_TEMPLATES;
  const vmSpec = () => spec({ backend: 'microvm', memoryMb: 192, diskMb: 64 });
  const live: string[] = [];
  try {
    // the shape's template, built once (what the first create of a shape pays)
    const t0 = performance.now();
    const first = await shim.createSandbox(vmSpec());
    const firstMs = performance.now() - t0;
    await shim.deleteSandbox(first.id);
    console.log(`\n# template build: first create of the shape ${ms(firstMs)} ms (${builds.join('; ')})`);
    results.firstCreateMs = firstMs;

    // 1. create -> first exec
    const times: Record<string, number[]> = { container: [], 'microvm (restored)': [], 'microvm (booted)': [] };
    for (let i = 0; i < STARTS; i++) {
      for (const row of Object.keys(times)) {
        const node = row === 'microvm (booted)' ? booting : shim;
        const t0 = performance.now();
        const sb = await node.createSandbox(row === 'container' ? spec() : vmSpec());
        await node.exec(sb.id, { cmd: ['true'] });
        times[row]!.push(performance.now() - t0);
        await node.deleteSandbox(sb.id);
      }
    }
    const rows = Object.entries(times).map(([b, v]) => ({ backend: b, n: String(v.length), p50: `${ms(percentile(v, 50))} ms`, p99: `${ms(percentile(v, 99))} ms` }));
    console.log('\n# create -> first exec');
    printTable(rows);
    results.createToFirstExec = times;

    // 3. memory per idle microVM, booted and restored (booted first: the restored set is the one kept for 2 and 4)
    const idle: Record<string, { cgroup: number[]; availablePerVm: number }> = {};
    let vms: { id: string }[] = [];
    for (const [row, node] of [['booted', booting], ['restored', shim]] as const) {
      const before = memAvailable();
      vms = [];
      for (let i = 0; i < IDLE_VMS; i++) {
        const sb = await node.createSandbox(vmSpec());
        await node.exec(sb.id, { cmd: ['true'] });
        vms.push(sb);
      }
      await new Promise((r) => setTimeout(r, 5000));
      idle[row] = { cgroup: vms.map((v) => native.cgroupStats(v.id).memoryCurrentBytes), availablePerVm: (before - memAvailable()) / IDLE_VMS };
      if (row === 'booted') for (const v of vms) await node.deleteSandbox(v.id);
      else live.push(...vms.map((v) => v.id));
    }
    console.log(`\n# host memory per idle microVM (${IDLE_VMS} microVMs at once on the same layer files, virtio-blk read-only; 192 MiB guests)`);
    printTable(Object.entries(idle).map(([row, m]) => ({ microVM: row, 'cgroup (mean)': `${mib(m.cgroup.reduce((a, b) => a + b, 0) / m.cgroup.length)} MiB`, 'MemAvailable drop per VM': `${mib(m.availablePerVm)} MiB` })));
    results.idleMemory = idle;

    // 2. exec round trip (a restored microVM)
    const one: number[] = [];
    for (let i = 0; i < EXECS; i++) {
      const t0 = performance.now();
      await shim.exec(vms[0]!.id, { cmd: ['true'] });
      one.push(performance.now() - t0);
    }
    const sess = await shim.openSession(vms[0]!.id, { mode: 'command' });
    const inSession: number[] = [];
    for (let i = 0; i < EXECS; i++) {
      const t0 = performance.now();
      await sess.run(`b${i}`, 'true', 30_000);
      inSession.push(performance.now() - t0);
    }
    await sess.close();
    console.log('\n# exec round trip (microvm)');
    printTable([
      { path: 'exec (agent)', p50: `${ms(percentile(one, 50))} ms`, p99: `${ms(percentile(one, 99))} ms` },
      { path: 'shell session command', p50: `${ms(percentile(inSession, 50))} ms`, p99: `${ms(percentile(inSession, 99))} ms` },
    ]);
    results.execRoundTrip = { exec: one, session: inSession };

    // 4. pause / resume with 256 MiB touched
    const big = await shim.createSandbox(spec({ backend: 'microvm', memoryMb: 512, diskMb: 64 }));
    live.push(big.id);
    await shim.exec(big.id, { cmd: 'mkdir -p /dev/shm && mount -o remount,size=300m /dev/shm 2>/dev/null; head -c 268435456 /dev/urandom > /dev/shm/touched' , timeoutMs: 300_000 });
    const p = await shim.pauseSandbox(big.id);
    const r = await shim.resumeSandbox(big.id);
    console.log('\n# pause (snapshot to disk + end VMM) / resume, 512 MiB guest with 256 MiB of random data touched');
    printTable([{ pause: `${p.durationMs} ms`, written: `${mib(p.writtenBytes ?? 0)} MiB`, released: `${mib(p.releasedBytes)} MiB`, resume: `${ms(r.durationMs)} ms` }]);
    results.pauseResume = { pause: p, resume: r };
  } finally {
    for (const id of live) await shim.deleteSandbox(id).catch(() => undefined);
    for (const node of [shim, booting]) {
      for (const s of node.listSandboxes()) await node.deleteSandbox(s.id).catch(() => undefined);
      await node.close();
      node.layers.unmountUnused();
    }
  }
  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'microvm.json'), JSON.stringify(results, null, 2));
}

function memAvailable(): number {
  return Number(/^MemAvailable:\s+(\d+) kB/m.exec(readFileSync('/proc/meminfo', 'utf8'))![1]) * 1024;
}

void main();
