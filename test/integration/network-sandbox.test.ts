/**
 * Per-service egress end to end (issue 4): real sandboxes on a node with
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

const t = skip ? test.skip : test.serial;
if (skip) test(`sandbox egress (skipped: ${skip})`, (tt) => tt.log(skip));

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
    for (const r of rs.slice(3, 11)) tt.true(r.ms < 200, `${r.kind} ${r.host}:${r.port} took ${r.ms} ms`);
    tt.false(net.zone.queries.some((q) => q.name === names.npm || q.name === names.other), 'refused names never reach the upstream');
    // denials are logged with the sandbox id
    await new Promise((r) => setTimeout(r, 300));
    const info = shim.networkInfo(sb.id);
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
  } finally {
    await shim.deleteSandbox(sb.id);
  }
});

t('DNS bindings are per sandbox: A resolving npm does not open npm to B', async (tt) => {
  const a = await create({ npm: true });
  const b = await create({ pypi: true });
  try {
    tt.deepEqual(outcomes(await probe(a.id, [{ kind: 'http', host: net.names.npm, port: SERVICE_PORT }])), ['ok']);
    tt.deepEqual(outcomes(await probe(b.id, [{ kind: 'tcp', host: net.npm.address, port: SERVICE_PORT }, { kind: 'resolve', host: net.names.npm }])), ['EPERM', 'gaierror']);
    await new Promise((r) => setTimeout(r, 300));
    const denial = shim.networkInfo(b.id).denials.find((d) => d.destination.startsWith(net.npm.address));
    tt.is(denial?.service, 'npm', 'the denial names the service the address belongs to');
  } finally {
    await shim.deleteSandbox(a.id);
    await shim.deleteSandbox(b.id);
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
