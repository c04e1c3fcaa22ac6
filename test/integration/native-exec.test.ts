/**
 * spawnSandbox + exec: pipes, exit codes, stdin, the status pipe, pty mode,
 * synchronous exec errors, users, PATH search, and the warren-nsexec helper.
 */
import { spawn, spawnSync } from 'node:child_process';
import net from 'node:net';
import { closeSync, openSync, readFileSync, readdirSync } from 'node:fs';

import {
  PATH_ENV,
  execSpec,
  exitOf,
  readFd,
  helperBinary,
  native,
  run,
  runPty,
  sh,
  warrenErrorOf,
  withSandbox,
} from '../helpers/native-fixtures';
import { WarrenError } from '../../src/errors';
import { testUnless, rootReason } from '../helpers/skip';

const maybe = testUnless(rootReason);

maybe('exec echo with pipes: output, exit codes, stderr, stdin, status pipe', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const r = await run(sb, ['echo', 'hello', 'world']);
    t.is(r.stdout, 'hello world\n');
    t.is(r.stderr, '');
    t.is(r.exitCode, 0);
    t.is(r.signal, null);

    const r2 = await sh(sb, 'echo out; echo err >&2; exit 3');
    t.is(r2.stdout, 'out\n');
    t.is(r2.stderr, 'err\n');
    t.is(r2.exitCode, 3);

    const r3 = await run(sb, ['cat'], { stdin: 'piped input' });
    t.is(r3.stdout, 'piped input');

    const r4 = await sh(sb, 'kill -TERM $$');
    t.is(r4.exitCode, null);
    t.is(r4.signal, 15);

    const r5 = await sh(sb, 'echo marker-7 >&3; echo done', { statusPipe: true });
    t.is(r5.status, 'marker-7\n');
    t.is(r5.stdout, 'done\n');

    const r6 = await sh(sb, 'pwd; echo $FOO', { cwd: '/tmp', env: [PATH_ENV, 'FOO=bar'] });
    t.is(r6.stdout, '/tmp\nbar\n');
  });
});

maybe("an exec's process gets a small descriptor table however many descriptors the caller holds (it leaves the caller's table without copying it)", async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const held: number[] = [];
    try {
      // like a gateway with a pidfd per sandbox (as many as this process may open, up to 5,000)
      const soft = Number(/^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1] ?? 1024);
      const n = Math.min(5000, soft - 256);
      t.true(n >= 512, `RLIMIT_NOFILE ${soft} leaves room for ${n} descriptors`);
      for (let i = 0; i < n; i++) held.push(openSync('/dev/null', 'r'));
      // the process as exec left it, seen from here while it waits on its stdin
      const p = native.exec(execSpec(sb, ['cat']));
      const exit = exitOf(p.pidfd);
      const out = readFd(p.stdout!);
      native.close(p.stderr!);
      // a copy of this table would be sized for all those descriptors (1,024 or more)
      const fdsize = /^FDSize:\s+(\d+)/m.exec(readFileSync(`/proc/${p.pid}/status`, 'utf8'))?.[1];
      t.true(Number(fdsize) <= 256, `FDSize ${fdsize}`);
      t.deepEqual(readdirSync(`/proc/${p.pid}/fd`).sort(), ['0', '1', '2'], 'stdin, stdout and stderr only');
      const stdin = new net.Socket({ fd: p.stdin!, readable: false, writable: true });
      stdin.end('through the pipe');
      t.is(await out, 'through the pipe');
      t.is((await exit).exitCode, 0);
      native.close(p.pidfd);
    } finally {
      for (const fd of held) closeSync(fd);
    }
  });
});

maybe("a sandbox's pid 1 gets a small descriptor table however many descriptors the caller holds (its spawn leaves the caller's table without copying it)", async (t) => {
  const held: number[] = [];
  try {
    // the addon reserves its slots when it loads, as a gateway's does before it holds a pidfd per sandbox
    t.truthy(native.cgroupLayout());
    const soft = Number(/^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1] ?? 1024);
    const n = Math.min(5000, soft - 256);
    t.true(n >= 512, `RLIMIT_NOFILE ${soft} leaves room for ${n} descriptors`);
    for (let i = 0; i < n; i++) held.push(openSync('/dev/null', 'r'));
    await withSandbox(t, {}, async (sb) => {
      const fdsize = /^FDSize:\s+(\d+)/m.exec(readFileSync(`/proc/${sb.pid}/status`, 'utf8'))?.[1];
      t.true(Number(fdsize) <= 256, `FDSize ${fdsize}`);
      t.deepEqual(readdirSync(`/proc/${sb.pid}/fd`).sort(), ['0', '1', '2'], 'pid 1 keeps its stdio only');
      t.is((await run(sb, ['echo', 'up'])).stdout, 'up\n');
    });
  } finally {
    for (const fd of held) closeSync(fd);
  }
});

