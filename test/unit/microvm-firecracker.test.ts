/**
 * The Firecracker driver's host side, where it does not need Firecracker
 * itself: the configuration a launch becomes, the command lines of a boot and
 * of a restore, the API client (against an HTTP server on a unix socket that
 * answers as Firecracker's API documents, including its faults) and the hybrid
 * vsock handshake (against a unix socket server speaking its CONNECT/OK
 * lines), hostile answers included. A VM under Firecracker is exercised by
 * the conformance suite where the binary and KVM are there
 * (test/conformance/microvm-firecracker.test.ts).
 */
import test from 'ava';
import http from 'node:http';
import net from 'node:net';
import { join } from 'node:path';
import { WarrenError } from '../../src/errors';
import { AgentClient } from '../../src/shim/backends/microvm/agent-client';
import { AgentDecoder, AgentType, encodeFrame } from '../../src/shim/backends/microvm/agent-protocol';
import { AGENT_VSOCK_PORT, FIRST_SESSION_VSOCK_PORT, bzImagePayload, checkVmlinux, firecracker, firecrackerApi, firecrackerConfig, vsockCmdline, vsockDial } from '../../src/shim/backends/microvm/firecracker';
import type { VmLaunch } from '../../src/shim/backends/microvm/vmm';
import { tempDir } from '../helpers/tmp';

function launch(over: Partial<VmLaunch> = {}): VmLaunch {
  const runDir = '/run/warren/vm/abc';
  return {
    id: 'abc',
    runDir,
    accel: 'kvm',
    kernel: '/boot/vmlinuz-x',
    initrd: '/data/abc/initrd.cpio',
    cmdline: 'console=ttyS0 warren.id=abc',
    vcpus: 2,
    memoryMb: 256,
    disks: [
      { id: 'rw', file: '/data/abc/disk.img', readOnly: false, serial: 'rw' },
      { id: 'l0', file: '/layers/a.erofs', readOnly: true, serial: 'l0' },
    ],
    agentSocket: join(runDir, 'agent.sock'),
    sessionSockets: [],
    qmpSocket: join(runDir, 'qmp.sock'),
    logFile: '/data/abc/vmm.log',
    ...over,
  };
}

test('a boot becomes Firecracker configuration: kernel, initrd, command line, disks by id, vCPUs, memory, vsock, NIC', (t) => {
  const c = firecrackerConfig(launch({ net: { netnsPath: '/run/netns/x', tap: 'wt1', mac: '02:00:00:00:00:07' } }), '/cache/vmlinux-1') as Record<string, any>;
  t.deepEqual(c['boot-source'], { kernel_image_path: '/cache/vmlinux-1', initrd_path: '/data/abc/initrd.cpio', boot_args: 'console=ttyS0 warren.id=abc' });
  t.deepEqual(c.drives, [
    { drive_id: 'rw', path_on_host: '/data/abc/disk.img', is_root_device: false, is_read_only: false },
    { drive_id: 'l0', path_on_host: '/layers/a.erofs', is_root_device: false, is_read_only: true },
  ]);
  t.deepEqual(c['machine-config'], { vcpu_count: 2, mem_size_mib: 256, smt: false });
  t.deepEqual(c['network-interfaces'], [{ iface_id: 'eth0', guest_mac: '02:00:00:00:00:07', host_dev_name: 'wt1' }]);
  t.deepEqual(c.vsock, { guest_cid: 3, uds_path: '/run/warren/vm/abc/v.sock' });
  t.false('network-interfaces' in (firecrackerConfig(launch(), '/k') as object), 'no NIC without a network');
});

const JAIL = { runDir: '/run/warren/vm/abc', dataDir: '/data/abc', runRoot: '/run/warren', dataRoot: '/data', files: ['/layers/a.erofs'], stash: '/run/warren-vm-jail', user: 'warren-vmm' };

test('a VMM that runs as the VMM user from its start reaches its files through the jail\'s stash (their real parents may be root-only)', (t) => {
  const c = firecrackerConfig(launch({ jail: JAIL }), '/var/cache/warren/microvm/vmlinux-1') as Record<string, any>;
  t.is(c['boot-source'].initrd_path, '/run/warren-vm-jail/data/initrd.cpio');
  t.is(c['boot-source'].kernel_image_path, '/var/cache/warren/microvm/vmlinux-1', 'the kernel cache is not hidden');
  t.deepEqual(c.drives.map((d: { path_on_host: string }) => d.path_on_host), ['/run/warren-vm-jail/data/disk.img', '/run/warren-vm-jail/f0']);
  t.is(c.vsock.uds_path, '/run/warren-vm-jail/run/v.sock');
  // without a VMM user (root in the jail) the real paths serve
  t.is((firecrackerConfig(launch({ jail: { ...JAIL, user: null } }), '/k') as Record<string, any>).vsock.uds_path, '/run/warren/vm/abc/v.sock');
});

