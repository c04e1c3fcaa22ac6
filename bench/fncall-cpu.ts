/**
 * Development aid (not part of npm run bench): CPU per FnCall invocation inside one process
 * (no HTTP), split into this process's CPU (the shim's TypeScript + native calls) and the pool
 * containers' cgroup CPU, for python3 hello forked from the zygote and started fresh (cmd).
 *   node dist/bench/fncall-cpu.js [iterations]
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { openTestShim } from '../test/helpers/warren';
import { native } from '../src/native';

async function main() {
  const n = Number(process.argv[2] ?? 200);
  const { shim } = await openTestShim({ dataDir: process.env.BENCH_DATA_DIR });
  const fns = shim.functions;
  await fns.createPool({ name: 'cpu', min: 1, max: 1 } as never);
  await fns.waitWarm('cpu');
  const cgCpu = () => {
    const l = native.cgroupLayout();
    let us = 0;
    for (const c of fns.pool('cpu').containerList()) {
      try {
        us += native.cgroupStats(c.id).cpuUsageUs;
      } catch {
        /* gone */
      }
    }
    void l;
    return us / 1000;
  };
  const kinds: Array<[string, Record<string, unknown>]> = [
    ['python3 zygote', { code: 'print("hello")\n', language: 'python3', files: [], stdin: Buffer.alloc(0), env: {}, fetchFiles: [] }],
    ['python3 fresh (cmd)', { cmd: ['python3', '-B', 'main.py'], files: [{ path: 'main.py', data: Buffer.from('print("hello")\n'), mode: 0o644 }], stdin: Buffer.alloc(0), env: {}, fetchFiles: [] }],
    ['true (cmd)', { cmd: ['true'], files: [], stdin: Buffer.alloc(0), env: {}, fetchFiles: [] }],
  ];
  for (const [name, req] of kinds) {
    for (let i = 0; i < 20; i++) await fns.invoke('cpu', 'bench', req as never);
    const c0 = process.cpuUsage();
    const g0 = cgCpu();
    const t0 = performance.now();
    for (let i = 0; i < n; i++) {
      const r = await fns.invoke('cpu', 'bench', req as never);
      if (r.status !== 'ok') throw new Error(JSON.stringify(r));
    }
    const wall = performance.now() - t0;
    const c1 = process.cpuUsage(c0);
    const g1 = cgCpu();
    console.log(`${name}: wall ${(wall / n).toFixed(2)} ms/inv, shim process CPU ${((c1.user + c1.system) / 1000 / n).toFixed(2)} ms/inv (user ${(c1.user / 1000 / n).toFixed(2)}), container cgroup CPU ${((g1 - g0) / n).toFixed(2)} ms/inv`);
  }
  console.log(`zygote runs: ${fns.pool('cpu').stats().zygoteRuns}; loadavg ${readFileSync('/proc/loadavg', 'utf8').trim()}`);
  void join;
  await fns.deletePool("cpu");
  await shim.close();
  process.exit(0);
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
