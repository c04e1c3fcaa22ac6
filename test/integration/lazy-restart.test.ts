/**
 * Lazily loaded layers across a kill -9 of the gateway: a real `warren up` pulls an
 * image lazily and runs a sandbox on it; after kill -9 the file server keeps serving,
 * a second `warren up` adopts it and the sandbox keeps reading its layer; a clean
 * shutdown then stops the file server and leaves no FUSE or layer mount.
 */
import type { ChildProcess } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { WarrenClient } from '../../src/sdk';
import { lazyUnavailableReason } from '../../src/shim/layers/lazy';
import { readMountInfo, removeTree } from '../../src/shim/layers/sys';
import { registryReason, startRegistry } from '../helpers/registry';
import { testUnless } from '../helpers/skip';
import { waitFor } from '../helpers/wait';
import { busyboxRootfs } from '../helpers/warren';
import { kill9, startWarrenProcess, stopGracefully } from '../helpers/warren-process';

const it = testUnless(skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces') ?? registryReason ?? lazyUnavailableReason());

function lazyfsPids(dataDir: string): number[] {
  const out: number[] = [];
  for (const p of require('node:fs').readdirSync('/proc') as string[]) {
    if (!/^\d+$/.test(p)) continue;
    try {
      const cmd = readFileSync(`/proc/${p}/cmdline`, 'utf8');
      if (cmd.includes('warren-lazyfs') && cmd.includes(dataDir)) out.push(Number(p));
    } catch {
      /* gone */
    }
  }
  return out;
}

it('gateway kill -9: the lazy file server keeps serving, the next gateway adopts it, a clean stop removes it', async (t) => {
  const registry = await startRegistry();
  const src = mkdtempSync(join(tmpdir(), 'warren-lazy-src-'));
  const dataA = mkdtempSync(join(tmpdir(), 'warren-lazy-a-'));
  const dataB = mkdtempSync(join(tmpdir(), 'warren-lazy-b-'));
  let a: ChildProcess | null = null;
  let b: ChildProcess | null = null;
  let client: WarrenClient | null = null;
  try {
    const root = join(src, 'root');
    cpSync(await busyboxRootfs(), root, { recursive: true, verbatimSymlinks: true });
    mkdirSync(join(root, 'opt'), { recursive: true });
    writeFileSync(join(root, 'opt/data'), randomBytes(1 << 20));
    const ref = `${registry.host}/warren/restart:v1`;
    // Node A has the image and pushes it.
    const pa = await startWarrenProcess(dataA, `la${process.pid.toString(36)}`);
    a = pa.child;
    const ca = new WarrenClient({ url: pa.url, token: readFileSync(join(dataA, 'admin.token'), 'utf8').trim() });
    await ca.images.import('img', root, { type: 'directory' });
    await ca.images.push('img', ref);
    await ca.close();
    await stopGracefully(a);
    a = null;

    // Node B pulls it lazily and runs a sandbox on it.
    const nodeB = `lb${process.pid.toString(36)}`;
    const first = await startWarrenProcess(dataB, nodeB, ['--pull-mode', 'lazy']);
    b = first.child;
    const token = readFileSync(join(dataB, 'admin.token'), 'utf8').trim();
    client = new WarrenClient({ url: first.url, token });
    const img = await client.images.pull(ref, { name: 'img' });
    t.deepEqual((await client.images.layers(img.layers)).map((l) => l.state), ['lazy']);
    const sb = await client.createSandbox({ image: 'img' });
    t.is((await sb.exec('cat /etc/hostname')).stdout, 'busybox\n');
    const pids = lazyfsPids(dataB);
    t.is(pids.length, 1);

    await kill9(b);
    b = null;
    await client.close();
    // The file server is node state: it survives the gateway (the sandbox keeps its mounts through it).
    t.deepEqual(lazyfsPids(dataB), pids);

    const second = await startWarrenProcess(dataB, nodeB);
    b = second.child;
    client = new WarrenClient({ url: second.url, token });
    const again = await client.getSandbox(sb.id);
    t.is((await again.exec('md5sum /opt/data | cut -c1-32')).stdout.trim().length, 32);
    t.deepEqual(lazyfsPids(dataB), pids, 'the running file server was adopted, not replaced');
    await client.deleteSandbox(sb.id);
    await client.close();
    client = null;
    await stopGracefully(b);
    b = null;
    await waitFor(() => lazyfsPids(dataB).length === 0, 5000, 'warren-lazyfs to stop with the node');
    t.is(readMountInfo().filter((m) => m.mountPoint.startsWith(dataB) && m.fstype.startsWith('fuse')).length, 0, 'no FUSE mount left');
    t.is(readMountInfo().filter((m) => m.fstype === 'erofs' && m.source.startsWith(dataB)).length, 0, 'no lazy layer mount left');
  } finally {
    if (a) await kill9(a);
    if (b) await kill9(b);
    await client?.close();
    for (const pid of lazyfsPids(dataB)) process.kill(pid, 'SIGKILL');
    removeTree(dataA);
    removeTree(dataB);
    rmSync(src, { recursive: true, force: true });
    await registry.stop();
  }
});
