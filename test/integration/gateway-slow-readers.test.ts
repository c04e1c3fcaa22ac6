/**
 * Shell clients that never read cannot grow the gateway: a real `warren up`
 * in a child process, a session whose shell prints without pause, and many
 * WebSocket attachments that complete the handshake and then read nothing.
 * The gateway's resident memory is measured from /proc while they hang on
 * and after they are gone, and the gateway lets go of them on its own
 * (their holder connections end).
 */
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { testUnless } from '../helpers/skip';
import { WarrenClient } from '../../src/sdk';
import { removeTree } from '../../src/shim/layers/sys';
import { busyboxRootfs } from '../helpers/warren';
import { startWarrenProcess, stopNode } from '../helpers/warren-process';
import { peakOver, pollUntil, rssBytes, stuckWebSocket, type StuckSocket } from '../helpers/slow-client';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip).serial;

const MiB = 1024 * 1024;
const CLIENTS = 64;

interface Node {
  child: ChildProcess;
  url: string;
  port: number;
  token: string;
  client: WarrenClient;
  dataDir: string;
}

async function startNode(t: { teardown(fn: () => Promise<void> | void): void }, args: string[] = []): Promise<Node> {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-slow-'));
  const nodeId = `w${process.pid.toString(36)}`;
  const { child, url } = await startWarrenProcess(dataDir, nodeId, args);
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url, token });
  const node = { child, url, port: Number(new URL(url).port), token, client, dataDir };
  t.teardown(async () => {
    for (const s of await client.listSandboxes().catch(() => [])) await client.deleteSandbox(s.id).catch(() => undefined);
    await client.close();
    await stopNode(child);
    removeTree(dataDir);
  });
  await client.images.import('busybox', await busyboxRootfs(), { type: 'directory' });
  return node;
}

it(`shell attachments that never read leave the gateway's memory bounded, are let go, and the memory comes back`, async (t) => {
  t.timeout(120_000);
  const node = await startNode(t, ['--shell-stall-timeout-ms', '3000']);
  const sb = await node.client.createSandbox({ image: 'busybox' });
  const sh = await node.client.getSandbox(sb.id).then((s) => s.shell({ mode: 'command' }));
  // A background writer that never stops: the session produces output as fast as it is taken.
  await sh.run('(while :; do echo 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef; done &) ; true');
  const session = sh.session;
  await sh.detach();

  const pid = node.child.pid!;
  const before = rssBytes(pid);
  const stuck: StuckSocket[] = [];
  t.teardown(() => stuck.forEach((s) => s.destroy()));
  for (let i = 0; i < CLIENTS; i++) {
    const s = await stuckWebSocket(node.port, `/v1/sandboxes/${sb.id}/shell?session=${session}&offset=0`, node.token);
    t.true(s.head.startsWith('HTTP/1.1 101'), s.head.split('\r\n')[0]);
    stuck.push(s);
  }
  const peak = await peakOver(() => rssBytes(pid), 2000);
  t.log(`gateway RSS: ${(before / MiB).toFixed(0)} MiB before, peak ${(peak / MiB).toFixed(0)} MiB with ${CLIENTS} clients that never read`);
  // Each stalled client holds at most its high-water mark plus one socket read (docs/shell-protocol.md,
  // Back-pressure): about 0.4 MiB, plus garbage V8 has not collected yet (it lets up to 64 MiB of
  // external memory pile up between collections). An unpaused 8 MiB queue per client cost ~9 MiB each.
  t.true(peak - before < 2 * MiB * CLIENTS, `gateway grew by ${((peak - before) / MiB).toFixed(0)} MiB for ${CLIENTS} stalled clients`);

  // The gateway gives up on them by itself: their holder connections go away.
  const api = await node.client.getSandbox(sb.id);
  // The sessions listing carries the holder's own INFO, its client count included.
  const clients = async () => ((await api.sessions()).find((s) => s.id === session) as { clients?: number } | undefined)?.clients ?? -1;
  let seen = -1;
  await pollUntil(async () => (seen = await clients()) <= 1, 30_000, () => `holder still has ${seen} clients`);
  t.true(seen <= 1, `holder clients after the stall timeout: ${seen}`);

  stuck.forEach((s) => s.destroy());
  let now = rssBytes(pid);
  await pollUntil(() => (now = rssBytes(pid)) - before < 32 * MiB, 30_000, () => `RSS ${(now / MiB).toFixed(0)} MiB, was ${(before / MiB).toFixed(0)} MiB`);
  t.true(now - before < 32 * MiB);

  // The session itself is unharmed: a reading client still gets live output.
  const again = await api.shell({ mode: 'command', session });
  const r = await again.run('echo still-here');
  t.is(r.exitCode, 0);
  t.true(r.stdout.includes('still-here'));
  await again.close();
});

it(`pty mode: stalled clients past the gateway-wide budget are dropped long before their stall timeout`, async (t) => {
  t.timeout(120_000);
  // A long stall timeout: only the budget (2 MiB for all stalled queues, about 8 clients at the 256 KiB mark) lets clients go early.
  const node = await startNode(t, ['--shell-stall-timeout-ms', '600000', '--shell-buffer-budget-mib', '2']);
  const sb = await node.client.getSandbox((await node.client.createSandbox({ image: 'busybox' })).id);
  const pty = await sb.shell({ mode: 'pty' });
  pty.write('(while :; do echo 0123456789abcdef0123456789abcdef; done) >/dev/tty 2>&1 &\n');
  const session = pty.session;
  await pty.detach();
  const pid = node.child.pid!;
  const before = rssBytes(pid);
  const stuck: StuckSocket[] = [];
  t.teardown(() => stuck.forEach((s) => s.destroy()));
  for (let i = 0; i < 32; i++) stuck.push(await stuckWebSocket(node.port, `/v1/sandboxes/${sb.id}/shell?mode=pty&session=${session}&offset=0`, node.token));
  const clients = async () => ((await sb.sessions()).find((s) => s.id === session) as { clients?: number } | undefined)?.clients ?? -1;
  let seen = -1;
  // 2 MiB / 256 KiB = 8 stalled queues fit; the others are let go although their stall timeout is 10 minutes away.
  await pollUntil(async () => (seen = await clients()) <= 12, 20_000, () => `holder still has ${seen} clients`);
  t.true(seen <= 12, `holder clients: ${seen}`);
  const grown = rssBytes(pid) - before;
  t.true(grown < 48 * MiB, `gateway grew by ${(grown / MiB).toFixed(0)} MiB`);
  stuck.forEach((s) => s.destroy());
  await pollUntil(async () => (seen = await clients()) <= 1, 20_000, () => `holder still has ${seen} clients after the sockets closed`);
  const again = await sb.shell({ mode: 'pty', session });
  let text = '';
  again.on('output', (o) => (text += o.data.toString('latin1')));
  await pollUntil(() => text.includes('0123456789abcdef'), 10_000, () => `pty output: ${JSON.stringify(text.slice(-100))}`);
  t.true(text.includes('0123456789abcdef'));
  await again.close();
});
