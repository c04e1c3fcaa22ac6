/** The userspace mirror of the egress decision, host patterns and service ids. */
import test from 'ava';
import { hostMatches, policyAllows, serviceId } from '../../src/shim/network/manager';
import type { SandboxEgressPolicy } from '../../src/shim/network/egress';
import { EGRESS_SERVICE_NONE, EGRESS_SERVICE_RULE } from '../../src/native/bpf-layouts';
import { SpecialAddresses } from '../../src/shim/network/special-addr';

const policy: SandboxEgressPolicy = {
  resolverV4: '10.88.0.1',
  ranges: [{ cidr: '10.20.0.0/16', ports: [5432], proto: 'tcp', serviceId: 7 }],
  bindings: [
    { address: '151.101.0.223', ports: [443], proto: 'tcp', serviceId: 3, expiresNs: 1n },
    { address: '140.82.112.3', ports: [], proto: 'tcp', serviceId: 4, expiresNs: 0n },
  ],
};

test('policyAllows: bindings by address and port, ranges by CIDR and port, the resolver, loopback', (t) => {
  t.true(policyAllows(policy, '151.101.0.223', 443, 'tcp'));
  t.false(policyAllows(policy, '151.101.0.223', 80, 'tcp'), 'another port');
  t.false(policyAllows(policy, '151.101.0.223', 443, 'udp'), 'another protocol');
  t.true(policyAllows(policy, '140.82.112.3', 22, 'tcp'), 'no ports: any port');
  t.true(policyAllows(policy, '10.20.255.1', 5432, 'tcp'));
  t.false(policyAllows(policy, '10.21.0.1', 5432, 'tcp'), 'outside the range');
  t.true(policyAllows(policy, '10.88.0.1', 53, 'udp'));
  t.false(policyAllows(policy, '10.88.0.1', 7070, 'tcp'), 'the node itself, not DNS');
  t.true(policyAllows(policy, '127.0.0.1', 8080, 'tcp'));
  t.false(policyAllows({ ...policy, resolverV4: null }, '10.88.0.1', 53, 'udp'));
});

test('hostMatches: exact names and *.domain (not the domain itself)', (t) => {
  t.true(hostMatches('pypi.org', 'pypi.org'));
  t.false(hostMatches('pypi.org', 'evil-pypi.org'));
  t.true(hostMatches('*.hf.co', 'cdn.hf.co'));
  t.true(hostMatches('*.hf.co', 'a.b.hf.co'));
  t.false(hostMatches('*.hf.co', 'hf.co'));
  t.false(hostMatches('*.hf.co', 'xhf.co'));
});

test('serviceId: stable, small, never a reserved id', (t) => {
  t.is(serviceId('pypi'), serviceId('pypi'));
  t.not(serviceId('pypi'), serviceId('npm'));
  for (let i = 0; i < 5000; i++) {
    const id = serviceId(`svc-${i}`);
    t.true(id > EGRESS_SERVICE_NONE && id < EGRESS_SERVICE_RULE && Number.isInteger(id), `svc-${i} -> ${id}`);
  }
});

test('policyAllows mirrors the programs: special-use and node ranges first, operator ranges only through CIDRs', (t) => {
  const special = new SpecialAddresses({ subnet: '10.88.0.0/16', deniedRanges: () => ['192.168.0.0/16'], nodeAddresses: () => ['10.88.0.1', '172.31.0.5'] });
  const p: SandboxEgressPolicy = {
    resolverV4: '10.88.0.1',
    ranges: [{ cidr: '192.168.7.0/24', ports: [5432], proto: 'tcp', serviceId: 3 }],
    bindings: ['169.254.169.254', '172.31.0.5', '10.88.0.9', '192.168.9.9', '192.168.7.7', '8.8.8.8'].map((address) => ({ address, ports: [443, 5432], proto: 'tcp' as const, serviceId: 1, expiresNs: 0n })),
  };
  t.false(policyAllows(p, '169.254.169.254', 443, 'tcp', special), 'metadata, although bound');
  t.false(policyAllows(p, '172.31.0.5', 443, 'tcp', special), 'a node address');
  t.false(policyAllows(p, '10.88.0.9', 443, 'tcp', special), 'another sandbox');
  t.false(policyAllows(p, '192.168.9.9', 443, 'tcp', special), 'operator range: a binding does not open it');
  t.true(policyAllows(p, '192.168.7.7', 5432, 'tcp', special), 'operator range: a CIDR entry does');
  t.false(policyAllows(p, '192.168.7.7', 443, 'tcp', special), 'on its own ports only');
  t.true(policyAllows(p, '8.8.8.8', 443, 'tcp', special));
  t.true(policyAllows(p, '10.88.0.1', 53, 'udp', special), 'the resolver comes before the node ranges');
  t.false(policyAllows(p, '169.254.169.254', 443, 'tcp'), 'special-use ranges need no node view (compiled in)');
  t.true(policyAllows(p, '172.31.0.5', 443, 'tcp'), 'without the node view, a node address is judged by the maps alone');
});
