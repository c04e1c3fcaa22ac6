/**
 * Removing a sandbox's cgroup, for every backend whose sandbox lives in one (a container's
 * processes, a VMM and its jail). Each step waits on the kernel (a freeze in v1, the memory
 * controller's offlining on rmdir), so each runs on the thread pool, not the event loop.
 */
import { native } from '../../native';
import { WarrenError } from '../../errors';

const ENOENT = 2;
const EBUSY = 16;

function isErrno(err: unknown, errno: number): boolean {
  return err instanceof WarrenError && err.errno === errno;
}

/**
 * Kill everything in the group, wait until it is empty, then remove it from every
 * hierarchy. Hierarchies are removed one by one, so a retry may find some already
 * gone (ENOENT): that is progress, not an error.
 */
export async function destroyCgroup(id: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    let remaining = 0;
    try {
      await native.cgroupKillAsync(id);
      remaining = native.cgroupProcs(id).length;
    } catch (err) {
      if (!isErrno(err, ENOENT)) throw err;
    }
    if (remaining === 0) {
      try {
        await native.cgroupDestroyAsync(id);
        return;
      } catch (err) {
        if (!isErrno(err, EBUSY) || Date.now() > deadline) throw err;
      }
    } else if (Date.now() > deadline) {
      throw new WarrenError('CGROUP_ERROR', `cgroup ${id} still has ${remaining} processes after SIGKILL`);
    }
    await new Promise((r) => setTimeout(r, 2));
  }
}
