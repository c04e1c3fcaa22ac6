/**
 * microVM sandboxes through the node (ShimNode), against real QEMU guests.
 * Guest boots cost seconds of a core under TCG, so one booted microVM is
 * shared by the serial tests and QEMU is always killed in teardown.
 */
import test from 'ava';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { release } from 'node:os';
import net from 'node:net';
import { join } from 'node:path';
import { microvmBackendStatus, skipReason } from '../../src/features';
import { WarrenError } from '../../src/errors';
import type { SandboxInfo } from '../../src/shim/types';
import { closeTestShim, countHostResources, openTestShim, spec, type ShimFixture } from '../helpers/warren';
import { tempDir } from '../helpers/tmp';

const status = microvmBackendStatus();
const skip = skipReason('native-helper', 'qemu', 'microvm-guest') ?? (status.available ? null : `microvm backend unavailable: ${status.reason}`);
const it = skip === null ? test.serial : test.serial.skip;
const title = (s: string) => (skip === null ? s : `${s} (skipped: ${skip})`);

let f: ShimFixture;
let vm: SandboxInfo;
let sessionId = '';
const vmSpec = () => spec({ backend: 'microvm', memoryMb: 192, diskMb: 64, cpu: 1 });

async function until(fn: () => Promise<boolean>, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (await fn()) return true;
    await new Promise((r) => setTimeout(r, 100));
  }
  return fn();
}

function vmmProcesses(id: string): number[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((pid) => {
      try {
        return require('node:fs').readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(`warren-${id}`);
      } catch {
        return false;
      }
    })
    .map(Number);
}

if (skip === null) {
  test.before(async () => {
    f = await openTestShim();
    vm = await f.shim.createSandbox(vmSpec());
  });
  test.after.always(async (t) => {
    if (f) await closeTestShim(f, (l) => t.log(l));
  });
}

