/**
 * Adversarial suite, part 1: escape and host integrity (research/security_anchors.md A.1-A.8).
 * Real attacks from attack.c inside a confined sandbox; each asserts the safe outcome.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT, refused, sharedNode } from './helpers';

const node = sharedNode(1);
const { it } = node;

// seccomp: each of these is refused with EPERM (a clear error, not a kill)
const EPERM_ATTACKS: Array<[string, string?]> = [
  ['mount'],
  ['umount'],
  ['pivot_root'],
  ['unshare-user'],
  ['unshare-mnt'],
  ['clone-newuser'],
  ['keyctl'],
  ['add_key'],
  ['request_key'],
  ['bpf'],
  ['perf_event_open'],
  ['kexec_load'],
  ['kexec_file_load'],
  ['open_by_handle_at'],
  ['init_module'],
  ['finit_module'],
  ['delete_module'],
  ['userfaultfd'],
  ['io_uring_setup'],
  ['ptrace-traceme'],
  ['process_vm_readv'],
  ['chroot'],
  ['tiocsti'],
  ['tiocsti64'],
  ['tioclinux'],
  ['packet-socket'],
  ['raw-socket'],
  ['raw6-socket'],
];

for (const [name, arg] of EPERM_ATTACKS) {
  it(`escape: ${name}${arg ? ` ${arg}` : ''} is refused with EPERM`, async (t) => {
    refused(t, await node.boxes[0]!.attack(name, arg), 'EPERM');
  });
}

it('escape: clone3 (flags hidden in memory) answers ENOSYS so libc falls back to the filtered clone', async (t) => {
  refused(t, await node.boxes[0]!.attack('clone3'), 'ENOSYS');
});

it('escape: setns into /proc/1/ns/mnt is refused', async (t) => {
  refused(t, await node.boxes[0]!.attack('setns', '/proc/1/ns/mnt'));
});

it('escape: x32 ABI syscalls kill the process (SIGSYS)', async (t) => {
  const r = await node.boxes[0]!.attack('x32');
  t.is(r.result.signal, 31);
  t.is(r.out, '');
});

it('escape: i386 syscalls through int 0x80 kill the process (SIGSYS)', async (t) => {
  const r = await node.boxes[0]!.attack('int80');
  t.is(r.result.signal, 31);
});

it('escape: a plain TCP socket still works (the filter is not a blanket deny)', async (t) => {
  t.is((await node.boxes[0]!.attack('tcp-socket')).out, 'ALLOWED');
});

it('escape: /proc/sysrq-trigger cannot be written and /proc/kcore cannot be read', async (t) => {
  const b = node.boxes[0]!;
  const w = await b.attack('write', '/proc/sysrq-trigger');
  t.not(w.out, 'ALLOWED', 'sysrq-trigger write reached the kernel');
  const r = await b.attack('read', '/proc/kcore');
  t.true(r.out === 'EMPTY' || r.out.startsWith('DENIED'), r.out);
});

it('escape: /sys, /proc/sys and cgroup release_agent are not writable', async (t) => {
  const b = node.boxes[0]!;
  for (const p of ['/sys/kernel/mm/ksm/run', '/proc/sys/kernel/core_pattern', '/sys/fs/cgroup/release_agent', '/sys/kernel/security/lsm']) {
    refused(t, await b.attack('write', p));
  }
});

it('escape: the default profile lets a sandbox change its own system dirs (its overlay), never the image under them nor the kernel interfaces', async (t) => {
  const b = node.boxes[0]!;
  for (const p of ['/etc/passwd', '/bin/sh-evil', '/usr/evil']) t.is((await b.attack('write', p)).out, 'ALLOWED', p);
  // the image's layer on the host is untouched: the writes went to this sandbox's upper layer
  const layer = node.shim.layers.mountPath(node.shim.getSandbox(b.id).layers.at(-1)!);
  t.regex(readFileSync(join(layer, 'etc/passwd'), 'utf8'), /^root:/);
  t.false(existsSync(join(layer, 'usr/evil')));
  for (const p of ['/proc/sys/kernel/core_pattern', '/sys/kernel/uevent_helper']) refused(t, await b.attack('write', p));
  t.is((await b.attack('write', '/tmp/ok')).out, 'ALLOWED');
  t.is((await b.attack('write', '/root/ok')).out, 'ALLOWED');
  t.is((await b.sh('mkdir -p /work 2>/dev/null; echo x > /tmp/y && mv /tmp/y /root/y && cat /root/y')).stdout, 'x\n');
});

it('escape: a block device made with mknod is inert (nodev)', async (t) => {
  const b = node.boxes[0]!;
  const r = await b.sh('/usr/local/bin/attack mknod; head -c 1 /tmp/sda; echo rc=$?');
  t.regex(r.stdout, /rc=1/);
});

it('escape: every sandbox process runs with no_new_privs, a seccomp filter and no CAP_SYS_ADMIN/NET_RAW', async (t) => {
  const b = node.boxes[0]!;
  const out = (await b.attack('setuid-root-caps')).out;
  t.regex(out, /NoNewPrivs:\s+1/);
  t.regex(out, /Seccomp:\s+2/);
  const eff = BigInt(`0x${/CapEff:\s+([0-9a-f]+)/.exec(out)![1]}`);
  t.is(eff & (1n << 21n), 0n, 'CAP_SYS_ADMIN');
  t.is(eff & (1n << 13n), 0n, 'CAP_NET_RAW');
  t.is(eff & (1n << 19n), 0n, 'CAP_SYS_PTRACE');
  // pid 1 (warren-init) too
  const init = readFileSync(`/proc/${b.pid}/status`, 'utf8');
  t.regex(init, /Seccomp:\s+2/);
  t.regex(init, /NoNewPrivs:\s+1/);
});

it('escape: the host root is not reachable through /proc/1/root or the sandbox root', async (t) => {
  const b = node.boxes[0]!;
  // a file only the host has
  t.true(existsSync(join(REPO_ROOT, 'package.json')));
  const r = await b.sh(`cat /proc/1/root${REPO_ROOT}/package.json ${REPO_ROOT}/package.json 2>&1; ls /proc/1/root${REPO_ROOT} 2>&1; echo done`);
  t.regex(r.stdout, /done\n$/, 'the probe ran to its end');
  t.false(r.stdout.includes('"name": "warren"'));
});

it('escape: the shell session holder runs confined like exec', async (t) => {
  const b = node.boxes[0]!;
  const att = await node.shim.openSession(b.id, { mode: 'command' });
  try {
    let out = '';
    att.onOutput((o) => {
      out += o.data.toString();
    });
    const res = await att.run('c1', 'grep -E "Seccomp|NoNewPrivs" /proc/self/status; /usr/local/bin/attack mount', 15_000);
    t.regex(out, /Seccomp:\s+2/);
    t.regex(out, /DENIED EPERM/);
    t.is(res.exitCode, 1, 'the attack reports its denial and exits 1');
  } finally {
    await att.close();
  }
});
