/**
 * npm run bench:lifecycle — the economics of pause and pack, side by side in one run:
 *
 *  1. pause/resume latency and memory released for a sandbox holding 256 MiB of
 *     anonymous memory (a static program filling it with a pattern), with a
 *     zram swap device set up for the run and removed afterwards, side by side
 *     with the raw kernel floor (the benchmark itself writes the freezer and
 *     memory.limit_in_bytes of the same cgroup, into the same zram); plus the
 *     time from resume until all 256 MiB are resident again: without prefetch
 *     (floor, and Warren with WARREN_RESUME_PREFETCH=off) that is the program
 *     re-reading every page; with prefetch (touch, willneed) it is the resume's
 *     background prefetch finishing, after which the program re-reads;
 *  2. pack_diff throughput (MB/s of diff) for a 200 MB diff (half random, half
 *     text files), with how long the sandbox was frozen for the copy;
 *  3. start latency (create + first exec) from a packed environment vs from
 *     the base image it was packed on, interleaved.
 *
 * Runs against the node (ShimNode) in-process, as the gateway does; needs root.
 * Conditions first, then tables; JSON goes to bench/results/lifecycle.json.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { readFileSync, writeFileSync as writeNow } from 'node:fs';
import { native } from '../src/native';
import { type PrefetchMode, prefetchDone, swapTotalBytes } from '../src/shim/lifecycle/memory';
import { memhogBinary, withZramSwap } from '../test/integration/lifecycle-fixture';
import { openTestShim, spec } from '../test/helpers/warren';
import { rm } from 'node:fs/promises';
import { conditions, percentile, printTable } from './stats';

const MIB = 1024 * 1024;
const PAUSES = Number(process.env.BENCH_PAUSES ?? 5);
const STARTS = Number(process.env.BENCH_STARTS ?? 20);
const DIFF_MB = Number(process.env.BENCH_DIFF_MB ?? 200);
const HOG_MB = Number(process.env.BENCH_HOG_MB ?? 256);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const ms = (x: number) => x.toFixed(1);
const mib = (x: number) => (x / MIB).toFixed(1);

async function main(): Promise<void> {
  const cond: Record<string, string> = { ...conditions(), swapBefore: `${mib(swapTotalBytes())} MiB`, zram: '1536 MiB device for this run', hog: `${HOG_MB} MiB anonymous`, diff: `${DIFF_MB} MB`, compression: 'lz4 (pack default)' };
  const results: Record<string, unknown> = { conditions: cond };

  await withZramSwap(1536, async (swap) => {
    cond.zram = `/dev/zram${swap.state!.device} ${mib(swap.state!.sizeBytes)} MiB, ${swap.state!.algorithm}, swap priority 100`;
    console.log('# conditions');
    for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
    const { shim, dataDir } = await openTestShim({ nodeId: `b${process.pid.toString(36)}` });
    const cleanup: string[] = [];
    try {
      // ---------------------------------------------------------------- 1. pause / resume
      const sb = await shim.createSandbox(spec({ memoryMb: HOG_MB + 256 }));
      cleanup.push(sb.id);
      await shim.writeFile(sb.id, '/bin/memhog', memhogBinary(), 0o755);
      const rows: Array<Record<string, string>> = [];
      const byMode: Record<string, { pause: number[]; resume: number[]; resident: number[]; reread: number[] }> = {};
      const layout = native.cgroupLayout();
      const memDir = join(layout.roots.memory ?? layout.roots.unified ?? '', sb.id);
      const frzDir = join(layout.roots.freezer ?? layout.roots.unified ?? '', sb.id);
      const limitBytes = (HOG_MB + 256) * MIB;
      const usage = () => Number(readFileSync(join(memDir, layout.version === 1 ? 'memory.usage_in_bytes' : 'memory.current'), 'utf8'));
      /** The kernel floor: freezer + reclaim into the same zram, written here directly (cgroup v1 files). */
      const floorPause = async (): Promise<{ ms: number; before: number; after: number }> => {
        const before = usage();
        const t0 = performance.now();
        writeNow(join(frzDir, 'freezer.state'), 'FROZEN');
        while (readFileSync(join(frzDir, 'freezer.state'), 'utf8').trim() !== 'FROZEN') await sleep(0);
        // as the kernel allows: EBUSY while it is still making progress is asked again (as pause does)
        for (let last = Infinity, i = 0; ; i++) {
          try {
            writeNow(join(memDir, 'memory.limit_in_bytes'), String(MIB));
            break;
          } catch {
            const u = usage();
            if (i < 8 && last - u > 4 * MIB) {
              last = u;
              continue;
            }
            writeNow(join(memDir, 'memory.limit_in_bytes'), String(Math.ceil((u + MIB) / 65536) * 65536));
            break;
          }
        }
        return { ms: performance.now() - t0, before, after: usage() };
      };
      const floorResume = (): number => {
        const t0 = performance.now();
        writeNow(join(memDir, 'memory.limit_in_bytes'), String(limitBytes));
        writeNow(join(frzDir, 'freezer.state'), 'THAWED');
        return performance.now() - t0;
      };
      const reread = async (): Promise<number> => {
        const t0 = performance.now();
        const check = await shim.exec(sb.id, { cmd: 'kill -USR1 $(pidof memhog); while ! grep -qE "ok|bad" /tmp/hog; do usleep 2000; done; cat /tmp/hog; echo ready > /tmp/hog' });
        const back = performance.now() - t0;
        if (check.stdout.split('\n')[0] !== 'ok') throw new Error(`memory came back corrupted: ${check.stdout}`);
        return back;
      };
      const modes: Array<'floor' | PrefetchMode> = layout.version === 1 ? ['floor', 'off', 'touch', 'willneed'] : ['off', 'touch', 'willneed'];
      // Page contents decide what zram costs: a third random (compresses ~3x, like typical heaps) and fully random.
      for (const randomPct of [33, 100]) {
        await shim.exec(sb.id, { cmd: `kill $(pidof memhog) 2>/dev/null; while pidof memhog >/dev/null; do usleep 10000; done; rm -f /tmp/hog; (memhog ${HOG_MB} /tmp/hog ${randomPct} >/dev/null 2>&1 &)` });
        while ((await shim.exec(sb.id, { cmd: 'cat /tmp/hog 2>/dev/null' })).stdout !== 'ready\n') await sleep(50);
        // interleaved, so every mode sees the same machine
        for (let i = 0; i < PAUSES; i++) {
          for (const mode of modes) {
            let pauseMs: number, resumeMs: number, residentMs: number, rereadMs: number, before: number, after: number;
            let residentBytes = 0;
            if (mode === 'floor') {
              const p = await floorPause();
              ({ before, after } = p);
              pauseMs = p.ms;
              resumeMs = floorResume();
              rereadMs = await reread();
              residentMs = resumeMs + rereadMs;
              residentBytes = usage();
            } else {
              process.env.WARREN_RESUME_PREFETCH = mode;
              const p = await shim.pauseSandbox(sb.id);
              before = p.memoryBeforeBytes;
              after = p.memoryAfterBytes;
              pauseMs = p.durationMs;
              const t0 = performance.now();
              const r = await shim.resumeSandbox(sb.id);
              resumeMs = r.durationMs;
              const pf = mode === 'off' ? undefined : prefetchDone(sb.id);
              if (pf !== undefined) {
                await pf;
                residentMs = performance.now() - t0;
                residentBytes = usage();
                rereadMs = await reread();
              } else {
                rereadMs = await reread();
                residentMs = performance.now() - t0;
                residentBytes = usage();
              }
            }
            const m = (byMode[`${randomPct}% ${mode}`] ??= { pause: [], resume: [], resident: [], reread: [] });
            m.pause.push(pauseMs);
            m.resume.push(resumeMs);
            m.resident.push(residentMs);
            m.reread.push(rereadMs);
            rows.push({
              pages: `${randomPct}% random`,
              run: String(i + 1),
              mode: mode === 'floor' ? 'kernel floor' : `warren, prefetch ${mode}`,
              'before MiB': mib(before),
              'after MiB': mib(after),
              'pause ms': ms(pauseMs),
              'resume ms': ms(resumeMs),
              'all resident ms': ms(residentMs),
              'resident MiB': mib(residentBytes),
              [`re-read ${HOG_MB} MiB ms`]: ms(rereadMs),
            });
          }
        }
      }
      delete process.env.WARREN_RESUME_PREFETCH;
      console.log(`\n# pause / resume (${HOG_MB} MiB held; cgroup ${cond.cgroup}; kernel floor = the benchmark writes freezer.state FROZEN + memory.limit_in_bytes 1 MiB itself, resume = limit back + THAWED; all resident = from the resume call until every page is resident: the program's re-read without prefetch, the background prefetch with it; re-read = the program touching every page afterwards, checking the pattern)`);
      printTable(rows);
      const summary = Object.entries(byMode).map(([k, v]) => {
        const floor = byMode[`${k.split(' ')[0]} floor`];
        return {
          'pages / mode': k,
          'pause p50 ms': ms(percentile(v.pause, 50)),
          'pause ÷ floor': floor ? (percentile(v.pause, 50) / percentile(floor.pause, 50)).toFixed(2) : '-',
          'resume p50 ms': ms(percentile(v.resume, 50)),
          'all resident p50 ms': ms(percentile(v.resident, 50)),
          're-read p50 ms': ms(percentile(v.reread, 50)),
        };
      });
      console.log('\n# pause / resume summary (p50 per mode; targets: pause within 1.5x of the floor, all resident <= 300 ms for 256 MiB)');
      printTable(summary);
      results.pause = { runs: byMode, summary };

      if (process.env.BENCH_PAUSE_ONLY === '1') return;
      // ---------------------------------------------------------------- 2. pack_diff throughput
      const half = Math.floor(DIFF_MB / 2);
      const builder = await shim.createSandbox(spec({ memoryMb: 512 }));
      cleanup.push(builder.id);
      const filled = await shim.exec(builder.id, {
        cmd: `mkdir -p /root/data/rand /root/data/text && for i in $(seq 1 ${half}); do head -c 1000000 /dev/urandom > /root/data/rand/f$i; done && for i in $(seq 1 ${DIFF_MB - half}); do yes "the quick brown fox jumps over the lazy dog $i" | head -c 1000000 > /root/data/text/t$i; done && sync && du -sm /root/data`,
        timeoutMs: 600_000,
      });
      if (filled.exitCode !== 0) throw new Error(`filling the diff failed: ${filled.stderr}`);
      const packRows: Array<Record<string, string>> = [];
      const packs: Record<string, unknown>[] = [];
      for (const compression of ['lz4', 'none'] as const) {
        const t0 = performance.now();
        const r = await shim.packSandbox(builder.id, { name: `bench-env-${compression}`, compression }, 'bench');
        const total = performance.now() - t0;
        packs.push({ compression, diffBytes: r.diffBytes, durationMs: total, frozenMs: r.frozenMs, layerBytes: r.image.sizeBytes });
        packRows.push({
          compression,
          'diff MB': (r.diffBytes / 1e6).toFixed(1),
          'total ms': ms(total),
          'MB/s': (r.diffBytes / 1e6 / (total / 1000)).toFixed(1),
          'frozen ms (copy)': ms(r.frozenMs),
        });
      }
      console.log(`\n# pack_diff (${DIFF_MB} MB diff: ${half} MB random + ${DIFF_MB - half} MB text; copy frozen, scrub through overlay, mkfs.erofs, register)`);
      printTable(packRows);
      results.pack = packs;

      // ---------------------------------------------------------------- 3. start latency
      const small = await shim.createSandbox(spec());
      cleanup.push(small.id);
      await shim.exec(small.id, { cmd: 'mkdir -p /root/app && for i in $(seq 1 200); do echo "file $i" > /root/app/f$i; done' });
      await shim.packSandbox(small.id, { name: 'bench-start-env' }, 'bench');
      const fromBase: number[] = [];
      const fromPacked: number[] = [];
      for (let i = 0; i < STARTS; i++) {
        for (const [image, sink] of [
          ['busybox', fromBase],
          ['bench-start-env', fromPacked],
        ] as const) {
          const t0 = performance.now();
          const s = await shim.createSandbox(spec({ image }));
          await shim.exec(s.id, { cmd: ['true'] });
          sink.push(performance.now() - t0);
          await shim.deleteSandbox(s.id);
        }
      }
      console.log(`\n# start latency, create + first exec (${STARTS} each, interleaved; packed env = base + 1 pack layer)`);
      printTable([
        { from: 'base image (busybox, 1 layer)', p50: ms(percentile(fromBase, 50)), p90: ms(percentile(fromBase, 90)), 'ratio p50': '1.00' },
        { from: 'packed environment (2 layers)', p50: ms(percentile(fromPacked, 50)), p90: ms(percentile(fromPacked, 90)), 'ratio p50': (percentile(fromPacked, 50) / percentile(fromBase, 50)).toFixed(2) },
      ]);
      results.start = { fromBaseMs: fromBase, fromPackedMs: fromPacked };
    } finally {
      for (const id of cleanup) await shim.deleteSandbox(id).catch(() => undefined);
      await shim.close();
      shim.layers.unmountUnused();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
  mkdirSync(join(__dirname, '../../bench/results'), { recursive: true });
  writeFileSync(join(__dirname, '../../bench/results/lifecycle.json'), JSON.stringify(results, null, 2));
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
