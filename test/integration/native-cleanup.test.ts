/** After kill + destroy nothing is left: no process, no cgroup directory, no host mount. */
import * as fs from 'node:fs';
import * as path from 'node:path';

import { createSandbox, destroyCgroup, hostMountLines, native, processExists, sh, sleep } from '../helpers/native-fixtures';
import { testUnless, rootReason } from '../helpers/skip';

const maybe = testUnless(rootReason);

maybe('kill + destroy leaves no process, no cgroup and no host mount', async (t) => {
  const before = new Set(hostMountLines());
  const sb = await createSandbox({ limits: { memoryBytes: 64 * 1024 * 1024, pidsMax: 64 } });
  let ok = false;
  try {
    const r = await sh(sb, 'sleep 60 >/dev/null 2>&1 & sleep 60 >/dev/null 2>&1 & mkdir -p /tmp/x && echo started');
    t.is(r.stdout, 'started\n');
    const procs = native.cgroupProcs(sb.id);
    t.true(procs.length >= 3, `init + 2 sleeps: ${procs}`);
    // the overlay and the sandbox mounts exist only in the sandbox's mount namespace
    t.false(hostMountLines().some((l) => l.includes(sb.rootfsDir)));
    t.is(fs.readdirSync(sb.rootfsDir).length, 0, 'the host sees an empty rootfs dir');

    t.true(native.cgroupKill(sb.id) >= 3);
    const st = await sb.exited;
    t.is(st.signal, 9);
    await destroyCgroup(sb.id);

    for (let i = 0; i < 100 && procs.some(processExists); i++) await sleep(10);
    for (const pid of procs) t.false(processExists(pid), `pid ${pid} is gone`);
    t.false(native.cgroupExists(sb.id));
    for (const root of Object.values(native.cgroupLayout().roots)) t.false(fs.existsSync(path.join(root, sb.id)), root);
    const added = hostMountLines().filter((l) => !before.has(l));
    t.false(added.some((l) => l.includes(sb.dir) || l.includes('warren-native')), added.join('\n'));
    ok = true;
  } finally {
    if (!ok) t.log(`sandbox id ${sb.id}`);
    await sb.destroy();
  }
});
