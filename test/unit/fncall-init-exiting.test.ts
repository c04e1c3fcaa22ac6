/**
 * How a FnCall step tells "its container died" from "it was killed": the container's pid 1 is
 * gone, a zombie, or exiting (PF_EXITING).
 */
import test from 'ava';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { initExiting } from '../../src/shim/fncall/container';
import { waitForValue } from '../helpers/wait';

test('a live process is not exiting; a missing one and a zombie are', async (t) => {
  t.false(initExiting(process.pid));
  t.true(initExiting(0x3fffffff), 'no such pid');
  // `true` exits at once and stays a zombie: its parent (sleep) never reaps it
  const parent = spawn('sh', ['-c', 'true & exec sleep 30'], { stdio: 'ignore' });
  try {
    const child = await waitForValue(
      () => readFileSync(`/proc/${parent.pid}/task/${parent.pid}/children`, 'utf8').trim(),
      (c) => c !== '' && readFileSync(`/proc/${c}/stat`, 'utf8').includes(') Z '),
      5000,
      'a zombie child',
    );
    t.true(initExiting(Number(child)));
    t.false(initExiting(parent.pid!));
  } finally {
    parent.kill('SIGKILL');
  }
});
