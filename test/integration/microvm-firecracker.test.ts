/**
 * What a Firecracker microVM needs from this host that this host can show
 * without Firecracker: the ELF vmlinux extracted from the installed guest
 * kernel (with the PVH entry note Firecracker boots through), cached once;
 * the initramfs carrying the vsock modules /init loads for a vsock guest; and
 * /v1/features-style reporting of why Firecracker is or is not used.
 */
import test from 'ava';
import { execFileSync, spawn } from 'node:child_process';
import { lstatSync, readFileSync, statSync } from 'node:fs';
import { feature, microvmBackendStatus, skipReason } from '../../src/features';
import type { WarrenError } from '../../src/errors';
import type { MicroVMBackend } from '../../src/shim/backends/microvm/backend';
import { BackendRegistry } from '../../src/shim/backends/registry';
import { checkVmlinux, extractVmlinux, firecracker, firecrackerPaths, guestVmlinux } from '../../src/shim/backends/microvm/firecracker';
import { findGuestKernel, guestInitramfs } from '../../src/shim/backends/microvm/guest';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';
import { waitForValue } from '../helpers/wait';

const kernel = findGuestKernel();
const skip = kernel === null ? `requires a guest kernel: ${feature('microvm-guest').reason}` : skipReason('microvm-guest');
const t0 = testUnless(skip);

/** The ELF notes of `elf` (PT_NOTE segments): owner and type. */
function notes(elf: Buffer): Array<{ owner: string; type: number }> {
  const out: Array<{ owner: string; type: number }> = [];
  const phoff = Number(elf.readBigUInt64LE(32));
  const phentsize = elf.readUInt16LE(54);
  for (let i = 0; i < elf.readUInt16LE(56); i++) {
    const h = phoff + i * phentsize;
    if (elf.readUInt32LE(h) !== 4) continue;
    let off = Number(elf.readBigUInt64LE(h + 8));
    const end = off + Number(elf.readBigUInt64LE(h + 32));
    while (off + 12 <= end) {
      const namesz = elf.readUInt32LE(off);
      const descsz = elf.readUInt32LE(off + 4);
      const type = elf.readUInt32LE(off + 8);
      out.push({ owner: elf.toString('latin1', off + 12, off + 12 + namesz).replace(/\0+$/, ''), type });
      off += 12 + Math.ceil(namesz / 4) * 4 + Math.ceil(descsz / 4) * 4;
    }
  }
  return out;
}

t0("the guest kernel's bzImage gives an x86-64 ELF vmlinux with the PVH entry note, made once and cached", (t) => {
  const elf = extractVmlinux(readFileSync(kernel!.image));
  t.notThrows(() => checkVmlinux(elf));
  t.true(elf.length > statSync(kernel!.image).size, 'decompressed: larger than the bzImage');
  // XEN_ELFNOTE_PHYS32_ENTRY (18): the 32-bit PVH entry Firecracker's loader starts the kernel at
  t.true(notes(elf).some((n) => n.owner === 'Xen' && n.type === 18), 'PVH entry note');
  const cached = guestVmlinux(kernel!.image);
  const st = statSync(cached);
  t.is(st.size, elf.length);
  t.is(guestVmlinux(kernel!.image), cached);
  t.is(statSync(cached).mtimeMs, st.mtimeMs, 'the second call takes the cached file');
});

t0("the initramfs carries the vsock transport modules a Firecracker guest's /init loads, apart from every guest's", (t) => {
  const initrd = guestInitramfs(kernel!);
  const listing = execFileSync('cpio', ['-t', '--quiet'], { input: readFileSync(initrd), maxBuffer: 64 << 20, encoding: 'utf8' }).split('\n');
  const list = (name: string) => execFileSync('cpio', ['-i', '--quiet', '--to-stdout', name], { input: readFileSync(initrd), maxBuffer: 64 << 20, encoding: 'utf8' }).trim().split('\n');
  const vsock = list('etc/modules.vsock');
  t.true(vsock.some((m) => m.endsWith('/vmw_vsock_virtio_transport.ko')), vsock.join(' '));
  t.true(vsock.some((m) => m.endsWith('/vsock.ko')), 'with its dependencies');
  for (const m of vsock) t.true(listing.includes(`lib/modules/${m}`), m);
  t.false(list('etc/modules.list').some((m) => m.includes('vsock')), 'a QEMU guest loads none of them');
});

test('whether Firecracker is used, and why not, is reported with the microvm backend', (t) => {
  const fc = feature('firecracker');
  const status = microvmBackendStatus();
  if (fc.supported) t.regex(fc.action ?? '', /^firecracker \d+\.\d+\.\d+/);
  else t.true((fc.reason ?? '').length > 0);
  if (status.available) t.regex(status.reason ?? '', /Firecracker/);
});

test("the console is a FIFO in the run dir, drained by the node: a guest's endless console costs its last lines, not the host's disk or memory", async (t) => {
  const runDir = tempDir('warren-fc-con-');
  const l = { id: 'con', runDir, accel: 'kvm' as const, kernel: '/k', initrd: '/i', cmdline: '', vcpus: 1, memoryMb: 128, disks: [], agentSocket: '', sessionSockets: [], qmpSocket: '', logFile: '', incoming: '/snapshot' };
  await firecracker.prepare!(l);
  try {
    const fifo = firecrackerPaths(runDir).console;
    t.true(lstatSync(fifo).isFIFO());
    // a VMM's stdout, as the command line opens it: the FIFO read-write, then 4 MiB of console and a last line
    const writer = spawn('/bin/sh', ['-c', `exec 1<>'${fifo}'; head -c 4194304 /dev/zero | tr '\\0' x; echo; echo 'WARREN_BOOT_FAILED: no writable disk'`], { stdio: ['ignore', 'ignore', 'inherit'] });
    const code = await new Promise<number | null>((r) => writer.on('exit', r));
    t.is(code, 0, 'the writer was never blocked: the node drains the FIFO');
    const tail = await waitForValue(() => firecracker.control.consoleTail(runDir), (x) => x.includes('WARREN_BOOT_FAILED'), 2000, 'the last console line to be drained', 20);
    t.true(tail.endsWith('WARREN_BOOT_FAILED: no writable disk'), tail.slice(-200));
    t.true(tail.length <= 1500, `bounded: ${tail.length}`);
    t.is(statSync(fifo).size, 0, 'nothing of it is on disk');
  } finally {
    firecracker.control.forget(runDir);
  }
  t.is(await firecracker.control.consoleTail(runDir), '', 'let go: nothing is kept, and reading does not start a drain again');
});

test('asking for Firecracker where its probe fails disables the microvm backend with that reason: a create is refused, never run under QEMU instead', (t) => {
  const fc = feature('firecracker');
  process.env.WARREN_MICROVM_VMM = 'firecracker';
  try {
    const registry = BackendRegistry.build({ dataDir: tempDir('warren-fc-reg-'), network: null, log: () => undefined });
    if (fc.supported) {
      t.is((registry.get('microvm') as MicroVMBackend).driver.name, 'firecracker');
      return;
    }
    t.false(registry.status().microvm.available);
    const err = t.throws(() => registry.get('microvm')) as WarrenError;
    t.is(err.code, 'NOT_SUPPORTED');
    t.true(err.message.includes(`WARREN_MICROVM_VMM=firecracker, but: ${fc.reason}`), err.message);
  } finally {
    delete process.env.WARREN_MICROVM_VMM;
  }
});
