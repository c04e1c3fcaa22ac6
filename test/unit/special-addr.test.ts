import test from 'ava';
import { normalizeAddress, specialReason, SpecialAddresses, embeddedIpv4, reasonName, REASON_CODES, localAddresses } from '../../src/shim/network/special-addr';
import { canonicalIpv6, ipToBytes } from '../../src/shim/network/addr';
import { cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { networkInterfaces, tmpdir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_DENIED_RANGES, PolicyError, loadPolicy } from '../../src/security/policy';
import { BUNDLED_POLICY_DIR } from '../../src/security/confinement';

test('special-use IPv4 ranges, with the metadata addresses singled out', (t) => {
  const cases: Array<[string, string | undefined]> = [
    ['0.0.0.0', 'unspecified'],
    ['0.1.2.3', 'unspecified'],
    ['127.0.0.1', 'loopback'],
    ['127.255.255.254', 'loopback'],
    ['169.254.169.254', 'metadata'],
    ['100.100.100.200', 'metadata'],
    ['169.254.0.1', 'link-local'],
    ['169.254.255.255', 'link-local'],
    ['224.0.0.1', 'multicast'],
    ['239.255.255.250', 'multicast'],
    ['240.0.0.1', 'broadcast'],
    ['255.255.255.255', 'broadcast'],
    ['1.1.1.1', undefined],
    ['10.0.0.1', undefined], // private: operator-listed, not special-use
    ['100.100.100.201', undefined],
    ['223.255.255.255', undefined],
    ['169.253.255.255', undefined],
    ['128.0.0.1', undefined],
  ];
  for (const [address, reason] of cases) t.is(specialReason(address) as string | undefined, reason, address);
});

test('special-use IPv6, and IPv6 forms that carry an IPv4 address', (t) => {
  const cases: Array<[string, string | undefined]> = [
    ['::', 'unspecified'],
    ['::1', 'loopback'],
    ['fe80::1', 'link-local'],
    ['febf:ffff::1', 'link-local'],
    ['fec0::1', undefined],
    ['ff02::1', 'multicast'],
    ['ff0e::fb', 'multicast'],
    ['fd00:ec2::254', 'metadata'],
    ['fd00:ec2::255', undefined], // ULA: operator-listed
    ['2001:db8::1', undefined],
    ['2606:4700::1111', undefined],
    // mapped: judged as the IPv4 address it is (the programs treat it so)
    ['::ffff:1.2.3.4', undefined],
    ['::ffff:169.254.169.254', 'metadata'],
    ['::ffff:127.0.0.1', 'loopback'],
    // every other embedding: the IPv4's own reason, else embedded-ipv4
    ['::ffff:0:1.2.3.4', 'embedded-ipv4'],
    ['::ffff:0:169.254.169.254', 'metadata'],
    ['::1.2.3.4', 'embedded-ipv4'],
    ['::127.0.0.1', 'loopback'],
    ['64:ff9b::1.2.3.4', 'embedded-ipv4'],
    ['64:ff9b::a9fe:a9fe', 'metadata'],
    ['64:ff9b:1::1.2.3.4', 'embedded-ipv4'],
    ['2002:0102:0304::1', 'embedded-ipv4'],
    ['2002:a9fe:a9fe::1', 'metadata'],
    ['2001:0:4136:e378:8000:63bf:3fff:fdd2', 'embedded-ipv4'],
    ['2001:1::1', undefined], // not Teredo (2001::/32 only)
    ['64:ff9c::1.2.3.4', undefined],
  ];
  for (const [address, reason] of cases) t.is(specialReason(address) as string | undefined, reason, address);
});

test('normalisation: canonical text and the embedded IPv4 with its form', (t) => {
  t.deepEqual(normalizeAddress('10.0.0.1'), { address: '10.0.0.1', family: 4 });
  t.deepEqual(normalizeAddress('2001:DB8:0:0:0:0:0:7'), { address: '2001:db8::7', family: 6 });
  t.deepEqual(normalizeAddress('::ffff:10.1.2.3'), { address: '::ffff:a01:203', family: 6, embedded: { form: 'mapped', ipv4: '10.1.2.3' } });
  t.deepEqual(normalizeAddress('::ffff:0:10.1.2.3').embedded, { form: 'translated', ipv4: '10.1.2.3' });
  t.deepEqual(normalizeAddress('64:ff9b::10.1.2.3').embedded, { form: 'nat64', ipv4: '10.1.2.3' });
  t.deepEqual(normalizeAddress('2002:0a01:0203::').embedded, { form: '6to4', ipv4: '10.1.2.3' });
  // Teredo stores the client's IPv4 inverted: 3fff:fdd2 is 192.0.2.45
  t.deepEqual(embeddedIpv4(ipToBytes('2001:0:4136:e378:8000:63bf:3fff:fdd2')), { form: 'teredo', ipv4: '192.0.2.45' });
  t.is(normalizeAddress('::1').embedded, undefined, '::1 is loopback, not ::0.0.0.1');
  t.is(canonicalIpv6(ipToBytes('2001:db8:0:0:1:0:0:1')), '2001:db8::1:0:0:1', 'the first of equal zero runs');
  t.is(canonicalIpv6(ipToBytes('2001:0:0:1:0:0:0:1')), '2001:0:0:1::1', 'the longest zero run');
  t.is(canonicalIpv6(ipToBytes('2001:db8:1:1:1:1:0:1')), '2001:db8:1:1:1:1:0:1', 'a single zero word stays');
  t.throws(() => normalizeAddress('not-an-ip'), { code: 'INVALID_ARGUMENT' } as never);
});

test('the node view: own addresses, the subnet, operator ranges; answers refused, deny entries listed', (t) => {
  let node = ['127.0.0.1', '::1', '10.88.0.1', '192.168.5.7', 'fe80::1%eth0', '2001:db8:feed::1'];
  let denied = ['10.0.0.0/8', '10.88.1.0/24', 'fc00::/7'];
  const s = new SpecialAddresses({ subnet: '10.88.0.0/16', deniedRanges: () => denied, nodeAddresses: () => node, maxAgeMs: 0 });
  const cases: Array<[string, string | undefined]> = [
    ['10.88.0.1', 'node'], // the bridge
    ['192.168.5.7', 'node'],
    ['::ffff:192.168.5.7', 'embedded-ipv4'], // an AAAA: never opens an IPv4, whichever
    ['2001:db8:feed::1', 'node'],
    ['10.88.3.4', 'sandbox-subnet'], // another sandbox
    ['10.1.2.3', 'operator'],
    ['fd12::1', 'operator'],
    ['169.254.169.254', 'metadata'],
    ['::ffff:0:1.2.3.4', 'embedded-ipv4'],
    ['::ffff:1.2.3.4', 'embedded-ipv4'], // an AAAA never opens an IPv4
    ['1.2.3.4', undefined],
    ['2606:4700::1', undefined],
  ];
  for (const [address, reason] of cases) t.is(s.refusal(address) as string | undefined, reason, address);
  t.is(s.nodeReason('::ffff:10.88.0.1'), 'node', 'the trie sees a mapped address as the IPv4 one');
  t.is(s.nodeReason('1.2.3.4'), undefined);

  const entries = s.denyRanges();
  t.deepEqual(
    entries.map((e) => `${e.cidr} ${e.reason}${e.overridable ? ' overridable' : ''}`).sort(),
    ['10.0.0.0/8 operator overridable', '10.88.0.0/16 sandbox-subnet', '10.88.0.1/32 node', '192.168.5.7/32 node', '2001:db8:feed::1/128 node', 'fc00::/7 operator overridable'].sort(),
    'loopback and link-local are compiled into the programs; an operator range inside the subnet would weaken it and is left out',
  );

  node = ['10.88.0.1'];
  denied = [];
  t.true(s.refresh(), 'a changed set of host addresses is noticed');
  t.false(s.refresh());
  t.is(s.refusal('192.168.5.7'), undefined);
  t.is(s.refusal('10.1.2.3'), undefined, 'no operator ranges');
});

test('a change seen by whichever reader comes first is reported once, to onChange', (t) => {
  let node = ['10.88.0.1'];
  let changes = 0;
  const s = new SpecialAddresses({ subnet: '10.88.0.0/16', deniedRanges: () => [], nodeAddresses: () => node, maxAgeMs: 0, onChange: () => changes++ });
  s.refresh();
  t.is(changes, 1, 'the first read is a change');
  node = ['10.88.0.1', '172.31.9.9'];
  t.is(s.nodeReason('172.31.9.9'), 'node', 'the DNS path reads the new address');
  t.is(changes, 2, 'and the trie is told, although the periodic refresh will see nothing new');
  t.false(s.refresh());
  t.is(changes, 2);
});

test("localAddresses is the kernel's list: loopback, and every address of an interface, carrier or not", (t) => {
  const local = new Set(localAddresses());
  t.true(local.has('127.0.0.1'));
  for (const list of Object.values(networkInterfaces())) {
    for (const i of list ?? []) if (i.family === 'IPv4' || !i.address.includes('%')) t.true(local.has(normalizeAddress(i.address).address), i.address);
  }
});

test('reason codes match bpf/layouts.json both ways', (t) => {
  for (const [name, code] of Object.entries(REASON_CODES)) t.is(reasonName(code) as string, name);
  t.is(reasonName(200), 'reason-200');
});

test('services.yaml denied_ranges: bundled default, explicit list, validation', (t) => {
  const policy = loadPolicy(BUNDLED_POLICY_DIR);
  t.deepEqual(policy.deniedRanges, ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', 'fc00::/7']);
  const dir = mkdtempSync(join(tmpdir(), 'warren-denied-'));
  try {
    cpSync(BUNDLED_POLICY_DIR, dir, { recursive: true });
    const services = readFileSync(join(dir, 'services.yaml'), 'utf8');
    const withRanges = (ranges: string) => writeFileSync(join(dir, 'services.yaml'), services.replace(/denied_ranges:\n(  - .*\n)+/, `denied_ranges: ${ranges}\n`));
    withRanges('[]');
    t.deepEqual(loadPolicy(dir).deniedRanges, [], 'an empty list turns them off');
    withRanges('[198.51.100.0/24, "2001:db8::/32"]');
    t.deepEqual(loadPolicy(dir).deniedRanges, ['198.51.100.0/24', '2001:db8::/32']);
    writeFileSync(join(dir, 'services.yaml'), services.replace(/denied_ranges:\n(  - .*\n)+/, ''));
    t.deepEqual(loadPolicy(dir).deniedRanges, [...DEFAULT_DENIED_RANGES], 'absent: private and shared address space');
    withRanges('[10.0.0.0/33, "::/200", nonsense, 10.0.0.0]');
    const err = t.throws(() => loadPolicy(dir), { instanceOf: PolicyError });
    t.is((err as PolicyError).issues.length, 4, JSON.stringify((err as PolicyError).issues));
    t.true((err as PolicyError).issues.every((i) => i.file === 'services.yaml' && i.line > 0));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
