/**
 * What a process inside a sandbox can see: its own pid namespace, hostname,
 * loopback only, reduced capabilities + no_new_privs, masked /proc paths,
 * a cgroup namespace, inert device nodes, SCHED_IDLE, and a tiny pid 1.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';

import { native, run, sh, warrenErrorOf, withSandbox } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';
import { waitForValue } from '../helpers/wait';

const maybe = testUnless(rootReason);

maybe('pid namespace: ps and /proc show only the sandbox processes; pid 1 is warren-init', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const r = await sh(sb, 'ls /proc | grep -E "^[0-9]+$" | sort -n | tr "\\n" " "; echo; cat /proc/1/comm; ps -o pid,comm');
    t.is(r.exitCode, 0, r.stderr);
    const [pids, comm, ...ps] = r.stdout.trim().split('\n');
    const seen = pids!.trim().split(' ').map(Number);
    t.is(seen[0], 1);
    t.true(seen.every((p) => p < 100), `only small pids expected: ${pids}`);
    t.true(seen.length <= 8, `only init and this pipeline: ${pids}`);
    t.is(comm, 'warren-init');
    t.true(ps.some((l) => /^\s*1\s+warren-init/.test(l)), ps.join('\n'));
    t.false(ps.some((l) => /node|ava/.test(l)));
  });
});

maybe('hostname, loopback-only network, cgroup namespace', async (t) => {
  await withSandbox(t, { hostname: 'box-under-test' }, async (sb) => {
    t.is((await run(sb, ['hostname'])).stdout, 'box-under-test\n');
    const dev = await run(sb, ['cat', '/proc/net/dev']);
    const ifaces = dev.stdout.split('\n').slice(2).filter(Boolean).map((l) => l.split(':')[0]!.trim());
    t.deepEqual(ifaces, ['lo']);
    const link = await run(sb, ['ip', 'link']);
    t.regex(link.stdout, /^1: lo: <LOOPBACK,UP,LOWER_UP>/);
    t.notRegex(link.stdout, /^2:/m);
    const ping = await sh(sb, 'nc -l -p 8080 -e echo pong & sleep 0.1; echo hi | nc 127.0.0.1 8080');
    t.regex(ping.stdout, /pong/);
    const cg = await run(sb, ['cat', '/proc/self/cgroup']);
    for (const line of cg.stdout.trim().split('\n')) t.regex(line, /:\/$/, `cgroup namespace root: ${line}`);
  });
});

maybe('capabilities are the reduced docker set, NoNewPrivs is 1, for pid 1 and exec', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const r = await sh(sb, 'grep -E "^(Cap|NoNewPrivs)" /proc/self/status; echo ---; grep -E "^(CapBnd|NoNewPrivs)" /proc/1/status');
    const want = '00000000a80405fb'; // docker's default set without NET_RAW
    t.regex(r.stdout, new RegExp(`CapInh:\\t${want}`));
    t.regex(r.stdout, new RegExp(`CapPrm:\\t${want}`));
    t.regex(r.stdout, new RegExp(`CapEff:\\t${want}`));
    t.regex(r.stdout, new RegExp(`CapBnd:\\t${want}`));
    t.regex(r.stdout, /CapAmb:\t0000000000000000/);
    const [self, init] = r.stdout.split('---');
    t.regex(self!, /NoNewPrivs:\t1/);
    t.regex(init!, new RegExp(`CapBnd:\\t${want}`));
    t.regex(init!, /NoNewPrivs:\t1/);
    // no CAP_SYS_ADMIN: no mounts, no hostname changes
    t.not((await run(sb, ['mount', '-t', 'tmpfs', 'x', '/mnt'])).exitCode, 0);
    t.not((await run(sb, ['hostname', 'other'])).exitCode, 0);
    // no CAP_NET_RAW
    t.not((await run(sb, ['ping', '-c', '1', '127.0.0.1'])).exitCode, 0);
  });
});

maybe('masked and read-only /proc and /sys paths; device nodes made inside are inert', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const r = await sh(
      sb,
      [
        'for f in /proc/kcore /proc/keys /proc/timer_list /proc/sysrq-trigger /proc/sched_debug; do [ -e $f ] && echo "$f $(wc -c < $f)"; done',
        'ls /proc/acpi | wc -l',
        'ls /sys/firmware | wc -l',
        'echo x > /proc/sys/kernel/domainname && echo WROTE-SYS',
        'echo 1 > /proc/irq/default_smp_affinity && echo WROTE-IRQ',
        'touch /sys/x && echo WROTE-SYSFS',
        'true',
      ].join('; '),
    );
    for (const line of r.stdout.split('\n').filter((l) => l.startsWith('/proc/'))) t.regex(line, / 0$/, line);
    t.notRegex(r.stdout, /WROTE/);
    t.regex(r.stderr, /Read-only file system/);
    const lines = r.stdout.trim().split('\n').filter((l) => /^\d+$/.test(l));
    t.deepEqual(lines, ['0', '0']);
    const ls = await run(sb, ['ls', '/dev']);
    t.deepEqual(ls.stdout.trim().split('\n').sort(), ['fd', 'full', 'null', 'ptmx', 'pts', 'random', 'shm', 'stderr', 'stdin', 'stdout', 'tty', 'urandom', 'zero']);
    t.is((await sh(sb, 'echo data > /dev/null && head -c 4 /dev/zero | wc -c')).stdout, '4\n');
    // CAP_MKNOD is kept (docker's set) but the rootfs, /dev and /dev/shm are nodev
    const blk = await sh(sb, 'mknod /tmp/disk b 8 0 && head -c 1 /tmp/disk; mknod /dev/mem2 c 1 1 && head -c 1 /dev/mem2');
    t.regex(blk.stderr, /Permission denied/);
    t.is(blk.stdout, '');
    const shm = await sh(sb, 'grep -E " /dev/shm " /proc/self/mounts');
    t.regex(shm.stdout, /nosuid,nodev,noexec/);
  });
});

maybe('SCHED_IDLE for pid 1 (inherited) and for exec; setSchedIdle on a host process', async (t) => {
  await withSandbox(t, { schedIdle: true }, async (sb) => {
    const init = await sh(sb, 'grep policy /proc/1/sched');
    t.regex(init.stdout, /policy\s*:\s*5/);
    const idle = await sh(sb, 'grep policy /proc/self/sched', { schedIdle: true });
    t.regex(idle.stdout, /policy\s*:\s*5/);
    const normal = await sh(sb, 'grep policy /proc/self/sched', { schedIdle: false });
    t.regex(normal.stdout, /policy\s*:\s*0/);
  });
  const child = spawn('/bin/sleep', ['10'], { stdio: 'ignore' });
  try {
    native.setSchedIdle(child.pid!);
    const stat = fs.readFileSync(`/proc/${child.pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    t.is(fields[41 - 3], '5', 'policy field of /proc/pid/stat');
  } finally {
    child.kill('SIGKILL');
  }
  t.is(warrenErrorOf(t, () => native.setSchedIdle(0)).code, 'INVALID_ARGUMENT');
});

maybe('core scheduling: supported is probed; unsupported kernels give NOT_SUPPORTED', async (t) => {
  const supported = native.coreSchedSupported();
  t.is(typeof supported, 'boolean');
  if (supported) {
    await withSandbox(t, { coreSched: true }, async (sb) => {
      t.is((await run(sb, ['true'])).exitCode, 0);
    });
    return;
  }
  const err = await withSandbox(t, { coreSched: true }, async () => undefined).then(
    () => undefined,
    (e: unknown) => e,
  );
  t.truthy(err);
  t.is((err as { code?: string }).code, 'NOT_SUPPORTED');
});

maybe('warren-init stays tiny (RSS well under 1 MiB)', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const status = fs.readFileSync(`/proc/${sb.pid}/status`, 'utf8');
    const rss = Number(/VmRSS:\s+(\d+) kB/.exec(status)![1]);
    const anon = Number(/RssAnon:\s+(\d+) kB/.exec(status)![1]);
    t.log(`warren-init VmRSS ${rss} kB (RssAnon ${anon} kB; the rest is page cache shared by every sandbox)`);
    t.true(anon < 256, `RssAnon ${anon} kB`);
    t.true(rss < 1024, `VmRSS ${rss} kB`);
    t.regex(status, /NoNewPrivs:\t1/);
    // it reaps orphans: a double-forked child does not stay a zombie
    await sh(sb, '(sleep 0.05 &) ; true');
    const z = await waitForValue(async () => (await sh(sb, 'ps -o stat,comm | grep -c "^Z" || true')).stdout.trim(), (n) => n === '0', 5000, 'no zombie left', 50);
    t.is(z, '0');
  });
});
