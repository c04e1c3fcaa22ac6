/**
 * microVMs restored from a template snapshot (src/shim/backends/microvm/template.ts): each is
 * its own machine (id, randomness, clock, limits), the template's RAM is shared copy-on-write
 * from a sealed memfd nobody can write, and what a build left behind after a crash is removed.
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, readlinkSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { microvmBackendStatus, skipReason } from '../../src/features';
import { native } from '../../src/native';
import { MicroVMBackend } from '../../src/shim/backends/microvm/backend';
import type { SandboxInfo } from '../../src/shim/types';
import { closeTestShim, openTestShim, spec, type ShimFixture } from '../helpers/warren';
import { tempDir } from '../helpers/tmp';
import { waitFor } from '../helpers/wait';

const status = microvmBackendStatus();
const skip = skipReason('native-helper', 'qemu', 'microvm-guest') ?? (status.available ? null : `microvm backend unavailable: ${status.reason}`);
const it = skip === null ? test.serial : test.serial.skip;
const title = (s: string) => (skip === null ? s : `${s} (skipped: ${skip})`);

let f: ShimFixture;
const built: string[] = [];
const vms: SandboxInfo[] = [];
const vmSpec = () => spec({ backend: 'microvm', memoryMb: 192, diskMb: 64, cpu: 1 });

/** QEMU of a sandbox: the child of the jail's unshare (the sandbox's pid). */
function qemuOf(id: string): number {
  const gate = f.shim.getSandbox(id).pid!;
  return Number(readFileSync(`/proc/${gate}/task/${gate}/children`, 'utf8').trim().split(' ')[0]);
}

if (skip === null) {
  test.before(async () => {
    f = await openTestShim({ log: (l) => void (/template \S+ built/.test(l) && built.push(l)) });
    vms.push(await f.shim.createSandbox(vmSpec()));
    vms.push(await f.shim.createSandbox(vmSpec()));
  });
  test.after.always(async (t) => {
    if (f) await closeTestShim(f, (l) => t.log(l));
  });
}

it(title('two microVMs of one shape come from one template build, and each is its own machine'), async (t) => {
  t.is(built.length, 1, `one build for both: ${built.join('; ')}`);
  const probe = 'hostname; cat /proc/sys/kernel/random/boot_id; head -c 32 /dev/urandom | od -An -tx1 | tr -d " \\n"; echo; date +%s';
  const [a, b] = await Promise.all(vms.map((vm) => f.shim.exec(vm.id, { cmd: probe })));
  const now = Math.floor(Date.now() / 1000);
  const lines = [a, b].map((r) => r.stdout.trim().split('\n'));
  t.is(lines[0][0], vms[0].id);
  t.is(lines[1][0], vms[1].id);
  t.not(lines[0][1], lines[1][1], 'boot ids differ');
  t.regex(lines[0][2], /^[0-9a-f]{64}$/);
  t.not(lines[0][2], lines[1][2], 'the kernels random streams differ (reseeded from the host)');
  for (const l of lines) t.true(Math.abs(Number(l[3]) - now) <= 5, `guest clock ${l[3]} vs host ${now}`);
  const third = await f.shim.createSandbox(vmSpec());
  vms.push(third);
  t.is(built.length, 1, 'a third microVM of the same shape is restored too');
  t.is((await f.shim.exec(third.id, { cmd: 'hostname' })).stdout.trim(), third.id);
});

