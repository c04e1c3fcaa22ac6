/**
 * Adversarial suite, part 3: cross-sandbox access (research/security_anchors.md A.10, B.20).
 * Sandbox A attacks sandbox B with real tools; B (and the node) must not notice.
 * Also: Landlock scoping in the fncall profile separates the processes of different execs.
 */
import test from 'ava';
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { activeEnforcer } from '../../src/features';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import { box, refused, sharedNode } from './helpers';
import { waitFor } from '../helpers/wait';

// Sandboxes owned by "judge" run under warren-fncall (Landlock signal/abstract-unix scoping).
const policyDir = mkdtempSync(join(tmpdir(), 'warren-policy-x-'));
cpSync(BUNDLED_POLICY_DIR, policyDir, { recursive: true });
writeFileSync(join(policyDir, 'accounts.yaml'), readFileSync(join(policyDir, 'accounts.yaml'), 'utf8').replace('accounts: {}', 'accounts:\n  judge:\n    profile: warren-fncall'));
usePolicyStore(new PolicyStore(policyDir));

const node = sharedNode(2);
const { it } = node;

/** Start a long-running marked process in B; returns its host pid. */
let victims = 0;
const marks = new Map<number, string>();
const alive = (pid: number) => { try { return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(marks.get(pid)!); } catch { return false; } };
async function victim(_tag: string): Promise<number> {
  const b = node.boxes[1]!;
  const mark = String(600_000 + ++victims * 7919);
  await b.sh(`sleep ${mark} >/dev/null 2>&1 &`);
  for (let i = 0; i < 50; i++) {
    const procs = (await import('../../src/native')).native.cgroupProcs(b.id);
    for (const p of procs) {
      try {
        if (readFileSync(`/proc/${p}/cmdline`, 'utf8').includes(mark)) { marks.set(p, mark); return p; }
      } catch {
        /* gone */
      }
    }
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('victim did not start');
}

it('cross-sandbox: A cannot see B\'s processes', async (t) => {
  const pid = await victim('see');
  const r = await node.boxes[0]!.sh('ps; cat /proc/*/cmdline 2>/dev/null | tr "\\0" " "');
  t.false(r.stdout.includes(marks.get(pid)!));
});

it('cross-sandbox: A cannot signal B\'s process (by host pid)', async (t) => {
  const pid = await victim('signal');
  refused(t, await node.boxes[0]!.attack('kill', String(pid)));
  t.true(alive(pid), 'victim died');
});

it('cross-sandbox: A cannot ptrace B\'s process', async (t) => {
  const pid = await victim('ptrace');
  refused(t, await node.boxes[0]!.attack('ptrace-attach', String(pid)), 'EPERM');
  t.notRegex(readFileSync(`/proc/${pid}/status`, 'utf8'), /TracerPid:\s+[1-9]/);
});

it('cross-sandbox: A cannot read B\'s files (filesystem, /proc/<pid>/root, /dev/shm)', async (t) => {
  const [a, b] = node.boxes as [typeof node.boxes[0], typeof node.boxes[0]];
  await b!.sh('echo SECRET-B-7f3a > /root/secret; echo SECRET-B-7f3a > /dev/shm/secret; echo SECRET-B-7f3a > /tmp/secret');
  const pid = b!.pid;
  const r = await a!.sh(`grep -rs SECRET-B-7f3a /root /tmp /dev/shm /home /var /etc 2>/dev/null; cat /proc/${pid}/root/root/secret 2>/dev/null; ls /proc/${pid} 2>/dev/null | head -1; echo end`);
  t.false(r.stdout.includes('SECRET-B-7f3a'));
});

it('cross-sandbox: A cannot connect to B\'s abstract unix socket', async (t) => {
  const [a, b] = node.boxes;
  const listener = await node.shim.execStream(b!.id, { cmd: ['/usr/local/bin/attack', 'abstract-listen', 'warren-xsb'] });
  try {
    await new Promise<void>((res) => listener.stdout.once('data', () => res()));
    refused(t, await a!.attack('abstract-connect', 'warren-xsb'), 'ECONNREFUSED');
  } finally {
    listener.kill();
  }
});

it.serial('cross-sandbox: kill -9 -1 inside A kills only A\'s processes', async (t) => {
  const c = await box(node.shim);
  try {
    const pid = await victim('killall');
    await c.sh('sleep 600 >/dev/null 2>&1 & sleep 0.1; kill -9 -1; echo after');
    t.true(alive(pid), 'B\'s process died');
    t.is((await node.boxes[1]!.sh('echo b-ok')).stdout, 'b-ok\n');
    // A itself survives (its init ignores signals from inside) and works
    t.is((await c.sh('echo c-ok')).stdout, 'c-ok\n');
  } finally {
    await node.shim.deleteSandbox(c.id);
  }
});

it.serial('cross-sandbox: killing pid 1 from inside does nothing; killing it from outside ends only that sandbox', async (t) => {
  const c = await box(node.shim);
  try {
    await c.sh('kill -9 1; kill -TERM 1; echo sent');
    t.is((await c.sh('echo alive')).stdout, 'alive\n');
    process.kill(c.pid, 'SIGKILL');
    await waitFor(() => node.shim.getSandbox(c.id).state !== 'running', 5000, 'the sandbox to be seen stopped');
    t.is((await node.boxes[1]!.sh('echo b-ok')).stdout, 'b-ok\n');
  } finally {
    await node.shim.deleteSandbox(c.id).catch(() => undefined);
  }
});

const scoping = activeEnforcer().landlockAbi >= 6;
const itScoped = scoping ? it : (title: string, _fn: unknown) => test.skip(`${title} (skipped: Landlock ABI < 6 has no scoping)`, () => undefined);
itScoped(
  'cross-exec (fncall profile): a process cannot signal or reach the abstract sockets of another exec (Landlock scopes)',
  async (t) => {
    const j = await box(node.shim, { owner: 'judge' });
    try {
      const s = await node.shim.execStream(j.id, { cmd: ['/usr/local/bin/attack', 'abstract-listen', 'warren-judge'] });
      await new Promise<void>((res) => s.stdout.once('data', () => res()));
      refused(t, await j.attack('abstract-connect', 'warren-judge'), 'EPERM');
      refused(t, await j.attack('kill', String(1)), 'EPERM');
      const ps = await j.sh('pidof attack');
      refused(t, await j.attack('kill', ps.stdout.trim().split(' ')[0]!), 'EPERM');
      s.kill();
    } finally {
      await node.shim.deleteSandbox(j.id);
    }
  },
);
