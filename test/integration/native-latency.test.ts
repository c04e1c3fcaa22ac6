/**
 * Latency of the hot path: spawnSandbox + exec(`true`) + wait, 50 iterations.
 * Reports p50/p90 (target: p50 under 5 ms on the 2-core dev VM); it does not fail on slowness.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

import { busyboxRootfs, destroyCgroup, exitOf, execSpec, helperBinary, native, uniqueId } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';

const maybe = testUnless(rootReason);

function pct(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
}

maybe('p50 of spawnSandbox + exec(true) + wait over 50 iterations', async (t) => {
  const N = 50;
  const lower = busyboxRootfs();
  const initPath = helperBinary('warren-init');
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-native-lat-'));
  const total: number[] = [];
  const spawnMs: number[] = [];
  const execMs: number[] = [];
  const createMs: number[] = [];
  try {
    for (let i = 0; i < N + 3; i++) {
      const id = uniqueId('lat');
      const dir = path.join(base, id);
      for (const d of ['upper', 'work', 'rootfs']) fs.mkdirSync(path.join(dir, d), { recursive: true });
      const c0 = process.hrtime.bigint();
      native.cgroupCreate(id, { memoryBytes: 256 << 20, pidsMax: 256, cpuQuotaUs: 100_000, cpuPeriodUs: 100_000 });
      const t0 = process.hrtime.bigint();
      let sb: { pid: number; pidfd: number } | undefined;
      try {
        sb = native.spawnSandbox({
          id,
          hostname: id,
          lowerDirs: [lower],
          upperDir: path.join(dir, 'upper'),
          workDir: path.join(dir, 'work'),
          rootfsDir: path.join(dir, 'rootfs'),
          initPath,
          network: 'loopback',
          schedIdle: false,
          coreSched: false,
        });
        const t1 = process.hrtime.bigint();
        const p = native.exec({ ...execSpec({ pid: sb.pid, id }, ['true']), statusPipe: false });
        for (const fd of [p.stdin!, p.stdout!, p.stderr!]) native.close(fd);
        const st = await exitOf(p.pidfd);
        const t2 = process.hrtime.bigint();
        native.close(p.pidfd);
        t.is(st.exitCode, 0);
        if (i >= 3) {
          // first iterations warm caches
          createMs.push(Number(t0 - c0) / 1e6);
          spawnMs.push(Number(t1 - t0) / 1e6);
          execMs.push(Number(t2 - t1) / 1e6);
          total.push(Number(t2 - t0) / 1e6);
        }
      } finally {
        if (sb) {
          const ended = exitOf(sb.pidfd);
          native.cgroupKill(id);
          await ended;
          native.close(sb.pidfd);
        }
        await destroyCgroup(id);
        fs.rmSync(dir, { recursive: true, force: true });
      }
    }
  } finally {
    fs.rmSync(base, { recursive: true, force: true });
  }
  const line =
    `spawnSandbox+exec(true)+wait over ${N} runs: p50 ${pct(total, 50).toFixed(2)} ms, p90 ${pct(total, 90).toFixed(2)} ms ` +
    `(spawn p50 ${pct(spawnMs, 50).toFixed(2)} ms, exec+wait p50 ${pct(execMs, 50).toFixed(2)} ms; ` +
    `cgroupCreate p50 ${pct(createMs, 50).toFixed(2)} ms, not included) on ${os.cpus().length} cpus, kernel ${os.release()}`;
  t.log(line);
  console.log(`[native latency] ${line}`);
  if (pct(total, 50) > 5) t.log('NOTE: p50 is above the 5 ms target (timing is judged by npm run bench, not here)');
  t.is(total.length, N);
});
