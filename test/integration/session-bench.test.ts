/**
 * Micro benchmark: round trips of `true` through ShellSession.run()
 * (gateway -> holder -> bash -> holder -> gateway, over the holder's unix socket).
 * The budget for holder + shell is well under 1 ms; the assertion is loose so a
 * busy 2-core CI machine does not flake, the numbers are printed.
 */
import test from 'ava';
import os from 'node:os';
import { openSession } from './session-fixture';

const ITERATIONS = 300;

function pct(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;
}

test.serial(`round trip of \`true\` through run(), ${ITERATIONS} iterations`, async (t) => {
  const { session } = await openSession(t);
  for (let i = 0; i < 20; i++) await session.run(`w${i}`, 'true'); // warm up
  const ms: number[] = [];
  for (let i = 0; i < ITERATIONS; i++) {
    const t0 = process.hrtime.bigint();
    const r = await session.run(`b${i}`, 'true');
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    if (r.exitCode !== 0) t.fail(`iteration ${i}: exit ${r.exitCode}`);
  }
  ms.sort((a, b) => a - b);
  const p50 = pct(ms, 0.5);
  const p99 = pct(ms, 0.99);
  const line = `session run('true'): p50 ${p50.toFixed(3)} ms, p99 ${p99.toFixed(3)} ms, max ${ms[ms.length - 1]!.toFixed(3)} ms ` +
    `(n=${ITERATIONS}, node ${process.version}, ${os.cpus().length} cpus, loadavg ${os.loadavg()[0]!.toFixed(2)})`;
  t.log(line);
  console.log(line);
  t.true(p50 < 3, `p50 ${p50} ms`);
});
