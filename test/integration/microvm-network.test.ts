/**
 * Per-service egress for microVMs, end to end: a real guest on a tap in its
 * sandbox's namespace, the test internet of network-sandbox.test.ts (hosts in
 * network namespaces, an upstream zone), python3 in the guest trying the ways
 * out. The guest's traffic passes no host socket, so what is checked here is the
 * tap programs: the same policy maps, DNS responder and denial records as a
 * container's, and that the guest cannot leave its address or MAC.
 *
 * A denied TCP connect in a guest is a dropped SYN (the guest sees a timeout,
 * not EPERM): the host drops it before anything leaves the namespace.
 */
import { existsSync, readdirSync, rmSync } from 'node:fs';
import type { ShimNode } from '../../src/shim/node';
import { microvmBackendStatus, skipReason } from '../../src/features';
import { openTestShim, spec } from '../helpers/warren';
import { egressSkipReason, SERVICE_PORT, startInternet, type Internet } from '../helpers/network';
import { parseProbeOutput, probeArgv, type Probe, type ProbeResult } from '../helpers/net-probe';
import { testUnless } from '../helpers/skip';
import { waitForValue } from '../helpers/wait';

const status = microvmBackendStatus();
const skip = egressSkipReason() ?? skipReason('native-helper', 'qemu', 'microvm-guest') ?? (status.available ? null : `microvm backend unavailable: ${status.reason}`);
const tag = process.pid.toString(36);
let net: Internet;
let shim: ShimNode;
let dataDir = '';
const logs: string[] = [];
const t = testUnless(skip);

if (!skip) {
  t.before(async () => {
    net = await startInternet(tag);
    const f = await openTestShim({ network: net.network, nodeId: `nv${tag}`, log: (l) => logs.push(l) });
    shim = f.shim;
    dataDir = f.dataDir;
    await shim.functions.ensureJudgeImage();
  });
  t.after.always(async () => {
    for (const s of shim?.listSandboxes() ?? []) await shim.deleteSandbox(s.id).catch(() => undefined);
    await shim?.network?.teardownHost();
    await shim?.close();
    shim?.layers.unmountUnused();
    await net?.close();
    if (dataDir) rmSync(dataDir, { recursive: true, force: true });
  });
}

async function probe(id: string, probes: Probe[]): Promise<ProbeResult[]> {
  const r = await shim.exec(id, { cmd: probeArgv(probes), timeoutMs: 120_000 });
  if (r.exitCode !== 0) throw new Error(`probe failed (${r.exitCode}): ${r.stderr}`);
  return parseProbeOutput(r.stdout);
}
const outcomes = (rs: ProbeResult[]) => rs.map((r) => r.outcome.replace(/^gaierror:.*/, 'gaierror'));

function createVm(network: Record<string, boolean>) {
  return shim.createSandbox(spec({ backend: 'microvm', image: 'judge', memoryMb: 256, diskMb: 128, cpu: 1, network }));
}

function linkPins(id: string): string[] {
  const dir = `${net.network.pinRoot}/nv${tag}/links`;
  return existsSync(dir) ? readdirSync(dir).filter((f) => f.startsWith(`${id}_`)) : [];
}

let first: { id: string } | null = null;

t.serial('microvm {pypi: true}: pypi by name works through the tap; npm, the node, metadata and other ports are dropped on the host and reported', async (tt) => {
  tt.timeout(360_000, 'a TCG guest boots slowly on a loaded machine');
  const sb = await createVm({ pypi: true, npm: false });
  first = sb;
  {
    tt.deepEqual(linkPins(sb.id).sort(), ['connect4', 'connect6', 'egress', 'sendmsg4', 'sendmsg6', 'tap', 'tapret'].map((h) => `${sb.id}_${h}`));
    const info0 = shim.networkInfo(sb.id);
    const { pypi, npm, names } = net;
    const gw = shim.network!.gatewayAddress;
    const rs = await probe(sb.id, [
      { kind: 'http', host: names.pypi, port: SERVICE_PORT },
      { kind: 'http', host: 'files.pypi.test', port: SERVICE_PORT },
      { kind: 'resolve', host: names.npm },
      { kind: 'tcp', host: npm.address, port: SERVICE_PORT },
      { kind: 'tcp', host: pypi.address, port: SERVICE_PORT + 1 },
      { kind: 'tcp', host: '169.254.169.254', port: 80 },
      { kind: 'tcp', host: gw, port: 22 },
      { kind: 'udp', host: '8.8.8.8', port: 53, expectReply: true },
    ]);
    tt.log(rs.map((r) => `${r.kind} ${r.host}:${r.port ?? ''} -> ${r.outcome} (${r.ms} ms)`).join('\n'));
    tt.deepEqual(outcomes(rs), ['ok', 'ok', 'gaierror', 'timeout', 'timeout', 'timeout', 'timeout', 'timeout']);
    tt.is(rs[0]!.body, 'pypi says hello');
    tt.false(net.zone.queries.some((q) => q.name === names.npm), 'a refused name never reaches the upstream');
    // the DNS responder knew the guest by the sandbox's address, and bound pypi for this sandbox only
    const info = await waitForValue(() => shim.networkInfo(sb.id), (i) => i.denials.filter((d) => d.hook === 'tap').length >= 5, 10_000, 'the tap denials');
    tt.true(info.bindings.some((b) => b.service === 'pypi' && b.address === pypi.address), JSON.stringify(info.bindings));
    const why = (destination: string) => info.denials.find((d) => d.hook === 'tap' && d.destination === destination)?.reason;
    tt.like(
      { npm: why(`${npm.address}:${SERVICE_PORT}`), port: why(`${pypi.address}:${SERVICE_PORT + 1}`), meta: why('169.254.169.254:80'), gw: why(`${gw}:22`), udp: why('8.8.8.8:53') },
      { npm: 'not-allowed', port: 'not-allowed', meta: 'metadata', gw: 'node', udp: 'not-allowed' },
      JSON.stringify(info.denials),
    );
    tt.true(logs.some((l) => l.includes(`egress denied: sandbox=${sb.id}`) && l.includes(`dest=${npm.address}:${SERVICE_PORT}/tcp hook=tap`)), 'denials are logged like a container\'s');
    tt.is(info.address, info0.address);
  }
});

