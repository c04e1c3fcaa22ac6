/**
 * Per-service egress end to end: real sandboxes on a node with
 * networking, a python3 inside each trying every way out, test "pypi" and "npm"
 * hosts in network namespaces, and an upstream DNS zone that names them. No
 * traffic leaves this machine.
 */
import test from 'ava';
import { existsSync, readdirSync } from 'node:fs';
import type { ShimNode } from '../../src/shim/node';
import { openTestShim, spec } from '../helpers/warren';
import { egressSkipReason, SERVICE_PORT, startInternet, type Internet } from '../helpers/network';
import { netResources } from '../helpers/net-hosts';
import { parseProbeOutput, probeArgv, type Probe, type ProbeResult } from '../helpers/net-probe';
import { testUnless } from '../helpers/skip';
import { waitFor, waitForValue } from '../helpers/wait';
import { HOSTILE_DNS_SCRIPT, VICTIM_DNS_SCRIPT } from '../helpers/dns-flood';

const skip = egressSkipReason();
const tag = process.pid.toString(36);
let net: Internet;
let shim: ShimNode;
let dataDir = '';
const logs: string[] = [];

if (!skip) {
  test.before(async () => {
    net = await startInternet(tag);
    const f = await openTestShim({ network: net.network, nodeId: `ns${tag}`, log: (l) => logs.push(l) });
    shim = f.shim;
    dataDir = f.dataDir;
    await shim.functions.ensureJudgeImage();
  });
  test.after.always(async () => {
    for (const s of shim?.listSandboxes() ?? []) await shim.deleteSandbox(s.id).catch(() => undefined);
    await shim?.network?.teardownHost();
    await shim?.close();
    shim?.layers.unmountUnused();
    await net?.close();
    if (dataDir) require('node:fs').rmSync(dataDir, { recursive: true, force: true });
  });
}

const t = testUnless(skip).serial;

async function probe(id: string, probes: Probe[]): Promise<ProbeResult[]> {
  const r = await shim.exec(id, { cmd: probeArgv(probes), timeoutMs: 60_000 });
  if (r.exitCode !== 0) throw new Error(`probe failed (${r.exitCode}): ${r.stderr}`);
  return parseProbeOutput(r.stdout);
}
const outcomes = (rs: ProbeResult[]) => rs.map((r) => r.outcome.replace(/^gaierror:.*/, 'gaierror'));

function create(network?: Record<string, boolean>) {
  return shim.createSandbox(spec({ image: 'judge', memoryMb: 512, ...(network ? { network } : {}) }));
}

t('{pypi: true, npm: false}: pypi by name works; npm is denied quickly every way', async (tt) => {
  const sb = await create({ pypi: true, npm: false });
  try {
    const { pypi, npm, other, names } = net;
    const rs = await probe(sb.id, [
      { kind: 'http', host: names.pypi, port: SERVICE_PORT },
      { kind: 'http', host: 'files.pypi.test', port: SERVICE_PORT },
      { kind: 'resolve', host: names.npm },
      { kind: 'tcp', host: npm.address, port: SERVICE_PORT },
      { kind: 'tcp6', host: `::ffff:${npm.address}`, port: SERVICE_PORT },
      { kind: 'udp', host: npm.address, port: SERVICE_PORT },
      { kind: 'udp', host: pypi.address, port: 53 },
      { kind: 'tcp', host: pypi.address, port: 53 },
      { kind: 'udp', host: '8.8.8.8', port: 53 },
      { kind: 'raw', host: npm.address },
      { kind: 'tcp', host: pypi.address, port: SERVICE_PORT + 1 },
      { kind: 'resolve', host: names.other },
    ]);
    tt.log(rs.map((r) => `${r.kind} ${r.host}:${r.port ?? ''} -> ${r.outcome} (${r.ms} ms)`).join('\n'));
    tt.deepEqual(outcomes(rs), ['ok', 'ok', 'gaierror', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'gaierror']);
    tt.is(rs[0]!.body, 'pypi says hello');
    tt.false(net.zone.queries.some((q) => q.name === names.npm || q.name === names.other), 'refused names never reach the upstream');
    // denials are logged with the sandbox id
    const info = await waitForValue(() => shim.networkInfo(sb.id), (i) => i.denials.some((d) => d.destination === `${npm.address}:${SERVICE_PORT}`), 5000, 'the denial to be logged');
    tt.true(info.denials.some((d) => d.destination === `${npm.address}:${SERVICE_PORT}` && d.hook === 'connect4'), JSON.stringify(info.denials));
    tt.true(info.denials.some((d) => d.hook === 'sendmsg4'));
    tt.true(logs.some((l) => l.includes(`egress denied: sandbox=${sb.id}`) && l.includes(`dest=${npm.address}:${SERVICE_PORT}/tcp`)));
    tt.true(info.bindings.some((b) => b.service === 'pypi' && b.address === pypi.address && b.expiresInS > 200), JSON.stringify(info.bindings));
    void other;
  } finally {
    await shim.deleteSandbox(sb.id);
  }
});

