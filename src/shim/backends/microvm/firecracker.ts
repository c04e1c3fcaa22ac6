/**
 * The Firecracker driver: the same microVM (Debian's cloud kernel, the same
 * initramfs and agent, the same layer disks) under Firecracker instead of
 * QEMU. What differs is behind the VmmDriver interface:
 *
 *   - configuration: a JSON file (`--config-file`) for a boot; a restore
 *     starts with the API socket only and loads the snapshot over it;
 *   - the kernel: Firecracker loads an ELF vmlinux (PVH where the kernel has
 *     the note, as the cloud kernel does), not a bzImage: it is extracted once
 *     per kernel and cached;
 *   - devices: virtio-mmio described by ACPI (Firecracker >= 1.8; the cloud
 *     kernel has no VIRTIO_MMIO_CMDLINE_DEVICES), virtio-blk disks whose
 *     serial is their drive id, and no virtio-serial: the agent and the shell
 *     sessions are guest vsock ports, reached through Firecracker's hybrid
 *     vsock (a unix socket; "CONNECT <port>\n" answered "OK <n>\n");
 *   - pause: PATCH /vm Paused, PUT /snapshot/create (a full snapshot: state
 *     file plus guest memory), then the VMM ends; resume: PUT /snapshot/load;
 *   - the console: the serial port is the VMM's stdout, a FIFO in the run dir
 *     that this process drains (the last 64 KiB kept for a failed boot's
 *     error). The VMM holds the FIFO open for reading as well, so a write
 *     never fails; while nobody drains it (a gateway restart) a guest that
 *     writes its console stalls on that write, and nothing grows.
 *   - no templates (QEMU migration with shared RAM): every microVM boots.
 *
 * Confinement is the jail of vmm.ts (namespaces, only its own dirs) with the
 * VMM started as the unprivileged VMM user by setpriv (it needs /dev/kvm: the
 * user is in group kvm), under Firecracker's own seccomp filters.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chownSync, constants as fsc, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { join } from 'node:path';
import { WarrenError } from '../../../errors';
import { feature } from '../../../features';
import { GUEST_CACHE } from './guest';
import { type GuestChannel, type VmLaunch, type VmmControl, type VmmDriver, vmmUserIds } from './vmm';

/** The guest's vsock context id (any id above 2 is the guest's own: each VM has its own vsock device). */
export const GUEST_CID = 3;
/** The agent's vsock port, and the first of the shell sessions' (one each, SESSION_SLOTS of them). */
export const AGENT_VSOCK_PORT = 1024;
export const FIRST_SESSION_VSOCK_PORT = 1025;
/** What an API answer may be (errors are a line of JSON): a VMM that sends more is broken. */
const MAX_API_BODY = 64 * 1024;
const API_TIMEOUT_MS = 30_000;
const CONSOLE_KEEP = 64 * 1024;

const channel: GuestChannel = { kind: 'vsock', agentPort: AGENT_VSOCK_PORT, firstSessionPort: FIRST_SESSION_VSOCK_PORT };

/** Paths of a VM's Firecracker files in its run dir. */
export function firecrackerPaths(runDir: string) {
  return { api: join(runDir, 'api.sock'), vsock: join(runDir, 'v.sock'), config: join(runDir, 'vm.json'), console: join(runDir, 'console') };
}

/**
 * A host path as the jailed VMM reaches it. Firecracker runs as the VMM user
 * from its start (QEMU opens its files as root and drops later), and the real
 * parents of a data dir or a layer store may be root-only: its own run and
 * data dirs and its layer files are reached through the jail's stash, which
 * is traversable (see jailScript in vmm.ts).
 */
export function jailPath(l: Pick<VmLaunch, 'jail'>, p: string): string {
  const j = l.jail;
  if (j === undefined || j.user === null) return p;
  const under = (dir: string) => (p.startsWith(`${dir}/`) ? p.slice(dir.length + 1) : null);
  const run = under(j.runDir);
  if (run !== null) return join(j.stash, 'run', run);
  const data = under(j.dataDir);
  if (data !== null) return join(j.stash, 'data', data);
  const i = j.files.indexOf(p);
  return i >= 0 ? join(j.stash, `f${i}`) : p;
}

// ------------------------------------------------------------------ the kernel

/** bzImage header fields (Documentation/arch/x86/boot.rst). */
const SETUP_SECTS = 0x1f1;
const HDR_MAGIC = 0x202;
const HDR_VERSION = 0x206;
const PAYLOAD_OFFSET = 0x248;
const PAYLOAD_LENGTH = 0x24c;