test('what Firecracker cannot do is refused with a reason: templates (shared RAM, deferred restore), a disk whose serial is not its id', (t) => {
  for (const over of [{ ram: { file: '/x', share: true } }, { passFd: 5 }, { templateNic: true }] as Partial<VmLaunch>[]) {
    const err = t.throws(() => firecrackerConfig(launch(over), '/k')) as WarrenError;
    t.is(err.code, 'NOT_SUPPORTED');
    t.regex(err.message, /templates are a QEMU feature/);
  }
  t.is((t.throws(() => firecracker.command(launch({ incoming: 'defer' }))) as WarrenError).code, 'NOT_SUPPORTED');
  const bad = launch({ disks: [{ id: 'rw', file: '/d', readOnly: false, serial: 'other' }] });
  t.is((t.throws(() => firecrackerConfig(bad, '/k')) as WarrenError).code, 'INTERNAL');
});

test('a boot reads the configuration file; a restore starts with the API only; the console is the FIFO; a jailed VMM drops to its user', (t) => {
  const boot = firecracker.command(launch());
  t.is(boot.bin, '/bin/sh');
  t.regex(boot.args[1]!, /^exec 1<>'\/run\/warren\/vm\/abc\/console'; exec "\$@"$/);
  const argv = boot.args.slice(3);
  t.deepEqual(argv.slice(0, 3), ['firecracker', '--api-sock', '/run/warren/vm/abc/api.sock']);
  t.true(argv.includes('--config-file') && argv[argv.indexOf('--config-file') + 1] === '/run/warren/vm/abc/vm.json');
  const restore = firecracker.command(launch({ incoming: '/data/abc/snapshot' })).args.slice(3);
  t.false(restore.includes('--config-file'), 'a restore loads its snapshot over the API');
  t.true(restore.includes('--api-sock'));
  const jailed = firecracker.command(launch({ jail: JAIL })).args.slice(3);
  t.is(jailed[0], 'setpriv');
  t.is(jailed[jailed.indexOf('--api-sock') + 1], '/run/warren-vm-jail/run/api.sock', 'reached through the stash');
  for (const f of ['--reuid=warren-vmm', '--regid=warren-vmm', '--init-groups', '--no-new-privs', '--bounding-set=-all']) t.true(jailed.includes(f), f);
  t.is(jailed[jailed.indexOf('--') + 1], 'firecracker');
  t.is(firecracker.channel.kind, 'vsock');
  t.false(firecracker.templates);
  t.is(vsockCmdline(4), `warren.vsock=${AGENT_VSOCK_PORT},${FIRST_SESSION_VSOCK_PORT}:4`);
});

// ------------------------------------------------------------------ API

async function fakeApi(handler: http.RequestListener): Promise<{ path: string; close(): Promise<void>; seen: Array<{ method: string; url: string; body: string }> }> {
  const path = join(tempDir('warren-fc-api-'), 'api.sock');
  const seen: Array<{ method: string; url: string; body: string }> = [];
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method!, url: req.url!, body });
      handler(req, res);
    });
  });
  await new Promise<void>((r) => server.listen(path, r));
  return { path, seen, close: () => new Promise<void>((r) => (server.closeAllConnections(), server.close(() => r()))) };
}

test('API calls send JSON and read answers; a fault carries Firecracker\'s own message', async (t) => {
  const api = await fakeApi((req, res) => {
    if (req.url === '/vm') return void res.writeHead(204).end();
    if (req.url === '/snapshot/create') return void res.writeHead(400, { 'Content-Type': 'application/json' }).end(JSON.stringify({ fault_message: 'Cannot create snapshot: disk full' }));
    res.writeHead(200, { 'Content-Type': 'application/json' }).end(JSON.stringify({ state: 'Running' }));
  });
  try {
    t.is(await firecrackerApi(api.path, 'PATCH', '/vm', { state: 'Paused' }), null);
    t.deepEqual(api.seen[0], { method: 'PATCH', url: '/vm', body: '{"state":"Paused"}' });
    t.deepEqual(await firecrackerApi(api.path, 'GET', '/'), { state: 'Running' });
    const err = (await t.throwsAsync(firecrackerApi(api.path, 'PUT', '/snapshot/create', { snapshot_type: 'Full' }))) as WarrenError;
    t.is(err.code, 'INTERNAL');
    t.regex(err.message, /400 Cannot create snapshot: disk full/);
  } finally {
    await api.close();
  }
});

test('a hostile or dead API: an endless answer is cut off, silence times out, no socket is UNAVAILABLE', async (t) => {
  const api = await fakeApi((req, res) => {
    if (req.url === '/big') {
      res.writeHead(200);
      const chunk = Buffer.alloc(16 * 1024, 0x61);
      const pump = () => {
        while (res.write(chunk)) {
          /* until the socket pushes back */
        }
      };
      res.on('drain', pump);
      pump();
      return;
    }
    /* /silent: never answers */
  });
  try {
    const big = (await t.throwsAsync(firecrackerApi(api.path, 'GET', '/big'))) as WarrenError;
    t.is(big.code, 'INTERNAL');
    t.regex(big.message, /more than 65536 bytes/);
    const silent = (await t.throwsAsync(firecrackerApi(api.path, 'GET', '/silent', undefined, 300))) as WarrenError;
    t.is(silent.code, 'TIMEOUT');
  } finally {
    await api.close();
  }
  const none = (await t.throwsAsync(firecrackerApi(join(tempDir('warren-fc-none-'), 'api.sock'), 'GET', '/'))) as WarrenError;
  t.is(none.code, 'UNAVAILABLE');
});