t('policy changes apply live (PATCH semantics: merge)', async (tt) => {
  const sb = await create({ pypi: true });
  try {
    const { names } = net;
    tt.deepEqual(outcomes(await probe(sb.id, [{ kind: 'http', host: names.pypi, port: SERVICE_PORT }, { kind: 'http', host: names.npm, port: SERVICE_PORT }])), ['ok', 'gaierror']);
    const after = await shim.updateNetwork(sb.id, { npm: true, pypi: false });
    tt.deepEqual(after.services, { pypi: false, npm: true });
    const rs = await probe(sb.id, [
      { kind: 'http', host: names.npm, port: SERVICE_PORT },
      { kind: 'resolve', host: names.pypi },
      { kind: 'tcp', host: net.pypi.address, port: SERVICE_PORT },
    ]);
    tt.deepEqual(outcomes(rs), ['ok', 'gaierror', 'EPERM'], 'pypi bindings went with the service');
    tt.is(rs[0]!.body, 'npm says hello');
    const err = await shim.updateNetwork(sb.id, { nosuch: true }).catch((e) => e);
    tt.is(err.code, 'INVALID_ARGUMENT');
    tt.deepEqual(shim.networkInfo(sb.id).services, { pypi: false, npm: true }, 'a rejected change leaves the policy as it was');
    // an open connection to a service that is turned off is aborted, not left to stall
    const holder = await shim.execStream(sb.id, {
      cmd: ['python3', '-c', `import socket,time\ns=socket.create_connection(("${net.npm.address}", ${SERVICE_PORT}))\nprint("connected", flush=True)\nt=time.monotonic()\ntry:\n s.recv(10); print("closed")\nexcept OSError as e: print(type(e).__name__, round((time.monotonic()-t)*1000))`],
    });
    let out = '';
    holder.stdout.on('data', (d: Buffer) => (out += d));
    await waitFor(() => out.includes('connected'), 10_000, 'the holder to connect');
    await shim.updateNetwork(sb.id, { npm: false });
    await holder.exited;
    tt.regex(out, /connected\nConnectionAbortedError \d+\n/, `${out} ${logs.filter((l) => /abort/.test(l)).join(" ")}`);
  } finally {
    await shim.deleteSandbox(sb.id);
  }
});

t('DNS bindings are per sandbox: A resolving npm does not open npm to B', async (tt) => {
  const a = await create({ npm: true });
  const b = await create({ pypi: true });
  try {
    // neighbours and the node itself are not destinations either
    const bAddress = shim.networkInfo(b.id).address;
    const gw = shim.network!.gatewayAddress;
    tt.deepEqual(outcomes(await probe(a.id, [{ kind: 'tcp', host: bAddress, port: 22 }, { kind: 'udp', host: bAddress, port: 53 }, { kind: 'tcp', host: gw, port: 22 }, { kind: 'udp', host: gw, port: 123 }])), ['EPERM', 'EPERM', 'EPERM', 'EPERM']);
    tt.deepEqual(outcomes(await probe(a.id, [{ kind: 'http', host: net.names.npm, port: SERVICE_PORT }])), ['ok']);
    tt.deepEqual(outcomes(await probe(b.id, [{ kind: 'tcp', host: net.npm.address, port: SERVICE_PORT }, { kind: 'resolve', host: net.names.npm }])), ['EPERM', 'gaierror']);
    const denial = (await waitForValue(() => shim.networkInfo(b.id).denials, (ds) => ds.some((d) => d.destination.startsWith(net.npm.address)), 5000, 'the denial to be logged')).find((d) => d.destination.startsWith(net.npm.address));
    tt.is(denial?.service, 'npm', 'the denial names the service the address belongs to');
  } finally {
    await shim.deleteSandbox(a.id);
    await shim.deleteSandbox(b.id);
  }
});

