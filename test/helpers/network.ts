/**
 * Fixtures for network tests: skip reasons from the feature module, and a
 * complete stand-in for the internet on this machine only: test hosts in network
 * namespaces ("pypi", "npm"), an upstream DNS zone that names them, a policy
 * directory whose services catalog points at them, and the node's network
 * settings (a bridge, subnet and nft table of this test process alone).
 */
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { feature } from '../../src/features';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import type { NetworkConfig } from '../../src/shim/node';
import { startDnsZone, type DnsZone, type ZoneRecords } from './dns-zone';
import { startTestHost, type TestHost } from './net-hosts';

export function egressSkipReason(): string | null {
  if (process.getuid?.() !== 0) return 'requires root';
  for (const f of ['egress-bpf', 'sandbox-network'] as const) {
    const st = feature(f);
    if (!st.supported) return `${f}: ${st.reason}`;
  }
  return null;
}

export const SERVICE_PORT = 8080;

export interface Internet {
  pypi: TestHost;
  npm: TestHost;
  /** An allowed-nowhere host: for exfiltration attempts. */
  other: TestHost;
  /** A host in an operator-listed range (denied_ranges), reachable only through the `internal` service's CIDR. */
  internal: TestHost;
  zone: DnsZone;
  /** The zone's records, to extend with zone.setRecords({ ...records, ... }). */
  records: ZoneRecords;
  policyDir: string;
  /** Settings for a node (openTestShim({ network })) or `warren up` flags. */
  network: NetworkConfig;
  upArgs: string[];
  names: { pypi: string; npm: string; other: string };
  close(): Promise<void>;
}

/** Bring up the test internet and install a policy whose catalog maps pypi/npm to it. */
export async function startInternet(tag: string): Promise<Internet> {
  const hosts: TestHost[] = [];
  let zone: DnsZone | null = null;
  const policyDir = mkdtempSync(join(tmpdir(), 'warren-netpolicy-'));
  try {
    const pypi = await startTestHost({ name: 'pypi', port: SERVICE_PORT, body: 'pypi says hello' });
    hosts.push(pypi);
    const npm = await startTestHost({ name: 'npm', port: SERVICE_PORT, body: 'npm says hello' });
    hosts.push(npm);
    const other = await startTestHost({ name: 'other', port: SERVICE_PORT, body: 'exfiltrated' });
    hosts.push(other);
    const internal = await startTestHost({ name: 'internal', port: SERVICE_PORT, body: 'internal says hello' });
    hosts.push(internal);
    const names = { pypi: 'pypi.test', npm: 'registry.npm.test', other: 'attacker.test' };
    const octet = 100 + (process.pid % 100);
    const third = Math.floor(Math.random() * 250);
    const gateway = `10.${octet}.${third}.1`;
    // Names of pypi (`*.pypi.test`) whose answers try to open what no answer may: a rebinding
    // attacker's zone, as far as the node can tell.
    const records: ZoneRecords = {
      [names.pypi]: [{ type: 'A', value: pypi.address, ttl: 300 }],
      'files.pypi.test': [{ type: 'CNAME', value: names.pypi, ttl: 300 }],
      [names.npm]: [{ type: 'A', value: npm.address, ttl: 300 }],
      [names.other]: [{ type: 'A', value: other.address, ttl: 300 }],
      'meta.pypi.test': [{ type: 'A', value: '169.254.169.254' }],
      'gw.pypi.test': [{ type: 'A', value: gateway }],
      'veth.pypi.test': [{ type: 'A', value: pypi.hostAddress }],
      'internal.pypi.test': [{ type: 'A', value: internal.address }],
      'mapped.pypi.test': [{ type: 'A', value: pypi.address }, { type: 'AAAA', value: `::ffff:${npm.address}` }],
      'nat64.pypi.test': [{ type: 'AAAA', value: `64:ff9b::${npm.address}` }],
      'to-npm.pypi.test': [{ type: 'CNAME', value: names.npm }],
      'cdn.pypi.test': [{ type: 'CNAME', value: 'edge.cdn.test' }],
      'edge.cdn.test': [{ type: 'A', value: pypi.address }],
    };
    zone = await startDnsZone({ records });
    cpSync(BUNDLED_POLICY_DIR, policyDir, { recursive: true });
    writeFileSync(
      join(policyDir, 'services.yaml'),
      `version: 1\ndenied_ranges: [${internal.address}/32, 192.168.0.0/16]\nservices:\n  pypi:\n    hosts: [${names.pypi}, files.pypi.test, "*.pypi.test"]\n    ports: [${SERVICE_PORT}]\n  npm:\n    hosts: [${names.npm}]\n    ports: [${SERVICE_PORT}]\n  internal:\n    cidrs: [${internal.address}/32]\n    ports: [${SERVICE_PORT}]\n  github:\n    hosts: [github.test]\n...\n`,
    );
    writeFileSync(
      join(policyDir, 'accounts.yaml'),
      `version: 1\ndefaults:\n  profile: warren-default\naccounts:\n  acct-pypi-default:\n    profile: warren-default\n    network:\n      default: {pypi: true}\n  acct-npm-only:\n    profile: warren-default\n    network:\n      allow: [npm]\n      rules:\n        - cidr: ${other.address}/32\n          ports: [${SERVICE_PORT}]\n...\n`,
    );
    usePolicyStore(new PolicyStore(policyDir, join(policyDir, 'audit.log')));
    const network: NetworkConfig = {
      bridge: `wb${tag}`.slice(0, 15),
      subnet: `10.${octet}.${third}.0/24`,
      nftTable: `wt${tag}`,
      warm: 2,
      upstreams: [{ address: zone.address, port: zone.port }],
      pinRoot: '/sys/fs/bpf/warren-test',
    };
    const upArgs = ['--bridge', network.bridge!, '--subnet', network.subnet!, '--nft-table', network.nftTable!, '--dns-upstream', `${zone.address}:${zone.port}`, '--netns-warm', '1', '--policy-dir', policyDir];
    const z = zone;
    return {
      pypi,
      npm,
      other,
      internal,
      zone: z,
      records,
      policyDir,
      network,
      upArgs,
      names,
      async close() {
        await z.close();
        for (const h of hosts) await h.close();
        rmSync(policyDir, { recursive: true, force: true });
      },
    };
  } catch (err) {
    await zone?.close();
    for (const h of hosts) await h.close().catch(() => undefined);
    rmSync(policyDir, { recursive: true, force: true });
    throw err;
  }
}
