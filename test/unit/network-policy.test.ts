/** The userspace mirror of the egress decision, host patterns and service ids (issue 4). */
import test from 'ava';
import { hostMatches, policyAllows, serviceId } from '../../src/shim/network/manager';
import type { SandboxEgressPolicy } from '../../src/shim/network/egress';
import { EGRESS_SERVICE_NONE, EGRESS_SERVICE_RULE } from '../../src/native/bpf-layouts';

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
