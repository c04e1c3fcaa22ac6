/**
 * The host tunables a node sets at start (src/shim/host-tunables.ts), against the real kernel:
 * here the cgroup `favordynmods` flag, which spares every cgroup migration (each exec joins the
 * sandbox's v1 groups on a v1 host) an RCU grace period after a quiet spell.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { raiseHostLimits } from '../../src/shim/host-tunables';
import { rootReason, testUnless } from '../helpers/skip';

function cgroupMounts(): Array<{ target: string; fstype: string; options: string[] }> {
  return readFileSync('/proc/self/mounts', 'utf8')
    .split('\n')
    .map((l) => l.split(' '))
    .filter((f) => f[2] === 'cgroup2' || f[2] === 'cgroup')
    .map((f) => ({ target: f[1]!, fstype: f[2]!, options: (f[3] ?? '').split(',') }));
}

/** The mount the node sets the flag on: the cgroup2 one, else the first cgroup one. */
function flagMount(): { target: string; fstype: string; options: string[] } | undefined {
  const all = cgroupMounts();
  return all.find((m) => m.fstype === 'cgroup2') ?? all[0];
}

const it = testUnless(rootReason ?? (flagMount() === undefined ? 'no cgroup file system is mounted here' : null));

const favoured = () => cgroupMounts().some((m) => m.options.includes('favordynmods'));

it.serial('a node start sets favordynmods on a cgroup mount, and says so in its tunables report', (t) => {
  const m = flagMount()!;
  // Clearing the flag needs a remount with every other option of the mount given again; that is
  // only done where the mount has nothing but the options below (so nothing else can be lost).
  const plain = m.options.every((o) => ['rw', 'relatime', 'favordynmods'].includes(o)) && m.fstype === 'cgroup2';
  if (plain && favoured()) {
    // mount(2) itself: mount(8) would merge the options it finds, favordynmods included
    execFileSync('python3', ['-c', `import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
MS_REMOUNT, MS_RELATIME = 32, 0x200000
if libc.mount(b'cgroup2', sys.argv[1].encode(), b'cgroup2', ctypes.c_ulong(MS_REMOUNT | MS_RELATIME), b'') != 0:
    sys.exit(os.strerror(ctypes.get_errno()))`, m.target]);
    t.false(favoured(), 'the flag was cleared for the test');
  }
  const wasSet = favoured();
  try {
    const row = raiseHostLimits().find((r) => r.name === 'cgroup.favordynmods');
    t.truthy(row, 'the report has a row for the flag');
    if (row!.status === 'short') {
      t.regex(row!.reason ?? '', /favordynmods/, 'a flag that cannot be set says why');
      return;
    }
    t.is(row!.status, wasSet ? 'ok' : 'raised');
    t.is(row!.value, 1);
    t.true(favoured(), 'the mount carries the flag');
    if (plain) t.false(wasSet, 'the raise path ran');
    t.is(raiseHostLimits().find((r) => r.name === 'cgroup.favordynmods')?.status, 'ok', 'a second start finds it set');
  } finally {
    // never leave the host slower than the test found it
    if (!favoured()) execFileSync('mount', ['-o', 'remount,favordynmods', m.target]);
  }
});
