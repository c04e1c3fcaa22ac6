/**
 * Host-capacity admission (src/shim/capacity.ts): each resource refuses with NODE_AT_CAPACITY and
 * names itself; kernel refusals on the create path map to the same code; the counters it reads
 * are the host's own.
 */
import test from 'ava';
import { WarrenError } from '../../src/errors';
import { HostCapacity, capacityErrorOf, hostTasks, memAvailableBytes, openFds, openFilesLimit } from '../../src/shim/capacity';

function refusal(fn: () => void): WarrenError {
  try {
    fn();
  } catch (err) {
    if (err instanceof WarrenError) return err;
    throw err;
  }
  throw new Error('not refused');
}

test('the counters are the host’s: open descriptors, RLIMIT_NOFILE, tasks, MemAvailable', (t) => {
  const fds = openFds();
  t.true(fds >= 3 && fds < openFilesLimit(), `${fds} open of ${openFilesLimit()}`);
  t.true(hostTasks() >= 1);
  t.true(memAvailableBytes() > 0);
});

test('a node with room admits; the report names every resource', (t) => {
  const c = new HostCapacity({ tasksMax: Number.MAX_SAFE_INTEGER, memoryReserveBytes: 1 });
  t.notThrows(() => c.admit());
  t.deepEqual(Object.keys(c.report()).sort(), ['fds', 'memory', 'namespaces', 'pids']);
});

test('descriptors: within the reserve of RLIMIT_NOFILE → 503 NODE_AT_CAPACITY (fds)', (t) => {
  const e = refusal(() => new HostCapacity({ fdReserve: openFilesLimit() }).admit());
  t.is(e.code, 'NODE_AT_CAPACITY');
  t.is(e.status, 503);
  t.is(e.details?.resource, 'fds');
});

test('descriptors: each sandbox made since the last count counts as one', (t) => {
  let sandboxes = 0;
  const limit = openFilesLimit();
  const c = new HostCapacity({ fdReserve: 16 }, () => sandboxes);
  c.admit();
  sandboxes = limit; // as many sandboxes as the limit: their pidfds cannot fit
  t.is(refusal(() => c.admit()).details?.resource, 'fds');
});

test('tasks: at the cap less the reserve → NODE_AT_CAPACITY (pids)', (t) => {
  const e = refusal(() => new HostCapacity({ tasksMax: hostTasks(), taskReserve: 0 }).admit());
  t.is(e.details?.resource, 'pids');
  t.regex(e.message, /tasks/);
});

test('memory: below the reserve → NODE_AT_CAPACITY (memory)', (t) => {
  const e = refusal(() => new HostCapacity({ memoryReserveBytes: Number.MAX_SAFE_INTEGER, tasksMax: Number.MAX_SAFE_INTEGER }).admit());
  t.is(e.details?.resource, 'memory');
});

test('kernel refusals on the create path: EMFILE anywhere, EAGAIN/ENOSPC of the clone, ENOMEM', (t) => {
  const of = (code: 'SPAWN_ERROR' | 'CGROUP_ERROR', msg: string, errno: number) => capacityErrorOf(new WarrenError(code, msg, undefined, errno))?.details?.resource;
  t.is(of('SPAWN_ERROR', 'confine sandbox init: landlock_create_ruleset', 24), 'fds');
  t.is(of('CGROUP_ERROR', 'open /sys/fs/cgroup/cpu/warren/x/cgroup.procs', 23), 'fds');
  t.is(of('SPAWN_ERROR', 'clone sandbox init', 11), 'pids');
  t.is(of('SPAWN_ERROR', 'clone sandbox init', 28), 'namespaces');
  t.is(of('SPAWN_ERROR', 'mount overlay', 12), 'memory');
  // not capacity: a full disk elsewhere, EAGAIN outside the clone, a user's error
  t.is(of('SPAWN_ERROR', 'mount overlay', 28), undefined);
  t.is(of('SPAWN_ERROR', 'exec', 11), undefined);
  t.is(capacityErrorOf(new WarrenError('INVALID_ARGUMENT', 'x', undefined, 24)), null);
  t.is(capacityErrorOf(new Error('plain')), null);
});
