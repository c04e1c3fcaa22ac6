/**
 * Resume prefetch (src/shim/lifecycle/memory.ts, native prefetch.c): after a pause pushed a
 * sandbox's memory into zram, the resume reads it back in the background. When the prefetch has
 * finished, the memory is resident again (charged to the sandbox, out of swap, and for 'touch'
 * mapped into the process: its own first touch faults nothing in), and the data are intact.
 */
import { spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { native } from '../../src/native';
import { prefetchDone } from '../../src/shim/lifecycle/memory';
import { spec, withShim } from '../helpers/warren';
import { memhogBinary, memhogCheck, memhogSkipReason, withZramSwap, zramSkipReason } from './lifecycle-fixture';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';
import { waitForValue } from '../helpers/wait';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces', 'cgroup-freezer') ?? zramSkipReason() ?? memhogSkipReason();
const it = testUnless(skip).serial;
const MIB = 1024 * 1024;

/** Resident and swapped memory of the sandbox's memhog, from the host (/proc/<pid>/status). */
function hogMemory(cgroup: string): { rss: number; swap: number; pid: number } {
  for (const pid of native.cgroupProcs(cgroup)) {
    let status: string;
    try {
      status = readFileSync(`/proc/${pid}/status`, 'utf8');
    } catch {
      continue;
    }
    if (!/^Name:\s+memhog$/m.test(status)) continue;
    const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? 0) * 1024;
    return { rss: kb('VmRSS'), swap: kb('VmSwap'), pid };
  }
  throw new Error('memhog is not running');
}

for (const mode of ['touch', 'willneed'] as const) {
  it(`prefetch '${mode}': after resume the swapped-out memory comes back in the background, intact`, async (t) => {
    await withZramSwap(512, async () => {
      await withShim(t, async ({ shim }) => {
        process.env.WARREN_RESUME_PREFETCH = mode;
        try {
          const sb = await shim.createSandbox(spec({ memoryMb: 256 }));
          await shim.writeFile(sb.id, '/bin/memhog', memhogBinary(), 0o755);
          await shim.exec(sb.id, { cmd: '(memhog 96 /tmp/hog 50 >/dev/null 2>&1 &)' });
          await waitForValue(async () => (await shim.exec(sb.id, { cmd: 'cat /tmp/hog 2>/dev/null' })).stdout, (s) => s === 'ready\n', 20_000, 'memhog to fill its memory', 50);
          const paused = await shim.pauseSandbox(sb.id);
          t.true(paused.releasedBytes > 80 * MIB, `released ${(paused.releasedBytes / MIB).toFixed(1)} MiB`);
          const out = hogMemory(sb.id);
          t.true(out.swap > 80 * MIB, `in swap while paused: ${(out.swap / MIB).toFixed(1)} MiB`);

          const r = await shim.resumeSandbox(sb.id);
          t.is(r.state, 'running');
          const pf = prefetchDone(sb.id);
          if (pf === undefined) throw new Error('the resume started no prefetch');
          const report = await pf;
          t.is(report.mode, mode);
          // What the prefetch itself read varies (pages the kernel brought back alongside others are
          // not read twice); what must hold is that the memory is resident afterwards, checked next.
          t.true(report.bytes > 0, `prefetched ${(report.bytes / MIB).toFixed(1)} MiB`);
          const memDir = join(native.cgroupLayout().roots.memory ?? native.cgroupLayout().roots.unified!, sb.id);
          const charged = Number(readFileSync(join(memDir, native.cgroupLayout().version === 1 ? 'memory.usage_in_bytes' : 'memory.current'), 'utf8'));
          t.true(charged > 90 * MIB, `resident (charged to the sandbox) after the prefetch: ${(charged / MIB).toFixed(1)} MiB`);
          const back = hogMemory(sb.id);
          if (mode === 'touch') {
            // mapped again: the process's own resident set holds it, nothing of it is in swap
            t.true(back.rss > 90 * MIB, `VmRSS ${(back.rss / MIB).toFixed(1)} MiB`);
            t.true(back.swap < 8 * MIB, `VmSwap ${(back.swap / MIB).toFixed(1)} MiB`);
          }
          t.is(await memhogCheck(shim, sb.id), 'ok\n', 'every page came back with its pattern');
          await shim.deleteSandbox(sb.id);
        } finally {
          delete process.env.WARREN_RESUME_PREFETCH;
        }
      });
    });
  });
}

it('prefetch and pageout refuse bad pids with stable codes', async (t) => {
  for (const pid of [0, -1, 2 ** 31, 1.5]) {
    await t.throwsAsync(Promise.resolve().then(() => native.pageoutAsync(pid)), { code: 'INVALID_ARGUMENT' } as never, `pageout ${pid}`);
    await t.throwsAsync(Promise.resolve().then(() => native.prefetchAsync(pid, 'touch')), { code: 'INVALID_ARGUMENT' } as never, `prefetch ${pid}`);
  }
  await t.throwsAsync(Promise.resolve().then(() => native.prefetchAsync(process.pid, 'sideways' as never)), { code: 'INVALID_ARGUMENT' } as never);
  // a pid that is not there (the highest possible one is never handed out here)
  const maxPid = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8')) - 1;
  await t.throwsAsync(native.pageoutAsync(maxPid), { code: 'SANDBOX_NOT_RUNNING' } as never);
});

it('pageout (its stripes dealt to one thread per CPU) pushes every page of a process to swap, and they come back intact', async (t) => {
  await withZramSwap(256, async () => {
    const dir = tempDir('warren-pageout-');
    const bin = join(dir, 'memhog');
    writeFileSync(bin, memhogBinary(), { mode: 0o755 });
    // 96 MiB in one mapping: 24 stripes of 4 MiB, so every thread gets some
    const hog = spawn(bin, ['96', join(dir, 'status'), '50'], { stdio: 'ignore' });
    try {
      const status = () => {
        try {
          return readFileSync(join(dir, 'status'), 'utf8');
        } catch {
          return ''; // not written yet
        }
      };
      await waitForValue(status, (s) => s === 'ready\n', 20_000, 'memhog to fill its memory', 50);
      const swapOf = () => Number(/^VmSwap:\s+(\d+) kB/m.exec(readFileSync(`/proc/${hog.pid}/status`, 'utf8'))?.[1] ?? 0) * 1024;
      const before = swapOf();
      const r = await native.pageoutAsync(hog.pid!);
      t.true(r.bytes >= 96 * MIB, `asked for ${(r.bytes / MIB).toFixed(1)} MiB`);
      const swapped = swapOf() - before;
      t.true(swapped > 90 * MIB, `in swap after the pageout: ${(swapped / MIB).toFixed(1)} MiB`);
      writeFileSync(join(dir, 'status'), '');
      hog.kill('SIGUSR1');
      const verdict = await waitForValue(status, (s) => /^(ok|bad)/.test(s), 30_000, 'memhog to check its pages', 50);
      t.is(verdict, 'ok\n', 'every page came back with its pattern');
    } finally {
      hog.kill('SIGKILL');
    }
  });
});
