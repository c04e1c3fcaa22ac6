/**
 * Enforcement outlives the gateway: a real `warren up` with sandbox
 * networking is killed with SIGKILL while a sandbox keeps trying npm and pypi;
 * denials stay in force with no Warren process alive, and a restarted gateway
 * takes the sandbox's network over (GET/PATCH work, DNS answers again).
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WarrenClient } from '../../src/sdk';
import { native } from '../../src/native';
import { HostNetwork } from '../../src/shim/network/host-net';
import { removeTree } from '../../src/shim/layers/sys';
import { egressSkipReason, SERVICE_PORT, startInternet, type Internet } from '../helpers/network';
import { netResources } from '../helpers/net-hosts';
import { openTestShim } from '../helpers/warren';
import { kill9, startWarrenProcess, stopGracefully } from '../helpers/warren-process';
import { parseProbeOutput, probeArgv } from '../helpers/net-probe';
import { testUnless } from '../helpers/skip';

const skip = egressSkipReason();
const it = testUnless(skip);
const tag = process.pid.toString(36);

/** Every 100 ms: one connect to pypi's and one to npm's address, with a timestamp. */
const LOOP = String.raw`
import socket, sys, time
pypi, npm, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
def attempt(host):
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port)); return "ok"
    except OSError as e:
        return {1: "EPERM", 111: "ECONNREFUSED"}.get(e.errno, str(e.errno))
    finally:
        s.close()
with open("/tmp/egress.log", "a", buffering=1) as f:
    while True:
        f.write("%.3f pypi=%s npm=%s\n" % (time.time(), attempt(pypi), attempt(npm)))
        time.sleep(0.1)
`;
import { elapse, waitFor } from '../helpers/wait';

