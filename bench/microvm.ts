/**
 * npm run bench:microvm — microVM sandboxes against container sandboxes, in one run:
 *
 *  1. create -> first exec (p50/p99) for microvm and container, interleaved;
 *  2. exec round trip: one-shot exec and a command in a shell session;
 *  3. host memory per idle microVM (the VMM's cgroup after boot, idle) for N
 *     microVMs sharing the same layer files (read-only virtio-blk; pmem/DAX is
 *     not available on QEMU 7.2's microvm machine, so there is no DAX column);
 *  4. pause (snapshot to disk + end the VMM) / resume latency and bytes with
 *     256 MiB of guest memory touched.
 *
 * Conditions (accelerator, load) are printed first; JSON to bench/results/microvm.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
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
  const { shim } = await openTestShim({ nodeId: `m${process.pid.toString(36)}` });
  const live: string[] = [];
  try {
    // 1. create -> first exec
    const times: Record<string, number[]> = { microvm: [], container: [] };
    for (let i = 0; i < STARTS; i++) {
      for (const backend of ['container', 'microvm'] as const) {
        const t0 = performance.now();
        const sb = await shim.createSandbox(spec(backend === 'microvm' ? { backend, memoryMb: 192, diskMb: 64 } : {}));
        await shim.exec(sb.id, { cmd: ['true'] });
        times[backend]!.push(performance.now() - t0);
        await shim.deleteSandbox(sb.id);
      }
    }
    const rows = Object.entries(times).map(([b, v]) => ({ backend: b, n: String(v.length), p50: `${ms(percentile(v, 50))} ms`, p99: `${ms(percentile(v, 99))} ms` }));
    console.log('\n# create -> first exec');
    printTable(rows);
    results.createToFirstExec = times;

    // 2. exec round trip + 3. memory per idle microVM
    const vms = [];
    for (let i = 0; i < IDLE_VMS; i++) {
      const sb = await shim.createSandbox(spec({ backend: 'microvm', memoryMb: 192, diskMb: 64 }));
      live.push(sb.id);
      vms.push(sb);
    }
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
    await new Promise((r) => setTimeout(r, 5000));
    const mem = vms.map((v) => native.cgroupStats(v.id).memoryCurrentBytes);
    console.log(`\n# host memory per idle microVM (${IDLE_VMS} microVMs on the same layer files, virtio-blk read-only)`);
    printTable(mem.map((m, i) => ({ vm: String(i), memory: `${mib(m)} MiB` })).concat([{ vm: 'mean', memory: `${mib(mem.reduce((a, b) => a + b, 0) / mem.length)} MiB` }]));
    results.execRoundTrip = { exec: one, session: inSession };
    results.idleMemoryBytes = mem;

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
    await shim.close();
    shim.layers.unmountUnused();
  }
  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'microvm.json'), JSON.stringify(results, null, 2));
}

void main();
