/**
 * Host networking for sandboxes: the bridge + nftables table (HostNetwork) and
 * the warm pool of network namespaces (NetnsPool), against the real kernel.
 * This file uses its own bridge, subnet, table and netns prefix, so it runs
 * concurrently with other test files; all traffic stays on this machine.
 */
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as dgram from 'node:dgram';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import * as net from 'node:net';
import test from 'ava';
import { HostNetwork, runTool } from '../../src/shim/network/host-net';
import { type NetnsLease, NetnsPool, hostVethName } from '../../src/shim/network/netns-pool';
import { netResources, startTestHost } from '../helpers/net-hosts';
import { rootSkipReason } from '../helpers/warren';
import { testUnless } from '../helpers/skip';

const why = rootSkipReason();
const it = testUnless(why).serial;

const id = randomBytes(4).readUInt32BE(0).toString(36).padStart(6, '0').slice(-6);
const bridge = `wt${id}`;
const nftTable = `wt_${id}`;
const prefix = `wn-${id}`;
const hostLog: string[] = [];

/** A random 10.(100-199).x.0/24 that no interface address or route on this machine overlaps. */
function pickSubnet(): string {
  const inUse = existsSync('/proc/net/route') ? readFileSync('/proc/net/route', 'utf8') : '';
  for (let attempt = 0; attempt < 50; attempt++) {
    const second = 100 + Math.floor(Math.random() * 100);
    const third = Math.floor(Math.random() * 256);
    // /proc/net/route prints destinations as little-endian hex.
    const hex = [0, third, second, 10].map((o) => o.toString(16).padStart(2, '0').toUpperCase()).join('');
    if (!inUse.includes(hex)) return `10.${second}.${third}.0/24`;
  }
  throw new Error('no free test subnet');
}

const host = why === null ? new HostNetwork({ bridge, subnet: pickSubnet(), nftTable, log: (l) => hostLog.push(l) }) : null;
const pools: NetnsPool[] = [];
const seenVeths = new Set<string>();
let pool: NetnsPool | null = null;
let leases: NetnsLease[] = [];

function newPool(poolPrefix: string, warm: number): NetnsPool {
  const p = new NetnsPool({ host: host!, prefix: poolPrefix, warm, log: (l) => hostLog.push(l) });
  pools.push(p);
  return p;
}

function remember(lease: NetnsLease): NetnsLease {
  seenVeths.add(lease.hostVeth);
  return lease;
}

