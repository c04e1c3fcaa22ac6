import test from 'ava';
import { skipReason } from '../../src/features';
import { spec, withShim } from '../helpers/warren';
import type { WarrenError } from '../../src/errors';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = skip === null ? test : test.skip;
const why = skip === null ? '' : ` (skipped: ${skip})`;

it(`going over memory is reported as OOM${why}`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec({ memoryMb: 32 }));
    // dd allocates and fills a 96 MiB block buffer: more than the 32 MiB limit
    const r = await shim.exec(id, { cmd: ['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=96M', 'count=1'] });
    t.is(r.status, 'oom');
    t.is(r.signal, 9);
    t.is((await shim.exec(id, { cmd: ['echo', 'still here'] })).stdout, 'still here\n');
  });
});

it(`the pids limit stops a fork bomb and the sandbox survives${why}`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec({ pids: 32 }));
    const neighbour = await shim.createSandbox(spec());
    const r = await shim.exec(id, { cmd: 'i=0; while [ $i -lt 200 ]; do sleep 2 & i=$((i+1)); done 2>&1; echo done', timeoutMs: 20_000 });
    t.regex(r.stdout, /can't fork|Resource temporarily unavailable|fork/i);
    const stats = await (shim as any).running(id).stats();
    t.true(stats.pidsCurrent <= 32, `pids.current ${stats.pidsCurrent}`);
    // while saturated, a new exec gets a clear error instead of hanging
    const saturated = await shim.exec(id, { cmd: ['true'] }).then(() => null, (e: WarrenError) => e);
    if (saturated !== null) t.is(saturated.code, 'RESOURCE_EXHAUSTED');
    t.is((await shim.exec(neighbour.id, { cmd: ['echo', 'neighbour fine'] })).stdout, 'neighbour fine\n');
    await new Promise((res) => setTimeout(res, 2500));
    t.is((await shim.exec(id, { cmd: ['echo', 'alive'] })).stdout, 'alive\n');
  });
});

it(`the cpu quota throttles a busy loop${why}`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec({ cpu: 0.2 }));
    const before = (await (shim as any).running(id).stats()).cpuUsageUs as number;
    const r = await shim.exec(id, { cmd: 'while :; do :; done', timeoutMs: 1500 });
    t.is(r.status, 'timeout');
    const used = ((await (shim as any).running(id).stats()).cpuUsageUs as number) - before;
    t.log(`cpu used in 1.5 s wall at 0.2 cores: ${(used / 1000).toFixed(0)} ms`);
    t.true(used < 600_000, `used ${used} us`);
    t.true(used > 100_000, `used ${used} us`);
  });
});