t('DNS answers open no special, node, neighbour or operator address; AAAA forms of IPv4 and CNAMEs into other services open nothing', async (tt) => {
  const neighbour = await create({});
  const sb = await create({ pypi: true });
  try {
    const nbAddress = shim.networkInfo(neighbour.id).address;
    const gw = shim.network!.gatewayAddress;
    net.zone.setRecords({ ...net.records, 'neighbour.pypi.test': [{ type: 'A', value: nbAddress }] });
    const { pypi, npm, internal } = net;
    const names = ['meta.pypi.test', 'gw.pypi.test', 'veth.pypi.test', 'neighbour.pypi.test', 'internal.pypi.test', 'to-npm.pypi.test'];
    const rs = await probe(sb.id, [
      ...names.map((host) => ({ kind: 'resolve' as const, host })),
      { kind: 'resolve6', host: 'mapped.pypi.test' },
      { kind: 'resolve6', host: 'nat64.pypi.test' },
      { kind: 'resolve', host: 'mapped.pypi.test' },
      { kind: 'http', host: 'cdn.pypi.test', port: SERVICE_PORT },
      // what the answers would have opened: denied at connect(), at once
      { kind: 'tcp', host: '169.254.169.254', port: SERVICE_PORT },
      { kind: 'tcp', host: gw, port: SERVICE_PORT },
      { kind: 'tcp', host: pypi.hostAddress, port: SERVICE_PORT },
      { kind: 'tcp', host: nbAddress, port: SERVICE_PORT },
      { kind: 'tcp', host: internal.address, port: SERVICE_PORT },
      { kind: 'tcp', host: npm.address, port: SERVICE_PORT },
      { kind: 'tcp6', host: `::ffff:${npm.address}`, port: SERVICE_PORT },
    ]);
    tt.log(rs.map((r) => `${r.kind} ${r.host}:${r.port ?? ''} -> ${r.outcome} ${r.body ?? ''} (${r.ms} ms)`).join('\n'));
    tt.deepEqual(outcomes(rs), [...names.map(() => 'gaierror'), 'gaierror', 'gaierror', 'ok', 'ok', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM', 'EPERM']);
    tt.is(rs[names.length + 2]!.body, pypi.address, "the A answer of a name whose AAAA is ::ffff:<npm's address> still works");
    tt.is(rs[names.length + 3]!.body, 'pypi says hello', 'a CNAME through a name of no service (a CDN) is followed');
    // the programs' denials reach the gateway through the ring buffer (read every 100 ms)
    const denials = await waitForValue(() => shim.networkInfo(sb.id).denials, (ds) => ds.some((d) => d.hook === 'connect4' && d.destination === `${npm.address}:${SERVICE_PORT}`), 5000, 'the connect denials');
    const why = (hook: string, destination: string) => denials.find((d) => d.hook === hook && d.destination === destination)?.reason;
    tt.like(
      {
        meta: why('dns', '169.254.169.254'),
        gw: why('dns', gw),
        veth: why('dns', pypi.hostAddress),
        neighbour: why('dns', nbAddress),
        internal: why('dns', internal.address),
        cname: denials.find((d) => d.hook === 'dns' && d.reason === 'cname')?.destination,
        connectMeta: why('connect4', `169.254.169.254:${SERVICE_PORT}`),
        connectGw: why('connect4', `${gw}:${SERVICE_PORT}`),
        connectNeighbour: why('connect4', `${nbAddress}:${SERVICE_PORT}`),
        connectInternal: why('connect4', `${internal.address}:${SERVICE_PORT}`),
        connectNpm: why('connect4', `${npm.address}:${SERVICE_PORT}`),
      },
      { meta: 'metadata', gw: 'node', veth: 'node', neighbour: 'sandbox-subnet', internal: 'operator', cname: 'to-npm.pypi.test', connectMeta: 'metadata', connectGw: 'node', connectNeighbour: 'sandbox-subnet', connectInternal: 'operator', connectNpm: 'not-allowed' },
      JSON.stringify(denials),
    );
    tt.true(denials.some((d) => d.hook === 'dns' && d.reason === 'embedded-ipv4'), 'the AAAA forms were refused too');
    tt.true(logs.some((l) => l.includes(`egress denied: sandbox=${sb.id} service=pypi dest=169.254.169.254 hook=dns reason=metadata`)), 'logged as a denial');
    tt.false(shim.networkInfo(sb.id).bindings.some((b) => b.address !== pypi.address), JSON.stringify(shim.networkInfo(sb.id).bindings));
    // an operator-listed range is reachable through a service that names it as a CIDR
    await shim.updateNetwork(sb.id, { internal: true });
    const opened = await probe(sb.id, [{ kind: 'http', host: internal.address, port: SERVICE_PORT }, { kind: 'resolve', host: 'internal.pypi.test' }]);
    tt.deepEqual(outcomes(opened), ['ok', 'gaierror'], 'the CIDR opens it; a DNS answer still does not');
    tt.is(opened[0]!.body, 'internal says hello');
  } finally {
    net.zone.setRecords(net.records);
    await shim.deleteSandbox(sb.id);
    await shim.deleteSandbox(neighbour.id);
  }
});

t("a hostile neighbour flooding the resolver over UDP and TCP (slow-loris, pipelined) does not starve a victim's lookups", async (tt) => {
  const hostile = await create({});
  const victim = await create({ pypi: true });
  try {
    const gw = shim.network!.gatewayAddress;
    const flood = await shim.execStream(hostile.id, { cmd: ['python3', '-c', HOSTILE_DNS_SCRIPT, gw, '8'] });
    let out = '';
    flood.stdout.on('data', (d: Buffer) => (out += d));
    const deadline = Date.now() + 20_000;
    while (!out.includes('flooding') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    tt.true(out.includes('flooding'), 'the flood started');
    // the flood holds every TCP connection it may, and more are being turned away
    await waitFor(() => shim.network!.dns.stats().tcpClosed > 8, 15_000, "the responder turning the flooder's extra TCP connections away");
    const before = shim.network!.dns.stats();
    const r = await shim.exec(victim.id, { cmd: ['python3', '-c', VICTIM_DNS_SCRIPT, gw, net.names.pypi, '30'], timeoutMs: 60_000 });
    const after = shim.network!.dns.stats();
    tt.is(r.exitCode, 0, r.stderr);
    const v = JSON.parse(r.stdout.trim().split('\n').pop()!) as { lat: number[]; fails: number; tcp: string; tcpMs: number };
    const sorted = [...v.lat].sort((a, b) => a - b);
    tt.log(`victim under the flood: p50 ${sorted[15]!.toFixed(1)} ms, max ${sorted[29]!.toFixed(1)} ms, TCP ${v.tcp} in ${v.tcpMs.toFixed(1)} ms; responder meanwhile: ${after.queries - before.queries} queries, ${after.dropped - before.dropped} dropped, ${after.tcpClosed - before.tcpClosed} TCP connections closed`);
    tt.is(v.fails, 0, 'every lookup answered');
    tt.is(v.tcp, 'ok', 'a TCP query gets a connection and an answer');
    // generous: a lost datagram costs the resolver a 5 s retry; the bench has the figures
    tt.true(sorted[29]! < 4000, `slowest lookup ${sorted[29]!.toFixed(0)} ms`);
    tt.true(v.tcpMs < 4000, `TCP query took ${v.tcpMs.toFixed(0)} ms`);
    flood.kill(9);
    await flood.exited;
  } finally {
    await shim.deleteSandbox(hostile.id);
    await shim.deleteSandbox(victim.id);
  }
});

t('without network a sandbox has loopback only; bad services are refused', async (tt) => {
  const sb = await create();
  try {
    const rs = await probe(sb.id, [{ kind: 'tcp', host: net.pypi.address, port: SERVICE_PORT }, { kind: 'tcp', host: '127.0.0.1', port: 1 }]);
    tt.deepEqual(outcomes(rs), ['ENETUNREACH', 'ECONNREFUSED']);
    tt.is((await shim.updateNetwork(sb.id, { pypi: true }).catch((e) => e)).code, 'NOT_SUPPORTED');
  } finally {
    await shim.deleteSandbox(sb.id);
  }
  tt.is((await create({ nosuch: true }).catch((e) => e)).code, 'INVALID_ARGUMENT');
  // names of Object.prototype members are no services either
  for (const name of ['constructor', 'toString', '__proto__']) tt.is((await create(JSON.parse(`{"${name}": true}`)).catch((e) => e)).code, 'INVALID_ARGUMENT', name);
});

t('deleting sandboxes leaves no netns, veth, BPF link or policy entry behind', async (tt) => {
  const ids: string[] = [];
  for (let i = 0; i < 3; i++) ids.push((await create({ pypi: true })).id);
  for (const id of ids) await shim.deleteSandbox(id);
  const m = shim.network!;
  tt.deepEqual(m.egress.pinnedSandboxes(), []);
  tt.is(m.stats().sandboxes, 0);
  const res = await netResources(`wn-ns${tag}`, { bridge: net.network.bridge });
  tt.is(res.netns, m.pool.stats().idle, 'only the warm pool remains');
  tt.is(res.bridgePorts, m.pool.stats().idle);
  tt.false(existsSync('/sys/fs/cgroup/unified/warren') && readdirSync('/sys/fs/cgroup/unified/warren').some((d) => ids.includes(d)));
});

t('account policies: a default for requests without network, an allow list, raw CIDR rules', async (tt) => {
  const byDefault = await shim.createSandbox(spec({ image: 'judge', memoryMb: 512, owner: 'acct-pypi-default' }));
  try {
    tt.deepEqual(shim.networkInfo(byDefault.id).services, { pypi: true }, 'no `network` in the request: the account default');
    tt.deepEqual(outcomes(await probe(byDefault.id, [{ kind: 'http', host: net.names.pypi, port: SERVICE_PORT }])), ['ok']);
  } finally {
    await shim.deleteSandbox(byDefault.id);
  }
  tt.is((await shim.createSandbox(spec({ image: 'judge', owner: 'acct-npm-only', network: { pypi: true } })).catch((e) => e)).code, 'FORBIDDEN');
  const locked = await shim.createSandbox(spec({ image: 'judge', memoryMb: 512, owner: 'acct-npm-only', network: { npm: true } }));
  try {
    tt.is((await shim.updateNetwork(locked.id, { pypi: true }).catch((e) => e)).code, 'FORBIDDEN');
    tt.is(shim.networkInfo(locked.id).rules, 1);
    const rs = await probe(locked.id, [
      { kind: 'http', host: net.other.address, port: SERVICE_PORT },
      { kind: 'tcp', host: net.other.address, port: SERVICE_PORT + 1 },
      { kind: 'http', host: net.names.npm, port: SERVICE_PORT },
    ]);
    tt.deepEqual(outcomes(rs), ['ok', 'EPERM', 'ok'], 'the raw rule opens exactly its address and port');
  } finally {
    await shim.deleteSandbox(locked.id);
  }
});

t('a policy apply re-computes running sandboxes; a bad file keeps the last good policy and is audited', async (tt) => {
  const { policyStore } = await import('../../src/security/confinement');
  const { readFileSync, writeFileSync } = await import('node:fs');
  const { join } = await import('node:path');
  const file = join(net.policyDir, 'services.yaml');
  const good = readFileSync(file, 'utf8');
  const sb = await create({ pypi: true });
  try {
    tt.deepEqual(outcomes(await probe(sb.id, [{ kind: 'http', host: net.names.pypi, port: SERVICE_PORT }])), ['ok']);
    writeFileSync(file, good.replace(`ports: [${SERVICE_PORT}]`, `ports: [${SERVICE_PORT + 1}]`));
    tt.true(policyStore().apply().ok);
    tt.deepEqual(outcomes(await probe(sb.id, [{ kind: 'tcp', host: net.pypi.address, port: SERVICE_PORT }])), ['EPERM'], 'the learned address now only opens the new port');
    writeFileSync(file, good.replace('services:', 'services:\n  broken: {hosts: [Not A Host]}'));
    tt.is((() => {
      try {
        policyStore().apply();
        return 'applied';
      } catch (e) {
        return (e as { code: string }).code;
      }
    })(), 'POLICY_INVALID');
    tt.is(policyStore().current.services.pypi!.ports[0], SERVICE_PORT + 1, 'the last good policy stays');
    const audit = readFileSync(join(net.policyDir, 'audit.log'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { event: string });
    tt.deepEqual(audit.slice(-2).map((a) => a.event), ['applied', 'rejected']);
    writeFileSync(file, good);
    policyStore().apply();
    tt.deepEqual(outcomes(await probe(sb.id, [{ kind: 'tcp', host: net.pypi.address, port: SERVICE_PORT }])), ['ok']);
  } finally {
    writeFileSync(file, good);
    policyStore().apply();
    await shim.deleteSandbox(sb.id);
  }
});

t('REST, SDK and CLI: GET/PATCH /v1/sandboxes/:id/network', async (tt) => {
  const { createGateway } = await import('../../src/gateway/server');
  const { Auth } = await import('../../src/gateway/auth');
  const { openDatabase } = await import('../../src/state/db');
  const { WarrenClient } = await import('../../src/sdk');
  const { main } = await import('../../src/cli/main');
  const { join } = await import('node:path');
  const db = openDatabase(join(dataDir, 'warren.db'));
  const auth = new Auth(db);
  const token = auth.ensureAdminToken(dataDir) ?? require('node:fs').readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const { LocalShim } = await import('../../src/shim/local');
  const gateway = await createGateway({ shim: new LocalShim(shim), db, dataDir, host: '127.0.0.1', port: 0 });
  const client = new WarrenClient({ url: gateway.url, token });
  try {
    const sb = await client.createSandbox({ image: 'judge', network: { pypi: true }, memoryMb: 512 });
    tt.deepEqual(sb.info?.network?.services, { pypi: true }, 'the create answer shows the services');
    tt.deepEqual((await sb.network()).services, { pypi: true });
    const changed = await sb.setNetwork({ npm: true });
    tt.deepEqual(changed.services, { pypi: true, npm: true });
    for (const [body, code] of [[{ npm: 'yes' }, 'INVALID_ARGUMENT'], [{ nosuch: true }, 'INVALID_ARGUMENT'], [JSON.parse('{"constructor": true}'), 'INVALID_ARGUMENT'], [[1], 'INVALID_ARGUMENT']] as const) {
      const err = await sb.setNetwork(body as never).catch((e) => e);
      tt.is(err.code, code, JSON.stringify(body));
    }
    const out: string[] = [];
    const io = { out: (s: string) => void out.push(s), err: (s: string) => void out.push(s), env: { WARREN_URL: gateway.url, WARREN_TOKEN: token } };
    tt.is(await main(['network', sb.id, 'npm=off'], io as never), 0, out.join(''));
    tt.regex(out.join(''), /services  pypi\n/);
    tt.deepEqual((await sb.refresh()).network?.services, { pypi: true, npm: false }, 'GET /v1/sandboxes/:id follows PATCH');
    const plain = await client.createSandbox({ image: 'judge' });
    tt.is((await plain.network().catch((e) => e)).code, 'NOT_SUPPORTED', 'a sandbox without network says so');
    await plain.delete();
    await sb.delete();
  } finally {
    await client.close();
    await gateway.close();
    db.close();
  }
});

t('a node whose resolver cannot listen refuses to start and leaves nothing behind', async (tt) => {
  const { openDatabase } = await import('../../src/state/db');
  const { ShimNode } = await import('../../src/shim/node');
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { join } = await import('node:path');
  const dir = mkdtempSync('/tmp/warren-netfail-');
  const db = openDatabase(join(dir, 'warren.db'));
  // same bridge and resolver address as the running node, whose responder holds port 53
  const second = new ShimNode({ dataDir: dir, db, nodeId: `nf${tag}`, network: { ...net.network, warm: 2 } });
  try {
    const err = await second.start().catch((e) => e);
    tt.is(err?.code, 'UNAVAILABLE', String(err));
    const res = await netResources(`wn-nf${tag}`);
    tt.is(res.netns, 0, 'no namespace of the failed node is left');
    tt.false(existsSync(`/sys/fs/bpf/warren-test/nf${tag}`), 'nor its pinned programs and maps');
  } finally {
    await second.close().catch(() => undefined);
    db.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
