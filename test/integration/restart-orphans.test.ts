/**
 * A node killed between making a sandbox's kernel resources and recording it must not leak them:
 * on its next start, a record left in `creating` and resources without any record are removed.
 * The two crash points are reproduced exactly by editing the registry of a stopped node.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { rm } from 'node:fs/promises';
import { skipReason } from '../../src/features';
import { openDatabase } from '../../src/state/db';
import { countHostResources, openTestShim, spec } from '../helpers/warren';
import { testUnless } from '../helpers/skip';

const why = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');

testUnless(why)('restart removes a sandbox whose create was interrupted and one that has no record at all', async (t) => {
  const first = await openTestShim({ nodeId: `o${process.pid.toString(36)}` });
  const { dataDir } = first;
  const nodeId = first.shim.nodeId;
  const scope = { dataDir, idPrefix: `${nodeId}-` };
  let second: Awaited<ReturnType<typeof openTestShim>> | null = null;
  try {
    const kept = await first.shim.createSandbox(spec());
    const interrupted = await first.shim.createSandbox(spec());
    const unrecorded = await first.shim.createSandbox(spec());
    await first.shim.exec(interrupted.id, { cmd: '(sleep 300 &) ; true' });
    await first.shim.exec(unrecorded.id, { cmd: '(sleep 300 &) ; true' });
    const alive = countHostResources(scope);
    t.true(alive.processes >= 5 && alive.cgroups > 0, JSON.stringify(alive));
    await first.shim.close(); // sandboxes keep running, as after a kill -9

    const db = openDatabase(join(dataDir, 'warren.db'));
    db.prepare("UPDATE sandboxes SET state = 'creating', runtime = '{}' WHERE id = ?").run(interrupted.id);
    db.prepare('DELETE FROM sandboxes WHERE id = ?').run(unrecorded.id);
    db.close();

    second = await openTestShim({ dataDir, nodeId });
    t.deepEqual(second.shim.listSandboxes().map((s) => s.id), [kept.id]);
    t.is((await second.shim.exec(kept.id, { cmd: 'echo kept' })).stdout, 'kept\n', 'the recorded sandbox is re-adopted');
    await second.shim.deleteSandbox(kept.id);
    const left = countHostResources(scope);
    t.like(left, { processes: 0, cgroups: 0, netns: 0 });
    const sandboxMounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter((l) => l.includes(`${dataDir}/sandboxes/`));
    t.deepEqual(sandboxMounts, [], 'no sandbox mount left');
  } finally {
    const shim = second?.shim ?? null;
    if (shim) {
      for (const s of shim.listSandboxes()) await shim.deleteSandbox(s.id).catch(() => undefined);
      await shim.close();
      shim.layers.unmountUnused();
    }
    await rm(dataDir, { recursive: true, force: true });
  }
});