const DECOMPRESSORS: Array<{ magic: Buffer; name: string; cmd: string[] }> = [
  { magic: Buffer.from([0x1f, 0x8b]), name: 'gzip', cmd: ['gzip', '-dc'] },
  { magic: Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]), name: 'xz', cmd: ['xz', '-dc'] },
  { magic: Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), name: 'zstd', cmd: ['zstd', '-dc'] },
  { magic: Buffer.from([0x02, 0x21, 0x4c, 0x18]), name: 'lz4', cmd: ['lz4', '-dc'] },
  { magic: Buffer.from([0x42, 0x5a, 0x68]), name: 'bzip2', cmd: ['bzip2', '-dc'] },
  { magic: Buffer.from([0x5d, 0x00, 0x00]), name: 'lzma', cmd: ['xz', '--format=lzma', '-dc'] },
];

/** The compressed kernel inside a bzImage and how it is compressed. */
export function bzImagePayload(image: Buffer): { payload: Buffer; format: string } {
  if (image.length < 0x260 || image.toString('latin1', HDR_MAGIC, HDR_MAGIC + 4) !== 'HdrS') throw new WarrenError('INVALID_ARGUMENT', 'not a bzImage (no HdrS header)');
  if (image.readUInt16LE(HDR_VERSION) < 0x208) throw new WarrenError('INVALID_ARGUMENT', `boot protocol ${image.readUInt16LE(HDR_VERSION).toString(16)} has no payload fields (needs 2.08)`);
  const sects = image[SETUP_SECTS] || 4;
  const start = (sects + 1) * 512 + image.readUInt32LE(PAYLOAD_OFFSET);
  const length = image.readUInt32LE(PAYLOAD_LENGTH);
  if (length === 0 || start + length > image.length) throw new WarrenError('INVALID_ARGUMENT', 'the bzImage payload lies outside the file');
  const payload = image.subarray(start, start + length);
  const d = DECOMPRESSORS.find((x) => payload.subarray(0, x.magic.length).equals(x.magic));
  if (d === undefined) throw new WarrenError('NOT_SUPPORTED', `unknown kernel compression (payload starts ${payload.subarray(0, 6).toString('hex')})`);
  return { payload, format: d.name };
}

/** Checks an x86-64 ELF executable: what Firecracker's loader accepts. */
export function checkVmlinux(elf: Buffer): void {
  if (elf.length < 64 || elf.readUInt32BE(0) !== 0x7f454c46) throw new WarrenError('INTERNAL', 'the extracted kernel is not an ELF file');
  if (elf[4] !== 2 || elf[5] !== 1) throw new WarrenError('INTERNAL', 'the extracted kernel is not a 64-bit little-endian ELF');
  if (elf.readUInt16LE(16) !== 2 || elf.readUInt16LE(18) !== 62) throw new WarrenError('INTERNAL', 'the extracted kernel is not an x86-64 executable');
  const phoff = Number(elf.readBigUInt64LE(32));
  const phnum = elf.readUInt16LE(56);
  const phentsize = elf.readUInt16LE(54);
  if (phnum === 0 || phoff + phnum * phentsize > elf.length) throw new WarrenError('INTERNAL', 'the extracted kernel has no (or truncated) program headers');
  for (let i = 0; i < phnum; i++) {
    const h = phoff + i * phentsize;
    if (elf.readUInt32LE(h) !== 1) continue; // PT_LOAD
    const off = Number(elf.readBigUInt64LE(h + 8));
    const size = Number(elf.readBigUInt64LE(h + 32));
    if (off + size > elf.length) throw new WarrenError('INTERNAL', 'the extracted kernel is truncated (a loadable segment lies past its end)');
  }
}

/**
 * The ELF vmlinux inside `bzImage`, decompressed with the format's own tool.
 * Like the kernel's extract-vmlinux, a decompressor's complaint about what
 * follows the stream (the build appends the uncompressed size) is not a
 * failure when what came out is a whole ELF.
 */
export function extractVmlinux(bzImage: Buffer): Buffer {
  const { payload, format } = bzImagePayload(bzImage);
  const cmd = DECOMPRESSORS.find((d) => d.name === format)!.cmd;
  let out: Buffer;
  try {
    out = execFileSync(cmd[0]!, cmd.slice(1), { input: payload, maxBuffer: 1 << 30, stdio: ['pipe', 'pipe', 'ignore'], timeout: 120_000 });
  } catch (err) {
    const partial = (err as { stdout?: Buffer }).stdout;
    if (!Buffer.isBuffer(partial) || partial.length === 0) throw new WarrenError('NOT_SUPPORTED', `cannot decompress the ${format} kernel: ${(err as Error).message.split('\n')[0]}`);
    out = partial;
  }
  checkVmlinux(out);
  return out;
}

