/**
 * npm run bench:idle-reclaim — what reclaiming the cold memory of idle, running sandboxes
 * (onIdle "reclaim") saves, and what it costs when they wake, side by side in one run:
 *
 *  1. two populations of BENCH_SANDBOXES sandboxes each, created interleaved: every sandbox
 *     holds BENCH_HOG_MB of anonymous memory written once and then left alone (a third of each
 *     page random, so zram compresses it about as well as a typical heap), plus a shell loop
 *     that keeps a few pages hot. One population has `idleSeconds: BENCH_IDLE_S, onIdle:
 *     "reclaim"`, the baseline has no idle policy. Host memory is sampled every 250 ms for
 *     BENCH_WINDOW_S: the sandboxes' resident memory (memory.current), plus, for the reclaim
 *     population, what zram holds for it (its compressed pages are host memory too). The table
 *     shows the time integral of both and their ratio;
 *  2. the wake cost: the first exec in each sandbox afterwards, and the time for its program
 *     to read every page of its memory again (swapped-in from zram vs. resident).
 *
 * A zram swap device is set up for the run and removed afterwards. Runs against the node
 * (ShimNode) in-process, as the gateway does; needs root. Conditions first, then tables;
 * JSON goes to bench/results/idle-reclaim.json.
 */
import { mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { native } from '../src/native';
import type { SandboxInfo } from '../src/shim/types';
import { memhogBinary, withZramSwap } from '../test/integration/lifecycle-fixture';
import { openTestShim, spec } from '../test/helpers/warren';
import { conditions, percentile, printTable } from './stats';

const MIB = 1024 * 1024;
const N = Number(process.env.BENCH_SANDBOXES ?? 12);
const HOG_MB = Number(process.env.BENCH_HOG_MB ?? 48);
const IDLE_S = Number(process.env.BENCH_IDLE_S ?? 5);
const WINDOW_S = Number(process.env.BENCH_WINDOW_S ?? 40);
const SAMPLE_MS = 250;
const mib = (x: number) => (x / MIB).toFixed(1);
const ms = (x: number) => x.toFixed(1);

async function waitUntil(cond: () => Promise<boolean>, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function main(): Promise<void> {
  const zramMb = Math.max(512, N * HOG_MB * 2);
  const cond: Record<string, string> = {
    ...conditions(),
    sandboxes: `${N} with idle reclaim after ${IDLE_S} s, ${N} without (interleaved)`,
    hog: `${HOG_MB} MiB anonymous per sandbox, written once (33% random per page), plus a shell loop writing a file every 50 ms`,
    window: `${WINDOW_S} s from the moment all are ready, sampled every ${SAMPLE_MS} ms`,
  };
  const results: Record<string, unknown> = { conditions: cond };
  await withZramSwap(zramMb, async (swap) => {
    cond.zram = `/dev/zram${swap.state!.device} ${mib(swap.state!.sizeBytes)} MiB, ${swap.state!.algorithm}`;
    console.log('# conditions');
    for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
    const { shim, dataDir } = await openTestShim({ nodeId: `b${process.pid.toString(36)}` });
    const made: SandboxInfo[] = [];
    try {
      const reclaiming: string[] = [];
      const baseline: string[] = [];
      const hog = memhogBinary();
      for (let i = 0; i < N; i++) {
        for (const [group, lifetime] of [
          [reclaiming, { idleSeconds: IDLE_S, onIdle: 'reclaim' as const }],
          [baseline, undefined],
        ] as const) {
          const sb = await shim.createSandbox(spec({ memoryMb: HOG_MB + 128, ...(lifetime ? { lifetime } : {}) }));
          made.push(sb);
          group.push(sb.id);
          await shim.writeFile(sb.id, '/bin/memhog', hog, 0o755);
          await shim.exec(sb.id, { cmd: `(memhog ${HOG_MB} /tmp/hog 33 >/dev/null 2>&1 &); (i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done >/dev/null 2>&1 &)` });
        }
      }
      for (const id of [...reclaiming, ...baseline]) {
        await waitUntil(async () => (await shim.readFile(id, '/tmp/hog', 16).catch(() => Buffer.alloc(0))).toString() === 'ready\n', 60_000, `${id} ready`);
      }
      // The requests above were activity: every clock starts from the last one.
      const resident = (ids: string[]) => ids.reduce((n, id) => n + native.cgroupStats(id).memoryCurrentBytes, 0);
      // Every zram device counts: swap spreads pages over all devices of the same priority.
      const zramUsed = () =>
        readdirSync('/sys/block')
          .filter((d) => /^zram\d+$/.test(d))
          .reduce((n, d) => {
            try {
              return n + Number(readFileSync(`/sys/block/${d}/mm_stat`, 'utf8').trim().split(/\s+/)[2] ?? 0);
            } catch {
              return n;
            }
          }, 0);
      const zramBase = zramUsed();
      const samples: Array<{ t: number; reclaim: number; baseline: number; zram: number }> = [];
      const t0 = performance.now();
      while (performance.now() - t0 < WINDOW_S * 1000) {
        const zram = Math.max(0, zramUsed() - zramBase);
        samples.push({ t: (performance.now() - t0) / 1000, reclaim: resident(reclaiming) + zram, baseline: resident(baseline), zram });
        await new Promise((r) => setTimeout(r, SAMPLE_MS));
      }
      const integral = (key: 'reclaim' | 'baseline') => samples.slice(1).reduce((s, x, i) => s + ((x[key] + samples[i]![key]) / 2) * (x.t - samples[i]!.t), 0) / MIB;
      const base = integral('baseline');
      const withReclaim = integral('reclaim');
      const reclaimed = reclaiming.map((id) => shim.getSandbox(id).lifecycle?.coldReclaim).filter((r) => r !== undefined);
      const last = samples.at(-1)!;
      console.log(`\n# host memory over ${WINDOW_S} s (${N} sandboxes each; the reclaim population includes what zram holds for it)`);
      printTable([
        { population: 'no idle policy (baseline)', 'MiB·s': base.toFixed(0), 'mean MiB': (base / WINDOW_S).toFixed(1), 'at the end, MiB': mib(last.baseline), 'per sandbox at the end': mib(last.baseline / N), ratio: '1.00' },
        {
          population: `onIdle reclaim after ${IDLE_S} s`,
          'MiB·s': withReclaim.toFixed(0),
          'mean MiB': (withReclaim / WINDOW_S).toFixed(1),
          'at the end, MiB': `${mib(last.reclaim)} (zram ${mib(last.zram)})`,
          'per sandbox at the end': mib(last.reclaim / N),
          ratio: (withReclaim / base).toFixed(2),
        },
      ]);
      console.log(`time-integrated host memory: ${((1 - withReclaim / base) * 100).toFixed(1)}% lower with idle reclaim; ${reclaimed.length} of ${N} reclaims done, p50 ${ms(percentile(reclaimed.map((r) => r!.durationMs), 50))} ms, ${mib(reclaimed.reduce((n, r) => n + r!.releasedBytes, 0) / Math.max(1, reclaimed.length))} MiB released each`);

      // ---------------------------------------------------------------- 2. wake cost
      const wake = async (ids: string[]) => {
        const firstExec: number[] = [];
        const touchAll: number[] = [];
        for (const id of ids) {
          let t = performance.now();
          await shim.exec(id, { cmd: ['true'] });
          firstExec.push(performance.now() - t);
          t = performance.now();
          const r = await shim.exec(id, { cmd: 'kill -USR1 $(pidof memhog); while ! grep -qE "ok|bad" /tmp/hog; do usleep 2000; done; cat /tmp/hog' });
          touchAll.push(performance.now() - t);
          if (r.stdout !== 'ok\n') throw new Error(`${id}: memory came back wrong: ${r.stdout}`);
        }
        return { firstExec, touchAll };
      };
      const wb = await wake(baseline);
      const wr = await wake(reclaiming);
      console.log(`\n# waking up (${N} each): the first exec, then the program reading all ${HOG_MB} MiB again`);
      printTable([
        { population: 'no idle policy (resident)', 'first exec p50 ms': ms(percentile(wb.firstExec, 50)), 'first exec p90': ms(percentile(wb.firstExec, 90)), 'read all p50 ms': ms(percentile(wb.touchAll, 50)), 'ratio read all': '1.00' },
        { population: 'after idle reclaim (from zram)', 'first exec p50 ms': ms(percentile(wr.firstExec, 50)), 'first exec p90': ms(percentile(wr.firstExec, 90)), 'read all p50 ms': ms(percentile(wr.touchAll, 50)), 'ratio read all': (percentile(wr.touchAll, 50) / percentile(wb.touchAll, 50)).toFixed(2) },
      ]);
      results.memory = { samples, integralMiBs: { baseline: base, reclaim: withReclaim }, reclaims: reclaimed };
      results.wake = { baseline: wb, reclaim: wr };
    } finally {
      for (const sb of made) await shim.deleteSandbox(sb.id).catch(() => undefined);
      await shim.close();
      shim.layers.unmountUnused();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
  mkdirSync(join(__dirname, '../../bench/results'), { recursive: true });
  writeFileSync(join(__dirname, '../../bench/results/idle-reclaim.json'), JSON.stringify(results, null, 2));
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
