/**
 * cgroups through the addon: layout, create/limits on disk, update, stats,
 * attach, freeze/thaw, kill, destroy (EBUSY while populated) and validation.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

import { WarrenError } from '../../src/errors';
import { destroyCgroup, native, processExists, sleep, uniqueId, warrenErrorOf } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';

const MiB = 1024 * 1024;
const maybe = testUnless(rootReason);

function read(dir: string, file: string): string {
  return fs.readFileSync(path.join(dir, file), 'utf8').trim();
}

/** The directories of group `id` in every hierarchy of the layout. */
function groupDirs(id: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [ctrl, root] of Object.entries(native.cgroupLayout().roots)) out[ctrl] = path.join(root, id);
  return out;
}

maybe('layout names the warren parent group in every hierarchy', (t) => {
  const layout = native.cgroupLayout();
  t.true(layout.version === 1 || layout.version === 2);
  if (layout.version === 1) {
    for (const c of ['cpu', 'cpuacct', 'memory', 'pids', 'freezer']) t.regex(layout.roots[c] ?? '', /\/warren$/, c);
    if (fs.existsSync('/sys/fs/cgroup/unified/cgroup.procs')) t.is(layout.roots.unified, '/sys/fs/cgroup/unified/warren');
  } else {
    t.deepEqual(layout.roots, { unified: '/sys/fs/cgroup/warren' });
  }
});

maybe('create writes the limits to disk, update changes them, destroy removes every directory', async (t) => {
  const id = uniqueId('cg');
  try {
    native.cgroupCreate(id, { cpuQuotaUs: 50_000, cpuPeriodUs: 100_000, memoryBytes: 64 * MiB, pidsMax: 64 });
    t.true(native.cgroupExists(id));
    const dirs = groupDirs(id);
    for (const d of Object.values(dirs)) t.true(fs.statSync(d).isDirectory(), d);
    const layout = native.cgroupLayout();
    if (layout.version === 1) {
      t.is(read(dirs.cpu!, 'cpu.cfs_quota_us'), '50000');
      t.is(read(dirs.cpu!, 'cpu.cfs_period_us'), '100000');
      t.is(read(dirs.memory!, 'memory.limit_in_bytes'), String(64 * MiB));
      if (fs.existsSync(path.join(dirs.memory!, 'memory.memsw.limit_in_bytes')))
        t.is(read(dirs.memory!, 'memory.memsw.limit_in_bytes'), String(64 * MiB), 'no swap by default');
      t.regex(read(dirs.memory!, 'memory.oom_control'), /oom_kill_disable 0/);
      t.is(read(dirs.pids!, 'pids.max'), '64');
      // raising memory above memsw needs memsw first: the addon orders the writes
      native.cgroupUpdate(id, { memoryBytes: 128 * MiB, cpuQuotaUs: -1, pidsMax: -1 });
      t.is(read(dirs.memory!, 'memory.limit_in_bytes'), String(128 * MiB));
      if (fs.existsSync(path.join(dirs.memory!, 'memory.memsw.limit_in_bytes')))
        t.is(read(dirs.memory!, 'memory.memsw.limit_in_bytes'), String(128 * MiB));
      t.is(read(dirs.cpu!, 'cpu.cfs_quota_us'), '-1');
      t.is(read(dirs.pids!, 'pids.max'), 'max');
      native.cgroupUpdate(id, { memoryBytes: 32 * MiB, memorySwapBytes: 48 * MiB });
      t.is(read(dirs.memory!, 'memory.limit_in_bytes'), String(32 * MiB));
      if (fs.existsSync(path.join(dirs.memory!, 'memory.memsw.limit_in_bytes')))
        t.is(read(dirs.memory!, 'memory.memsw.limit_in_bytes'), String(48 * MiB));
    } else {
      const d = dirs.unified!;
      t.is(read(d, 'cpu.max'), '50000 100000');
      t.is(read(d, 'memory.max'), String(64 * MiB));
      if (fs.existsSync(path.join(d, 'memory.swap.max'))) t.is(read(d, 'memory.swap.max'), '0');
      t.is(read(d, 'pids.max'), '64');
      native.cgroupUpdate(id, { memoryBytes: 128 * MiB, cpuQuotaUs: -1, pidsMax: -1 });
      t.is(read(d, 'memory.max'), String(128 * MiB));
      t.is(read(d, 'cpu.max'), 'max 100000');
      t.is(read(d, 'pids.max'), 'max');
    }
    const again = warrenErrorOf(t, () => native.cgroupCreate(id, {}));
    t.is(again.code, 'ALREADY_EXISTS');

    const st = native.cgroupStats(id);
    t.is(st.frozen, false);
    t.is(st.pidsCurrent, 0);
    t.is(st.oomKills, 0);
    t.is(native.cgroupOomKills(id), 0);
    for (const k of ['memoryCurrentBytes', 'memoryPeakBytes', 'cpuUsageUs'] as const) t.is(typeof st[k], 'number');

    native.cgroupDestroy(id);
    t.false(native.cgroupExists(id));
    for (const d of Object.values(dirs)) t.false(fs.existsSync(d), d);
    t.notThrows(() => native.cgroupDestroy(id), 'destroy is idempotent');
  } finally {
    await destroyCgroup(id);
  }
});