maybe('exec runs as the requested user with no capabilities left', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const r = await sh(sb, 'id -u; id -g; grep -E "^Cap(Prm|Eff)" /proc/self/status', { uid: 1000, gid: 1000, cwd: '/home/user' });
    t.is(r.exitCode, 0, r.stderr);
    t.deepEqual(r.stdout.trim().split('\n'), ['1000', '1000', 'CapPrm:\t0000000000000000', 'CapEff:\t0000000000000000']);
  });
});

maybe('exec failures are thrown synchronously as SPAWN_ERROR with errno', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const missing = warrenErrorOf(t, () => native.exec(execSpec(sb, ['no-such-binary'])));
    t.is(missing.code, 'SPAWN_ERROR');
    t.is(missing.errno, 2);
    t.regex(missing.message, /exec no-such-binary: ENOENT/);

    const abs = warrenErrorOf(t, () => native.exec(execSpec(sb, ['/bin/nope'])));
    t.is(abs.errno, 2);

    const cwd = warrenErrorOf(t, () => native.exec(execSpec(sb, ['true'], { cwd: '/does/not/exist' })));
    t.is(cwd.code, 'SPAWN_ERROR');
    t.is(cwd.errno, 2);
    t.regex(cwd.message, /chdir \/does\/not\/exist: ENOENT/);

    t.is((await sh(sb, 'echo "#!/bin/sh" > /tmp/noexec; chmod 644 /tmp/noexec; mkdir -m 700 /tmp/private')).exitCode, 0);
    const eacces = warrenErrorOf(t, () => native.exec(execSpec(sb, ['/tmp/noexec'])));
    t.is(eacces.code, 'SPAWN_ERROR');
    t.is(eacces.errno, 13);

    const priv = warrenErrorOf(t, () => native.exec(execSpec(sb, ['true'], { uid: 1000, gid: 1000, cwd: '/tmp/private' })));
    t.is(priv.errno, 13);
    t.regex(priv.message, /chdir/);

    // PATH comes from the given env
    const nopath = warrenErrorOf(t, () => native.exec(execSpec(sb, ['ls'], { env: ['PATH=/nowhere:/also/not'] })));
    t.is(nopath.errno, 2);
    const found = await run(sb, ['ls', '/bin/busybox'], { env: ['PATH=/nowhere:/bin'] });
    t.is(found.stdout, '/bin/busybox\n');

    for (const bad of [
      { argv: [] },
      { argv: ['a\0b'] },
      { env: ['NOEQUALS'] },
      { cwd: 'relative' },
      { cwd: '/a/../b' },
      { uid: -1 },
      { initPid: 0 },
      { cgroup: 'Bad/Name' },
    ]) {
      const e = warrenErrorOf(t, () => native.exec({ ...execSpec(sb, ['true']), ...bad } as never));
      t.is(e.code, 'INVALID_ARGUMENT', JSON.stringify(bad));
    }
    // the sandbox is unharmed
    t.is((await run(sb, ['true'])).exitCode, 0);
  });
});

maybe('exec refuses a pid that is not the init of that sandbox, and frozen or dead sandboxes', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const wrong = warrenErrorOf(t, () => native.exec({ ...execSpec(sb, ['true']), initPid: process.pid }));
    t.is(wrong.code, 'SANDBOX_NOT_RUNNING');

    native.cgroupFreeze(sb.id, true);
    const frozen = warrenErrorOf(t, () => native.exec(execSpec(sb, ['true'])));
    t.is(frozen.code, 'SANDBOX_NOT_RUNNING');
    native.cgroupFreeze(sb.id, false);
    t.is((await run(sb, ['true'])).exitCode, 0);

    native.pidfdSendSignal(sb.pidfd, 9);
    const st = await sb.exited;
    t.is(st.signal, 9);
    const dead = warrenErrorOf(t, () => native.exec(execSpec(sb, ['true'])));
    t.is(dead.code, 'SANDBOX_NOT_RUNNING');
  });
});

maybe('pty mode: tty is /dev/pts/0, output arrives on the master, resize changes stty size', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const p1 = runPty(sb, ['tty'], 80, 24);
    const r1 = await p1.done;
    t.is(r1.exitCode, 0);
    t.regex(r1.output, /^\/dev\/pts\/0\r?\n/);
    t.is(p1.proc.stdout, undefined);

    const p2 = runPty(sb, ['sh', '-c', 'stty size; read line; stty size; echo "got $line"'], 100, 30);
    await p2.waitFor(/30 100/);
    native.ptyResize(p2.proc.ptyFd!, 132, 43);
    p2.write('hello\n');
    const r2 = await p2.done;
    t.is(r2.exitCode, 0);
    t.regex(r2.output, /43 132/);
    t.regex(r2.output, /got hello/);

    // job control works: the shell is a session leader with a controlling tty
    const p3 = runPty(sb, ['sh', '-c', 'ps -o pid,tty,comm | grep -c pts; exit 5'], 80, 24);
    const r3 = await p3.done;
    t.is(r3.exitCode, 5);
  });
});