it(`denials stay in force while no gateway runs; a restarted gateway takes over`, async (t) => {
  const nodeId = `nr${tag}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-netrestart-'));
  let net: Internet | null = null;
  let child: ChildProcess | null = null;
  let client: WarrenClient | null = null;
  let sandboxId: string | null = null;
  try {
    net = await startInternet(tag);
    {
      // the judge image (python3) in this data dir, from the node cache
      const f = await openTestShim({ dataDir, nodeId });
      await f.shim.functions.ensureJudgeImage();
      await f.shim.close();
      f.shim.layers.unmountUnused();
    }
    const first = await startWarrenProcess(dataDir, nodeId, net.upArgs);
    child = first.child;
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    client = new WarrenClient({ url: first.url, token });
    const sb = await client.createSandbox({ image: 'judge', network: { pypi: true }, memoryMb: 512 });
    sandboxId = sb.id;
    // resolve pypi through the node's DNS (this binds its address), then loop on addresses
    const internet = net;
    const resolved = await sb.exec(probeArgv([{ kind: 'resolve', host: internet.names.pypi }]));
    const pypiAddress = parseProbeOutput(resolved.stdout)[0]!.body!;
    t.is(pypiAddress, internet.pypi.address);
    await sb.exec(['sh', '-c', `python3 -c '${LOOP}' ${pypiAddress} ${internet.npm.address} ${SERVICE_PORT} >/dev/null 2>&1 &`]);
    const pid = (await sb.refresh()).pid!;
    await waitFor(() => { try { return readFileSync(`/proc/${pid}/root/tmp/egress.log`, 'utf8').includes('npm=EPERM'); } catch { return false; } }, 10_000, 'the loop to log its first attempts', 50);

    await kill9(child);
    child = null;
    await client.close();
    client = null;
    const killedAt = Date.now() / 1000;
    await elapse(1500, 'the loop keeps connecting while no gateway runs');
    const after = readFileSync(`/proc/${pid}/root/tmp/egress.log`, 'utf8')
      .trim()
      .split('\n')
      .filter((l) => Number(l.split(' ')[0]) > killedAt + 0.05);
    t.true(after.length >= 5, `the loop kept running with no gateway (${after.length} attempts)`);
    t.deepEqual([...new Set(after.map((l) => l.split(' ').slice(1).join(' ')))], ['pypi=ok npm=EPERM'], 'pypi still allowed, npm still denied');
    t.true(existsSync(`/sys/fs/bpf/warren/${nodeId}/links/${sb.id}_connect4`), 'links pinned in bpffs');

    const log2: string[] = [];
    const second = await startWarrenProcess(dataDir, nodeId, net.upArgs, log2);
    child = second.child;
    const restartedAt = Date.now() / 1000;
    client = new WarrenClient({ url: second.url, token });
    const again = await client.getSandbox(sb.id);
    const adopted = await again.network();
    t.deepEqual(adopted.services, { pypi: true });
    t.true(adopted.bindings.some((b) => b.service === 'pypi' && b.address === pypiAddress), 'DNS bindings survive the restart');
    const logSince = () => readFileSync(`/proc/${pid}/root/tmp/egress.log`, 'utf8').trim().split('\n').filter((l) => Number(l.split(' ')[0]) > restartedAt + 0.05);
    await waitFor(() => logSince().length >= 3, 10_000, 'attempts after the restart', 50);
    const sinceRestart = readFileSync(`/proc/${pid}/root/tmp/egress.log`, 'utf8')
      .trim()
      .split('\n')
      .filter((l) => Number(l.split(' ')[0]) > restartedAt + 0.05);
    t.deepEqual([...new Set(sinceRestart.map((l) => l.split(' ').slice(1).join(' ')))], ['pypi=ok npm=EPERM'], 'the adopting node keeps the same allowlist');
    await again.setNetwork({ npm: true });
    const probe = parseProbeOutput((await again.exec(probeArgv([{ kind: 'http', host: net.names.npm, port: SERVICE_PORT }]))).stdout);
    t.is(probe[0]!.outcome, 'ok', 'the restarted node answers DNS and binds for the adopted sandbox');
    // SIGHUP re-reads the policy directory: a broken services.yaml is refused and the last good one stays
    const servicesFile = join(net.policyDir, 'services.yaml');
    const good = readFileSync(servicesFile, 'utf8');
    writeFileSync(servicesFile, good.replace('services:', 'services:\n  broken: {hosts: [Not A Host]}'));
    child.kill('SIGHUP');
    const until = Date.now() + 5000;
    while (!log2.join('').includes('SIGHUP: policy rejected') && Date.now() < until) await new Promise((r) => setTimeout(r, 50));
    t.true(log2.join('').includes('SIGHUP: policy rejected'), 'a bad file is refused on SIGHUP');
    writeFileSync(servicesFile, good);
    t.deepEqual((await again.network()).services, { pypi: true, npm: true }, 'and the sandbox keeps its policy');
    await again.delete();
    sandboxId = null;
    t.false(existsSync(`/sys/fs/bpf/warren/${nodeId}/links/${sb.id}_connect4`), 'links unpinned on delete');
    await client.close();
    client = null;
    await stopGracefully(child);
    child = null;
    const res = await netResources(`wn-${nodeId}`, { bridge: net.network.bridge });
    t.is(res.netns, 0, 'no namespace left after a clean stop');
    t.is(res.bridgePorts, 0, 'no veth left on the bridge');
    // its layers were used by the deleted sandbox only: a clean stop unmounts them
    t.deepEqual(readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(` ${dataDir}/`)), [], 'no mount of the data dir left after a clean stop');
  } finally {
    await client?.close().catch(() => undefined);
    if (child) await kill9(child);
    if (sandboxId !== null && native.cgroupExists(sandboxId)) {
      // the test failed with the sandbox alive: its looping python must not outlive the test
      native.cgroupKill(sandboxId);
      await waitFor(() => native.cgroupProcs(sandboxId!).length === 0, 5000, 'the killed processes to go').catch(() => undefined);
      try {
        native.cgroupDestroy(sandboxId);
      } catch {
        /* still busy: reported by the leak checks of later runs */
      }
    }
    if (net) {
      await new HostNetwork({ bridge: net.network.bridge, subnet: net.network.subnet, nftTable: net.network.nftTable }).teardown().catch(() => undefined);
      await net.close();
    }
    rmSync(`/sys/fs/bpf/warren/${nodeId}`, { recursive: true, force: true });
    try {
      rmdirSync('/sys/fs/bpf/warren'); // only when no other node pins there
    } catch {
      /* in use or gone */
    }
    for (const ns of existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => n.startsWith(`wn-${nodeId}-`)) : []) {
      spawnSync('ip', ['netns', 'delete', ns]);
    }
    try {
      removeTree(dataDir);
    } catch {
      /* best effort */
    }
  }
});