maybe('attach, procs, freeze/thaw, kill and EBUSY on destroy', async (t) => {
  const id = uniqueId('cg');
  const child = spawn('/bin/sleep', ['30'], { stdio: 'ignore' });
  const exited = new Promise<NodeJS.Signals | null>((r) => child.on('exit', (_c, s) => r(s)));
  try {
    native.cgroupCreate(id, { pidsMax: 16 });
    native.cgroupAttach(id, child.pid!);
    t.deepEqual(native.cgroupProcs(id), [child.pid!]);
    const dirs = groupDirs(id);
    for (const [ctrl, d] of Object.entries(dirs)) t.is(read(d, 'cgroup.procs'), String(child.pid), ctrl);
    t.is(native.cgroupStats(id).pidsCurrent, 1);

    const busy = warrenErrorOf(t, () => native.cgroupDestroy(id));
    t.is(busy.code, 'CGROUP_ERROR');
    t.is(busy.errno, 16);
    t.regex(busy.message, /rmdir .*: EBUSY/);

    native.cgroupFreeze(id, true);
    t.true(native.cgroupStats(id).frozen);
    if (native.cgroupLayout().version === 1) t.is(read(dirs.freezer!, 'freezer.state'), 'FROZEN');
    else t.regex(read(dirs.unified!, 'cgroup.events'), /frozen 1/);
    native.cgroupFreeze(id, false);
    t.false(native.cgroupStats(id).frozen);

    t.is(native.cgroupKill(id), 1);
    t.is(await exited, 'SIGKILL');
    for (let i = 0; i < 200 && native.cgroupProcs(id).length > 0; i++) await sleep(5);
    native.cgroupDestroy(id);
    t.false(native.cgroupExists(id));
    t.false(processExists(child.pid!));
  } finally {
    child.kill('SIGKILL');
    await destroyCgroup(id);
  }
});

maybe('bad names and limits are INVALID_ARGUMENT, checked again in C++', (t) => {
  for (const name of ['', 'A', '-x', '../etc', 'a/b', 'x'.repeat(64), 'a\0b', 'a b']) {
    const err = warrenErrorOf(t, () => native.cgroupCreate(name, {}));
    t.is(err.code, 'INVALID_ARGUMENT', JSON.stringify(name));
  }
  const bad: Array<Record<string, unknown>> = [
    { cpuQuotaUs: 10 },
    { cpuPeriodUs: 5 },
    { memoryBytes: 1.5 },
    { memoryBytes: 'lots' },
    { pidsMax: 0 },
    { memoryBytes: 64 * MiB, memorySwapBytes: 32 * MiB },
  ];
  for (const limits of bad) {
    const err = warrenErrorOf(t, () => native.cgroupCreate(uniqueId('cg'), limits as never));
    t.is(err.code, 'INVALID_ARGUMENT', JSON.stringify(limits));
  }
  t.is(warrenErrorOf(t, () => native.cgroupOomKills('../etc')).code, 'INVALID_ARGUMENT');
  const e = warrenErrorOf(t, () => native.cgroupStats('no-such-group-here'));
  t.is(e.code, 'CGROUP_ERROR');
  t.is(warrenErrorOf(t, () => native.cgroupOomKills('no-such-group-here')).code, 'CGROUP_ERROR');
  t.is(e.errno, 2);
  t.true(e instanceof WarrenError);
  t.false(native.cgroupExists('no-such-group-here'));
});