it(title('the feature report names the microvm backend, its accelerator and facets'), async (t) => {
  const b = f.shim.features().backends.microvm;
  t.true(b.available);
  t.regex(b.accelerator ?? '', /^(kvm|tcg) \(/);
  t.true(b.facets?.files.offered);
  t.false(b.facets?.network.offered);
  t.is(vm.backend, 'microvm');
  t.is(typeof vm.pid, 'number');
});

it(title('the VMM is jailed: own namespaces, unprivileged, seccomp, sees no other sandbox'), async (t) => {
  const fs = require('node:fs') as typeof import('node:fs');
  const gate = f.shim.getSandbox(vm.id).pid!;
  const qemu = Number(fs.readFileSync(`/proc/${gate}/task/${gate}/children`, 'utf8').trim().split(' ')[0]);
  const status = fs.readFileSync(`/proc/${qemu}/status`, 'utf8');
  t.regex(status, /^Uid:\s+(\d+)/m);
  t.not(/^Uid:\s+(\d+)/m.exec(status)![1], '0', 'QEMU runs unprivileged');
  t.regex(status, /^Seccomp:\s+2$/m, 'under a seccomp filter');
  t.regex(status, /^NSpid:\s+\d+\s+1$/m, 'pid 1 of its own pid namespace');
  for (const ns of ['mnt', 'net', 'ipc', 'uts', 'pid']) t.not(fs.readlinkSync(`/proc/${qemu}/ns/${ns}`), fs.readlinkSync(`/proc/self/ns/${ns}`), ns);
  t.deepEqual(fs.readdirSync(`/proc/${qemu}/root/run/warren/vm`), [vm.id], 'only its own run dir (sockets) is visible');
  t.deepEqual(fs.readdirSync(`/proc/${qemu}/root${join(f.dataDir, 'microvm')}`), [vm.id], 'only its own data dir (disk, snapshot) is visible');
  t.deepEqual(fs.readdirSync(`/proc/${qemu}/root/run/warren`), ['vm'], 'no session holder sockets');
});

it(title('the guest has its own kernel and sees no host processes, host files or other disks'), async (t) => {
  const uname = await f.shim.exec(vm.id, { cmd: 'uname -r' });
  t.is(uname.exitCode, 0);
  t.not(uname.stdout.trim(), release(), 'a guest kernel, not the host one');
  t.regex(uname.stdout, /cloud-amd64/);
  const marker = join(tempDir('warren-vm-host-'), 'host-only');
  writeFileSync(marker, 'x');
  const r = await f.shim.exec(vm.id, { cmd: `test -e ${marker} && echo visible; for e in /proc/[0-9]*/exe; do readlink $e; done 2>/dev/null | grep -c .; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c -e '[n]ode_modules' -e '[w]arren-test'; ls /sys/block; cat /etc/hostname` });
  const [count, hostProcs, ...rest] = r.stdout.trim().split('\n').filter((l) => l !== 'visible');
  t.false(r.stdout.includes('visible'), 'host files are not in the guest');
  t.true(Number(count) < 10, `guest user processes only (${count}): the agent, the shell and its pipeline`);
  t.is(hostProcs, '0', 'no host process (this test runner) is visible');
  const disks = rest.slice(0, -1).sort();
  t.deepEqual(disks, ['vda', 'vdb'], 'its writable disk and its one layer, nothing else');
  t.is(rest.at(-1), vm.id);
  // the host side of files goes through the agent: a host path is looked up in the guest
  await t.throwsAsync(f.shim.readFile(vm.id, marker, 100), { instanceOf: WarrenError });
});

it(title('a memory hog and a fork bomb stay inside the guest'), async (t) => {
  const vmmBefore = f.shim.getSandbox(vm.id).pid;
  const vmmProcs = vmmProcesses(vm.id).sort();
  let t0 = Date.now();
  const hog = await f.shim.exec(vm.id, { cmd: 'head -c 300000000 /dev/zero | tail -c 300000000 >/dev/null && echo survived', timeoutMs: 60_000 });
  t.not(hog.stdout, 'survived\n', 'the hog does not get 300 MB in a 192 MiB guest');
  t.log(`memory hog: ${hog.status} after ${Date.now() - t0} ms`);
  t0 = Date.now();
  const bomb = await f.shim.exec(vm.id, { cmd: 'b() { b | b & }; b', timeoutMs: 3000 });
  t.log(`fork bomb: ${bomb.status} after ${Date.now() - t0} ms`);
  t.true(['timeout', 'ok', 'error', 'killed', 'oom'].includes(bomb.status));
  // the VMM's own cgroup was never OOM-killed and holds only QEMU's threads
  t.deepEqual(vmmProcesses(vm.id).sort(), vmmProcs, 'the same VMM processes (the jail and QEMU), whatever the guest forks');
  t.true(await until(async () => (await f.shim.exec(vm.id, { cmd: 'kill -9 -1 2>/dev/null; echo ok', timeoutMs: 30_000 }).catch(() => ({ stdout: '' }))).stdout === 'ok\n', 60_000), 'the guest recovers once its processes are killed');
  t.log(`recovered after ${Date.now() - t0} ms`);
  t.is(f.shim.getSandbox(vm.id).pid, vmmBefore, 'the VMM itself was never killed');
});

it(title("the sandbox's pids limit holds inside the guest, and the agent can still start commands at it"), async (t) => {
  t.timeout(5 * 60_000);
  const limit = vmSpec().pids;
  // More background processes than the limit allows: the fork past it fails (EAGAIN), which ends this shell.
  const flood = await f.shim.exec(vm.id, { cmd: `i=0; while [ $i -lt ${limit + 50} ]; do sleep 600 & i=$((i+1)); done; echo all started`, timeoutMs: 240_000 });
  t.regex(flood.stderr, /can't fork: Resource temporarily unavailable/);
  t.notRegex(flood.stdout, /all started/);
  // At the limit a new command still starts (the agent forks outside the group); builtins only
  // from here on, as no process in the group can fork until some are gone.
  const forEachSleep = (action: string) => `n=0; for p in /proc/[0-9]*; do read -r c < $p/comm 2>/dev/null && [ "$c" = sleep ] && { n=$((n+1)); ${action}; }; done; echo $n`;
  const count = await f.shim.exec(vm.id, { cmd: forEachSleep(':'), timeoutMs: 60_000 });
  const started = Number(count.stdout.trim());
  t.log(`${started} of ${limit + 50} background processes started under pids ${limit}`);
  t.true(started < limit && started > limit / 2, `${started} started: ${JSON.stringify(count)}`);
  await f.shim.exec(vm.id, { cmd: forEachSleep('kill -9 ${p#/proc/}'), timeoutMs: 60_000 });
  t.true(await until(async () => (await f.shim.exec(vm.id, { cmd: forEachSleep(':') })).stdout.trim() === '0', 60_000), 'the sleeps are gone');
});

it(title('pause saves the VM to disk and ends the VMM; any request resumes it with its processes running'), async (t) => {
  await f.shim.exec(vm.id, { cmd: '(i=0; while :; do i=$((i+1)); echo $i > /root/count.tmp; mv /root/count.tmp /root/count; sleep 0.1; done) >/dev/null 2>&1 &' });
  t.true(await until(async () => Number((await f.shim.exec(vm.id, { cmd: 'cat /root/count' })).stdout) > 1, 20_000));
  const before = Number((await f.shim.exec(vm.id, { cmd: 'cat /root/count' })).stdout);
  const oldPid = f.shim.getSandbox(vm.id).pid!;
  const sess = await f.shim.openSession(vm.id, { mode: 'command' });
  sessionId = sess.info.id;
  t.is((await sess.run('c1', 'export KEPT=42; cd /root', 30_000)).exitCode, 0);
  sess.detach();
  const p = await f.shim.pauseSandbox(vm.id);
  t.is(p.state, 'paused');
  t.is(p.reclaim, 'snapshot');
  t.true((p.writtenBytes ?? 0) > 1 << 20, `snapshot bytes: ${p.writtenBytes}`);
  t.true(p.releasedBytes > 32 << 20, `released: ${p.releasedBytes}`);
  t.is(vmmProcesses(vm.id).length, 0, 'no VMM while paused');
  t.is(f.shim.getSandbox(vm.id).pid, undefined);
  t.log(`pause: ${p.durationMs} ms, ${p.writtenBytes} bytes written, ${p.releasedBytes} released`);
  const started = Date.now();
  const after = Number((await f.shim.exec(vm.id, { cmd: 'cat /root/count' })).stdout);
  t.log(`transparent resume + exec: ${Date.now() - started} ms`);
  t.is(f.shim.getSandbox(vm.id).state, 'running');
  t.not(f.shim.getSandbox(vm.id).pid, oldPid);
  t.true(after >= before);
  t.true(await until(async () => Number((await f.shim.exec(vm.id, { cmd: 'cat /root/count' })).stdout) > after, 20_000), 'the background counter goes on counting');
  t.false(existsSync(join(f.dataDir, 'microvm', vm.id, 'snapshot')), 'the snapshot is removed once resumed');
  // the shell session opened before the pause answers after the resume, with its state
  const listed = (await f.shim.listSessions(vm.id)).find((x) => x.id === sessionId)!;
  const att = await f.shim.attachSession(vm.id, sessionId, listed.outputOffset);
  const out: Buffer[] = [];
  att.onOutput((o) => out.push(o.data));
  const r = await att.run('c2', 'echo "$KEPT $PWD"', 30_000);
  t.is(r.exitCode, 0, 'the command finished (its status came through)');
  t.true(await until(async () => Buffer.concat(out).toString() === '42 /root\n', 5000), Buffer.concat(out).toString());
  await att.close();
});

it(title('a restarted node re-adopts the running microVM and its shell session'), async (t) => {
  await f.shim.writeFile(vm.id, '/root/kept', Buffer.from('kept\n'));
  const sess = await f.shim.openSession(vm.id, { mode: 'command' });
  sessionId = sess.info.id;
  t.is((await sess.run('r1', 'export KEPT=42', 30_000)).exitCode, 0);
  sess.detach();
  await f.shim.close();
  f.shim.layers.unmountUnused();
  f = await openTestShim({ dataDir: f.dataDir });
  t.is(f.shim.getSandbox(vm.id).state, 'running');
  t.is((await f.shim.readFile(vm.id, '/root/kept', 100)).toString(), 'kept\n');
  t.is((await f.shim.exec(vm.id, { cmd: 'echo again' })).stdout, 'again\n');
  const sessions = await f.shim.listSessions(vm.id);
  t.true(sessions.map((x) => x.id).includes(sessionId));
  const att = await f.shim.attachSession(vm.id, sessionId, sessions.find((x) => x.id === sessionId)!.outputOffset);
  const out: Buffer[] = [];
  att.onOutput((o) => out.push(o.data));
  t.is((await att.run('c3', 'echo "$KEPT"', 30_000)).exitCode, 0);
  t.true(await until(async () => Buffer.concat(out).toString() === '42\n', 5000), 'the session is re-attached after the restart');
  await att.close();
});

/** One frame of a session port (native/guest-agent/vmshell.c): u8 type, u32 0, u32 length, payload. */
function portFrame(type: number, payload: Buffer = Buffer.alloc(0)): Buffer {
  const h = Buffer.alloc(9);
  h[0] = type;
  h.writeUInt32LE(payload.length, 5);
  return Buffer.concat([h, payload]);
}

/** A raw connection to a session port: frames written as given, frames read as they come. */
async function rawPort(path: string): Promise<{ send(b: Buffer): void; frames: { type: number; payload: Buffer }[]; close(): Promise<void> }> {
  const sock = net.createConnection(path);
  await new Promise<void>((resolve, reject) => sock.once('connect', resolve).once('error', reject));
  const frames: { type: number; payload: Buffer }[] = [];
  let buf = Buffer.alloc(0);
  sock.on('data', (d: Buffer) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 9 && buf.length >= 9 + buf.readUInt32LE(5)) {
      const len = buf.readUInt32LE(5);
      frames.push({ type: buf[0]!, payload: buf.subarray(9, 9 + len) });
      buf = buf.subarray(9 + len);
    }
  });
  sock.on('error', () => undefined);
  return { send: (b) => sock.write(b), frames, close: () => new Promise<void>((r) => sock.end(r)) };
}

