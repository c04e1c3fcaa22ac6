/**
 * Hibernate: checkpoint a sandbox's whole process tree to disk with CRIU and
 * release all of its memory; restore it on the next request.
 *
 * Feature-detected (features.ts probe `criu`: `criu check` must pass). Where
 * it does not, hibernate is refused with NOT_SUPPORTED and the probe's reason
 * (on this development kernel CRIU 3.17 fails its vDSO detection, so this path
 * is not exercised by the tests here; pause = freeze + reclaim is).
 *
 * dump:    criu dump -t <pid 1> -D <dir> --manage-cgroups=ignore --ext-mount-map auto
 *          --external mnt[]: (the sandbox's overlay root and its /proc, /dev, /sys mounts
 *          are recreated at restore), --tcp-established, --file-locks, --link-remap.
 *          The processes are killed by the dump; the cgroup stays (empty) and the
 *          upper dir stays on disk.
 * restore: the overlay (same lower layers + the kept upper dir) is mounted on the
 *          sandbox's rootfs dir on the host, then
 *          criu restore -D <dir> --root <rootfs> --restore-detached --pidfile <f>
 *          --cgroup-root <sandbox cgroup> puts the tree back, in new namespaces,
 *          into the sandbox's cgroup; the new pid 1 is re-adopted.
 */
import { execFile } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { WarrenError } from '../../errors';
import { requireFeature } from '../../features';

const run = promisify(execFile);

async function criu(args: string[]): Promise<void> {
  try {
    await run('criu', args, { timeout: 300_000, maxBuffer: 4 << 20 });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new WarrenError('INTERNAL', `criu ${args[0]} failed: ${(e.stderr || e.message).toString().trim().split('\n').slice(-3).join(' | ')}`);
  }
}

export interface CheckpointInfo {
  dir: string;
  pid: number;
  dumpMs: number;
}

export async function dumpSandbox(opts: { pid: number; dir: string; logDir: string }): Promise<CheckpointInfo> {
  requireFeature('criu');
  rmSync(opts.dir, { recursive: true, force: true });
  mkdirSync(opts.dir, { recursive: true, mode: 0o700 });
  const t = performance.now();
  await criu([
    'dump',
    '-t', String(opts.pid),
    '-D', opts.dir,
    '-o', join(opts.logDir, 'dump.log'),
    '--manage-cgroups=ignore',
    '--ext-mount-map', 'auto',
    '--enable-external-sharing',
    '--enable-external-masters',
    '--tcp-established',
    '--file-locks',
    '--link-remap',
  ]);
  return { dir: opts.dir, pid: opts.pid, dumpMs: Math.round(performance.now() - t) };
}

export async function restoreSandbox(opts: { dir: string; rootfs: string; cgroupRoot: string; logDir: string }): Promise<{ pid: number; restoreMs: number }> {
  requireFeature('criu');
  const pidfile = join(opts.logDir, 'restore.pid');
  const t = performance.now();
  await criu([
    'restore',
    '-D', opts.dir,
    '-o', join(opts.logDir, 'restore.log'),
    '--root', opts.rootfs,
    '--restore-detached',
    '--pidfile', pidfile,
    '--manage-cgroups=ignore',
    '--cgroup-root', opts.cgroupRoot,
    '--ext-mount-map', 'auto',
    '--tcp-established',
    '--file-locks',
    '--link-remap',
  ]);
  const pid = Number(readFileSync(pidfile, 'utf8').trim());
  if (!Number.isInteger(pid) || pid <= 1) throw new WarrenError('INTERNAL', 'criu restore left no pid');
  return { pid, restoreMs: Math.round(performance.now() - t) };
}