async function waitFor(what: string, condition: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function inNetns(ns: string, argv: string[], opts: { timeoutMs?: number; env?: Record<string, string> } = {}) {
  return runTool('ip', ['netns', 'exec', ns, ...argv], { timeoutMs: opts.timeoutMs ?? 10_000, env: opts.env ?? {} });
}

async function httpGetFrom(ns: string, url: string, timeoutSeconds: number): Promise<{ ok: boolean; body: string; detail: string }> {
  const r = existsSync('/usr/bin/curl')
    ? await inNetns(ns, ['curl', '-sS', '--connect-timeout', String(timeoutSeconds), '--max-time', String(timeoutSeconds + 2), url])
    : await inNetns(ns, ['/bin/busybox', 'wget', '-q', '-O', '-', '-T', String(timeoutSeconds), url]);
  return { ok: r.code === 0, body: r.stdout, detail: `exit ${r.code}: ${r.stderr.trim()}` };
}

const TCP_PROBE = `
const s = require('node:net').connect({ host: process.env.H, port: Number(process.env.P) });
setTimeout(() => { console.log('timeout'); process.exit(2); }, Number(process.env.T));
s.on('connect', () => { console.log('connected'); process.exit(0); });
s.on('error', (e) => { console.log('error ' + e.code); process.exit(1); });
`;
const UDP_PROBE = `
const s = require('node:dgram').createSocket('udp4');
setTimeout(() => { console.log('timeout'); process.exit(2); }, Number(process.env.T));
s.on('message', (m) => { console.log('echo ' + m); process.exit(0); });
s.send('ping', Number(process.env.P), process.env.H);
`;

async function tcpProbe(ns: string, hostAddress: string, port: number, timeoutMs: number): Promise<string> {
  const r = await inNetns(ns, [process.execPath, '-e', TCP_PROBE], { env: { H: hostAddress, P: String(port), T: String(timeoutMs) } });
  return r.stdout.trim() || r.stderr.trim();
}

async function udpProbe(ns: string, hostAddress: string, port: number, timeoutMs: number): Promise<string> {
  const r = await inNetns(ns, [process.execPath, '-e', UDP_PROBE], { env: { H: hostAddress, P: String(port), T: String(timeoutMs) } });
  return r.stdout.trim() || r.stderr.trim();
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

// If the worker dies before after.always (an uncaught exception), still remove what this file made.
process.once('exit', () => {
  if (host === null) return;
  const names = existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => n.startsWith(prefix)) : [];
  const commands = names.flatMap((n) => [`link delete dev ${hostVethName(n)}`, `netns delete ${n}`]);
  if (existsSync(`/sys/class/net/${bridge}`)) commands.push(`link delete dev ${bridge}`);
  if (commands.length > 0) spawnSync('ip', ['-force', '-batch', '-'], { input: commands.join('\n') + '\n', stdio: ['pipe', 'ignore', 'ignore'] });
  spawnSync('nft', ['delete', 'table', 'inet', nftTable], { stdio: 'ignore' });
});

test.after.always(async () => {
  if (host === null) return;
  for (const p of pools) await p.close().catch(() => undefined);
  for (const p of pools) for (const l of p.leases()) await p.release(l).catch(() => undefined);
  // Whatever a failed test left with this file's prefix.
  for (const name of existsSync('/run/netns') ? readdirSync('/run/netns') : []) {
    if (!name.startsWith(prefix)) continue;
    await runTool('ip', ['-force', '-batch', '-'], { input: `link delete dev ${hostVethName(name)}\nnetns delete ${name}\n` });
  }
  await host.teardown().catch(() => undefined);
});

test('HostNetwork: invalid options are refused with INVALID_ARGUMENT; addresses are derived from the subnet', (t) => {
  const bad: Array<[Record<string, string>, RegExp]> = [
    [{ bridge: 'a-bridge-name-too-long' }, /bridge name/],
    [{ bridge: 'br/0' }, /bridge name/],
    [{ bridge: '' }, /bridge name/],
    [{ nftTable: 'bad table' }, /table name/],
    [{ subnet: '10.0.0.0/29' }, /between \/8 and \/28/],
    [{ subnet: '10.0.0.0/7' }, /between \/8 and \/28/],
    [{ subnet: '8.8.8.0/24' }, /private range/],
    [{ subnet: '172.32.0.0/16' }, /private range/],
    [{ subnet: '10.88.0.1/16' }, /host bits/],
    [{ subnet: 'fd00::/64' }, /IPv4 CIDR/],
    [{ subnet: '10.300.0.0/16' }, /IPv4 CIDR/],
  ];
  for (const [opts, message] of bad) {
    const err = t.throws(() => new HostNetwork(opts), { code: 'INVALID_ARGUMENT' } as never, JSON.stringify(opts));
    t.regex(err!.message, message);
  }

  const defaults = new HostNetwork();
  t.is(defaults.bridge, 'warren0');
  t.is(defaults.subnet, '10.88.0.0/16');
  t.is(defaults.nftTable, 'warren');
  t.is(defaults.gatewayAddress, '10.88.0.1');
  t.is(defaults.prefixLength, 16);
  t.is(defaults.sandboxAddressCount, 65533);

  const small = new HostNetwork({ bridge: 'x', subnet: '192.168.7.16/28' });
  t.is(small.gatewayAddress, '192.168.7.17');
  const all = [...small.sandboxAddresses()];
  t.is(all.length, small.sandboxAddressCount);
  t.is(all[0], '192.168.7.18');
  t.is(all.at(-1), '192.168.7.30');
  t.is(small.sandboxAddressIndex('192.168.7.17'), -1, 'gateway');
  t.is(small.sandboxAddressIndex('192.168.7.31'), -1, 'broadcast');
  t.is(small.sandboxAddressIndex('192.168.7.16'), -1, 'network');
  t.is(small.sandboxAddressIndex('192.168.7.20'), 2);
  t.is(small.sandboxAddressAt(2), '192.168.7.20');
  t.throws(() => new NetnsPool({ host: small, prefix: 'bad prefix', warm: 1 }), { code: 'INVALID_ARGUMENT' } as never);
  t.throws(() => new NetnsPool({ host: small, prefix: 'ok', warm: -1 }), { code: 'INVALID_ARGUMENT' } as never);
});

it('ensure(): bridge up with the gateway address, forwarding on, nftables table loaded; idempotent', async (t) => {
  await Promise.all([host!.ensure(), host!.ensure()]);
  await host!.ensure();
  t.true(existsSync(`/sys/class/net/${bridge}/bridge`));
  const addr = await runTool('ip', ['-4', '-o', 'address', 'show', 'dev', bridge]);
  t.regex(addr.stdout, new RegExp(`inet ${host!.gatewayAddress.replace(/\./g, '\\.')}/24 `));
  t.is(addr.stdout.trim().split('\n').length, 1, 'one address only');
  const link = await runTool('ip', ['-o', 'link', 'show', 'dev', bridge]);
  t.regex(link.stdout, /<[^>]*\bUP\b[^>]*>/);
  t.is(readFileSync('/proc/sys/net/ipv4/ip_forward', 'utf8').trim(), '1');
  const table = await runTool('nft', ['list', 'table', 'inet', nftTable]);
  t.is(table.code, 0, table.stderr);
  t.regex(table.stdout, /masquerade/);
  t.regex(table.stdout, new RegExp(`iifname "${bridge}" oifname "${bridge}" drop`));
  t.is((table.stdout.match(/hook forward/g) ?? []).length, 1, 'the table was replaced, not appended to');
});

it('pool: on-demand creation time, and the pool fills to warm in the background', async (t) => {
  const measure = newPool(`${prefix}-m`, 0);
  await measure.start([]);
  const times: number[] = [];
  const made: NetnsLease[] = [];
  for (let i = 0; i < 10; i++) {
    const start = process.hrtime.bigint();
    made.push(remember(await measure.acquire()));
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  const releaseStart = process.hrtime.bigint();
  for (const l of made) await measure.release(l);
  const releaseMs = Number(process.hrtime.bigint() - releaseStart) / 1e6 / made.length;
  await measure.close();
  t.log(`on-demand netns creation: median ${median(times).toFixed(1)} ms, min ${Math.min(...times).toFixed(1)} ms, max ${Math.max(...times).toFixed(1)} ms; release ${releaseMs.toFixed(1)} ms each`);
  t.is((await netResources(`${prefix}-m-`)).netns, 0);

  pool = newPool(`${prefix}-p`, 4);
  const fillStart = Date.now();
  await pool.start([]);
  await waitFor('pool to fill', () => pool!.stats().idle === 4);
  t.log(`filled 4 in ${Date.now() - fillStart} ms (2 at a time)`);
  t.deepEqual(pool.stats(), { idle: 4, leased: 0, creating: 0 });
  t.is((await netResources(`${prefix}-p-`)).netns, 4);

  // A lease from a full pool is one of the namespaces made ahead, not one made on the call.
  const warm = readdirSync('/run/netns').filter((n) => n.startsWith(`${prefix}-p-`));
  const fastStart = process.hrtime.bigint();
  const lease = remember(await pool.acquire());
  const fastMs = Number(process.hrtime.bigint() - fastStart) / 1e6;
  t.log(`acquire() from the warm pool: ${fastMs.toFixed(2)} ms`);
  t.true(warm.includes(lease.name), `${lease.name} was not among the warm namespaces ${warm.join(' ')}`);
  t.is(pool.stats().leased, 1);
  await waitFor('refill', () => pool!.stats().idle === 4);
  leases.push(lease);
});

it('pool: 20 concurrent acquire() give distinct names, addresses and veths on the bridge', async (t) => {
  const more = await Promise.all(Array.from({ length: 20 }, () => pool!.acquire()));
  leases.push(...more.map(remember));
  const names = new Set(leases.map((l) => l.name));
  const addresses = new Set(leases.map((l) => l.address));
  const veths = new Set(leases.map((l) => l.hostVeth));
  t.is(names.size, 21);
  t.is(addresses.size, 21);
  t.is(veths.size, 21);
  const ports = new Set(readdirSync(`/sys/class/net/${bridge}/brif`));
  for (const l of leases) {
    t.regex(l.name, new RegExp(`^${prefix}-p-\\d+$`));
    t.is(l.path, `/run/netns/${l.name}`);
    t.true(existsSync(l.path));
    t.true(l.hostVeth.length <= 15);
    t.true(ports.has(l.hostVeth), `${l.hostVeth} is a port of ${bridge}`);
    t.not(host!.sandboxAddressIndex(l.address), -1, l.address);
  }
  t.is(pool!.stats().leased, 21);
});

it('a process in a leased netns sees eth0 with its address, lo up, a default route via the gateway, and no IPv6', async (t) => {
  const lease = leases[0]!;
  const r = await inNetns(lease.name, [
    '/bin/sh',
    '-c',
    'ip -j address show; ip -j route show; cat /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6',
  ]);
  t.is(r.code, 0, r.stderr);
  const [addressJson, routeJson, allOff, defaultOff] = r.stdout.trim().split('\n');
  const links = JSON.parse(addressJson!) as Array<{ ifname: string; flags: string[]; addr_info: Array<{ family: string; local: string; prefixlen: number }> }>;
  t.deepEqual(links.map((l) => l.ifname).sort(), ['eth0', 'lo']);
  const eth0 = links.find((l) => l.ifname === 'eth0')!;
  const lo = links.find((l) => l.ifname === 'lo')!;
  t.true(eth0.flags.includes('UP'));
  t.true(lo.flags.includes('UP'));
  t.deepEqual(eth0.addr_info.map((a) => `${a.family} ${a.local}/${a.prefixlen}`), [`inet ${lease.address}/24`]);
  t.deepEqual(lo.addr_info.map((a) => `${a.family} ${a.local}`), ['inet 127.0.0.1']);
  const routes = JSON.parse(routeJson!) as Array<{ dst: string; gateway?: string; dev: string }>;
  t.true(routes.some((x) => x.dst === 'default' && x.gateway === host!.gatewayAddress && x.dev === 'eth0'), routeJson);
  t.is(allOff, '1');
  t.is(defaultOff, '1');
});

it('from a leased netns, HTTP and UDP reach a test host through the bridge and NAT', async (t) => {
  const target = await startTestHost({ name: 'web', port: 8080, body: `hello from ${id}\n` });
  try {
    const got = await httpGetFrom(leases[0]!.name, `http://${target.address}:${target.port}/`, 3);
    t.true(got.ok, got.detail);
    t.is(got.body, `hello from ${id}\n`);
    t.is(await udpProbe(leases[1]!.name, target.address, target.port, 2000), 'echo ping');
  } finally {
    await target.close();
  }
  t.false(existsSync(`/run/netns/${target.netns}`));
  t.false(existsSync(`/sys/class/net/${target.hostVeth}`));
});

it('sandboxes cannot reach each other, though the host reaches them', async (t) => {
  const [a, b] = [leases[0]!, leases[1]!];
  const server = inNetns(b.name, [process.execPath, '-e', `require('node:http').createServer((q, r) => r.end('b')).listen(8081, () => console.log('ready')); setTimeout(() => process.exit(0), 8000);`], {
    timeoutMs: 9000,
  });
  try {
    let fromHost = '';
    for (let i = 0; i < 100 && fromHost !== 'b'; i++) {
      fromHost = await fetch(`http://${b.address}:8081/`).then((r) => r.text(), () => '');
      if (fromHost !== 'b') await new Promise((r) => setTimeout(r, 20));
    }
    t.is(fromHost, 'b', 'the host reaches a sandbox');
    t.regex(await tcpProbe(a.name, b.address, 8081, 1000), /^(timeout|error )/);
  } finally {
    await runTool('ip', ['netns', 'pids', b.name]).then(async (r) => {
      for (const pid of r.stdout.split('\n').filter(Boolean)) process.kill(Number(pid), 'SIGKILL');
    });
    await server;
  }
});

it('the gateway answers on port 53 only; other host ports are unreachable from a sandbox', async (t) => {
  const ns = leases[2]!.name;
  const gateway = host!.gatewayAddress;
  const tcp = net.createServer((s) => s.on('error', () => undefined).end('host\n'));
  await new Promise<void>((resolve) => tcp.listen(0, '0.0.0.0', resolve));
  const tcpPort = (tcp.address() as net.AddressInfo).port;
  const udp = dgram.createSocket('udp4');
  udp.on('message', (m, from) => udp.send(m, from.port, from.address));
  await new Promise<void>((resolve) => udp.bind(0, '0.0.0.0', resolve));
  const udpPort = udp.address().port;
  const dnsTcp = net.createServer((s) => s.on('error', () => undefined).end());
  const dnsUdp = dgram.createSocket('udp4');
  dnsUdp.on('message', (m, from) => dnsUdp.send(m, from.port, from.address));
  const dnsBound = await Promise.all([
    new Promise<boolean>((resolve) => dnsTcp.once('error', () => resolve(false)).listen(53, gateway, () => resolve(true))),
    new Promise<boolean>((resolve) => {
      dnsUdp.once('error', () => resolve(false));
      dnsUdp.bind(53, gateway, () => resolve(true));
    }),
  ]);
  try {
    const local = await new Promise<string>((resolve) => {
      const s = net.connect({ host: gateway, port: tcpPort }, () => resolve('connected'));
      s.on('error', (e) => resolve(String(e)));
      s.on('connect', () => s.destroy());
    });
    t.is(local, 'connected', 'the listener is up on the gateway address');
    const [tcpResult, udpResult] = await Promise.all([tcpProbe(ns, gateway, tcpPort, 800), udpProbe(ns, gateway, udpPort, 800)]);
    t.is(tcpResult, 'timeout', 'TCP to a non-53 port on the gateway is dropped');
    t.is(udpResult, 'timeout', 'UDP to a non-53 port on the gateway is dropped');
    if (dnsBound.every(Boolean)) {
      const [dnsTcpResult, dnsUdpResult] = await Promise.all([tcpProbe(ns, gateway, 53, 2000), udpProbe(ns, gateway, 53, 2000)]);
      t.is(dnsTcpResult, 'connected');
      t.is(dnsUdpResult, 'echo ping');
    } else {
      t.log('port 53 on the gateway address is taken on this host; skipped the DNS half');
    }
  } finally {
    tcp.close();
    udp.close();
    if (dnsBound[0]) dnsTcp.close();
    if (dnsBound[1]) dnsUdp.close();
  }
});

it('release() removes the netns and its veth, is idempotent, and refuses foreign names', async (t) => {
  const [first, ...rest] = leases;
  await pool!.release(first!);
  t.false(existsSync(first!.path));
  t.false(existsSync(`/sys/class/net/${first!.hostVeth}`));
  await pool!.release(first!);
  await pool!.release(first!.name);
  await t.throwsAsync(pool!.release('someone-else-1'), { code: 'INVALID_ARGUMENT' } as never);
  await Promise.all(rest.map((l) => pool!.release(l.name)));
  leases = [];
  t.is(pool!.stats().leased, 0);
  t.is((await netResources(`${prefix}-p-`, { interfaces: [...seenVeths] })).netns, 4, 'only the idle ones');
  await pool!.close();
  t.deepEqual(pool!.stats(), { idle: 0, leased: 0, creating: 0 });
  await t.throwsAsync(pool!.acquire(), { code: 'UNAVAILABLE' } as never);
  const left = await netResources(`${prefix}-p-`, { bridge, interfaces: [...seenVeths] });
  t.is(left.netns, 0);
  t.is(left.interfaces, 0);
  t.is(left.bridgePorts, 0);
});

it('start(leased) after a restart deletes stale idle entries and keeps the leased ones', async (t) => {
  const restartPrefix = `${prefix}-r`;
  const before = newPool(restartPrefix, 3);
  await before.start([]);
  const kept = [remember(await before.acquire()), remember(await before.acquire())];
  await waitFor('idle entries', () => before.stats().idle === 3 && before.stats().creating === 0);
  const staleNames = readdirSync('/run/netns').filter((n) => n.startsWith(`${restartPrefix}-`) && !kept.some((k) => k.name === n));
  t.is(staleNames.length, 3);
  // The old pool is abandoned without close(), as after a crash.

  const after = newPool(restartPrefix, 2);
  await after.start(kept);
  for (const name of staleNames) {
    t.false(existsSync(`/run/netns/${name}`), `stale ${name} deleted`);
    t.false(existsSync(`/sys/class/net/${hostVethName(name)}`));
  }
  for (const k of kept) {
    t.true(existsSync(k.path), `leased ${k.name} kept`);
    t.true(existsSync(`/sys/class/net/${k.hostVeth}`));
  }
  t.deepEqual(after.leases().map((l) => l.name).sort(), kept.map((k) => k.name).sort());
  await waitFor('refill after restart', () => after.stats().idle === 2);
  const fresh = [remember(await after.acquire()), remember(await after.acquire()), remember(await after.acquire())];
  for (const f of fresh) {
    t.false(kept.some((k) => k.address === f.address || k.name === f.name), `${f.name} ${f.address} is new`);
  }
  const probe = await inNetns(kept[0]!.name, ['ip', '-o', '-4', 'address', 'show', 'dev', 'eth0']);
  t.true(probe.stdout.includes(`${kept[0]!.address}/`), 'the adopted netns still works');

  await after.close();
  t.is(after.stats().leased, 5);
  for (const l of [...kept, ...fresh]) t.true(existsSync(l.path), 'close() leaves leased entries alone');
  for (const l of [...kept, ...fresh]) await after.release(l);
  t.is((await netResources(`${restartPrefix}-`)).netns, 0);
});

it('a failed creation rolls back what it created, and only that', async (t) => {
  // No such bridge: `link add ... master` fails after `netns add` succeeded.
  const nowhere = new HostNetwork({ bridge: `wx${id}`, subnet: '10.250.0.0/24', nftTable: `wx_${id}` });
  const broken = new NetnsPool({ host: nowhere, prefix: `${prefix}-f`, warm: 0 });
  pools.push(broken);
  await broken.start([]);
  const err = await t.throwsAsync(broken.acquire(), { code: 'INTERNAL' } as never);
  t.regex(err!.message, /creating netns/);
  t.is((await netResources(`${prefix}-f-`)).netns, 0, 'the namespace was rolled back');
  t.false(existsSync(`/sys/class/net/${hostVethName(`${prefix}-f-0`)}`));
  t.deepEqual(broken.stats(), { idle: 0, leased: 0, creating: 0 });
  await broken.close();

  // A namespace that is not ours has the next name: creation fails at `netns add` and leaves it alone.
  const squatted = newPool(`${prefix}-s`, 0);
  await squatted.start([]);
  const squatter = `${prefix}-s-0`;
  await runTool('ip', ['netns', 'add', squatter]);
  try {
    await t.throwsAsync(squatted.acquire(), { code: 'INTERNAL' } as never);
    t.true(existsSync(`/run/netns/${squatter}`), 'the foreign namespace is untouched');
    const lease = remember(await squatted.acquire());
    t.is(lease.name, `${prefix}-s-1`);
    await squatted.release(lease);
  } finally {
    await runTool('ip', ['netns', 'delete', squatter]);
  }
  await squatted.close();
});

it('close() and teardown() leave no netns, veth, nft table or bridge behind', async (t) => {
  const last = newPool(`${prefix}-z`, 3);
  await last.start([]);
  const lease = remember(await last.acquire());
  const during = last.stats();
  t.true(during.creating > 0 || during.idle > 0, JSON.stringify(during));
  await last.close();
  t.deepEqual(last.stats(), { idle: 0, leased: 1, creating: 0 });
  await last.release(lease);
  t.deepEqual(last.stats(), { idle: 0, leased: 0, creating: 0 });

  await host!.teardown();
  await host!.teardown();
  const left = await netResources(prefix, { bridge, nftTable, interfaces: [...seenVeths] });
  t.deepEqual(left, { netns: 0, bridgeExists: false, bridgePorts: 0, nftTable: false, interfaces: 0 });
  t.false(existsSync(`/sys/class/net/${bridge}`));
  t.log(`${seenVeths.size} host veths checked; host log: ${hostLog.length} lines`);
});