it(title("a session port: frames after a close the guest saw belong to the shell's bridge unless a new one says otherwise"), async (t) => {
  // the guest learns of a port's close from a queue it serves after the data: a bridge's next
  // frames can arrive after the close it reports, and must still reach its shell
  const slot = join('/run/warren/vm', vm.id, 's3.sock');
  t.true(existsSync(slot), slot);
  const [S_START, S_INPUT, S_SIGNAL, S_RESUME, S_OUT, S_EXIT, S_STARTED] = [0x20, 0x21, 0x23, 0x24, 0xa1, 0xa2, 0xa3];
  const token = Buffer.alloc(16, 7);
  const strings = ['/', '0', '0', '1', '/bin/sh', '0'].map((x) => Buffer.from(`${x}\0`));
  const first = await rawPort(slot);
  first.send(portFrame(S_START, Buffer.concat([token, Buffer.from([0, 0, 0, 0, 0]), ...strings])));
  t.true(await until(async () => first.frames.some((x) => x.type === S_STARTED), 60_000), 'the shell started');
  // the bridge sends START again until it hears STARTED: a repeat is answered, and starts nothing
  first.send(portFrame(S_START, Buffer.concat([token, Buffer.from([0, 0, 0, 0, 0]), ...strings])));
  t.true(await until(async () => first.frames.filter((x) => x.type === S_STARTED).length === 2, 60_000), 'a repeated START is answered');
  const pids = first.frames.filter((x) => x.type === S_STARTED).map((x) => x.payload.readUInt32LE(0));
  t.is(pids[1], pids[0], 'the same shell');
  await first.close();
  // a round trip through the agent while the port is closed: the guest has seen the close by then
  await f.shim.exec(vm.id, { cmd: 'true' });
  const again = await rawPort(slot);
  const out = () => Buffer.concat(again.frames.filter((x) => x.type === S_OUT).map((x) => x.payload.subarray(1))).toString();
  again.send(portFrame(S_INPUT, Buffer.from('echo late-$((6*7))\n')));
  t.true(await until(async () => out().includes('late-42'), 60_000), `input after the close reached the shell, and its output came back: ${JSON.stringify(out())}`);
  await again.close();
  // a connection that says it is another shell's bridge is not this shell's: its input is dropped
  const foreign = await rawPort(slot);
  foreign.send(Buffer.concat([portFrame(S_RESUME, Buffer.alloc(16, 9)), portFrame(S_INPUT, Buffer.from('touch /tmp/foreign-input\n'))]));
  await foreign.close();
  await f.shim.exec(vm.id, { cmd: 'true' });
  const last = await rawPort(slot);
  last.send(Buffer.concat([portFrame(S_RESUME, token), portFrame(S_INPUT, Buffer.from('test -e /tmp/foreign-input && echo foreign-ran || echo foreign-dropped\n'))]));
  const lastOut = () => Buffer.concat(last.frames.filter((x) => x.type === S_OUT).map((x) => x.payload.subarray(1))).toString();
  t.true(await until(async () => lastOut().includes('foreign-'), 60_000), 'the bridge that resumed is heard');
  t.true(lastOut().includes('foreign-dropped'), lastOut());
  last.send(portFrame(S_SIGNAL, Buffer.from([9, 2])));
  t.true(await until(async () => last.frames.some((x) => x.type === S_EXIT), 60_000), 'a tree kill ends the shell and the guest says so');
  await last.close();
});