t.serial('microvm: a live policy change reaches the guest at once (the same maps); delete unpins every link', async (tt) => {
  tt.timeout(360_000, 'a TCG guest boots slowly on a loaded machine');
  if (first === null) throw new Error('the previous test did not create its microVM');
  const sb = first;
  try {
    const { names, pypi } = net;
    await shim.updateNetwork(sb.id, { npm: true, pypi: false });
    tt.deepEqual(outcomes(await probe(sb.id, [{ kind: 'http', host: names.npm, port: SERVICE_PORT }, { kind: 'resolve', host: names.pypi }, { kind: 'tcp', host: pypi.address, port: SERVICE_PORT }])), ['ok', 'gaierror', 'timeout']);
  } finally {
    await shim.deleteSandbox(sb.id);
  }
  tt.deepEqual(linkPins(sb.id), [], 'no link of the sandbox is left pinned');
});

t.serial('microvm: guest root cannot leave its address or MAC (spoofed frames are dropped), nor reach a neighbour', async (tt) => {
  tt.timeout(360_000, 'a TCG guest boots slowly on a loaded machine');
  const a = await createVm({ pypi: true });
  // the neighbour only needs an address on the bridge: a container costs no boot
  const b = await shim.createSandbox(spec({ network: {} }));
  try {
    const bAddress = shim.networkInfo(b.id).address;
    const aAddress = shim.networkInfo(a.id).address;
    // The neighbour is on the guest's own subnet, so the guest asks for its MAC first, and the
    // request gets no answer (sandbox ports on the bridge are isolated from each other). Which ends
    // the connect depends on which runs out first: the probe's 3 s socket timeout, or the kernel's
    // ARP retries (about 3 s, then EHOSTUNREACH).
    const [toNeighbour] = outcomes(await probe(a.id, [{ kind: 'tcp', host: bAddress, port: SERVICE_PORT }]));
    tt.true(toNeighbour === 'timeout' || toNeighbour === 'EHOSTUNREACH', `the neighbour answered: ${toNeighbour}`);
    // as the neighbour's address: dropped at the tap, whatever the destination
    const spoof = await shim.exec(a.id, { cmd: `ip address add ${bAddress}/32 dev eth0 && python3 -c 'import socket,sys; s=socket.socket(); s.settimeout(3); s.bind(("${bAddress}",0)); s.connect(("${net.pypi.address}",${SERVICE_PORT})); print("connected")' ; echo rc=$?; ip address del ${bAddress}/32 dev eth0`, timeoutMs: 60_000 });
    tt.regex(spoof.stdout, /rc=1/, spoof.stdout + spoof.stderr);
    tt.notRegex(spoof.stdout, /connected/);
    // another MAC: nothing gets out until the guest takes its own back
    const mac = await shim.exec(a.id, { cmd: `old=$(cat /sys/class/net/eth0/address); ip link set dev eth0 address 02:00:00:00:00:01 && python3 -c 'import socket; s=socket.socket(); s.settimeout(3); s.connect(("${net.pypi.address}",${SERVICE_PORT})); print("connected")'; echo rc=$?; ip link set dev eth0 address $old`, timeoutMs: 60_000 });
    tt.regex(mac.stdout, /rc=1/, mac.stdout + mac.stderr);
    tt.deepEqual(outcomes(await probe(a.id, [{ kind: 'http', host: net.names.pypi, port: SERVICE_PORT }])), ['ok'], 'with its own address and MAC it works again');
    tt.not(aAddress, bAddress);
  } finally {
    await shim.deleteSandbox(a.id);
    await shim.deleteSandbox(b.id);
  }
});

t.serial('microvm: network survives a pause (the VMM ends, the tap and its programs stay); delete leaves no namespace, tap or link', async (tt) => {
  tt.timeout(360_000, 'a TCG guest boots slowly on a loaded machine');
  const sb = await createVm({ pypi: true });
  const lease = shim.network!.info(sb.id).address;
  const netnsBefore = readdirSync('/run/netns').filter((n) => n.startsWith(`wn-nv${tag}-`));
  try {
    const p = await shim.pauseSandbox(sb.id);
    tt.is(p.state, 'paused');
    tt.is(linkPins(sb.id).length, 7, 'enforcement stays in place while no VMM runs');
    // any request resumes it; the restored guest finds its NIC on the same tap
    const rs = await probe(sb.id, [{ kind: 'http', host: net.names.pypi, port: SERVICE_PORT }, { kind: 'tcp', host: net.npm.address, port: SERVICE_PORT }]);
    tt.deepEqual(outcomes(rs), ['ok', 'timeout']);
    tt.is(shim.networkInfo(sb.id).address, lease);
  } finally {
    await shim.deleteSandbox(sb.id);
  }
  tt.deepEqual(linkPins(sb.id), []);
  const gone = netnsBefore.filter((n) => !readdirSync('/run/netns').includes(n));
  tt.true(gone.length >= 1, 'the sandbox namespace (with its tap) was destroyed');
});
