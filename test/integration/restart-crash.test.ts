/**
 * Gateway kill -9 and restart keeps sandboxes and sessions: a real `warren up`
 * runs in a child process, is SIGKILLed mid-session, and a second `warren up`
 * on the same data dir re-adopts everything.
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { WarrenClient } from '../../src/sdk';
import { busyboxRootfs, countHostResources } from '../helpers/warren';
import { kill9, startWarrenProcess } from '../helpers/warren-process';
import { removeTree } from '../../src/shim/layers/sys';
import { testUnless } from '../helpers/skip';
import { elapse, waitFor, waitForValue } from '../helpers/wait';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

/** `p`, its failure named after the step. */
const step = <T>(what: string, p: Promise<T>): Promise<T> => p.catch((e: Error) => Promise.reject(new Error(`${what}: ${e.message}`)));

/** Each process's output, shown when the test fails (a gateway that dies answers its clients 1006). */
const logs: string[][] = [];
const startUp = (dataDir: string, nodeId: string) => {
  const log: string[] = [];
  logs.push(log);
  return startWarrenProcess(dataDir, nodeId, [], log);
};

it(`gateway kill -9 and restart keeps sandboxes and sessions`, async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-crash-'));
  const nodeId = `k${process.pid.toString(36)}`;
  let child: ChildProcess | null = null;
  let client: WarrenClient | null = null;
  try {
    const first = await startUp(dataDir, nodeId);
    child = first.child;
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    client = new WarrenClient({ url: first.url, token });
    await client.images.import('busybox', await busyboxRootfs(), { type: 'directory' });

    const sb = await client.createSandbox({ image: 'busybox', labels: { test: 'crash' } });
    await sb.exec('echo persisted > /tmp/state; (while :; do date +%s >> /tmp/ticks; sleep 0.2; done &) ; true');
    // reconnect: false: this test re-attaches by hand after the kill, as a client of its own would
    const shell = await sb.shell({ mode: 'command', reconnect: false });
    await step('the first command', shell.run('cd /tmp && export CRASH=yes'));
    const sessionId = shell.session;
    const offset = shell.offset;
    // output produced while no gateway is listening must be replayed after the restart
    const pending = shell.run('sleep 1; echo produced-while-down').catch(() => undefined);
    await waitFor(async () => /^sleep$/m.test((await sb.exec(['sh', '-c', 'cat /proc/[0-9]*/comm'])).stdout), 5000, 'the command to be running', 20);

    await kill9(child);
    child = null;
    await pending;
    await client.close();
    await elapse(1200, 'the command ends and prints while no gateway is listening');

    const second = await startUp(dataDir, nodeId);
    child = second.child;
    client = new WarrenClient({ url: second.url, token });
    const list = await client.listSandboxes();
    t.deepEqual(list.map((s) => [s.id, s.state]), [[sb.id, 'running']]);
    const again = await client.getSandbox(sb.id);
    t.is((await again.exec('cat /tmp/state')).stdout, 'persisted\n');
    const ticks = Number((await again.exec('wc -l < /tmp/ticks')).stdout.trim());
    const later = await waitForValue(async () => Number((await again.exec('wc -l < /tmp/ticks')).stdout.trim()), (n) => n > ticks, 5000, 'another tick', 50);
    t.true(later > ticks, 'the background loop kept running');

    const seen: string[] = [];
    const reattached = await step('the re-attach', again.shell({ mode: 'command', session: sessionId, offset, onOutput: (o) => void seen.push(o.data.toString()) }));
    const r = await step('the command after the re-attach', reattached.run('pwd; echo $CRASH'));
    t.is(r.stdout, '/tmp\nyes\n');
    t.true(seen.join('').includes('produced-while-down'), `replayed: ${JSON.stringify(seen.join(''))}`);
    await reattached.close();

    await client.deleteSandbox(sb.id);
    const left = countHostResources({ dataDir, idPrefix: `${nodeId}-` });
    t.is(left.processes, 0);
    t.is(left.cgroups, 0);
  } catch (err) {
    t.log(`gateway ${child ? `alive: ${child.exitCode === null && child.signalCode === null}` : 'not started'}; its output:\n${(logs.at(-1) ?? []).join('').split('\n').slice(-40).join('\n')}`);
    throw err;
  } finally {
    if (child) await kill9(child);
    await client?.close();
    // unmounts the layers the node left mounted, then deletes the data dir
    removeTree(dataDir);
  }
});
