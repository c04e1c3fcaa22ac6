import { skipReason } from '../../src/features';
import { spec, withShim } from '../helpers/warren';
import { testUnless } from '../helpers/skip';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

it(`two sandboxes cannot see each other's processes or files`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const a = await shim.createSandbox(spec());
    const b = await shim.createSandbox(spec());
    await shim.exec(a.id, { cmd: 'echo secret-a > /tmp/secret; (sleep 300 &) ; true' });
    const aPids = await shim.exec(a.id, { cmd: 'ls /proc | grep -E "^[0-9]+$" | sort -n | tr "\\n" " "' });
    const bPs = await shim.exec(b.id, { cmd: 'ps -o pid,args' });
    t.false(bPs.stdout.includes('sleep 300'), 'B sees no process of A');
    t.is((await shim.exec(b.id, { cmd: 'cat /tmp/secret' })).exitCode, 1, 'B cannot read A\'s file');
    t.log(`A's pids: ${aPids.stdout}`);
    // A's host pid means nothing inside B's pid namespace
    const hostPid = shim.getSandbox(a.id).pid!;
    const kill = await shim.exec(b.id, { cmd: `kill -9 ${hostPid}; echo rc=$?` });
    t.regex(kill.stdout + kill.stderr, /rc=1|No such process/);
    t.is((await shim.exec(a.id, { cmd: 'cat /tmp/secret' })).stdout, 'secret-a\n');
    // pid 1 in each sandbox is its own reaper; the host's processes are invisible
    t.is((await shim.exec(b.id, { cmd: 'cat /proc/1/comm' })).stdout, 'warren-init\n');
    const comms = (await shim.exec(b.id, { cmd: 'for p in /proc/[0-9]*; do cat $p/comm; done' })).stdout.trim().split('\n');
    t.deepEqual([...new Set(comms)].sort(), ['sh', 'warren-init'], 'B sees only pid 1 and its own exec');
    // network: loopback only
    t.is((await shim.exec(b.id, { cmd: "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '" })).stdout, 'lo\n');
  });
});

it(`kill -9 -1 and killing pid 1 only harm that sandbox`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const a = await shim.createSandbox(spec());
    const b = await shim.createSandbox(spec());
    await shim.exec(b.id, { cmd: '(sleep 300 &); true' });
    await shim.exec(a.id, { cmd: 'kill -9 -1; kill -9 1; true' });
    t.is((await shim.exec(a.id, { cmd: 'echo a-alive' })).stdout, 'a-alive\n', 'pid 1 ignores signals from inside');
    t.is((await shim.exec(b.id, { cmd: 'pgrep -c sleep || ps | grep -c "sleep 300"' })).exitCode, 0);
    t.is(shim.getSandbox(b.id).state, 'running');
  });
});

it(`sandboxes run with a reduced capability set and no_new_privs`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec());
    const status = (await shim.exec(id, { cmd: 'grep -E "^(CapBnd|CapEff|NoNewPrivs)" /proc/self/status' })).stdout;
    const bnd = BigInt('0x' + /CapBnd:\s*([0-9a-f]+)/.exec(status)![1]);
    t.is(bnd & (1n << 21n), 0n, 'no CAP_SYS_ADMIN');
    t.is(bnd & (1n << 13n), 0n, 'no CAP_NET_RAW');
    t.is(bnd & (1n << 16n), 0n, 'no CAP_SYS_MODULE');
    t.regex(status, /NoNewPrivs:\s*1/);
    t.not((await shim.exec(id, { cmd: 'mount -t tmpfs none /mnt' })).exitCode, 0, 'mount is refused');
  });
});
