/**
 * The cgroup v2 code paths (CLONE_INTO_CGROUP spawn/exec, cgroup.freeze, cgroup.kill, cgroup
 * namespace rooted at the group) on a host whose /sys/fs/cgroup is v1: a child process points
 * WARREN_CGROUP_ROOT at the controller-less cgroup2 tree (/sys/fs/cgroup/unified), where
 * everything but the controller files (limits, stats) exists. On a v2 host every other
 * native-*.test.ts already runs on v2 and this file is skipped.
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';

import { testUnless, rootReason } from '../helpers/skip';

const CG2 = '/sys/fs/cgroup/unified';
const CGROUP2_SUPER_MAGIC = 0x63677270;

function isCgroup2(p: string): boolean {
  try {
    return fs.statfsSync(p).type === CGROUP2_SUPER_MAGIC;
  } catch {
    return false;
  }
}

const runnable = rootReason ?? (isCgroup2('/sys/fs/cgroup') ? 'the host is cgroup v2 only: the real v2 paths are used by every other test' : isCgroup2(CG2) ? null : `no cgroup2 hierarchy at ${CG2}`);

testUnless(runnable)('v2 paths: spawn/exec into the group, freeze, kill, destroy (emulated on the cgroup2 tree)', (t) => {
  const fixtures = path.resolve(__dirname, '../helpers/native-fixtures.js');
  const script = `
    const fs = require('node:fs');
    const f = require(${JSON.stringify(fixtures)});
    const { native, helperBinary } = f;
    const { spawnSync } = require('node:child_process');
    (async () => {
      const out = { layout: native.cgroupLayout() };
      const sb = await f.createSandbox({});
      try {
        out.id = sb.id;
        out.procs = native.cgroupProcs(sb.id);
        out.pid = sb.pid;
        out.initCgroup = fs.readFileSync('/proc/' + sb.pid + '/cgroup', 'utf8');
        const r = await f.sh(sb, 'cat /proc/self/cgroup; hostname; echo $$');
        out.exec = r;
        out.hostCgroupOfExec = native.cgroupProcs(sb.id).length;
        const ns = spawnSync(helperBinary('warren-nsexec'), ['--pid', String(sb.pid), '--cgroup', sb.id, '--', 'sh', '-c', 'cat /proc/self/cgroup; exit 4'], { encoding: 'utf8' });
        out.nsexec = { status: ns.status, stdout: ns.stdout, stderr: ns.stderr };
        native.cgroupFreeze(sb.id, true);
        out.frozen = fs.readFileSync(${JSON.stringify(CG2)} + '/warren/' + sb.id + '/cgroup.events', 'utf8');
        try { native.exec(f.execSpec(sb, ['true'])); out.execFrozen = 'ran'; } catch (e) { out.execFrozen = e.code; }
        native.cgroupFreeze(sb.id, false);
        out.killed = native.cgroupKill(sb.id);
        out.exit = await sb.exited;
      } finally {
        await sb.destroy();
      }
      out.existsAfter = native.cgroupExists(sb.id);
      out.dirAfter = fs.existsSync(${JSON.stringify(CG2)} + '/warren/' + sb.id);
      console.log(JSON.stringify(out));
    })().catch((e) => { console.log(JSON.stringify({ error: String(e && e.stack || e), code: e && e.code })); });
  `;
  const stdout = execFileSync(process.execPath, ['-e', script], {
    encoding: 'utf8',
    env: { ...process.env, WARREN_CGROUP_ROOT: CG2 },
    timeout: 60_000,
  });
  const out = JSON.parse(stdout.trim().split('\n').pop()!);
  t.falsy(out.error, out.error);
  t.is(out.layout.version, 2);
  t.deepEqual(out.layout.roots, { unified: `${CG2}/warren` });
  t.deepEqual(out.procs, [out.pid]);
  t.is(out.initCgroup.trim().split('\n').find((l: string) => l.startsWith('0::')), `0::/warren/${out.id}`);
  t.is(out.exec.exitCode, 0, out.exec.stderr);
  t.regex(out.exec.stdout, /^0::\/$/m, 'the exec child is in the cgroup namespace rooted at the group');
  t.is(out.nsexec.status, 4, out.nsexec.stderr);
  t.regex(out.nsexec.stdout, /^0::\/$/m);
  t.regex(out.frozen, /frozen 1/);
  t.is(out.execFrozen, 'SANDBOX_NOT_RUNNING');
  t.true(out.killed >= 1);
  t.is(out.exit.signal, 9);
  t.false(out.existsAfter);
  t.false(out.dirAfter);
});
