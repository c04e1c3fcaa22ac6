/**
 * microVMs outlive their gateway: a real `warren up` (child process) is
 * killed with SIGKILL while a microVM runs a background counter; the VMM keeps
 * running with no Warren process alive, and a restarted `warren up` on the same
 * data dir re-adopts it (exec answers, the counter kept counting). Then the same
 * for a paused microVM (only its snapshot exists): the restarted node adopts the
 * snapshot and the next request resumes it. Delete leaves no VMM, run dir or
 * data dir behind.
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WarrenClient } from '../../src/sdk';
import { microvmBackendStatus, skipReason } from '../../src/features';
import { native } from '../../src/native';
import { removeTree } from '../../src/shim/layers/sys';
import { openTestShim } from '../helpers/warren';
import { kill9, startWarrenProcess, stopGracefully } from '../helpers/warren-process';
import { testUnless } from '../helpers/skip';
import { waitForValue } from '../helpers/wait';

const status = microvmBackendStatus();
const skip = skipReason('native-helper', 'qemu', 'microvm-guest') ?? (status.available ? null : `microvm backend unavailable: ${status.reason}`);
const tag = process.pid.toString(36);

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** QEMU processes of the sandbox (not the jail's unshare that starts them). */
function vmmPids(id: string): number[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((pid) => {
      try {
        const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        return argv[0]!.endsWith('qemu-system-x86_64') && argv.includes(`warren-${id}`);
      } catch {
        return false;
      }
    })
    .map(Number);
}

testUnless(skip).serial('a kill -9 of warren up leaves microVMs running; a restarted node re-adopts them, running or paused', async (t) => {
  const nodeId = `mr${tag}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-vmrestart-'));
  let child: ChildProcess | null = null;
  let client: WarrenClient | null = null;
  let id: string | null = null;
  try {
    {
      // the busybox image in this data dir
      const f = await openTestShim({ dataDir, nodeId });
      await f.shim.close();
      f.shim.layers.unmountUnused();
    }
    const first = await startWarrenProcess(dataDir, nodeId);
    child = first.child;
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    client = new WarrenClient({ url: first.url, token });
    const sb = await client.createSandbox({ image: 'busybox', backend: 'microvm', memoryMb: 192, diskMb: 64 });
    id = sb.id;
    // replaced whole (rename), so a read never sees a half-written file
    const started = await sb.exec(['sh', '-c', 'i=0; (while true; do i=$((i+1)); echo $i > /tmp/count.tmp; mv /tmp/count.tmp /tmp/count; sleep 0.2; done) >/dev/null 2>&1 & echo started']);
    t.is(started.stdout, 'started\n');
    const vmm = vmmPids(sb.id);
    t.is(vmm.length, 1, 'one VMM');

    await kill9(child);
    child = null;
    await client.close();
    client = null;
    t.true(alive(vmm[0]!), 'the VMM runs on with no gateway');

    const log2: string[] = [];
    const second = await startWarrenProcess(dataDir, nodeId, [], log2);
    child = second.child;
    client = new WarrenClient({ url: second.url, token });
    const again = await client.getSandbox(sb.id);
    t.is((await again.refresh()).state, 'running', log2.join(''));
    const before = Number((await again.exec(['cat', '/tmp/count'])).stdout);
    const later = await waitForValue(async () => Number((await again.exec(['cat', '/tmp/count'])).stdout), (n) => n > before, 20_000, 'the counter to go on');
    t.true(later > before, `the guest's counter kept counting (${before} -> ${later})`);
    t.deepEqual(vmmPids(sb.id), vmm, 'the same VMM, adopted (not restarted)');

    // paused: only the snapshot is left; a restarted node adopts it and a request resumes it
    const p = await again.pause();
    t.is(p.state, 'paused');
    t.deepEqual(vmmPids(sb.id), [], 'no VMM while paused');
    await kill9(child);
    child = null;
    await client.close();
    client = null;
    const third = await startWarrenProcess(dataDir, nodeId);
    child = third.child;
    client = new WarrenClient({ url: third.url, token });
    const resumed = await client.getSandbox(sb.id);
    const n1 = Number((await resumed.exec(['cat', '/tmp/count'])).stdout);
    t.true(n1 >= later, 'resumed from the snapshot with its files');
    await waitForValue(async () => Number((await resumed.exec(['cat', '/tmp/count'])).stdout), (n) => n > n1, 20_000, 'the counter to go on after the resume');
    t.is(vmmPids(sb.id).length, 1);

    await resumed.delete();
    id = null;
    t.deepEqual(vmmPids(sb.id), [], 'no VMM after delete');
    t.false(existsSync(join(dataDir, 'microvm', sb.id)), 'no disk or snapshot left');
    t.false(native.cgroupExists(sb.id), 'no cgroup left');
    t.false(existsSync(join('/run/warren/vm', sb.id)), 'no sockets left');
    await client.close();
    client = null;
    await stopGracefully(child);
    child = null;
  } finally {
    await client?.close().catch(() => undefined);
    if (child) await kill9(child);
    if (id !== null) {
      // the test failed with the VM alive: it must not outlive the test
      for (const pid of vmmPids(id)) process.kill(pid, 'SIGKILL');
      if (native.cgroupExists(id)) {
        native.cgroupKill(id);
        await waitForValue(() => native.cgroupProcs(id!).length, (n) => n === 0, 5000, 'the VMM to go').catch(() => undefined);
        try {
          native.cgroupDestroy(id);
        } catch {
          /* still busy: reported by the leak checks of later runs */
        }
      }
    }
    if (id !== null) rmSync(join('/run/warren/vm', id), { recursive: true, force: true });
    try {
      removeTree(dataDir);
    } catch {
      /* best effort */
    }
  }
});
