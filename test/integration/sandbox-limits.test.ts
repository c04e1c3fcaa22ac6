import { skipReason } from '../../src/features';
import { spec, withShim } from '../helpers/warren';
import type { WarrenError } from '../../src/errors';
import { testUnless } from '../helpers/skip';
import { waitForValue } from '../helpers/wait';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

it(`going over memory is reported as OOM`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec({ memoryMb: 32 }));
    // dd allocates and fills a 96 MiB block buffer: more than the 32 MiB limit
    const r = await shim.exec(id, { cmd: ['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=96M', 'count=1'] });
    t.is(r.status, 'oom');
    t.is(r.signal, 9);
    t.is((await shim.exec(id, { cmd: ['echo', 'still here'] })).stdout, 'still here\n');
  });
});

it(`a supervised exec (how keyed execs run) going over memory is reported as OOM by its supervisor`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec({ memoryMb: 32 }));
    const live = await shim.execSupervised(id, { cmd: ['dd', 'if=/dev/zero', 'of=/dev/null', 'bs=96M', 'count=1'] }, 'oom-run');
    live.stdout.resume();
    live.stderr.resume();
    const r = await live.done;
    t.is(r.status, 'oom');
    t.is(r.signal, 9);
    await shim.dropSupervised(id, 'oom-run');
  });
});

it(`the pids limit stops a fork bomb and the sandbox survives`, async (t) => {
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
    // the bomb's processes die with their 2 s timeout; the sandbox then serves execs again
    const alive = await waitForValue(() => shim.exec(id, { cmd: ['echo', 'alive'] }).then((r) => r.stdout, () => ''), (out) => out === 'alive\n', 15_000, 'the sandbox to run a command again', 100);
    t.is(alive, 'alive\n');
  });
});

it(`the cpu quota throttles a busy loop`, async (t) => {
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
