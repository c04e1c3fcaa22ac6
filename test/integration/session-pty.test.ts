import test from 'ava';
import { WarrenError } from '../../src/errors';
import { collect, openSession, waitFor } from './session-fixture';

const PTY_BASH = ['/usr/bin/env', 'PS1=$ ', 'TERM=dumb', '/bin/bash', '--noprofile', '--norc', '-i'];

test('pty mode: echo, window size and resize', async (t) => {
  const { session } = await openSession(t, { mode: 'pty', argv: PTY_BASH, cols: 100, rows: 30 });
  const out = collect(session);
  t.is(session.info.mode, 'pty');
  session.write('echo hel""lo\r');
  await waitFor(() => /\r\nhello\r\n/.test(out.text()), 5000, 'echo');
  t.regex(out.text(), /echo hel""lo/, 'the terminal echoes input');
  t.true(out.chunks.every((c) => c.stream === 'pty'));

  session.write('stty size\r');
  await waitFor(() => /\r\n30 100\r\n/.test(out.text()), 5000, 'initial size');
  session.resize(132, 43);
  session.write('stty size\r');
  await waitFor(() => /\r\n43 132\r\n/.test(out.text()), 5000, 'new size');

  await t.throwsAsync(session.run('c', 'true'), { instanceOf: WarrenError, message: /command-mode/ });
  t.throws(() => session.resize(0, 10), { instanceOf: WarrenError });
});

/** Command names of a process's children. */
function childCommands(pid: number): string[] {
  const { readFileSync } = require('node:fs') as typeof import('node:fs');
  try {
    const kids = readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean);
    return kids.map((k) => { try { return readFileSync(`/proc/${k}/comm`, 'utf8').trim(); } catch { return ''; } });
  } catch {
    return [];
  }
}

test('pty mode: a signal reaches the foreground job, not the shell', async (t) => {
  const { session, childPid } = await openSession(t, { mode: 'pty', argv: PTY_BASH });
  const out = collect(session);
  session.write('sleep 30; echo after-sleep-$?\r');
  await waitFor(() => out.text().includes('sleep 30'), 5000, 'command echo');
  // the signal must find `sleep` in the foreground, not the shell still reading its line
  await waitFor(() => childCommands(childPid).includes('sleep'), 5000, 'sleep to start under the shell');
  session.signal(2); // SIGINT to the foreground process group
  session.write('echo shell-$((40+2))\r');
  await waitFor(() => out.text().includes('shell-42'), 5000, 'the shell to answer after the interrupt');
  t.true(session.info.alive);
  // Ctrl-D ends the shell and the session reports the exit
  const exited = new Promise((r) => session.onExit(r));
  session.write('exit 5\r');
  t.deepEqual(await exited, { exitCode: 5, signal: null });
});
