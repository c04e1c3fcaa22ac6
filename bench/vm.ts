/**
 * npm run bench:vm — desktop vms (QEMU q35 + Xorg), with microVMs as the
 * baseline in the same run:
 *
 *  1. create -> first screenshot and create -> first exec (vm), next to a
 *     microVM's create -> first exec;
 *  2. screenshot latency and size: full-size PNG (QEMU writes it) and scaled
 *     to 512 px wide (PPM from QEMU, scaled and encoded here);
 *  3. input round trip: a typed character -> the screen has changed;
 *  4. host memory per idle desktop vm (its cgroup, after boot and 10 s idle);
 *  5. pause (snapshot to disk + end the VMM) / resume, and whether the screen
 *     after resume is the same.
 *
 * The accelerator is detected (KVM where the host can run the guest, else
 * TCG) and printed with the load. On a KVM host the same command runs there:
 * `npm run bench:vm` (WARREN_VM_ACCEL=tcg forces TCG for a side-by-side).
 * JSON to bench/results/vm.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { microvmBackendStatus, vmAccelerator, vmBackendStatus } from '../src/features';
import { native } from '../src/native';
import { openTestShim, spec } from '../test/helpers/warren';
import { conditions, percentile, printTable } from './stats';

const MIB = 1024 * 1024;
const BOOTS = Number(process.env.BENCH_BOOTS ?? 2);
const SHOTS = Number(process.env.BENCH_SHOTS ?? 20);
const KEYS = Number(process.env.BENCH_KEYS ?? 10);
const IDLE_VMS = Number(process.env.BENCH_IDLE_VMS ?? 2);
const ms = (x: number) => x.toFixed(0);
const mib = (x: number) => (x / MIB).toFixed(1);
const p = (v: number[]) => ({ n: String(v.length), p50: `${ms(percentile(v, 50))} ms`, p99: `${ms(percentile(v, 99))} ms` });

async function main(): Promise<void> {
  const status = vmBackendStatus();
  if (!status.available) {
    console.log(`vm backend unavailable: ${status.reason}`);
    process.exitCode = 1;
    return;
  }
  const accel = vmAccelerator();
  const vmSpec = () => spec({ backend: 'vm', image: 'desktop', cpu: 2, memoryMb: 512, diskMb: 1024 });
  const cond: Record<string, string> = { ...conditions(), accelerator: `${accel.accel} (${accel.why})`, guest: 'vm: 512 MiB, 2 vCPUs, 1024x768 desktop; microvm: 192 MiB, 1 vCPU', loadavg: loadavg().map((x) => x.toFixed(1)).join(' ') };
  console.log('# conditions');
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
  const results: Record<string, unknown> = { conditions: cond };
  const { shim } = await openTestShim({ nodeId: `b${process.pid.toString(36)}` });
  const live: string[] = [];
  try {
    // 1. boot
    const toShot: number[] = [];
    const toExec: number[] = [];
    const micro: number[] = [];
    const microOk = microvmBackendStatus().available;
    for (let i = 0; i < BOOTS; i++) {
      let t0 = performance.now();
      const sb = await shim.createSandbox(vmSpec());
      await shim.screenshot!(sb.id);
      toShot.push(performance.now() - t0);
      await shim.exec(sb.id, { cmd: ['true'] });
      toExec.push(performance.now() - t0);
      await shim.deleteSandbox(sb.id);
      if (microOk) {
        t0 = performance.now();
        const m = await shim.createSandbox(spec({ backend: 'microvm', memoryMb: 192, diskMb: 64 }));
        await shim.exec(m.id, { cmd: ['true'] });
        micro.push(performance.now() - t0);
        await shim.deleteSandbox(m.id);
      }
    }
    console.log('\n# boot (create returns once the desktop shows its terminal)');
    printTable([
      { path: 'vm: create -> first screenshot', ...p(toShot) },
      { path: 'vm: create -> first exec', ...p(toExec) },
      ...(microOk ? [{ path: 'microvm: create -> first exec (baseline)', ...p(micro) }] : []),
    ]);
    if (microOk) console.log(`ratio vm/microvm (p50, to first exec): ${(percentile(toExec, 50) / percentile(micro, 50)).toFixed(1)}x`);
    results.boot = { toShot, toExec, microvmToExec: micro };

    // 2. screenshots
    const vms = [];
    for (let i = 0; i < IDLE_VMS; i++) {
      const sb = await shim.createSandbox(vmSpec());
      live.push(sb.id);
      vms.push(sb);
    }
    const id = vms[0]!.id;
    const full: number[] = [];
    const scaled: number[] = [];
    let fullBytes = 0;
    let scaledBytes = 0;
    for (let i = 0; i < SHOTS; i++) {
      let t0 = performance.now();
      fullBytes = (await shim.screenshot!(id)).png.length;
      full.push(performance.now() - t0);
      t0 = performance.now();
      scaledBytes = (await shim.screenshot!(id, { width: 512 })).png.length;
      scaled.push(performance.now() - t0);
    }
    console.log('\n# screenshot');
    printTable([
      { kind: '1024x768 PNG (QEMU)', ...p(full), size: `${(fullBytes / 1024).toFixed(1)} KiB` },
      { kind: '512x384 PNG (scaled here)', ...p(scaled), size: `${(scaledBytes / 1024).toFixed(1)} KiB` },
    ]);
    results.screenshot = { full, scaled, fullBytes, scaledBytes };

    // 3. input round trip: a character typed into the terminal until the screen differs
    await shim.sendInput!(id, [{ type: 'move', x: 300, y: 200 }]);
    const rtt: number[] = [];
    for (let i = 0; i < KEYS; i++) {
      const before = (await shim.screenshot!(id)).png;
      const t0 = performance.now();
      await shim.sendInput!(id, [{ type: 'type', text: 'x' }]);
      for (;;) {
        const now = (await shim.screenshot!(id)).png;
        if (!now.equals(before)) break;
        if (performance.now() - t0 > 30_000) throw new Error('typed character never showed');
      }
      rtt.push(performance.now() - t0);
    }
    await shim.sendInput!(id, [{ type: 'key', keys: 'ctrl+u' }]);
    console.log('\n# input round trip (a typed character until the screen shows it; includes one screenshot)');
    printTable([{ action: 'type one character', ...p(rtt) }]);
    results.inputRoundTrip = rtt;

    // 4. idle memory
    await new Promise((r) => setTimeout(r, 10_000));
    const mem = vms.map((v) => native.cgroupStats(v.id).memoryCurrentBytes);
    console.log(`\n# host memory per idle desktop vm (${IDLE_VMS} vms, 512 MiB guests, cgroup of the VMM)`);
    printTable(mem.map((m, i) => ({ vm: String(i), memory: `${mib(m)} MiB` })).concat([{ vm: 'mean', memory: `${mib(mem.reduce((a, b) => a + b, 0) / mem.length)} MiB` }]));
    results.idleMemoryBytes = mem;

    // 5. pause / resume
    const shotBefore = (await shim.screenshot!(id)).png;
    const pz = await shim.pauseSandbox(id);
    const rz = await shim.resumeSandbox(id);
    const same = (await shim.screenshot!(id)).png.equals(shotBefore);
    console.log('\n# pause (snapshot to disk + end the VMM) / resume of an idle desktop vm');
    printTable([{ pause: `${pz.durationMs} ms`, written: `${mib(pz.writtenBytes ?? 0)} MiB`, released: `${mib(pz.releasedBytes)} MiB`, resume: `${ms(rz.durationMs)} ms`, 'same screen': same ? 'yes' : 'no' }]);
    results.pauseResume = { pause: pz, resume: rz, sameScreen: same };
  } finally {
    for (const id of live) await shim.deleteSandbox(id).catch(() => undefined);
    await shim.close();
    shim.layers.unmountUnused();
  }
  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'vm.json'), JSON.stringify(results, null, 2));
}

void main();
