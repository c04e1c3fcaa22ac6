/**
 * The pause/resume decisions against a fake cgroup: the cgroup v2 path
 * (swap.max opened, memory.reclaim, EAGAIN tolerated, swap.max closed on
 * resume) cannot run on this v1 host, and the v1 EBUSY fallback is hard to
 * provoke for real. The real v1 path is tested in
 * test/integration/lifecycle-pause.test.ts.
 */
import test from 'ava';
import { type CgroupOps, coldBytesFromStat, pauseCgroup, reclaimColdCgroup, resumeCgroup } from '../../src/shim/lifecycle/memory';

const MIB = 1024 * 1024;

function fake(version: 1 | 2, opts: { swap?: number; usage: number; after: number; busyBelow?: number; reclaimErr?: string; coldAnon?: number; coldFile?: number }) {
  const writes: Array<[string, string]> = [];
  const frozen: boolean[] = [];
  let usage = opts.usage;
  const files: Record<string, string> = {
    '/cg/s1/memory.stat': `anon 1\ninactive_anon ${opts.coldAnon ?? 0}\nactive_anon 5\ninactive_file ${opts.coldFile ?? 0}\ntotal_inactive_anon ${opts.coldAnon ?? 0}\ntotal_inactive_file ${opts.coldFile ?? 0}\n`,
    '/cg/s1/memory.swap.current': String(opts.usage - opts.after),
    '/cg/s1/memory.memsw.usage_in_bytes': String(opts.usage),
  };
  const ops: CgroupOps = {
    layout: () => ({ version, roots: (version === 2 ? { unified: '/cg' } : { memory: '/cg' }) as Record<string, string> }),
    memoryCurrent: () => usage,
    freeze: (_id, f) => void frozen.push(f),
    async write(path, value) {
      writes.push([path.replace('/cg/s1/', ''), value]);
      if (path.endsWith('memory.reclaim')) {
        usage = opts.after;
        if (opts.reclaimErr) throw Object.assign(new Error(opts.reclaimErr), { code: opts.reclaimErr });
      }
      if (path.endsWith('memory.limit_in_bytes')) {
        const v = Number(value);
        if (opts.busyBelow !== undefined && v < opts.busyBelow) {
          usage = opts.after;
          throw Object.assign(new Error('EBUSY'), { code: 'EBUSY' });
        }
        if (v < opts.usage) usage = opts.after;
      }
    },
    async read(path) {
      if (path.endsWith('memory.usage_in_bytes')) return String(usage);
      const f = files[path];
      if (f === undefined) throw Object.assign(new Error('ENOENT'), { code: 'ENOENT' });
      return f;
    },
    swapTotal: () => opts.swap ?? 1024 * MIB,
  };
  return { ops, writes, frozen };
}

test('v2: freeze, open swap.max to the limit, reclaim the whole usage; resume closes swap.max and thaws', async (t) => {
  const f = fake(2, { usage: 200 * MIB, after: 3 * MIB });
  const r = await pauseCgroup('s1', 512 * MIB, { ops: f.ops });
  t.deepEqual(f.writes, [
    ['memory.swap.max', String(512 * MIB)],
    ['memory.reclaim', String(200 * MIB)],
  ]);
  t.deepEqual(f.frozen, [true]);
  t.is(r.reclaim, 'memory.reclaim');
  t.is(r.releasedBytes, 197 * MIB);
  t.is(r.swapBytes, 197 * MIB);
  t.is(r.note, undefined);
  f.writes.length = 0;
  await resumeCgroup('s1', 512 * MIB, undefined, f.ops);
  t.deepEqual(f.writes, [['memory.swap.max', '0']]);
  t.deepEqual(f.frozen, [true, false]);
});

test('v2: EAGAIN (could not reclaim everything) is not an error; no swap is reported', async (t) => {
  const f = fake(2, { usage: 100 * MIB, after: 60 * MIB, reclaimErr: 'EAGAIN', swap: 0 });
  const r = await pauseCgroup('s1', 256 * MIB, { ops: f.ops });
  t.is(r.releasedBytes, 40 * MIB);
  t.regex(r.note ?? '', /no swap/);
  t.deepEqual(f.frozen, [true]);
});

test('v2: any other reclaim failure thaws the sandbox and throws CGROUP_ERROR', async (t) => {
  const f = fake(2, { usage: 100 * MIB, after: 60 * MIB, reclaimErr: 'EIO' });
  const err = await t.throwsAsync(pauseCgroup('s1', 256 * MIB, { ops: f.ops }));
  t.is((err as { code?: string }).code, 'CGROUP_ERROR');
  t.deepEqual(f.frozen, [true, false]);
});