/** The cached vmlinux of a guest kernel image (made once per image content). */
export function guestVmlinux(image: string): string {
  const st = statSync(image);
  const key = createHash('sha256').update(`${image}\0${st.size}\0${st.mtimeMs}\0${st.ino}`).digest('hex').slice(0, 16);
  const out = join(GUEST_CACHE, `vmlinux-${key}`);
  if (existsSync(out)) return out;
  mkdirSync(GUEST_CACHE, { recursive: true, mode: 0o755 });
  const tmp = `${out}.${process.pid}.tmp`;
  try {
    writeFileSync(tmp, extractVmlinux(readFileSync(image)), { mode: 0o644 });
    renameSync(tmp, out);
  } finally {
    rmSync(tmp, { force: true });
  }
  return out;
}

// ------------------------------------------------------------------ configuration

/** Firecracker's configuration for a boot of `l` (see its API's PUT bodies, which the file repeats). */
export function firecrackerConfig(l: VmLaunch, vmlinux: string): Record<string, unknown> {
  if (l.ram !== undefined || l.passFd !== undefined || l.templateNic) throw new WarrenError('NOT_SUPPORTED', 'firecracker: templates are a QEMU feature (shared guest RAM over migration)');
  const paths = firecrackerPaths(l.runDir);
  const at = (p: string) => jailPath(l, p);
  return {
    'boot-source': { kernel_image_path: vmlinux, initrd_path: at(l.initrd), boot_args: l.cmdline },
    drives: l.disks.map((d) => {
      // the guest's /init finds disks by their serial, which Firecracker answers with the drive id
      if (d.id !== d.serial) throw new WarrenError('INTERNAL', `firecracker: disk ${d.id} must have its id as serial (${d.serial})`);
      return { drive_id: d.id, path_on_host: at(d.file), is_root_device: false, is_read_only: d.readOnly };
    }),
    'machine-config': { vcpu_count: l.vcpus, mem_size_mib: l.memoryMb, smt: false },
    ...(l.net !== undefined ? { 'network-interfaces': [{ iface_id: 'eth0', guest_mac: l.net.mac, host_dev_name: l.net.tap }] } : {}),
    vsock: { guest_cid: GUEST_CID, uds_path: at(paths.vsock) },
  };
}

/** The kernel command line additions a vsock guest needs (read by /init, see guest.ts). */
export function vsockCmdline(sessionSlots: number): string {
  return `warren.vsock=${AGENT_VSOCK_PORT},${FIRST_SESSION_VSOCK_PORT}:${sessionSlots}`;
}

// ------------------------------------------------------------------ the API

/**
 * One call to Firecracker's API over its unix socket. Answers are bounded
 * and every call has a deadline; a fault is an error carrying Firecracker's
 * own message.
 */
export function firecrackerApi(socket: string, method: 'GET' | 'PUT' | 'PATCH', path: string, body?: unknown, timeoutMs = API_TIMEOUT_MS): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
    const req = http.request(
      { socketPath: socket, method, path, headers: { Accept: 'application/json', ...(payload ? { 'Content-Type': 'application/json', 'Content-Length': payload.length } : {}) }, agent: false },
      (res) => {
        const parts: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > MAX_API_BODY) {
            req.destroy(new WarrenError('INTERNAL', `firecracker ${method} ${path}: an answer of more than ${MAX_API_BODY} bytes`));
            return;
          }
          parts.push(c);
        });
        res.on('end', () => {
          clearTimeout(timer);
          const text = Buffer.concat(parts).toString('utf8');
          let json: unknown = null;
          try {
            json = text === '' ? null : JSON.parse(text);
          } catch {
            /* not JSON: reported as text below */
          }
          const status = res.statusCode ?? 0;
          if (status >= 200 && status < 300) return resolve(json);
          const fault = (json as { fault_message?: unknown } | null)?.fault_message;
          reject(new WarrenError('INTERNAL', `firecracker ${method} ${path}: ${status} ${String(fault ?? text).replace(/[^\x20-\x7e]/g, '?').slice(0, 300)}`, { status }));
        });
        res.on('error', (err) => {
          clearTimeout(timer);
          reject(err);
        });
      },
    );
    const timer = setTimeout(() => req.destroy(new WarrenError('TIMEOUT', `firecracker ${method} ${path}: no answer within ${timeoutMs} ms`)), timeoutMs);
    req.on('error', (err) => {
      clearTimeout(timer);
      reject(err instanceof WarrenError ? err : new WarrenError('UNAVAILABLE', `firecracker ${method} ${path}: ${err.message}`));
    });
    req.end(payload);
  });
}

