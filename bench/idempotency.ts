/**
 * npm run bench:idempotency: what an idempotency key costs an exec, side by
 * side with the same exec without a key, in one run on one `warren up`
 * (loopback, the default image):
 *
 *  - round trip of `exec true` without a key (the baseline) and with a fresh
 *    key each time (the key's record is written to SQLite before the command
 *    starts and again with its result);
 *  - a retry of a finished keyed exec (the stored result is answered; nothing
 *    runs), with a small and with a 1 MiB output.
 *
 * Alternated sample by sample so that drift on the machine hits every side
 * alike. Conditions are printed first; results go to
 * bench/results/idempotency.json.
 */
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { WarrenClient } from '../src/sdk';
import { startGateway } from './gateway';
import { conditions, percentile, printTable } from './stats';

const N = Number(process.env.BENCH_N ?? 300);

async function main(): Promise<void> {
  const cond = { ...conditions(), loadavg: os.loadavg().map((l) => l.toFixed(1)).join(' '), samples: `${N} per side, alternated` };
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
  const dataDir = mkdtempSync(join(os.tmpdir(), 'warren-bench-idem-'));
  const { url, child } = await startGateway(dataDir);
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url, token });
  try {
    const sb = await client.createSandbox({});
    const big = "head -c 1048576 /dev/zero | tr '\\0' x";
    await sb.exec('true', { idempotencyKey: 'warm-small' });
    await sb.exec(big, { idempotencyKey: 'warm-big', maxOutputBytes: 2 << 20 });
    for (let i = 0; i < 20; i++) await sb.exec('true');
    const plain: number[] = [];
    const keyed: number[] = [];
    const replay: number[] = [];
    const replayBig: number[] = [];
    const bigRun: number[] = [];
    for (let i = 0; i < N; i++) {
      let t0 = performance.now();
      await sb.exec('true');
      plain.push(performance.now() - t0);
      t0 = performance.now();
      await sb.exec('true', { idempotencyKey: `k-${i}` });
      keyed.push(performance.now() - t0);
      t0 = performance.now();
      await sb.exec('true', { idempotencyKey: 'warm-small' });
      replay.push(performance.now() - t0);
      if (i % 10 === 0) {
        t0 = performance.now();
        const r = await sb.exec(big, { maxOutputBytes: 2 << 20 });
        bigRun.push(performance.now() - t0);
        if (r.stdout.length !== 1 << 20) throw new Error('big output is not 1 MiB');
        t0 = performance.now();
        const s = await sb.exec(big, { idempotencyKey: 'warm-big', maxOutputBytes: 2 << 20 });
        replayBig.push(performance.now() - t0);
        if (s.stdout.length !== 1 << 20) throw new Error('replayed output is not 1 MiB');
      }
    }
    const ms = (v: number) => `${v.toFixed(2)} ms`;
    const row = (what: string, xs: number[], base: number[]) => ({
      what,
      p50: ms(percentile(xs, 50)),
      p90: ms(percentile(xs, 90)),
      'ratio p50': (percentile(xs, 50) / percentile(base, 50)).toFixed(2),
    });
    printTable([
      row('exec true, no key (baseline)', plain, plain),
      row('exec true, a new key', keyed, plain),
      row('retry of a finished keyed exec (stored result)', replay, plain),
      row('exec of 1 MiB output, no key (baseline)', bigRun, bigRun),
      row('retry of a finished 1 MiB keyed exec', replayBig, bigRun),
    ]);
    const out = {
      conditions: cond,
      plain: { p50: percentile(plain, 50), p90: percentile(plain, 90) },
      keyed: { p50: percentile(keyed, 50), p90: percentile(keyed, 90) },
      replay: { p50: percentile(replay, 50), p90: percentile(replay, 90) },
      bigRun: { p50: percentile(bigRun, 50), p90: percentile(bigRun, 90) },
      replayBig: { p50: percentile(replayBig, 50), p90: percentile(replayBig, 90) },
    };
    mkdirSync(join(__dirname, '../../bench/results'), { recursive: true });
    writeFileSync(join(__dirname, '../../bench/results/idempotency.json'), JSON.stringify(out, null, 2));
    await client.deleteSandbox(sb.id);
  } finally {
    await client.close();
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    await rm(dataDir, { recursive: true, force: true }).catch(() => undefined);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