it(title("a restored VMM maps the template's RAM from a sealed memfd: writes to it are refused, the template file stays as built"), async (t) => {
  const templates = join(f.dataDir, 'microvm-templates');
  const [key] = readdirSync(templates).filter((n) => /^[0-9a-f]{32}$/.test(n));
  const ramFile = join(templates, key, 'ram');
  const digest = () => createHash('sha256').update(readFileSync(ramFile)).digest('hex');
  const before = digest();
  const qemu = qemuOf(vms[0].id);
  const target = readlinkSync(`/proc/${qemu}/fd/3`);
  t.regex(target, /^\/memfd:warren-template-/);
  const maps = readFileSync(`/proc/${qemu}/maps`, 'utf8');
  t.regex(maps, / \/memfd:warren-template-\S+ \(deleted\)/, 'guest RAM is that memfd');
  t.false(maps.includes(ramFile), 'the VMM never maps the template file itself');
  // filled: a fault on a hole would allocate it in the memfd, charged to the faulting VMM (a pause reads every page)
  const st = statSync(`/proc/${qemu}/fd/3`);
  t.is(st.size, vmSpec().memoryMb * 1024 * 1024);
  t.true(st.blocks * 512 >= st.size, `memfd has ${st.blocks * 512} of ${st.size} bytes allocated`);
  // even root cannot write into it through the VMM's descriptor
  const fd = openSync(`/proc/${qemu}/fd/3`, 'r+');
  try {
    t.throws(() => writeSync(fd, Buffer.from('poison'), 0, 6, 4096), { code: 'EPERM' });
  } finally {
    closeSync(fd);
  }
  // the guest writing its memory changes only its own copy
  const w = await f.shim.exec(vms[0].id, { cmd: 'head -c 50000000 /dev/urandom > /dev/shm/x && rm /dev/shm/x && echo ok', timeoutMs: 120_000 });
  t.is(w.stdout, 'ok\n');
  t.is(digest(), before, 'the template RAM file is unchanged');
  const third = vms[2];
  t.is((await f.shim.exec(third.id, { cmd: 'echo fine' })).stdout, 'fine\n', 'its siblings run on');
});

it(title('a restored guest has resident only what it uses, not its whole RAM'), async (t) => {
  // a booted guest has nearly all of its RAM resident (its kernel is decompressed through it)
  const qemu = qemuOf(vms[1].id);
  const anonKb = Number(/^RssAnon:\s+(\d+) kB/m.exec(readFileSync(`/proc/${qemu}/status`, 'utf8'))![1]);
  t.log(`QEMU anonymous memory: ${Math.round(anonKb / 1024)} MiB for a ${vmSpec().memoryMb} MiB guest`);
  t.true(anonKb < vmSpec().memoryMb * 1024 * 0.75, `${anonKb} kB`);
});

it(title('pause and resume of a restored microVM keep it, and its clock is the host time again'), async (t) => {
  const id = vms[1].id;
  // a clock far off, so that only the resume setting it can bring it back
  await f.shim.exec(id, { cmd: 'echo kept > /root/mark && date -u -s @1000000000 >/dev/null' });
  const p = await f.shim.pauseSandbox(id);
  t.true((p.writtenBytes ?? 0) > 0);
  const r = await f.shim.exec(id, { cmd: 'cat /root/mark; date +%s' });
  const [mark, clock] = r.stdout.trim().split('\n');
  t.is(mark, 'kept');
  t.true(Math.abs(Number(clock) - Date.now() / 1000) <= 5, `guest clock ${clock}`);
});

it(title('what a template build of a dead process left (its VMM, cgroup, directory) is removed by the next backend'), async (t) => {
  const dataDir = tempDir('warren-tpl-sweep-');
  const root = join(dataDir, 'microvm-templates');
  const dir = join(root, `${'ab'.repeat(16)}.build-999999-0000`);
  mkdirSync(dir, { recursive: true });
  const cg = `tpl-sweep-${process.pid}`;
  native.cgroupCreate(cg, { memoryBytes: 64 << 20, pidsMax: 8 });
  const fake = spawn('sleep', ['600'], { detached: true, stdio: 'ignore' });
  native.cgroupAttach(cg, fake.pid!);
  writeFileSync(join(dir, 'vmm.json'), JSON.stringify({ pid: fake.pid, startTime: native.processStartTime(fake.pid!), cgroup: cg }));
  const exited = new Promise((r) => fake.once('exit', r));
  const logs: string[] = [];
  const backend = new MicroVMBackend({ dataDir, runRoot: join(dataDir, 'run'), log: (l) => logs.push(l) });
  try {
    await exited;
    await waitFor(() => !native.cgroupExists(cg) && !existsSync(dir), 10_000, 'the sweep');
    t.regex(logs.join('\n'), /removed 1 unfinished template build/);
  } finally {
    backend.close();
    if (native.cgroupExists(cg)) native.cgroupDestroy(cg);
  }
});