it(title('pack of a microVM produces a layer a container sandbox starts from'), async (t) => {
  await f.shim.exec(vm.id, { cmd: 'mkdir -p /work/pkg && echo packed > /work/pkg/f && rm /bin/cpio' });
  const packed = await f.shim.packSandbox(vm.id, { name: `vmpack-${process.pid}` }, 'test');
  t.true(packed.diffEntries >= 2);
  const box = await f.shim.createSandbox(spec({ image: packed.image.name }));
  try {
    const r = await f.shim.exec(box.id, { cmd: 'cat /work/pkg/f; test -e /bin/cpio && echo still-there; true' });
    t.is(r.stdout, 'packed\n', 'the file is there and the deleted one is a whiteout');
  } finally {
    await f.shim.deleteSandbox(box.id);
  }
});

it(title('delete leaves no VMM, socket, disk, snapshot or cgroup'), async (t) => {
  const id = vm.id;
  await f.shim.deleteSandbox(id);
  t.deepEqual(vmmProcesses(id), []);
  t.false(existsSync(join('/run/warren/vm', id)));
  t.false(existsSync(join(f.dataDir, 'microvm', id)));
  const left = countHostResources({ dataDir: join(f.dataDir, 'microvm'), idPrefix: id });
  t.deepEqual(left, { processes: 0, mounts: 0, cgroups: 0, loopDevices: left.loopDevices, netns: 0 });
});

it(title('a guest that does not boot fails the create in bounded time with its console, leaving nothing'), async (t) => {
  const bogus = join(tempDir('warren-vm-kernel-'), 'vmlinuz-6.1.0-57-cloud-amd64');
  writeFileSync(bogus, Buffer.alloc(4096, 0x90));
  process.env.WARREN_MICROVM_KERNEL = bogus;
  const before = readdirSync(join(f.dataDir, 'microvm')).length;
  try {
    const started = Date.now();
    const err = (await t.throwsAsync(f.shim.createSandbox(vmSpec()))) as WarrenError;
    t.is(err.code, 'SPAWN_ERROR');
    t.true(Date.now() - started < 60_000);
  } finally {
    delete process.env.WARREN_MICROVM_KERNEL;
  }
  t.is(readdirSync(join(f.dataDir, 'microvm')).length, before);
  t.is(f.shim.listSandboxes().length, 0);
});
