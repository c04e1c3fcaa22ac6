/**
 * Adversarial suite, part 2: resource exhaustion (research/security_anchors.md B.13-B.21).
 * Each attack runs in sandbox A; the test asserts that A hits its own wall and that
 * sandbox B (the neighbour) and the host are unaffected.
 */
import { closeSync, openSync, readdirSync, statfsSync } from 'node:fs';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { native } from '../../src/native';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import { box, sharedNode } from './helpers';

// This file's policy: small rlimits so the walls are reachable quickly.
const policyDir = mkdtempSync(join(tmpdir(), 'warren-policy-res-'));
cpSync(BUNDLED_POLICY_DIR, policyDir, { recursive: true });
writeFileSync(
  join(policyDir, 'profiles.yaml'),
  readFileSync(join(policyDir, 'profiles.yaml'), 'utf8').replace('fileSizeMb: 4096', 'fileSizeMb: 8').replace('openFiles: 4096', 'openFiles: 256'),
);
usePolicyStore(new PolicyStore(policyDir));

const node = sharedNode(2, { memoryMb: 96, pids: 64, diskMb: 48 });
const { it } = node;

/** The neighbour still answers promptly and can use its disk. */
async function neighbourHealthy(t: import('ava').ExecutionContext): Promise<void> {
  const b = node.boxes[1]!;
  const started = performance.now();
  const r = await b.sh('echo alive; dd if=/dev/zero of=/tmp/n bs=1M count=4 2>/dev/null && rm /tmp/n && echo wrote');
  t.is(r.stdout, 'alive\nwrote\n');
  t.true(performance.now() - started < 5000, 'neighbour exec took more than 5 s');
}

it.serial('exhaustion: a fork bomb is stopped by pids.max; the neighbour and the host are unaffected', async (t) => {
  const c = await box(node.shim, { memoryMb: 96, pids: 64, diskMb: 48 });
  try {
    const r = await c.sh('bomb() { bomb | bomb & }; bomb; sleep 3; echo survived', { timeoutMs: 8000 });
    t.log(`bomb: ${r.status}`);
    t.true(native.cgroupStats(c.id).pidsCurrent <= 64, `pids.current ${native.cgroupStats(c.id).pidsCurrent}`);
    await neighbourHealthy(t);
  } finally {
    // the bombed sandbox can still be deleted
    await node.shim.deleteSandbox(c.id);
  }
  t.false(native.cgroupExists(c.id));
});

it.serial('exhaustion: filling the writable layer gives ENOSPC inside the sandbox only; host free space unchanged', async (t) => {
  const a = node.boxes[0]!;
  const hostBefore = statfsSync('/var/lib').bavail * statfsSync('/var/lib').bsize;
  // files of 7 MiB each (under this policy's 8 MiB RLIMIT_FSIZE) until the 48 MiB layer is full
  const r = await a.sh('for i in $(seq 1 12); do dd if=/dev/zero of=/root/fill$i bs=1M count=7 2>&1 || { echo rc=1; break; }; done; df -m / | tail -1');
  t.regex(r.stdout, /No space left on device/);
  t.regex(r.stdout, /rc=1/);
  const hostAfter = statfsSync('/var/lib').bavail * statfsSync('/var/lib').bsize;
  t.true(hostBefore - hostAfter < 40 * 1024 * 1024, `host lost ${(hostBefore - hostAfter) >> 20} MiB`);
  await neighbourHealthy(t);
  await a.sh('rm -f /root/fill*');
});

it.serial('exhaustion: millions of empty files run out of inodes inside the sandbox only', async (t) => {
  const a = node.boxes[0]!;
  const r = await a.sh('mkdir -p /tmp/many && cd /tmp/many && i=0; while [ $i -lt 40 ]; do seq -f "f$i-%g" 1 500 | xargs touch 2>/dev/null || { echo full; break; }; i=$((i+1)); done; ls | wc -l', { timeoutMs: 60_000 });
  t.regex(r.stdout, /full/);
  await neighbourHealthy(t);
  await a.sh('rm -rf /tmp/many');
});

it.serial('exhaustion: a file larger than RLIMIT_FSIZE is cut at the limit (SIGXFSZ)', async (t) => {
  const a = node.boxes[0]!;
  const r = await a.sh('dd if=/dev/zero of=/tmp/big bs=1M count=20 2>/dev/null; echo rc=$?; ls -l /tmp/big; ulimit -f', { timeoutMs: 20_000 });
  t.regex(r.stdout, /rc=(153|1)\b/); // 128 + SIGXFSZ(25), or EFBIG
  t.regex(r.stdout, / 8388608 /);
  await a.sh('rm -f /tmp/big');
});

it.serial('exhaustion: fd exhaustion stops at RLIMIT_NOFILE with EMFILE', async (t) => {
  const a = node.boxes[0]!;
  const r = await a.attack('fds');
  t.regex(r.out, /^OPENED 25\d EMFILE$/);
  await neighbourHealthy(t);
});