/** Wait until the VMM's API socket answers (it appears once the VMM has started). */
async function apiReady(socket: string, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last = '';
  while (Date.now() < deadline) {
    try {
      await firecrackerApi(socket, 'GET', '/', undefined, 2000);
      return;
    } catch (err) {
      last = (err as Error).message;
      await new Promise((r) => setTimeout(r, 20));
    }
  }
  throw new WarrenError('TIMEOUT', `firecracker's API did not answer within ${timeoutMs} ms (${last})`);
}

// ------------------------------------------------------------------ vsock

/**
 * A stream to guest vsock port `port` through Firecracker's hybrid vsock:
 * connect to its unix socket, send "CONNECT <port>\n", and the stream is the
 * guest's once "OK <host port>\n" comes back (the VMM closes it when nothing
 * in the guest listens). Bytes after the OK line belong to the guest: the
 * socket is handed over paused with them put back, and the caller resumes it
 * once it listens.
 */
export function vsockDial(uds: string, port: number, timeoutMs = 5000): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.createConnection({ path: uds });
    let buf = Buffer.alloc(0);
    const fail = (err: Error) => {
      clearTimeout(timer);
      s.destroy();
      reject(err instanceof WarrenError ? err : new WarrenError('UNAVAILABLE', `vsock port ${port}: ${err.message}`));
    };
    const timer = setTimeout(() => fail(new WarrenError('TIMEOUT', `vsock port ${port}: no answer to CONNECT within ${timeoutMs} ms`)), timeoutMs);
    const onData = (chunk: Buffer) => {
      buf = Buffer.concat([buf, chunk]);
      const nl = buf.indexOf(0x0a);
      if (nl < 0) {
        if (buf.length > 64) fail(new WarrenError('INTERNAL', `vsock port ${port}: an answer to CONNECT that is not a line`));
        return;
      }
      const line = buf.subarray(0, nl).toString('latin1');
      if (!/^OK \d+$/.test(line)) return fail(new WarrenError('UNAVAILABLE', `vsock port ${port}: ${JSON.stringify(line.slice(0, 64))}`));
      clearTimeout(timer);
      s.off('data', onData);
      s.off('error', fail);
      s.off('close', onClose);
      s.pause();
      const rest = buf.subarray(nl + 1);
      if (rest.length > 0) s.unshift(rest);
      resolve(s);
    };
    const onClose = () => fail(new WarrenError('UNAVAILABLE', `vsock port ${port}: closed before OK (nothing listens in the guest yet)`));
    s.once('connect', () => s.write(`CONNECT ${port}\n`));
    s.on('data', onData);
    s.on('error', fail);
    s.on('close', onClose);
  });
}

// ------------------------------------------------------------------ the console

/** A VM's console FIFO, drained; the last CONSOLE_KEEP bytes kept while it boots. */
class ConsoleDrain {
  private kept: Buffer[] = [];
  private size = 0;
  private readonly sock: net.Socket;

  constructor(fifo: string) {
    // read-write: a FIFO read with no writer ends at once, and the VMM opens its end only later
    const fd = openSync(fifo, fsc.O_RDWR | fsc.O_NONBLOCK);
    this.sock = new net.Socket({ fd, readable: true, writable: false });
    this.sock.on('data', (c: Buffer) => {
      this.kept.push(c);
      this.size += c.length;
      while (this.size - this.kept[0]!.length >= CONSOLE_KEEP) this.size -= this.kept.shift()!.length;
    });
    this.sock.on('error', () => undefined);
    // a drain never keeps a process alive by itself (the node lives on its server; a CLI or test exits)
    this.sock.unref();
  }

  text(): string {
    return Buffer.concat(this.kept).subarray(-CONSOLE_KEEP).toString('latin1');
  }

  close(): void {
    this.sock.destroy();
  }
}

const drains = new Map<string, ConsoleDrain>();

function drain(runDir: string): ConsoleDrain | null {
  let d = drains.get(runDir);
  if (d === undefined) {
    const fifo = firecrackerPaths(runDir).console;
    if (!existsSync(fifo)) return null;
    try {
      d = new ConsoleDrain(fifo);
    } catch {
      return null;
    }
    drains.set(runDir, d);
  }
  return d;
}

