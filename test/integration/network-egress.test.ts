/**
 * The egress programs against the real kernel, without a sandbox around them: a
 * cgroup2 group with the programs attached, a python3 process inside it, and
 * local servers on test addresses added to lo (nothing leaves this machine; the
 * programs only treat 127/8 as loopback, so these take the full path).
 */
import test, { type ExecutionContext } from 'ava';
import { execFileSync, spawn } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { createSocket } from 'node:dgram';
import { existsSync, mkdirSync, readdirSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { native } from '../../src/native';
import { EgressEnforcer, type SandboxEgressPolicy } from '../../src/shim/network/egress';
import { parseProbeOutput, probeArgv, type Probe, type ProbeResult } from '../helpers/net-probe';
import { egressSkipReason } from '../helpers/network';
import { testUnless } from '../helpers/skip';

const skip = egressSkipReason();
const tag = process.pid.toString(36);
const octet = 10 + (process.pid % 200);
const ALLOWED = `10.251.${octet}.1`;
const DENIED = `10.251.${octet}.2`;
const RANGE_HOST = `10.251.${octet}.130`;
const RESOLVER = `10.251.${octet}.3`;
const pinDir = `/sys/fs/bpf/warren-test-${tag}`;
const cgRoot = `/sys/fs/cgroup/unified/warren-egress-test-${tag}`;
const objectPath = join(__dirname, '../../../bpf/out/sandbox_egress.bpf.o');

let tcp: Server | null = null;
let port = 0;
const udpServer = createSocket('udp4');

if (!skip) {
  test.before(async () => {
    for (const ip of [ALLOWED, DENIED, RANGE_HOST, RESOLVER]) execFileSync('ip', ['addr', 'add', `${ip}/32`, 'dev', 'lo']);
    tcp = createServer((s) => {
      s.on('error', () => undefined);
      s.end('hello');
    });
    await new Promise<void>((r) => tcp!.listen(0, '0.0.0.0', r));
    port = (tcp.address() as { port: number }).port;
    await new Promise<void>((r) => udpServer.bind(port, '0.0.0.0', r));
    udpServer.on('message', (m, rinfo) => udpServer.send(m, rinfo.port, rinfo.address));
    mkdirSync(cgRoot, { recursive: true });
  });
  // also when the worker dies of an uncaught exception, which skips after.always
  process.once('exit', removeAddresses);
  test.after.always(() => {
    const e = new EgressEnforcer({ native, objectPath, pinDir });
    if (existsSync(pinDir)) e.unpinAll();
    tcp?.close();
    udpServer.close();
    removeAddresses();
    for (const d of existsSync(cgRoot) ? readdirSync(cgRoot, { withFileTypes: true }) : []) if (d.isDirectory()) rmdirSync(join(cgRoot, d.name));
    if (existsSync(cgRoot)) rmdirSync(cgRoot);
  });
}

function removeAddresses(): void {
  for (const ip of [ALLOWED, DENIED, RANGE_HOST, RESOLVER]) {
    try {
      execFileSync('ip', ['addr', 'del', `${ip}/32`, 'dev', 'lo'], { stdio: 'ignore' });
    } catch {
      /* gone */
    }
  }
}

let groups = 0;
function group(): string {
  const dir = join(cgRoot, `g${groups++}`);
  mkdirSync(dir);
  return dir;
}

/** Run the probes in a python3 process born into `cgroupDir`. */
function probe(cgroupDir: string, probes: Probe[]): Promise<ProbeResult[]> {
  const argv = probeArgv(probes);
  return new Promise((resolve, reject) => {
    const child = spawn('sh', ['-c', `echo $$ > ${cgroupDir}/cgroup.procs && exec "$@"`, 'sh', ...argv], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('close', (code) => (code === 0 ? resolve(parseProbeOutput(out)) : reject(new Error(`probe exited ${code}: ${err}`))));
  });
}

function policy(over: Partial<SandboxEgressPolicy> = {}): SandboxEgressPolicy {
  return { resolverV4: RESOLVER, ranges: [], bindings: [{ address: ALLOWED, ports: [port], proto: 'tcp', serviceId: 1, expiresNs: 0n }], ...over };
}

function withEnforcer(fn: (e: EgressEnforcer, tt: ExecutionContext) => Promise<void>): (tt: ExecutionContext) => Promise<void> {
  return async (tt) => {
    const e = new EgressEnforcer({ native, objectPath, pinDir });
    e.open();
    try {
      await fn(e, tt);
    } finally {
      e.close();
    }
  };
}

const outcomes = (rs: ProbeResult[]) => rs.map((r) => r.outcome);
const t = testUnless(skip).serial;

t('only allowed destinations connect; denials are EPERM (refused, not dropped), over IPv4, IPv4-mapped IPv6 and UDP', withEnforcer(async (e, tt) => {
  const cg = group();
  const cgid = e.attach('t-basic', cg, policy());
  try {
    const rs = await probe(cg, [
      { kind: 'tcp', host: ALLOWED, port },
      { kind: 'tcp', host: ALLOWED, port: port + 1 },
      { kind: 'tcp', host: DENIED, port },
      { kind: 'tcp6', host: `::ffff:${DENIED}`, port },
      { kind: 'tcp6', host: `::ffff:${ALLOWED}`, port },
      { kind: 'udp', host: DENIED, port },
      { kind: 'udp', host: RESOLVER, port: 53 },
      { kind: 'tcp', host: '127.0.0.1', port },
    ]);
    // allowed; denied port; denied host; mapped denied; mapped allowed; UDP out; UDP to the resolver; loopback
    tt.deepEqual(outcomes(rs), ['ok', 'EPERM', 'EPERM', 'EPERM', 'ok', 'EPERM', 'ok', 'ok'], JSON.stringify(rs));
    const seen = e.drainDenials().filter((d) => d.cgroupId === cgid).map((d) => `${d.hook} ${d.address}:${d.port}`);
    for (const want of [`connect4 ${DENIED}:${port}`, `connect4 ${ALLOWED}:${port + 1}`, `connect6 ${DENIED}:${port}`, `sendmsg4 ${DENIED}:${port}`]) {
      tt.true(seen.includes(want), `denial event ${want} in ${seen.join(', ')}`);
    }
  } finally {
    e.detach('t-basic', cgid);
  }
}));


t('CIDR ranges, DNS bindings with expiry, and atomic policy updates', withEnforcer(async (e, tt) => {
  const cg = group();
  const cgid = e.attach('t-update', cg, policy({ bindings: [], ranges: [{ cidr: `10.251.${octet}.128/25`, ports: [port], proto: 'tcp', serviceId: 2 }] }));
  try {
    tt.deepEqual(outcomes(await probe(cg, [{ kind: 'tcp', host: RANGE_HOST, port }, { kind: 'tcp', host: ALLOWED, port }])), ['ok', 'EPERM'], 'CIDR range');
    const now = process.hrtime.bigint();
    e.bind(cgid, [{ address: ALLOWED, ports: [port], proto: 'tcp', serviceId: 3, expiresNs: now + 30_000_000_000n }, { address: DENIED, ports: [port], proto: 'tcp', serviceId: 3, expiresNs: now - 1n }]);
    tt.deepEqual(outcomes(await probe(cg, [{ kind: 'tcp', host: ALLOWED, port }, { kind: 'tcp', host: DENIED, port }])), ['ok', 'EPERM'], 'bindings: fresh, expired');
    e.update(cgid, policy({ bindings: [{ address: DENIED, ports: [], proto: 'tcp', serviceId: 4, expiresNs: 0n }] }));
    tt.deepEqual(e.entries(cgid), { generation: 1, cidrs: 0, exact: 1 }, 'the old generation is gone');
    tt.deepEqual(outcomes(await probe(cg, [{ kind: 'tcp', host: DENIED, port }, { kind: 'tcp', host: ALLOWED, port }, { kind: 'tcp', host: RANGE_HOST, port }])), ['ok', 'EPERM', 'EPERM'], 'after the update');
    tt.is(e.sweep(process.hrtime.bigint() + 3_600_000_000_000n), 0, 'an entry that never expires is never swept');
  } finally {
    e.detach('t-update', cgid);
  }
}));

t('special-use ranges and the node-wide deny trie win over allow entries; each denial says why', withEnforcer(async (e, tt) => {
  const cg = group();
  const OPERATOR_ONLY = `10.251.${octet}.4`;
  const special = ['169.254.169.254', '169.254.7.7', '100.100.100.200', '224.0.0.251', '255.255.255.255', '240.0.0.1', '0.0.0.0', '64:ff9b::a9fe:a9fe', '64:ff9b::a01:203', '::ffff:0:a01:203', '2002:a01:203::1', 'fe80::1', 'ff02::1'];
  const udp = (address: string) => ({ address, ports: [port], proto: 'udp' as const, serviceId: 1, expiresNs: 0n });
  // every one of them has an allow entry, as if a DNS answer had bound it
  const cgid = e.attach('t-special', cg, policy({
    bindings: [...[...special, ALLOWED, DENIED, RANGE_HOST, OPERATOR_ONLY].map(udp)],
    ranges: [{ cidr: `10.251.${octet}.128/25`, ports: [port], proto: 'udp', serviceId: 2 }],
  }));
  try {
    e.setDenyRanges([
      { cidr: `${DENIED}/32`, reason: 'node', overridable: false },
      { cidr: `10.251.${octet}.128/25`, reason: 'operator', overridable: true },
      { cidr: `${OPERATOR_ONLY}/32`, reason: 'operator', overridable: true },
    ]);
    tt.is(e.denyEntries(), 3);
    const rs = await probe(cg, [...special, ALLOWED, DENIED, RANGE_HOST, OPERATOR_ONLY].map((host) => ({ kind: 'udpconnect' as const, host, port })));
    const byHost = Object.fromEntries(rs.map((r) => [r.host, r.outcome]));
    for (const host of special) tt.is(byHost[host], 'EPERM', `${host}: ${JSON.stringify(rs)}`);
    tt.is(byHost[ALLOWED], 'ok', 'an ordinary binding still works');
    tt.is(byHost[DENIED], 'EPERM', 'a node address: no allow entry opens it');
    tt.is(byHost[RANGE_HOST], 'ok', "an operator range is opened by the sandbox's CIDR entry");
    tt.is(byHost[OPERATOR_ONLY], 'EPERM', 'but never by a DNS binding');
    const reasons = Object.fromEntries(e.drainDenials().filter((d) => d.cgroupId === cgid).map((d) => [d.address, d.reason]));
    tt.like(reasons, {
      '169.254.169.254': 'metadata',
      '100.100.100.200': 'metadata',
      '169.254.7.7': 'link-local',
      '224.0.0.251': 'multicast',
      '255.255.255.255': 'broadcast',
      '240.0.0.1': 'broadcast',
      '0.0.0.0': 'unspecified',
      '64:ff9b::a9fe:a9fe': 'embedded-ipv4',
      '::ffff:0:a01:203': 'embedded-ipv4',
      '2002:a01:203::1': 'embedded-ipv4',
      'fe80::1': 'link-local',
      'ff02::1': 'multicast',
      [DENIED]: 'node',
      [OPERATOR_ONLY]: 'operator',
    }, JSON.stringify(reasons));
    // the trie is written by difference and can be emptied again
    tt.deepEqual(e.setDenyRanges([{ cidr: `${DENIED}/32`, reason: 'node', overridable: false }]), { added: 0, removed: 2 });
    tt.deepEqual(outcomes(await probe(cg, [{ kind: 'udpconnect', host: OPERATOR_ONLY, port }])), ['ok']);
  } finally {
    e.setDenyRanges([]);
    e.detach('t-special', cgid);
  }
}));

t('the skb backstop drops what bypasses the socket hooks (raw ICMP)', withEnforcer(async (e, tt) => {
  const cg = group();
  const cgid = e.attach('t-raw', cg, policy());
  try {
    const [r] = await probe(cg, [{ kind: 'raw', host: DENIED }]);
    tt.is(r!.outcome, 'EPERM', JSON.stringify(r));
    const d = e.drainDenials().filter((x) => x.cgroupId === cgid && x.hook === 'skb');
    tt.true(d.length > 0, 'an skb denial event');
    tt.is(d[0]?.address, DENIED);
    tt.is(d[0]?.proto, 1, 'ICMP');
  } finally {
    e.detach('t-raw', cgid);
  }
}));

t('enforcement lives in bpffs: a new process adopts it, detaching ends it', async (tt) => {
  const cg = group();
  const first = new EgressEnforcer({ native, objectPath, pinDir });
  first.open();
  const cgid = first.attach('t-pin', cg, policy());
  first.close(); // the "gateway" is gone
  let o = outcomes(await probe(cg, [{ kind: 'tcp', host: DENIED, port }, { kind: 'tcp', host: ALLOWED, port }]));
  tt.deepEqual(o, ['EPERM', 'ok'], 'denials stay in force with no process holding anything');
  const second = new EgressEnforcer({ native, objectPath, pinDir });
  second.open();
  try {
    tt.is(second.adopt('t-pin', cg), cgid);
    tt.deepEqual(second.entries(cgid), { exact: 1, cidrs: 0, generation: 0 });
    tt.true(second.pinnedSandboxes().includes('t-pin'));
    second.detach('t-pin', cgid);
    tt.false(second.pinnedSandboxes().includes('t-pin'), 'link pins removed');
    o = outcomes(await probe(cg, [{ kind: 'tcp', host: DENIED, port }]));
    tt.deepEqual(o, ['ok'], 'detached: unfiltered');
    const progs = execFileSync('bpftool', ['cgroup', 'show', cg]).toString();
    tt.notRegex(progs, /egress_/, 'no program left attached to the cgroup');
  } finally {
    second.unpinAll();
  }
  tt.false(existsSync(pinDir), 'pin directory removed');
});

t('bad input: unknown cgroup, bad addresses, wrong buffer sizes', withEnforcer(async (e, tt) => {
  const cg = group();
  tt.throws(() => e.attach('t-bad', join(cgRoot, 'missing'), policy()), { code: 'NOT_FOUND' } as never, 'missing cgroup');
  tt.deepEqual(e.pinnedSandboxes().filter((s) => s === 't-bad'), [], 'nothing left pinned by the failed attach');
  const cgid = e.attach('t-bad', cg, policy());
  try {
    tt.throws(() => e.bind(cgid, [{ address: 'not-an-ip', ports: [1], proto: 'tcp', serviceId: 1, expiresNs: 0n }]), { code: 'INVALID_ARGUMENT' } as never);
    tt.throws(() => e.update(cgid, policy({ ranges: [{ cidr: '10.0.0.0/99', ports: [], proto: 'tcp', serviceId: 1 }] })), { code: 'INVALID_ARGUMENT' } as never);
    tt.is(e.entries(cgid).generation, 0, 'a failed update leaves the policy as it was');
    const fd = native.bpfObjGet(join(pinDir, 'egress_allow'));
    try {
      tt.throws(() => native.bpfMapUpdate(fd, Buffer.alloc(3), Buffer.alloc(16)), { code: 'INVALID_ARGUMENT' } as never, 'short key');
      tt.throws(() => native.bpfMapLookup(fd, Buffer.alloc(64)), { code: 'INVALID_ARGUMENT' } as never, 'long key');
    } finally {
      native.close(fd);
    }
  } finally {
    e.detach('t-bad', cgid);
  }
}));