test('v1: lower the limit to 1 MiB, again while usage still falls and after force_empty; on EBUSY settle just above what is left; the limit goes back before the answer, still frozen', async (t) => {
  const f = fake(1, { usage: 200 * MIB, after: 3 * MIB, busyBelow: 4 * MIB });
  const r = await pauseCgroup('s1', 512 * MIB, { ops: f.ops });
  t.deepEqual(
    f.writes.map(([k]) => k),
    ['memory.limit_in_bytes', 'memory.limit_in_bytes', 'memory.force_empty', 'memory.limit_in_bytes', 'memory.limit_in_bytes', 'memory.limit_in_bytes'],
  );
  t.is(f.writes[0]![1], String(MIB));
  t.is(f.writes[1]![1], String(MIB), 'usage fell from 200 to 3 MiB: asked again');
  t.is(f.writes[3]![1], String(MIB), 'after force_empty: asked again');
  t.is(Number(f.writes[4]![1]), 4 * MIB, 'no more progress: usage (3 MiB) + 1 MiB, rounded to 64 KiB');
  t.is(f.writes[5]![1], String(512 * MIB), 'the limit is back');
  t.deepEqual(f.frozen, [true], 'and the sandbox stays frozen');
  t.is(r.reclaim, 'limit');
  t.is(r.releasedBytes, 197 * MIB);
  f.writes.length = 0;
  await resumeCgroup('s1', 512 * MIB, undefined, f.ops);
  t.deepEqual(f.writes, [], 'resume only thaws');
  t.deepEqual(f.frozen, [true, false]);
});

test('v1: resume puts back a limit that a pause of an earlier version left lowered', async (t) => {
  const f = fake(1, { usage: 3 * MIB, after: 3 * MIB });
  await resumeCgroup('s1', 512 * MIB, 4 * MIB, f.ops);
  t.deepEqual(f.writes, [['memory.limit_in_bytes', String(512 * MIB)]]);
  t.deepEqual(f.frozen, [false]);
});

test('v1 without swap: freeze only, and say why', async (t) => {
  const f = fake(1, { usage: 200 * MIB, after: 200 * MIB, swap: 0 });
  const r = await pauseCgroup('s1', 512 * MIB, { ops: f.ops });
  t.deepEqual(f.writes, []);
  t.is(r.reclaim, 'none');
  t.regex(r.note ?? '', /zram/);
});

test('cold bytes come from the inactive lists of memory.stat (v1: the hierarchy totals)', (t) => {
  t.deepEqual(coldBytesFromStat('inactive_anon 10\ninactive_file 20\ntotal_inactive_anon 30\ntotal_inactive_file 40\n', 1), { anon: 30, file: 40 });
  t.deepEqual(coldBytesFromStat('inactive_anon 10\ninactive_file 20\n', 2), { anon: 10, file: 20 });
  t.deepEqual(coldBytesFromStat('garbage\ninactive_anon x\n', 2), { anon: 0, file: 0 });
});

test('cold reclaim v2: memory.reclaim of the inactive bytes, swap opened for it and then capped at what went there; never frozen', async (t) => {
  const f = fake(2, { usage: 100 * MIB, after: 40 * MIB, coldAnon: 50 * MIB, coldFile: 10 * MIB });
  const r = await reclaimColdCgroup('s1', 256 * MIB, f.ops);
  t.deepEqual(f.writes, [
    ['memory.swap.max', String(256 * MIB)],
    ['memory.reclaim', String(60 * MIB)],
    ['memory.swap.max', String(60 * MIB)],
  ]);
  t.deepEqual(f.frozen, []);
  t.like(r, { reclaim: 'memory.reclaim', coldBytes: 60 * MIB, releasedBytes: 60 * MIB, memoryAfterBytes: 40 * MIB });
});

test('cold reclaim v1: frozen while the limit is lowered by the cold bytes, the limit always put back; EBUSY is partial success', async (t) => {
  const f = fake(1, { usage: 100 * MIB, after: 70 * MIB, coldAnon: 30 * MIB, coldFile: 10 * MIB, busyBelow: 80 * MIB });
  const r = await reclaimColdCgroup('s1', 256 * MIB, f.ops);
  t.deepEqual(f.writes, [
    ['memory.limit_in_bytes', String(60 * MIB)],
    ['memory.limit_in_bytes', String(256 * MIB)],
  ]);
  t.deepEqual(f.frozen, [true, false]);
  t.like(r, { reclaim: 'limit', coldBytes: 40 * MIB, releasedBytes: 30 * MIB });
});

test('cold reclaim: without swap only page cache counts; nothing cold means nothing written', async (t) => {
  const f = fake(1, { usage: 100 * MIB, after: 95 * MIB, coldAnon: 50 * MIB, coldFile: 5 * MIB, swap: 0 });
  const r = await reclaimColdCgroup('s1', 256 * MIB, f.ops);
  t.is(r.coldBytes, 5 * MIB);
  t.regex(r.note ?? '', /no swap/);
  const idle = fake(2, { usage: 100 * MIB, after: 100 * MIB, coldAnon: 0, coldFile: 512 * 1024 });
  const r2 = await reclaimColdCgroup('s1', 256 * MIB, idle.ops);
  t.deepEqual(idle.writes, []);
  t.like(r2, { reclaim: 'none', releasedBytes: 0, note: 'nothing cold to reclaim' });
});