// ------------------------------------------------------------------ the driver

export const firecrackerControl: VmmControl = {
  async save(runDir, file) {
    const api = firecrackerPaths(runDir).api;
    await firecrackerApi(api, 'PATCH', '/vm', { state: 'Paused' });
    try {
      await firecrackerApi(api, 'PUT', '/snapshot/create', { snapshot_type: 'Full', snapshot_path: file.vmm, mem_file_path: `${file.vmm}.mem` }, 300_000);
    } catch (err) {
      await firecrackerApi(api, 'PATCH', '/vm', { state: 'Resumed' }).catch(() => undefined);
      throw err;
    }
    return [file.host, `${file.host}.mem`];
  },
  async resumeIncoming(runDir, vmmFile) {
    const api = firecrackerPaths(runDir).api;
    await apiReady(api, 30_000);
    // the snapshot names the devices' host ends (disks, tap, vsock socket) as they were: the same paths
    await firecrackerApi(api, 'PUT', '/snapshot/load', { snapshot_path: vmmFile, mem_backend: { backend_type: 'File', backend_path: `${vmmFile}.mem` }, resume_vm: true }, 120_000);
  },
  async consoleTail(runDir) {
    // only a drain that exists: reading a tail must not start holding a FIFO nobody will let go of
    const text = drains.get(runDir)?.text() ?? '';
    return text.replace(/[^\x20-\x7e\n]/g, '').trim().split('\n').slice(-8).join(' | ').slice(-1500);
  },
  dialAgent(runDir) {
    drain(runDir); // after a restart of this process: drain the console again
    return vsockDial(firecrackerPaths(runDir).vsock, AGENT_VSOCK_PORT);
  },
  forget(runDir) {
    drains.get(runDir)?.close();
    drains.delete(runDir);
  },
};

/** Start lines for Firecracker as the VMM user (setpriv), or as is. */
function asVmmUser(user: string | null | undefined, argv: string[]): { bin: string; args: string[] } {
  if (!user) return { bin: argv[0]!, args: argv.slice(1) };
  return { bin: 'setpriv', args: [`--reuid=${user}`, `--regid=${user}`, '--init-groups', '--inh-caps=-all', '--bounding-set=-all', '--no-new-privs', '--', ...argv] };
}

export const firecracker: VmmDriver = {
  name: 'firecracker',
  templates: false,
  channel,
  control: firecrackerControl,
  status: () => {
    const f = feature('firecracker');
    return f.supported ? { available: true } : { available: false, reason: f.reason ?? 'unavailable' };
  },
  async prepare(l) {
    const paths = firecrackerPaths(l.runDir);
    for (const p of [paths.api, paths.vsock, paths.console]) rmSync(p, { force: true });
    execFileSync('mkfifo', ['-m', '0600', paths.console]);
    const ids = l.jail?.user ? vmmUserIds() : null;
    if (ids !== null) {
      // the VMM creates its sockets here once it runs as the VMM user
      chownSync(l.runDir, ids.uid, ids.gid);
      chownSync(paths.console, ids.uid, ids.gid);
    }
    if (l.incoming === undefined) writeFileSync(paths.config, JSON.stringify(firecrackerConfig(l, guestVmlinux(l.kernel))), { mode: 0o644 });
    // drained from before the VMM starts (a drain of an earlier VMM of this VM is let go)
    firecrackerControl.forget(l.runDir);
    drain(l.runDir);
  },
  command(l) {
    if (l.incoming === 'defer') throw new WarrenError('NOT_SUPPORTED', 'firecracker: templates are a QEMU feature');
    const paths = firecrackerPaths(l.runDir);
    const at = (p: string) => jailPath(l, p);
    // A boot reads the configuration file; a restore gets its snapshot over the API (resumeIncoming).
    const argv = ['firecracker', '--api-sock', at(paths.api), '--id', l.id.replace(/[^A-Za-z0-9-]/g, '-').slice(0, 64), '--level', 'Warning', ...(l.incoming === undefined ? ['--config-file', at(paths.config)] : [])];
    // stdout is the console: the FIFO, opened read-write so that a write never fails for want of a reader
    const started = asVmmUser(l.jail?.user, argv);
    return { bin: '/bin/sh', args: ['-c', `exec 1<>${shellQuote(paths.console)}; exec "$@"`, 'warren-fc', started.bin, ...started.args] };
  },
};

function shellQuote(p: string): string {
  return `'${p.replace(/'/g, `'\\''`)}'`;
}

