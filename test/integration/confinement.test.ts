/**
 * confinement end to end on a real node: the disk quota of the writable layer,
 * rlimits from the profile, hot reload of the policy through `warren policy apply` (a running
 * sandbox's next exec gets the new seccomp choice), and the doctor/features report.
 */
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { main } from '../../src/cli/main';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import { integrationSkipReason, withGateway } from './gateway-fixture';
import { spec, withShim } from '../helpers/warren';
import { attackBinary } from '../adversarial/helpers';
import { testUnless } from '../helpers/skip';

const why = integrationSkipReason();
const it = testUnless(why).serial;

const dir = join(mkdtempSync(join(tmpdir(), 'warren-policy-conf-')), 'policies');
cpSync(BUNDLED_POLICY_DIR, dir, { recursive: true });
const audit = join(dir, '..', 'audit.log');
usePolicyStore(new PolicyStore(dir, audit));

function io() {
  const out: string[] = [];
  const err: string[] = [];
  return { io: { out: (s: string) => out.push(s), err: (s: string) => err.push(s), env: {} as NodeJS.ProcessEnv }, out, err };
}

it('quota: diskMb sizes the writable layer; the profile default applies when the request has none', async (t) => {
  await withShim(t, async ({ shim }) => {
    const a = await shim.createSandbox(spec({ diskMb: 64 }));
    const b = await shim.createSandbox(spec({ diskMb: null }));
    const da = await shim.exec(a.id, { cmd: "df -m / | tail -1 | awk '{print $2}'" });
    const db = await shim.exec(b.id, { cmd: "df -m / | tail -1 | awk '{print $2}'" });
    t.is(da.stdout.trim(), '64');
    t.is(db.stdout.trim(), '2048');
    const r = await shim.exec(a.id, { cmd: 'dd if=/dev/zero of=/root/f bs=1M count=100 2>&1; echo rc=$?' });
    t.regex(r.stdout, /No space left on device/);
    await shim.deleteSandbox(a.id);
    await shim.deleteSandbox(b.id);
  });
});

it('rlimits: RLIMIT_NOFILE and RLIMIT_FSIZE come from the profile, for exec and pid 1', async (t) => {
  await withShim(t, async ({ shim }) => {
    const a = await shim.createSandbox(spec());
    const r = await shim.exec(a.id, { cmd: 'ulimit -n; ulimit -f' });
    t.is(r.stdout, `4096\n${(4096 * 1024 * 1024) / 512}\n`);
    t.regex(readFileSync(`/proc/${a.pid}/limits`, 'utf8'), /Max open files\s+4096\s+4096/);
    await shim.deleteSandbox(a.id);
  });
});

it('policy apply: a running gateway hot-reloads the policy; the next exec gets the new seccomp choice; errors keep the last good policy', async (t) => {
  await withGateway(t, async ({ url, adminToken, admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    // the attack program of the adversarial suite tries PTRACE_TRACEME
    await sb.writeFile('/tmp/attack', readFileSync(attackBinary()), 0o755);
    t.is((await sb.exec(['/tmp/attack', 'ptrace-traceme'])).stdout, 'DENIED EPERM\n');

    // 1. a bad edit: rejected with file:line, nothing changes
    const p = join(dir, 'seccomp.yaml');
    const good = readFileSync(p, 'utf8');
    writeFileSync(p, good.replace('ptrace: false        # ptrace', 'ptrace: yes-please        # ptrace'));
    const bad = io();
    t.is(await main(['policy', 'apply', '--url', url, '--token', adminToken], bad.io), 1);
    t.regex(bad.err.join(''), /seccomp\.yaml:\d+: filters\.default\.allow\.ptrace must be true or false/);
    t.regex(bad.err.join(''), /last good policy stays in force/);

    // 2. a good edit: applied, diff printed, audited
    writeFileSync(p, good.replace('ptrace: false        # ptrace', 'ptrace: true        # ptrace'));
    const ok = io();
    t.is(await main(['policy', 'apply', '--url', url, '--token', adminToken], ok.io), 0);
    t.regex(ok.out.join(''), /seccomp\.default\.allow\.ptrace: false -> true/);
    const events = readFileSync(audit, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { event: string }).event);
    t.deepEqual(events.slice(-2), ['rejected', 'applied']);
    // the running sandbox's next exec is confined by the new policy
    t.is((await sb.exec(['/tmp/attack', 'ptrace-traceme'])).stdout, 'ALLOWED\n');

    // 3. show + validate
    const show = io();
    t.is(await main(['policy', 'show', '--url', url, '--token', adminToken], show.io), 0);
    t.regex(show.out.join(''), /"defaultProfile": "warren-default"/);
    const v = io();
    t.is(await main(['policy', 'validate', dir], v.io), 0);
    t.regex(v.out.join(''), /valid/);
    writeFileSync(p, good);
  });
});

it('doctor: prints the active enforcer', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    const d = io();
    await main(['doctor', '--url', url, '--token', adminToken], d.io);
    t.regex(d.out.join(''), /enforcer: (apparmor|landlock \(ABI \d+\))/);
    t.regex(d.out.join(''), /bpf-lsm/);
  });
});

it('landlock cache: a mount made in the sandbox after the first exec, or a new top-level directory, is covered by the next exec', async (t) => {
  const { execFileSync } = await import('node:child_process');
  await withShim(t, async ({ shim }) => {
    const a = await shim.createSandbox(spec());
    t.is((await shim.exec(a.id, { cmd: 'echo a > /root/a && echo ok' })).stdout, 'ok\n');
    execFileSync('nsenter', ['-t', String(a.pid), '-m', 'mount', '-t', 'tmpfs', 'none', '/root']);
    t.is((await shim.exec(a.id, { cmd: 'echo b > /root/b && echo ok' })).stdout, 'ok\n');
    // a new top-level directory made through the files API is writable from the next exec on
    await shim.writeFile(a.id, '/newtop/seed', Buffer.from('x'));
    t.is((await shim.exec(a.id, { cmd: 'echo c > /newtop/c && echo ok' })).stdout, 'ok\n');
    // the kernel's interfaces stay read-only
    t.regex((await shim.exec(a.id, { cmd: '(echo d > /sys/kernel/d) 2>&1; true' })).stdout, /Permission denied|Read-only file system/);
    await shim.deleteSandbox(a.id);
  });
});
