/** spawnSandbox errors, pid 1 lifetime, the small process helpers, the loader, worker threads. */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { Worker } from 'node:worker_threads';

import {
  busyboxRootfs,
  destroyCgroup,
  helperBinary,
  native,
  processExists,
  sh,
  uniqueId,
  warrenErrorOf,
  withSandbox,
} from '../helpers/native-fixtures';
import type { SpawnSandboxSpec } from '../../src/native/types';
import { testUnless, rootReason } from '../helpers/skip';

const maybe = testUnless(rootReason);

function specFor(id: string, dir: string, over: Partial<SpawnSandboxSpec> = {}): SpawnSandboxSpec {
  return {
    id,
    hostname: id,
    lowerDirs: [busyboxRootfs()],
    upperDir: path.join(dir, 'upper'),
    workDir: path.join(dir, 'work'),
    rootfsDir: path.join(dir, 'rootfs'),
    initPath: helperBinary('warren-init'),
    network: 'loopback',
    schedIdle: false,
    coreSched: false,
    ...over,
  };
}

maybe('spawn failures name the step and path, and leave nothing behind', async (t) => {
  const id = uniqueId('sp');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-native-sp-'));
  for (const d of ['upper', 'work', 'rootfs']) fs.mkdirSync(path.join(dir, d));
  try {
    const nocg = warrenErrorOf(t, () => native.spawnSandbox(specFor(id, dir)));
    t.is(nocg.code, 'CGROUP_ERROR');
    t.is(nocg.errno, 2);

    native.cgroupCreate(id, {});
    const lower = warrenErrorOf(t, () => native.spawnSandbox(specFor(id, dir, { lowerDirs: ['/nonexistent/layer'] })));
    t.is(lower.code, 'MOUNT_ERROR');
    t.regex(lower.message, new RegExp(`^mount overlay on ${dir}/rootfs: E`));
    t.truthy(lower.errno);

    const init = warrenErrorOf(t, () => native.spawnSandbox(specFor(id, dir, { initPath: '/nonexistent/warren-init' })));
    t.is(init.code, 'SPAWN_ERROR');
    t.is(init.errno, 2);

    const notexec = path.join(dir, 'not-exec');
    fs.writeFileSync(notexec, 'x', { mode: 0o644 });
    const eacces = warrenErrorOf(t, () => native.spawnSandbox(specFor(id, dir, { initPath: notexec })));
    t.is(eacces.code, 'SPAWN_ERROR');
    t.is(eacces.errno, 13);
    t.regex(eacces.message, /execveat/);

    for (const over of [
      { id: 'Bad' },
      { hostname: '-bad' },
      { lowerDirs: [] },
      { lowerDirs: ['/a,b'] },
      { lowerDirs: ['/a:b'] },
      { upperDir: 'relative' },
      { rootfsDir: '/' },
      { network: 'host' },
      { schedIdle: 'yes' },
      { shmBytes: 12 },
      { lowerDirs: Array(129).fill('/x') },
    ]) {
      const e = warrenErrorOf(t, () => native.spawnSandbox(specFor(id, dir, over as never)));
      t.is(e.code, 'INVALID_ARGUMENT', JSON.stringify(over).slice(0, 80));
    }
    t.deepEqual(native.cgroupProcs(id), [], 'no process left in the group');
    t.deepEqual(fs.readdirSync(path.join(dir, 'rootfs')), []);
  } finally {
    await destroyCgroup(id);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

maybe('killing pid 1 ends the whole sandbox; start time and pidfd helpers', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const stat = fs.readFileSync(`/proc/${sb.pid}/stat`, 'utf8');
    t.is(native.processStartTime(sb.pid), Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[22 - 3]));
    t.is(sb.startTime, native.processStartTime(sb.pid));
    await sh(sb, 'sleep 60 >/dev/null 2>&1 & sleep 60 >/dev/null 2>&1 &');
    const procs = native.cgroupProcs(sb.id);
    t.is(procs.length, 3);
    native.pidfdSendSignal(sb.pidfd, 9);
    t.deepEqual(await sb.exited, { exitCode: null, signal: 9 });
    for (let i = 0; i < 200 && native.cgroupProcs(sb.id).length > 0; i++) await new Promise((r) => setTimeout(r, 5));
    t.deepEqual(native.cgroupProcs(sb.id), []);
    for (const pid of procs) t.false(processExists(pid));
    t.is(native.processStartTime(sb.pid), 0);
  });
  t.is(warrenErrorOf(t, () => native.pidfdOpen(4194303)).errno, 3);
  t.is(warrenErrorOf(t, () => native.close(1)).code, 'INVALID_ARGUMENT');
  t.is(warrenErrorOf(t, () => native.close(1 << 30)).errno, 9);
  t.is(warrenErrorOf(t, () => native.pidfdSendSignal(-1, 9)).code, 'INVALID_ARGUMENT');
  t.is(warrenErrorOf(t, () => native.processStartTime(0)).code, 'INVALID_ARGUMENT');
  t.is(warrenErrorOf(t, () => native.ptyResize(0, 0, 10)).code, 'INVALID_ARGUMENT');
  t.is(typeof native.version, 'string');
});

