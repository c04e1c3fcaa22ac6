/**
 * The vm backend end to end: a real desktop VM (QEMU q35, Xorg, twm, xterm)
 * behind a real gateway, driven through the SDK, the CLI and raw HTTP /
 * WebSocket. A TCG boot costs tens of seconds of a core, so one VM is shared
 * by the serial tests; the boot-failure test makes (and must leave) nothing.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import WebSocket from 'ws';
import { vmBackendStatus, skipReason } from '../../src/features';
import { WarrenError } from '../../src/errors';
import { main as cli } from '../../src/cli/main';
import { Auth } from '../../src/gateway/auth';
import { type Gateway, createGateway } from '../../src/gateway/server';
import { WarrenClient, type Sandbox } from '../../src/sdk';
import { VmBackend } from '../../src/shim/backends/vm';
import { LocalShim } from '../../src/shim/local';
import { desktopImage } from '../../src/shim/backends/vm/image';
import { native } from '../../src/native';
import { openDatabase } from '../../src/state/db';
import { decodePng, pixel, type Decoded } from '../helpers/png';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';
import { waitFor, waitForValue } from '../helpers/wait';
import { closeTestShim, openTestShim, spec, type ShimFixture } from '../helpers/warren';

const status = vmBackendStatus();
const reason = skipReason('native-helper', 'qemu', 'debootstrap') ?? (status.available ? null : `vm backend unavailable: ${status.reason}`);
const test = testUnless(reason);

let f: ShimFixture;
let gateway: Gateway;
let token: string;
let client: WarrenClient;
let box: Sandbox;
const W = 1024;
const H = 768;

function vmmProcesses(id: string): number[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(`warren-${id}`);
      } catch {
        return false;
      }
    })
    .map(Number);
}

async function shot(): Promise<Decoded> {
  return decodePng(await box.screenshot());
}

async function exec(cmd: string): Promise<string> {
  return (await box.exec(cmd, { timeoutMs: 30_000 })).stdout;
}

test.before(async (t) => {
  // the desktop image is built once per node (minutes, cached), then one TCG boot
  t.timeout(25 * 60_000);
  await desktopImage();
  f = await openTestShim();
  const db = openDatabase(join(f.dataDir, 'warren.db'));
  token = new Auth(db).ensureAdminToken(f.dataDir)!;
  gateway = await createGateway({ shim: new LocalShim(f.shim), db, dataDir: f.dataDir, host: '127.0.0.1', port: 0, log: () => undefined });
  client = new WarrenClient({ url: gateway.url, token });
  box = await client.createSandbox({ backend: 'vm', cpu: 2, memoryMb: 512, diskMb: 1024 });
});

test.after.always(async () => {
  if (!f) return;
  await client?.close();
  await gateway?.close();
  await closeTestShim(f);
});

test.serial('the feature report names the vm backend, its accelerator, and a create boots the desktop', async (t) => {
  const b = (await client.features()).backends.vm;
  t.true(b.available, b.reason);
  t.regex(b.accelerator ?? '', /^(kvm|tcg) \(/);
  t.true(b.facets?.freeze.offered);
  t.false(b.facets?.export.offered);
  t.is(box.info?.backend, 'vm');
  t.is((await exec('test -S /tmp/.X11-unix/X0 && echo x')).trim(), 'x', 'X is up when the create returns');
  t.regex(await exec('df -m / | tail -1'), /\s(9\d\d|10\d\d)\s/, 'the root filesystem was grown to the overlay (diskMb 1024)');
});

test.serial('the VMM is jailed like a microVM: own namespaces, unprivileged, seccomp, only its own files', async (t) => {
  const gate = f.shim.getSandbox(box.id).pid!;
  const qemu = Number(readFileSync(`/proc/${gate}/task/${gate}/children`, 'utf8').trim().split(' ')[0]);
  const st = readFileSync(`/proc/${qemu}/status`, 'utf8');
  t.not(/^Uid:\s+(\d+)/m.exec(st)![1], '0', 'QEMU runs unprivileged');
  t.regex(st, /^Seccomp:\s+2$/m, 'under a seccomp filter');
  t.regex(st, /^NSpid:\s+\d+\s+1$/m, 'pid 1 of its own pid namespace');
  const { readlinkSync } = require('node:fs') as typeof import('node:fs');
  for (const ns of ['mnt', 'net', 'ipc', 'uts', 'pid']) t.not(readlinkSync(`/proc/${qemu}/ns/${ns}`), readlinkSync(`/proc/self/ns/${ns}`), ns);
  t.deepEqual(readdirSync(`/proc/${qemu}/root/run/warren/fullvm`), [box.id], 'only its own run dir (sockets) is visible');
  t.deepEqual(readdirSync(`/proc/${qemu}/root${join(f.dataDir, 'vm')}`), [box.id], 'only its own data dir (overlay, snapshot) is visible');
  t.true(native.cgroupProcs(box.id).includes(gate), 'the VMM is in the sandbox cgroup');
});

test.serial('a screenshot is a PNG of the configured size showing the desktop', async (t) => {
  // the terminal is mapped when the create returns; a loaded guest may still be drawing it
  const img = await waitForValue(shot, (i) => pixel(i, 300, 200).every((c) => c === 255), 60_000, 'the terminal is drawn', 500);
  t.is(img.width, W);
  t.is(img.height, H);
  t.deepEqual(pixel(img, W - 20, H - 20), [0x3a, 0x6e, 0xa5], 'the root window colour');
  t.deepEqual(pixel(img, 300, 200), [255, 255, 255], 'the terminal');
  const colours = new Set<number>();
  for (let i = 0; i < img.rgb.length; i += 3 * 97) colours.add(img.rgb.readUIntBE(i, 3));
  t.true(colours.size >= 3, `not blank (${colours.size} colours sampled)`);
  const small = decodePng(await box.screenshot({ width: 256 }));
  t.deepEqual([small.width, small.height], [256, 192]);
});

test.serial('typing a command into the terminal through input makes a file that exec reads', async (t) => {
  await box.input([{ type: 'move', x: 300, y: 200 }]);
  const r = await box.input([{ type: 'type', text: 'echo "typed by $((6*7))" > /tmp/typed\n' }]);
  t.true(r.events > 40);
  const text = await waitForValue(() => exec('cat /tmp/typed 2>/dev/null'), (s) => s !== '', 30_000, 'the typed command ran');
  t.is(text, 'typed by 42\n');
});

test.serial('a click at a known position reaches the window there, at that cell', async (t) => {
  // An xterm that reports the first mouse press (X10 mode: ESC [ M b col row) into a file.
  const script = "stty raw -echo; printf '\\033[?9h'; touch /tmp/click.ready; head -c 6 > /tmp/click.raw; printf '\\033[?9l'; sleep 60";
  await exec(`DISPLAY=:0 setsid xterm -fn fixed -geometry 40x10+600+420 -title clicktarget -e sh -c "${script}" >/dev/null 2>&1 &`);
  const info = await waitForValue(() => exec('DISPLAY=:0 xwininfo -name clicktarget 2>/dev/null'), (s) => s.includes('Map State: IsViewable'), 30_000, 'the click target is on screen');
  const ax = Number(/Absolute upper-left X:\s+(\d+)/.exec(info)![1]);
  const ay = Number(/Absolute upper-left Y:\s+(\d+)/.exec(info)![1]);
  // wait until the program inside has switched mouse reporting on
  await waitFor(async () => (await exec('test -e /tmp/click.ready && echo y')).trim() === 'y', 30_000, 'the reporter runs');
  const x = ax + 2 + 6 * 10 + 3; // column 11 of a 6x13 font, inside a 2-pixel border
  const y = ay + 2 + 13 * 4 + 6; // row 5
  await box.input([{ type: 'click', x, y }]);
  const raw = await waitForValue(() => box.execBytes('cat /tmp/click.raw 2>/dev/null').then((r) => r.stdout), (b) => b.length === 6, 30_000, 'the click was reported');
  t.deepEqual([...raw.subarray(0, 3)], [0x1b, 0x5b, 0x4d], 'ESC [ M');
  t.is(raw[3]! - 32, 0, 'left button');
  t.is(raw[4]! - 32, 11, 'column');
  t.is(raw[5]! - 32, 5, 'row');
});

test.serial('bad input gets 4xx with stable codes and sends nothing', async (t) => {
  const post = async (body: unknown, raw?: Buffer) => {
    const res = await fetch(`${gateway.url}/v1/sandboxes/${box.id}/input`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: raw ?? JSON.stringify(body) });
    return { status: res.status, code: ((await res.json()) as { error?: { code: string } }).error?.code };
  };
  t.deepEqual(await post({ actions: [{ type: 'click', x: W, y: 10 }] }), { status: 400, code: 'OFF_SCREEN' });
  t.deepEqual(await post({ actions: [{ type: 'key', keys: 'ctrl+warp' }] }), { status: 400, code: 'UNKNOWN_KEY' });
  t.deepEqual(await post({ actions: [{ type: 'key', keys: 'a', repeat: 100000 }] }), { status: 400, code: 'LIMIT_OUT_OF_RANGE' });
  t.deepEqual(await post(null, Buffer.from(JSON.stringify({ actions: [{ type: 'type', text: 'x'.repeat(400_000) }] }))), { status: 413, code: 'PAYLOAD_TOO_LARGE' });
  t.deepEqual(await post({ actions: [{ type: 'move', x: 1, y: 1 }], extra: 1 }), { status: 400, code: 'UNKNOWN_FIELD' });
  const res = await fetch(`${gateway.url}/v1/sandboxes/${box.id}/screen?width=9`, { headers: { authorization: `Bearer ${token}` } });
  t.is(res.status, 400);
  const err = await t.throwsAsync(box.input([{ type: 'move', x: -5, y: 0 }]));
  t.is((err as WarrenError).code, 'OFF_SCREEN');
});

test.serial('the live view speaks RFB over WebSocket; the CLI writes screenshots', async (t) => {
  const greeting = await new Promise<string>((resolve, reject) => {
    const ws = new WebSocket(box.vncUrl(), ['binary'], { headers: { authorization: `Bearer ${token}` } });
    ws.binaryType = 'nodebuffer';
    ws.once('message', (d: Buffer) => {
      resolve(d.toString('latin1'));
      ws.close();
    });
    ws.once('error', reject);
  });
  t.regex(greeting, /^RFB 003\.00\d\n/);
  const refused = await new Promise<number>((resolve) => {
    const ws = new WebSocket(box.vncUrl(), { headers: { authorization: 'Bearer nope' } });
    ws.once('unexpected-response', (_q, res) => resolve(res.statusCode ?? 0));
    ws.once('open', () => resolve(101));
  });
  t.is(refused, 401);
  const out = join(tempDir('warren-vm-cli-'), 'screen.png');
  const lines: string[] = [];
  const code = await cli(['screenshot', box.id, out, '--width', '512', '--url', gateway.url, '--token', token], { out: (s) => lines.push(s), err: (s) => lines.push(s), env: {} });
  t.is(code, 0, lines.join(''));
  const img = decodePng(readFileSync(out));
  t.deepEqual([img.width, img.height], [512, 384]);
});

test.serial('pause gives the memory back and resume brings the same screen and processes', async (t) => {
  await exec('(while :; do date +%s%N > /tmp/tick; sleep 0.2; done) >/dev/null 2>&1 &');
  const before = await shot();
  const p = await f.shim.pauseSandbox(box.id);
  t.is(p.state, 'paused');
  t.is(p.reclaim, 'snapshot');
  t.true(p.releasedBytes > 128 << 20, `released ${p.releasedBytes}`);
  t.is(vmmProcesses(box.id).length, 0, 'no VMM while paused');
  await f.shim.resumeSandbox(box.id);
  const after = await shot();
  t.true(before.rgb.equals(after.rgb), 'the screen after resume is the screen before pause, pixel for pixel');
  const tick = Number(await exec('cat /tmp/tick'));
  await waitFor(async () => Number(await exec('cat /tmp/tick')) > tick, 20_000, 'the loop started before the pause goes on');
  t.is((await exec('cat /tmp/typed')).trim(), 'typed by 42');
});

test.serial('delete leaves no VMM, disk, socket or cgroup', async (t) => {
  const id = box.id;
  const runDir = join('/run/warren/fullvm', id);
  const dataDir = join(f.dataDir, 'vm', id);
  t.true(existsSync(runDir) && existsSync(join(dataDir, 'disk.img')));
  await box.delete();
  t.deepEqual(vmmProcesses(id), []);
  t.false(existsSync(runDir), 'sockets gone');
  t.false(existsSync(dataDir), 'overlay gone');
  t.false(native.cgroupExists(id), 'cgroup gone');
});

test.serial('a guest that never boots fails the create with a timeout and its console, leaving nothing', async (t) => {
  const dir = tempDir('warren-vm-noboot-');
  const backend = new VmBackend({ dataDir: dir, bootTimeoutMs: 4000 });
  const id = `fnb-${process.pid.toString(36)}`;
  const err = await t.throwsAsync(backend.create(id, spec({ backend: 'vm', memoryMb: 512, diskMb: 1024 }), []));
  t.is((err as WarrenError).code, 'TIMEOUT');
  t.regex((err as WarrenError).message, /did not come up/);
  t.is(typeof (err as WarrenError).details?.console, 'string', 'the console tail is in the details');
  t.deepEqual(vmmProcesses(id), []);
  t.false(existsSync(join(dir, 'vm', id)));
  t.false(existsSync(join('/run/warren/fullvm', id)));
  t.false(native.cgroupExists(id));
  await rm(dir, { recursive: true, force: true });
});