maybe('warren-nsexec enters the sandbox, forwards signals and exits with the child status', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const bin = helperBinary('warren-nsexec');
    const base = ['--pid', String(sb.pid), '--cgroup', sb.id];
    const r = spawnSync(bin, [...base, '--cwd', '/tmp', '--env', PATH_ENV, '--env', 'X=1', '--', 'sh', '-c', 'pwd; hostname; echo $X; echo fd3 >&3; cat; exit 7'], {
      input: 'from stdin',
      encoding: 'utf8',
      stdio: ['pipe', 'pipe', 'pipe', 'pipe'],
    });
    t.is(r.status, 7, r.stderr);
    t.is(r.stdout, `/tmp\n${sb.hostname}\n1\nfrom stdin`);
    t.is(String(r.output[3]), 'fd3\n');

    const missing = spawnSync(bin, [...base, '--', 'no-such-thing'], { encoding: 'utf8' });
    t.is(missing.status, 125);
    t.regex(missing.stderr, /SPAWN_ERROR: exec no-such-thing: ENOENT/);

    const usage = spawnSync(bin, ['--pid', 'x'], { encoding: 'utf8' });
    t.is(usage.status, 2);

    const child = spawn(bin, [...base, '--env', PATH_ENV, '--', 'sh', '-c', 'echo ready; exec sleep 30'], { stdio: ['ignore', 'pipe', 'inherit'] });
    await new Promise<void>((res) => child.stdout!.once('data', () => res()));
    const exited = new Promise<number | null>((res) => child.on('exit', (code) => res(code)));
    child.kill('SIGTERM');
    t.is(await exited, 128 + 15);

    const idle = spawnSync(bin, [...base, '--sched-idle', '--uid', '1000', '--gid', '1000', '--', 'sh', '-c', 'id -u; grep policy /proc/self/sched'], { encoding: 'utf8' });
    t.is(idle.status, 0, idle.stderr);
    t.regex(idle.stdout, /^1000\n/);
    t.regex(idle.stdout, /policy\s*:\s*5/);
  });
});

maybe('watchExit reports a status for children and nulls for processes it cannot reap', async (t) => {
  await withSandbox(t, {}, async (sb) => {
    const p = native.exec(execSpec(sb, ['sh', '-c', 'exit 42']));
    for (const fd of [p.stdin!, p.stdout!, p.stderr!]) native.close(fd);
    const st = await new Promise((r) => native.watchExit(p.pidfd, r));
    t.deepEqual(st, { exitCode: 42, signal: null });
    native.close(p.pidfd);

    // an adopted process (not our child): the sandbox's own child, seen through a fresh pidfd
    const bg = await sh(sb, 'sleep 30 >/dev/null 2>&1 & echo $!');
    const inner = Number(bg.stdout.trim());
    t.true(inner > 1);
    // find its host pid through the cgroup
    const hostPids = native.cgroupProcs(sb.id).filter((pid) => pid !== sb.pid);
    t.is(hostPids.length, 1);
    const pidfd = native.pidfdOpen(hostPids[0]!);
    const adopted = new Promise((r) => native.watchExit(pidfd, r));
    native.pidfdSendSignal(pidfd, 9);
    t.deepEqual(await adopted, { exitCode: null, signal: null });
    native.close(pidfd);
  });
});

/** Zombies whose parent is this process: children nobody will reap. */
function ownZombies(): number[] {
  const out: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const [state, ppid] = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (state === 'Z' && Number(ppid) === process.pid) out.push(Number(e));
    } catch {
      /* gone */
    }
  }
  return out;
}

maybe('an exec racing a kill of everything in the sandbox leaves no unreaped child, and the sandbox still ends', async (t) => {
  t.timeout(180_000);
  await withSandbox(t, {}, async (sb) => {
    // What a pool reset does: SIGKILL every process in the sandbox's cgroup but its init, in a
    // tight loop, while execs start. The kill lands at every step of an exec, including while
    // its first stage waits for the child it cloned (the child is this process's to reap).
    let stop = false;
    let kills = 0;
    const killer = (async () => {
      while (!stop) {
        for (const p of native.cgroupProcs(sb.id)) {
          if (p === sb.pid) continue;
          try {
            process.kill(p, 'SIGKILL');
            kills++;
          } catch {
            /* gone */
          }
        }
        await new Promise<void>((r) => setImmediate(r));
      }
    })();
    const exits: Promise<unknown>[] = [];
    let started = 0;
    let refused = 0;
    for (let i = 0; i < 300; i++) {
      try {
        const p = await native.execAsync(execSpec(sb, ['/bin/sleep', '30']));
        started++;
        for (const fd of [p.stdin, p.stdout, p.stderr]) if (fd !== undefined) native.close(fd);
        exits.push(exitOf(p.pidfd).finally(() => native.close(p.pidfd)));
      } catch (err) {
        refused++;
        t.true(err instanceof WarrenError, String(err));
      }
    }
    stop = true;
    await killer;
    await Promise.all(exits);
    t.true(kills > 0, 'the killer ran');
    t.log(`${started} execs started, ${refused} refused, ${kills} kills`);
    t.deepEqual(ownZombies(), [], 'every child this process made is reaped');
  });
});