// ------------------------------------------------------------------ vsock

/** A unix socket server speaking Firecracker's host-initiated vsock handshake. */
async function fakeVsock(answer: (port: number, sock: net.Socket) => void): Promise<{ path: string; close(): Promise<void> }> {
  const path = join(tempDir('warren-fc-vsock-'), 'v.sock');
  const socks: net.Socket[] = [];
  const server = net.createServer((sock) => {
    socks.push(sock);
    sock.on('error', () => undefined);
    let line = '';
    const onData = (c: Buffer) => {
      line += c.toString('latin1');
      const m = /^CONNECT (\d+)\n/.exec(line);
      if (m) {
        sock.off('data', onData);
        answer(Number(m[1]), sock);
      }
    };
    sock.on('data', onData);
  });
  await new Promise<void>((r) => server.listen(path, r));
  return { path, close: () => new Promise<void>((r) => (socks.forEach((s) => s.destroy()), server.close(() => r()))) };
}

test('vsock: CONNECT <port> answered OK gives the guest\'s stream, with bytes that came with the OK line kept', async (t) => {
  const v = await fakeVsock((port, sock) => {
    sock.write(`OK 1073741824\nhello from ${port}`);
    sock.on('data', (c) => sock.write(`echo:${c}`));
  });
  try {
    const s = await vsockDial(v.path, 1024);
    const got = await new Promise<string>((resolve) => {
      let text = '';
      s.on('data', (c: Buffer) => {
        text += c.toString();
        if (text.includes('echo:ping')) resolve(text);
      });
      s.resume();
      s.write('ping');
    });
    t.is(got, 'hello from 1024echo:ping');
    s.destroy();
  } finally {
    await v.close();
  }
});

test('the agent client speaks to an agent behind the vsock handshake, and gets what came in the same write as the OK line', async (t) => {
  let pings = 0;
  const v = await fakeVsock((port, sock) => {
    t.is(port, AGENT_VSOCK_PORT);
    // a HELLO for the client's first channel shares the write with the OK line: the dialer must hand it on
    sock.write(Buffer.concat([Buffer.from('OK 1073741825\n'), encodeFrame(AgentType.HELLO, 1, Buffer.from('6.1.0-vsock'))]));
    const dec = new AgentDecoder();
    sock.on('data', (d) => {
      for (const f of dec.push(d)) if (f.type === AgentType.PING) pings++;
    });
  });
  try {
    const client = await AgentClient.connect(() => vsockDial(v.path, AGENT_VSOCK_PORT, 2000), 3000);
    t.is(client.release, '6.1.0-vsock');
    t.true(pings <= 1, 'answered by the frame that came with the OK, not by a later one');
    client.close();
  } finally {
    await v.close();
  }
});

test('vsock: nothing listening (closed), a refusal line, an endless line and silence all fail with a clear error', async (t) => {
  const cases: Array<[string, (port: number, sock: net.Socket) => void, WarrenError["code"], RegExp]> = [
    ['closed', (_p, sock) => sock.destroy(), 'UNAVAILABLE', /closed before OK/],
    ['refused', (_p, sock) => sock.write('NOPE\n'), 'UNAVAILABLE', /"NOPE"/],
    ['endless', (_p, sock) => sock.write('x'.repeat(200)), 'INTERNAL', /not a line/],
    ['silent', () => undefined, 'TIMEOUT', /no answer to CONNECT/],
  ];
  for (const [name, answer, code, re] of cases) {
    const v = await fakeVsock(answer);
    try {
      const err = (await t.throwsAsync(vsockDial(v.path, 1025, 300))) as WarrenError;
      t.is(err.code, code, name);
      t.regex(err.message, re, name);
    } finally {
      await v.close();
    }
  }
});

// ------------------------------------------------------------------ the kernel

test('a bzImage that is not one, or whose payload lies outside it, is refused before any decompressor runs', (t) => {
  t.is((t.throws(() => bzImagePayload(Buffer.alloc(4096))) as WarrenError).code, 'INVALID_ARGUMENT');
  const img = Buffer.alloc(8192);
  img.write('HdrS', 0x202, 'latin1');
  img.writeUInt16LE(0x20f, 0x206);
  img[0x1f1] = 1;
  img.writeUInt32LE(100, 0x248);
  img.writeUInt32LE(1 << 20, 0x24c);
  t.regex((t.throws(() => bzImagePayload(img)) as WarrenError).message, /outside the file/);
  img.writeUInt32LE(16, 0x24c);
  t.is((t.throws(() => bzImagePayload(img)) as WarrenError).code, 'NOT_SUPPORTED', 'unknown compression');
  t.is((t.throws(() => checkVmlinux(Buffer.from('not an elf at all, not an elf at all, not an elf at all, not an elf'))) as WarrenError).code, 'INTERNAL');
});
