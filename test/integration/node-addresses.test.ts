/**
 * The node's own addresses, as the deny trie needs them: an address stays the node's while its
 * interface has no carrier, as a bridge has none once its last sandbox's port is gone.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { networkInterfaces } from 'node:os';
import { localAddresses, SpecialAddresses } from '../../src/shim/network/special-addr';
import { rootReason, testUnless } from '../helpers/skip';
import { waitFor } from '../helpers/wait';

const test = testUnless(rootReason);
const tag = process.pid.toString(36);
const bridge = `wna${tag}`.slice(0, 15);
const veth = `wnv${tag}`.slice(0, 15);
const address = `10.252.${process.pid % 250}.1`;

const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
const carrier = () => readFileSync(`/sys/class/net/${bridge}/carrier`, 'utf8').trim() === '1';

test('a bridge that lost its last port keeps its address in the node view', async (t) => {
  try {
    ip('link', 'add', bridge, 'type', 'bridge');
    ip('addr', 'add', `${address}/24`, 'dev', bridge);
    ip('link', 'set', bridge, 'up');
    ip('link', 'add', veth, 'type', 'veth', 'peer', 'name', `${veth}p`);
    ip('link', 'set', veth, 'master', bridge);
    ip('link', 'set', veth, 'up');
    ip('link', 'set', `${veth}p`, 'up');
    await waitFor(carrier, 5000, 'the bridge to get carrier from its port');
    const special = new SpecialAddresses({ subnet: '10.252.0.0/16', deniedRanges: () => [], maxAgeMs: 0 });
    special.refresh();
    t.is(special.nodeReason(address), 'node');
    ip('link', 'del', veth);
    await waitFor(() => !carrier(), 5000, 'the bridge to lose carrier');
    t.log(`os.networkInterfaces() lists the bridge without carrier: ${bridge in networkInterfaces()}`);
    t.true(localAddresses().includes(address), 'the kernel still delivers to it locally');
    t.is(special.nodeReason(address), 'node');
    t.true(special.denyRanges().some((r) => r.cidr === `${address}/32` && r.reason === 'node'), 'the trie keeps its /32');
  } finally {
    for (const dev of [veth, bridge]) {
      try {
        ip('link', 'del', dev);
      } catch {
        /* already gone */
      }
    }
  }
});
