/** Resource limits enforced on real sandboxes: memory (OOM kill), pids (fork fails), cpu quota. */

import { execSpec, exitOf, native, run, sh, sleep, warrenErrorOf, withSandbox } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';

const MiB = 1024 * 1024;
const maybe = testUnless(rootReason);

maybe('memory limit: a process allocating past it is OOM-killed, the sandbox survives', async (t) => {
  await withSandbox(t, { limits: { memoryBytes: 32 * MiB } }, async (sb) => {
    const r = await run(sb, ['awk', 'BEGIN { s = "x"; for (i = 0; i < 40; i++) s = s s; print length(s) }'], { timeoutMs: 60_000 });
    t.is(r.signal, 9, `expected SIGKILL, got ${JSON.stringify(r)}`);
    const st = native.cgroupStats(sb.id);
    t.true(st.oomKills > 0, JSON.stringify(st));
    t.true(st.memoryPeakBytes >= 16 * MiB && st.memoryPeakBytes <= 33 * MiB, JSON.stringify(st));
    t.is((await run(sb, ['echo', 'alive'])).stdout, 'alive\n');
    t.true(native.cgroupProcs(sb.id).includes(sb.pid), 'pid 1 was not the victim');
  });
});

maybe('pids limit: a fork loop hits EAGAIN, exec fails with EAGAIN while full, the sandbox survives', async (t) => {
  await withSandbox(t, { limits: { pidsMax: 12 } }, async (sb) => {
    const r = await sh(sb, 'i=0; while [ $i -lt 30 ]; do sleep 1 >/dev/null 2>&1 & i=$((i+1)); done; echo started', { timeoutMs: 20_000 });
    t.regex(r.stderr, /fork|Resource temporarily unavailable/i);
    t.true(native.cgroupStats(sb.id).pidsCurrent <= 12);
    let full: { code?: string; errno?: number } | undefined;
    try {
      const p = native.exec(execSpec(sb, ['true']));
      for (const fd of [p.stdin!, p.stdout!, p.stderr!]) native.close(fd);
      // always reap exec children: an unreaped zombie keeps the sandbox's pid namespace from dying
      await exitOf(p.pidfd);
      native.close(p.pidfd);
    } catch (err) {
      full = err as { code?: string; errno?: number };
    }
    if (full) {
      t.is(full.code, 'SPAWN_ERROR');
      t.is(full.errno, 11);
    }
    for (let i = 0; i < 100 && native.cgroupStats(sb.id).pidsCurrent > 1; i++) await sleep(50);
    t.is((await run(sb, ['echo', 'alive'])).stdout, 'alive\n');
  });
});

maybe('cpu quota caps usage; stats count it', async (t) => {
  await withSandbox(t, { limits: { cpuQuotaUs: 20_000, cpuPeriodUs: 100_000 } }, async (sb) => {
    const before = native.cgroupStats(sb.id).cpuUsageUs;
    const started = Date.now();
    await sh(sb, 'timeout 1 sh -c "while :; do :; done"; true');
    const wall = (Date.now() - started) * 1000;
    const used = native.cgroupStats(sb.id).cpuUsageUs - before;
    t.log(`cpu used ${used} us in ${wall} us wall at 0.2 cpu`);
    t.true(used > 50_000, `some cpu was used: ${used}`);
    t.true(used < wall * 0.45, `quota enforced: ${used} us of ${wall} us`);
  });
});

maybe('limits are validated in C++', (t) => {
  const e = warrenErrorOf(t, () => native.cgroupUpdate('no-such-group-x', { pidsMax: 10 }));
  t.is(e.code, 'CGROUP_ERROR');
});
