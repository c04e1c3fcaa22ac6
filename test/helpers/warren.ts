/**
 * Fixtures for tests that need a real node: a temp data dir, a SQLite registry,
 * a ShimNode with a busybox image, and leak accounting. Everything created is
 * destroyed in `finally`, and the ids of sandboxes still alive are printed.
 */
import { mkdtempSync, readdirSync, readFileSync, existsSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ExecutionContext } from 'ava';
import { openDatabase } from '../../src/state/db';
import { type NetworkConfig, ShimNode } from '../../src/shim/node';
import type { SandboxSpec } from '../../src/shim/types';
import type { PreparedOptions } from '../../src/shim/prepared';
import { buildBusyboxRootfs } from './images';

export interface ShimFixture {
  shim: ShimNode;
  dataDir: string;
}

const imageCache = new Map<string, string>();

/** A busybox rootfs directory, built once per test process. */
export async function busyboxRootfs(): Promise<string> {
  let dir = imageCache.get('busybox');
  if (dir === undefined) {
    dir = mkdtempSync(join(tmpdir(), 'warren-busybox-'));
    await buildBusyboxRootfs(dir);
    imageCache.set('busybox', dir);
    process.once('exit', () => {
      try {
        require('node:fs').rmSync(dir, { recursive: true, force: true });
      } catch {
        /* best effort */
      }
    });
  }
  return dir;
}

export async function openTestShim(opts: { dataDir?: string; nodeId?: string; network?: NetworkConfig; log?: (line: string) => void; prepared?: Partial<PreparedOptions> } = {}): Promise<ShimFixture> {
  const dataDir = opts.dataDir ?? mkdtempSync(join(tmpdir(), 'warren-test-'));
  const db = openDatabase(join(dataDir, 'warren.db'));
  const shim = new ShimNode({
    dataDir,
    db,
    nodeId: opts.nodeId ?? 't' + process.pid.toString(36),
    ...(opts.network ? { network: opts.network } : {}),
    ...(opts.log ? { log: opts.log } : {}),
    ...(opts.prepared ? { prepared: opts.prepared } : {}),
  });
  await shim.start();
  if (!shim.listImages().some((i) => i.name === 'busybox')) {
    await shim.importImage({ name: 'busybox', source: { type: 'directory', path: await busyboxRootfs() } });
  }
  return { shim, dataDir };
}

/** Delete what a test left, close the shim, unmount its layers and remove its data. */
export async function closeTestShim(f: ShimFixture, log: (line: string) => void = () => undefined): Promise<void> {
  const alive = f.shim.listSandboxes();
  if (alive.length > 0) log(`cleaning up sandboxes: ${alive.map((s) => s.id).join(', ')}`);
  for (const s of alive) await f.shim.deleteSandbox(s.id).catch((e) => log(`delete ${s.id}: ${e}`));
  await f.shim.close();
  f.shim.layers.unmountUnused();
  await rm(f.dataDir, { recursive: true, force: true });
}

export async function withShim(t: ExecutionContext, fn: (f: ShimFixture) => Promise<void>): Promise<void> {
  const f = await openTestShim();
  try {
    await fn(f);
  } finally {
    await closeTestShim(f, (l) => t.log(l));
  }
}

export function spec(overrides: Partial<SandboxSpec> = {}): SandboxSpec {
  return {
    backend: 'container',
    image: 'busybox',
    workspaces: [],
    toolkits: [],
    cpu: 1,
    memoryMb: 256,
    pids: 256,
    diskMb: null,
    priority: 'normal',
    user: 'root',
    env: {},
    labels: {},
    owner: 'test',
    ...overrides,
  };
}

/**
 * What a sandbox could leak on the host, counted within one test's scope (other
 * test files run concurrently on the same host): processes whose command line or
 * cgroup names the scope, mounts under the data dir, cgroups named with the
 * node prefix, loop devices, and network namespaces held by scoped processes.
 */
export interface HostResources {
  processes: number;
  mounts: number;
  cgroups: number;
  loopDevices: number;
  netns: number;
}

const CGROUP_ROOTS = ['/sys/fs/cgroup/memory/warren', '/sys/fs/cgroup/pids/warren', '/sys/fs/cgroup/cpu/warren', '/sys/fs/cgroup/cpu,cpuacct/warren', '/sys/fs/cgroup/freezer/warren', '/sys/fs/cgroup/unified/warren', '/sys/fs/cgroup/warren'];

export function countHostResources(scope: { dataDir: string; idPrefix: string }): HostResources {
  const fs = require('node:fs') as typeof import('node:fs');
  let cgroups = 0;
  for (const root of CGROUP_ROOTS) {
    if (!existsSync(root)) continue;
    cgroups += readdirSync(root, { withFileTypes: true }).filter((d) => d.isDirectory() && d.name.startsWith(scope.idPrefix)).length;
  }
  let processes = 0;
  const netns = new Set<string>();
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    try {
      // Zombies hold nothing but a pid; the parent (host init for sandboxes adopted after a crash) reaps them.
      if (/^\d+ \(.*\) Z /.test(fs.readFileSync(`/proc/${pid}/stat`, 'utf8'))) continue;
      const cmdline = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8');
      const cgroup = fs.readFileSync(`/proc/${pid}/cgroup`, 'utf8');
      if (cmdline.includes(scope.idPrefix) || cgroup.includes(`/warren/${scope.idPrefix}`)) {
        processes++;
        netns.add(fs.readlinkSync(`/proc/${pid}/ns/net`));
      }
    } catch {
      /* exited meanwhile */
    }
  }
  const loops = existsSync('/sys/block')
    ? readdirSync('/sys/block').filter((d) => d.startsWith('loop') && existsSync(`/sys/block/${d}/loop/backing_file`)).length
    : 0;
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.includes(scope.dataDir) || l.includes(scope.idPrefix)).length;
  return { processes, mounts, cgroups, loopDevices: loops, netns: netns.size };
}

export function rootSkipReason(): string | null {
  return typeof process.getuid === 'function' && process.getuid() !== 0 ? 'requires root' : null;
}