it.serial('exhaustion: a gateway holding more descriptors than the sandbox RLIMIT_NOFILE still creates and execs, and none of them reaches the sandbox', async (t) => {
  // A node with thousands of sandboxes holds a pidfd for each; a sandbox child starts with a copy
  // of that table and must still open what it needs (a Landlock ruleset) under its own limit.
  const held: number[] = [];
  for (let i = 0; i < 1100; i++) held.push(openSync('/dev/null', 'r'));
  let c: Awaited<ReturnType<typeof box>> | null = null;
  try {
    t.true(Math.max(...held) > 1024, `the test holds fds up to ${Math.max(...held)}, above every sandbox limit here`);
    c = await box(node.shim, { memoryMb: 96, pids: 64, diskMb: 48 });
    const r = await c.sh('ulimit -n; ls /proc/self/fd | wc -l; sleep 30 & ls /proc/$!/fd | wc -l');
    const [limit, mine, bg] = r.stdout.trim().split('\n').map((l) => Number(l.trim()));
    t.is(limit, 256, r.stdout);
    // 0..2 and the directory ls reads; nothing of the gateway's
    t.true(mine! <= 4 && bg! <= 3, `exec holds ${mine} fds, its background child ${bg}`);
    t.true(readdirSync(`/proc/${c.pid}/fd`).length <= 3, 'the sandbox pid 1 holds only 0..2');
  } finally {
    for (const fd of held) closeSync(fd);
    if (c) await node.shim.deleteSandbox(c.id);
  }
});

it.serial('density: a sandbox with a disk mounts as few superblocks as it can (/dev and /dev/shm on its disk, one mask tmpfs and one sysfs for the whole node)', async (t) => {
  // Each superblock costs every memory cgroup of the node a slot in its shrinker bookkeeping.
  const devOf = (pid: number | 'self') => new Map(readFileSync(`/proc/${pid}/mountinfo`, 'utf8').split('\n').filter((l) => l !== '').map((l) => [l.split(' ')[4]!, l.split(' ')[2]!]));
  const host = new Set(devOf('self').values());
  const [a, b] = [devOf(node.boxes[0]!.pid), devOf(node.boxes[1]!.pid)];
  t.is(a.get('/dev'), a.get('/dev/shm'), '/dev and /dev/shm are the disk tmpfs');
  const maskedIn = (m: Map<string, string>) => ['/proc/acpi', '/proc/scsi', '/sys/firmware', '/sys/devices/virtual/powercap'].filter((p) => m.has(p)).map((p) => m.get(p)!);
  const masks = new Set([...maskedIn(a), ...maskedIn(b)]);
  t.true(maskedIn(a).length > 0, 'some directory is masked');
  t.is(masks.size, 1, `every masked directory of both sandboxes is the same tmpfs: ${[...masks].join(' ')}`);
  // one sysfs for the node too, and not the host's (that one shows the host's network interfaces)
  t.is(a.get('/sys'), b.get('/sys'), 'both sandboxes bind the node sysfs');
  t.false(host.has(a.get('/sys')!), 'the node sysfs is not the host one');
  // overlay, proc, devpts and the disk; the mask and the sysfs are the node's
  const own = new Set([...a.values()].filter((d) => !host.has(d) && !masks.has(d) && d !== a.get('/sys')));
  t.true(own.size <= 4, `superblocks of its own: ${[...own].join(' ')}`);
  // read-only, and no network interface in it: neither the host's nor a sandbox's
  const sys = await node.boxes[0]!.sh('ls /sys/class/net | wc -l; ls -d /sys/kernel; touch /sys/x 2>/dev/null || echo ro');
  t.is(sys.stdout, '0\n/sys/kernel\nro\n');
  const r = await node.boxes[0]!.sh('echo x > /dev/probe && cat /dev/probe && rm /dev/probe && stat -c %a /dev; touch /proc/acpi/x 2>/dev/null || echo masked-ro');
  t.is(r.stdout, 'x\n755\nmasked-ro\n');
});

it.serial('exhaustion: a memory balloon is OOM-killed inside its cgroup and reported as oom', async (t) => {
  const a = node.boxes[0]!;
  const r = await a.sh('head -c 400m /dev/zero | tail -c 300m > /dev/null', { timeoutMs: 30_000 });
  t.true(native.cgroupStats(a.id).oomKills > 0, `status ${r.status}`);
  t.is(native.cgroupOomKills(a.id), native.cgroupStats(a.id).oomKills, 'the one-file read gives the same count');
  await neighbourHealthy(t);
  t.is((await a.sh('echo still-here')).stdout, 'still-here\n');
});

it.serial('exhaustion: /dev/shm is bounded (ENOSPC), not host memory', async (t) => {
  const a = node.boxes[0]!;
  const r = await a.sh('for i in $(seq 1 12); do dd if=/dev/zero of=/dev/shm/x$i bs=1M count=7 2>&1 || break; done; rm -f /dev/shm/x*');
  t.regex(r.stdout, /No space left on device/);
});

it.serial('exhaustion: a stdout flood is truncated with a flag; the caller keeps bounded memory', async (t) => {
  const a = node.boxes[0]!;
  const r = await node.shim.exec(a.id, { cmd: 'head -c 50000000 /dev/zero', maxOutputBytes: 1 << 20, timeoutMs: 30_000 });
  t.true(r.truncated);
  t.is(r.stdout.length, 1 << 20);
});

it.serial('exhaustion: a busy loop past its timeout is killed with status timeout', async (t) => {
  const a = node.boxes[0]!;
  const r = await a.sh('while :; do :; done', { timeoutMs: 500 });
  t.is(r.status, 'timeout');
  await neighbourHealthy(t);
});