/** A process that is not our child: an orphaned `sleep` (re-parented away from us). */
function orphanSleep(): number {
  const out = execFileSync('/bin/sh', ['-c', 'sleep 30 >/dev/null 2>&1 & echo $!'], { encoding: 'utf8' });
  return Number(out.trim());
}

maybe('watchExit in a worker thread: terminating the worker cleans its watchers up', async (t) => {
  const pid = orphanSleep();
  try {
    const indexJs = path.resolve(__dirname, '../../src/native/index.js');
    const worker = new Worker(
      `const { native } = require(${JSON.stringify(indexJs)});
       const { parentPort, workerData } = require('node:worker_threads');
       const fd = native.pidfdOpen(workerData.pid);
       native.watchExit(fd, () => parentPort.postMessage('exited'));
       parentPort.postMessage('watching');`,
      { eval: true, workerData: { pid } },
    );
    await new Promise<void>((res, rej) => {
      worker.once('message', () => res());
      worker.once('error', rej);
    });
    await worker.terminate();
    // the main thread's addon instance is independent and still works
    const fd = native.pidfdOpen(pid);
    const done = new Promise((r) => native.watchExit(fd, r));
    process.kill(pid, 'SIGKILL');
    t.deepEqual(await done, { exitCode: null, signal: null }, 'not our child: status unknown');
    native.close(fd);
  } finally {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
});

test('loader: helperBinary finds the static helpers and explains what is missing', (t) => {
  for (const name of ['warren-init', 'warren-nsexec'] as const) {
    const p = helperBinary(name);
    t.true(path.isAbsolute(p));
    t.regex(p, new RegExp(`native/helper/out/${name}$`));
  }
  const saved = process.env.WARREN_HELPER_DIR;
  process.env.WARREN_HELPER_DIR = '/nonexistent-warren-helpers';
  try {
    const e = warrenErrorOf(t, () => helperBinary('warren-init'));
    t.is(e.code, 'NATIVE_ERROR');
    t.regex(e.message, /nonexistent-warren-helpers\/warren-init/);
  } finally {
    if (saved === undefined) delete process.env.WARREN_HELPER_DIR;
    else process.env.WARREN_HELPER_DIR = saved;
  }
});

test('loader: a missing addon is a NATIVE_ERROR listing every path tried', (t) => {
  const base = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-native-loader-'));
  try {
    const dist = path.resolve(__dirname, '../../src');
    fs.mkdirSync(path.join(base, 'src/native'), { recursive: true });
    fs.copyFileSync(path.join(dist, 'native/index.js'), path.join(base, 'src/native/index.js'));
    fs.copyFileSync(path.join(dist, 'errors.js'), path.join(base, 'src/errors.js'));
    fs.writeFileSync(path.join(base, 'binding.gyp'), '{}');
    const out = execFileSync(
      process.execPath,
      ['-e', `try { require('./src/native').native.cgroupLayout() } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })) }`],
      { cwd: base, encoding: 'utf8', env: { ...process.env, WARREN_NATIVE_ADDON: '' } },
    );
    const err = JSON.parse(out) as { code: string; message: string };
    t.is(err.code, 'NATIVE_ERROR');
    t.true(err.message.includes(path.join(base, 'build/Release/warren_native.node')), err.message);
    t.true(err.message.includes(path.join(base, 'build/Debug/warren_native.node')), err.message);
  } finally {
    fs.rmSync(base, { recursive: true, force: true });
  }
});
