import { skipReason } from '../../src/features';
import { countHostResources, spec, withShim } from '../helpers/warren';
import { testUnless } from '../helpers/skip';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

it(`delete leaves no process, mount, cgroup, loop device or netns behind`, async (t) => {
  await withShim(t, async ({ shim, dataDir }) => {
    const scope = { dataDir, idPrefix: `${shim.nodeId}-` };
    // warm-up: the first sandbox mounts the image's layer, which stays mounted as a node cache
    const warm = await shim.createSandbox(spec());
    await shim.deleteSandbox(warm.id);
    const before = countHostResources(scope);
    for (let i = 0; i < 5; i++) {
      const { id } = await shim.createSandbox(spec());
      await shim.exec(id, { cmd: '(sleep 100 &); (sleep 100 &); echo x > /tmp/f' });
      const session = await shim.openSession(id, { mode: 'command' });
      await session.run('c1', 'sleep 100 & echo started');
      session.detach();
      const pty = await shim.openSession(id, { mode: 'pty', cols: 80, rows: 24 });
      pty.detach();
      const during = countHostResources(scope);
      t.true(during.processes > before.processes, 'the sandbox is visible while it runs');
      await shim.deleteSandbox(id);
    }
    const after = countHostResources(scope);
    t.deepEqual(after, before);
  });
});
