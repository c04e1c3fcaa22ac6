import test from 'ava';
import { existsSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { WarrenError } from '../../src/errors';
import { listSessions, sessionInfo, spawnHolder } from '../../src/shim/sessions/session-manager';
import type { CommandResult } from '../../src/shim/types';
import { BASH, collect, freshSocketDir, openSession, pidAlive, socketDir, waitFor } from './session-fixture';
import { testUnless } from '../helpers/skip';

const POSIX_SHELLS: Array<[string, string[]]> = [
  ['dash', ['/bin/dash']],
  ['busybox ash', ['/usr/bin/busybox', 'sh']],
];

for (const [name, argv] of POSIX_SHELLS) {
  const missing = !existsSync(argv[0]!);
  testUnless(missing ? `${argv[0]} is not installed` : null)(`command mode works on ${name} too`, async (t) => {
    const { session } = await openSession(t, { argv });
    const out = collect(session);
    t.is((await session.run('a', 'cd /tmp; X=1; f() { echo "f $X"; }; echo out; echo err >&2; (exit 3)')).exitCode, 3);
    t.is((await session.run('b', "pwd; f; echo \"it's\"")).exitCode, 0);
    t.is((await session.run('c', 'if then')).exitCode, 2, 'a syntax error does not end the shell');
    t.deepEqual(await session.run('d', 'sleep 30; echo never', 200), { commandId: 'd', exitCode: null, timedOut: true });
    t.deepEqual(await session.run('e', 'while :; do :; done', 200), { commandId: 'e', exitCode: null, timedOut: true });
    t.is((await session.run('g', 'echo "X=$X"')).exitCode, 0);
    t.is(out.text('stdout'), "out\n/tmp\nf 1\nit's\nX=1\n");
    t.regex(out.text('stderr'), /^err\n/);
    t.true(session.info.alive);
  });
}

test('command mode is stateful: cwd, env, functions, variables persist', async (t) => {
  const { session } = await openSession(t);
  const out = collect(session);
  t.deepEqual(await session.run('c1', 'cd /tmp && export GREETING=hello && LOCALVAR=42 && greet() { echo "$GREETING $1"; }; declare -A MAP=([k]=v); set -o noglob'), { commandId: 'c1', exitCode: 0, timedOut: false });
  t.is((await session.run('c2', 'pwd; greet world; echo $LOCALVAR ${MAP[k]} /*; bash -c \'echo child sees $GREETING\'')).exitCode, 0);
  t.is(out.text('stdout'), '/tmp\nhello world\n42 v /*\nchild sees hello\n');
  t.is(out.text('stderr'), '');
  t.is(session.info.mode, 'command');
  t.true(session.info.alive);
});

test('stdout and stderr are separate streams; exit codes come back', async (t) => {
  const { session } = await openSession(t);
  const out = collect(session);
  const done: CommandResult[] = [];
  session.onCommandDone((r) => done.push(r));
  t.is((await session.run('a', 'echo to-out; echo to-err >&2; (exit 3)')).exitCode, 3);
  t.is((await session.run('b', 'false')).exitCode, 1);
  t.is((await session.run('c', 'ls /nonexistent-dir-xyz')).exitCode, 2);
  t.is((await session.run('d', 'if then')).exitCode, 2, 'a syntax error fails the command, not the shell');
  t.is((await session.run('e', 'echo still-here')).exitCode, 0);
  t.is(out.text('stdout'), 'to-out\nstill-here\n');
  t.regex(out.text('stderr'), /^to-err\n.*nonexistent-dir-xyz.*\n.*syntax error/s);
  t.deepEqual(done.map((r) => [r.commandId, r.exitCode]), [['a', 3], ['b', 1], ['c', 2], ['d', 2], ['e', 0]]);
  // offsets are absolute and increasing across streams
  for (let i = 1; i < out.chunks.length; i++) {
    t.true(out.chunks[i]!.offset >= out.chunks[i - 1]!.offset + out.chunks[i - 1]!.data.length);
  }
});

test('multi-line commands, quotes and odd characters survive quoting', async (t) => {
  const { session } = await openSession(t);
  const out = collect(session);
  const cmd = [
    `printf '%s\\n' "it's" 'say "hi"' \\$HOME '\\'`,
    'for i in 1 2; do',
    '  echo "line $i"',
    'done',
    "cat <<'EOF'",
    '$(not expanded) `nor this` \'q\'',
    'EOF',
    'echo "ünïcödé ✓"',
  ].join('\n');
  t.is((await session.run('m1', cmd)).exitCode, 0);
  t.is(out.text('stdout'), `it's\nsay "hi"\n$HOME\n\\\nline 1\nline 2\n$(not expanded) \`nor this\` 'q'\nünïcödé ✓\n`);
  const err = await t.throwsAsync(session.run('m2', 'echo a\0b'), { instanceOf: WarrenError });
  t.is(err?.code, 'INVALID_ARGUMENT');
  await t.throwsAsync(session.run('bad id!', 'true'), { instanceOf: WarrenError, message: /command id/ });
});

test('commands cannot read the session input or forge status lines', async (t) => {
  const { session } = await openSession(t);
  const out = collect(session);
  // `cat` gets /dev/null; fd 3 is closed for the command
  t.is((await session.run('r1', 'cat; echo "r1 99" >&3 2>/dev/null; echo rc=$?')).exitCode, 0);
  t.is(out.text('stdout'), 'rc=1\n');
  // user functions named like the wrapper's builtins do not break it
  t.is((await session.run('r2', 'eval() { echo hijack; }; printf() { echo hijack; }; trap() { echo hijack; }; break() { echo hijack; }')).exitCode, 0);
  t.is((await session.run('r3', 'echo fine')).exitCode, 0);
  t.is(out.text('stdout'), 'rc=1\nfine\n');
});

test('a background job keeps running and writing between commands', async (t) => {
  const { session } = await openSession(t);
  const out = collect(session);
  await session.run('bg', '(while :; do echo tick; sleep 0.05; done) & BG=$!');
  await waitFor(() => (out.text('stdout').match(/tick/g) ?? []).length >= 3, 5000, 'ticks');
  t.is((await session.run('x', 'echo marker; kill -0 $BG && echo alive')).exitCode, 0);
  const before = (out.text('stdout').match(/tick/g) ?? []).length;
  await waitFor(() => (out.text('stdout').match(/tick/g) ?? []).length >= before + 3, 5000, 'more ticks');
  t.regex(out.text('stdout'), /marker\nalive\n/);
  // a later command's timeout does not kill the older job (it was in the MARK snapshot)
  t.true((await session.run('t', 'sleep 20', 200)).timedOut);
  t.is((await session.run('y', 'kill -0 $BG && echo still-alive; kill $BG; wait $BG 2>/dev/null; echo stopped')).exitCode, 0);
  t.regex(out.text('stdout').replace(/tick\n/g, ''), /marker\nalive\nstill-alive\nstopped\n$/);
});

test('timeout kills what the command started and keeps the shell', async (t) => {
  const { session } = await openSession(t);
  const out = collect(session);
  await session.run('cd', 'cd /tmp');
  const r = await session.run('slow', 'sleep 30; echo never; sleep 30', 300);
  t.deepEqual(r, { commandId: 'slow', exitCode: null, timedOut: true });
  t.deepEqual(await session.run('after', 'echo ok; pwd'), { commandId: 'after', exitCode: 0, timedOut: false });
  t.regex(out.text('stdout'), /^ok\n\/tmp\n$/);
  // a pipeline and its subprocesses all die too
  const r2 = await session.run('pipe', 'sleep 40 | sleep 40 | cat', 200);
  t.true(r2.timedOut);
  // the shell has no children left (read is a builtin: no fork to see itself)
  t.is((await session.run('n', 'read -r kids < /proc/$$/task/$$/children; echo "kids=[$kids]"')).exitCode, 0);
  t.regex(out.text('stdout'), /kids=\[\]\n$/);
});

test('with --control-fd the child is a bridge: MARKs and signals reach it as records, never as signals, and it may end itself on close', async (t) => {
  // A stand-in for warren-vmshell: it prints each record it reads on fd 4, and ends on a tree
  // SIGKILL after noting it in a file (a closing session reads no more output).
  const ended = join(freshSocketDir(), 'ended');
  const bridge = ['/usr/bin/python3', '-c', [
    'import os, sys',
    'print("ready", flush=True)',
    'while True:',
    '    b = os.read(4, 2)',
    '    if len(b) < 2: sys.exit(3)',
    '    print(f"rec {b[0]} {b[1]}", flush=True)',
    '    if b[0] == 9 and b[1] == 2:',
    `        open(${JSON.stringify(ended)}, "w").write("tree kill")`,
    '        sys.exit(0)',
  ].join('\n')];
  const { session, childPid } = await openSession(t, { argv: bridge, controlFd: 4 });
  const out = collect(session);
  await waitFor(() => out.text('stdout').includes('ready\n'), 30_000, 'the bridge to start');
  void session.run('c1', 'true').catch(() => undefined); // MARK, then input the bridge ignores
  session.signal(15);
  session.abortCommand();
  const want = ['rec 0 0', 'rec 15 1', 'rec 28 3', 'rec 9 1'];
  await waitFor(() => want.every((r) => out.text('stdout').includes(`${r}\n`)), 30_000, 'the records');
  t.deepEqual(out.text('stdout').trim().split('\n'), ['ready', ...want], 'in the order they were sent');
  t.true(pidAlive(childPid), 'the SIGTERM and SIGKILL were passed on, not delivered to the bridge');
  await session.close();
  await waitFor(() => !pidAlive(childPid), 30_000, 'the bridge to end');
  t.is(existsSync(ended) ? readFileSync(ended, 'utf8') : null, 'tree kill', 'the bridge was told to kill the tree before it was killed');
});

test('--control-fd outside 4..9 is refused before a holder starts', async (t) => {
  const dir = freshSocketDir();
  for (const fd of [3, 10, 1.5]) {
    const e = await t.throwsAsync(spawnHolder({ socketPath: join(dir, `s-ctl-${fd}.sock`), mode: 'command', argv: BASH, bufferBytes: 65536, controlFd: fd }), { instanceOf: WarrenError });
    t.is(e!.code, 'INVALID_ARGUMENT');
  }
});

test('a signal to the command spares a shell that came up after the command was sent (launcher in front)', async (t) => {
  // A launcher (as warren-nsexec is) that starts the shell as its child only once told to:
  // the command, and the snapshot of what was running when it began, arrive before the shell exists.
  const dir = freshSocketDir();
  const go = join(dir, 'go');
  const launcher = ['/bin/bash', '-c', `while [ ! -e ${go} ]; do sleep 0.01; done; /bin/bash --noprofile --norc; exit $?`];
  const { session } = await openSession(t, { argv: launcher, shellDepth: 1 });
  const marker = `31.${process.pid}${Date.now() % 1000}`;
  const running = session.run('c1', `sleep ${marker}`);
  await session.refreshInfo(); // the holder handles frames in order: the MARK has been taken
  writeFileSync(go, '');
  const sleeping = (): boolean =>
    readdirSync('/proc').some((p) => /^\d+$/.test(p) && (() => {
      try {
        return readFileSync(`/proc/${p}/cmdline`, 'latin1') === `sleep\0${marker}\0`;
      } catch {
        return false;
      }
    })());
  await waitFor(sleeping, 30_000, 'the command to be running in the late shell');
  session.signal(9);
  t.deepEqual(await running, { commandId: 'c1', exitCode: 137, timedOut: false });
  t.deepEqual(await session.run('c2', 'echo alive'), { commandId: 'c2', exitCode: 0, timedOut: false }, 'the shell was not what the signal hit');
  t.true(session.info.alive);
});

test('a timeout also stops a builtin-only loop, and the shell keeps its state', async (t) => {
  const { session } = await openSession(t, { graceMs: 5000 });
  const out = collect(session);
  const r = await session.run('spin', 'N=0; while :; do N=$((N+1)); done; echo never', 300);
  t.deepEqual(r, { commandId: 'spin', exitCode: null, timedOut: true });
  // the abort broke the loop: had the grace period run out instead, the session would be gone
  t.is((await session.run('n', '[ "$N" -gt 0 ] && echo counted')).exitCode, 0);
  t.is(out.text('stdout'), 'counted\n');
  t.true(session.info.alive);
});

test('a shell that ignores the abort and spins is killed after the grace period; the session reports exit', async (t) => {
  const { session, pid } = await openSession(t, { graceMs: 300 });
  const exits: unknown[] = [];
  session.onExit((e) => exits.push(e));
  const r = await session.run('spin', "trap '' WINCH; while :; do :; done", 200);
  t.deepEqual(r, { commandId: 'spin', exitCode: null, timedOut: true });
  await waitFor(() => exits.length === 1, 30_000, 'exit event');
  t.deepEqual(exits[0], { exitCode: null, signal: 9 });
  t.false(session.info.alive);
  const err = await t.throwsAsync(session.run('again', 'true'), { instanceOf: WarrenError });
  t.is(err?.code, 'SESSION_NOT_FOUND');
  t.true(pidAlive(pid), 'the holder lingers to serve the tail');
  await session.close();
  await waitFor(() => !pidAlive(pid), 3000, 'holder exit');
});

test('one command at a time; the shell exiting resolves the command', async (t) => {
  const { session } = await openSession(t);
  const first = session.run('one', 'sleep 0.3; echo one');
  const err = await t.throwsAsync(session.run('two', 'true'), { instanceOf: WarrenError });
  t.is(err?.code, 'SESSION_BUSY');
  t.is((await first).exitCode, 0);
  t.is((await session.run('two', 'true')).exitCode, 0);
  const exited = new Promise((r) => session.onExit(r));
  t.deepEqual(await session.run('bye', 'exit 4'), { commandId: 'bye', exitCode: 4, timedOut: false });
  t.deepEqual(await exited, { exitCode: 4, signal: null });
  await t.throwsAsync(session.run('x', 'true', 0), { instanceOf: WarrenError, message: /timeoutMs/ });
  t.throws(() => session.write('x'), { instanceOf: WarrenError, message: /pty/ });
});

test('several concurrent sessions stay independent', async (t) => {
  const sessions = await Promise.all(Array.from({ length: 8 }, () => openSession(t)));
  const outs = sessions.map((s) => collect(s.session));
  await Promise.all(sessions.map((s, i) => s.session.run('set', `cd /; V=${i}; for n in 1 2 3; do echo s${i}-$n; sleep 0.01; done`)));
  await Promise.all(sessions.map((s) => s.session.run('get', 'echo "v=$V"')));
  sessions.forEach((_, i) => t.is(outs[i]!.text('stdout'), `s${i}-1\ns${i}-2\ns${i}-3\nv=${i}\n`));
  const infos = await listSessions(socketDir());
  for (const s of sessions) t.true(infos.some((x) => x.id === s.id && x.alive && x.sandboxId === 'test'));
});

test('CLOSE kills the whole tree and leaves no process and no socket', async (t) => {
  const { session, pid, childPid, socketPath } = await openSession(t);
  const out = collect(session);
  // a plain job, an orphan (its parent subshell exits at once) and one in its own session
  await session.run('bg', 'sleep 1000 & echo $!; (sleep 1000 & echo $!); setsid sleep 1000 & echo $!');
  const pids = out.text('stdout').trim().split('\n').map(Number);
  t.is(pids.length, 3);
  for (const p of [pid, childPid, ...pids]) t.true(pidAlive(p), `pid ${p} alive before close`);
  const info = await sessionInfo(socketPath);
  t.like(info, { holderPid: pid, childPid, alive: true, mode: 'command' });
  await session.close();
  t.false(existsSync(socketPath), 'socket removed');
  await waitFor(() => ![pid, childPid, ...pids].some(pidAlive), 3000, 'every process of the session to exit');
  await t.throwsAsync(sessionInfo(socketPath), { instanceOf: WarrenError, message: /no session holder/ });
});

test('spawn failures are clear errors and dead sockets are cleaned up by listSessions', async (t) => {
  const dir = freshSocketDir(); // other tests list socketDir() concurrently
  const e1 = await t.throwsAsync(spawnHolder({ socketPath: join(dir, 's-nobin.sock'), mode: 'command', argv: ['/no/such/binary'], bufferBytes: 65536 }), { instanceOf: WarrenError });
  t.is(e1?.code, 'SPAWN_ERROR');
  t.regex(e1!.message, /\/no\/such\/binary.*No such file/);
  t.false(existsSync(join(dir, 's-nobin.sock')));

  const e2 = await t.throwsAsync(spawnHolder({ socketPath: 'relative.sock', mode: 'command', argv: BASH, bufferBytes: 65536 }), { instanceOf: WarrenError });
  t.is(e2?.code, 'INVALID_ARGUMENT');
  const e3 = await t.throwsAsync(spawnHolder({ socketPath: join(dir, 's-x.sock'), mode: 'command', argv: BASH, bufferBytes: 10 }), { instanceOf: WarrenError });
  t.is(e3?.code, 'LIMIT_OUT_OF_RANGE');

  // an existing path is never replaced
  const taken = join(dir, 's-taken.sock');
  writeFileSync(taken, 'x');
  const e4 = await t.throwsAsync(spawnHolder({ socketPath: taken, mode: 'command', argv: BASH, bufferBytes: 65536 }), { instanceOf: WarrenError });
  t.regex(e4!.message, /exists/);
  t.is(readFileSync(taken, 'utf8'), 'x');

  // a holder killed with -9 leaves its socket behind; listSessions removes it
  const s = await openSession(t, { dir });
  process.kill(s.pid, 'SIGKILL');
  await waitFor(() => !pidAlive(s.pid), 3000, 'holder death');
  try { process.kill(s.childPid, 'SIGKILL'); } catch { /* gone */ }
  t.true(existsSync(s.socketPath));
  const list = await listSessions(dir);
  t.false(list.some((x) => x.id === s.id));
  t.false(existsSync(s.socketPath));
});

test('a session whose shell exits lingers for re-attach, then goes away', async (t) => {
  const { session, pid, socketPath } = await openSession(t, { lingerSeconds: 1 });
  const out = collect(session);
  t.is((await session.run('last', 'echo tail-output; exit 7')).exitCode, 7);
  session.detach();
  // a new attachment still gets the tail and the exit status
  const { attachSession } = await import('../../src/shim/sessions/session-manager');
  const again = await attachSession(socketPath, 0);
  const out2 = collect(again);
  const exit = await new Promise((r) => again.onExit(r));
  t.deepEqual(exit, { exitCode: 7, signal: null });
  t.is(out2.text('stdout'), 'tail-output\n');
  t.is(out.text('stdout'), 'tail-output\n');
  again.detach();
  await waitFor(() => !pidAlive(pid) && !existsSync(socketPath), 5000, 'holder to leave after the linger time');
});
