/**
 * `warren fn ...` as a user runs it (bin/warren in a child process) against a
 * real gateway with a warm pool: pools listing with live stats, invoke with
 * the program's exit code, judge with a verdict table.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { type FnFixture, integrationSkipReason, openFnFixture } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
const maybe = testUnless(skip).serial;
const BIN = join(__dirname, '..', '..', '..', 'bin', 'warren');
let f: FnFixture;
let dir: string;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  await f.pool({ name: 'cli', min: 1, max: 2 });
  dir = mkdtempSync(join(tmpdir(), 'warren-fn-cli-'));
});

test.after.always(async () => {
  if (f) await f.close();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

function warren(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { env: { PATH: process.env.PATH ?? '', WARREN_URL: f.url, WARREN_TOKEN: f.adminToken }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

maybe('warren fn invoke: code from a file, stdin, exit code; -- CMD', async (t) => {
  writeFileSync(join(dir, 'sol.py'), 'import sys\nprint(sys.stdin.read().upper(), end="")\nsys.exit(3)\n');
  writeFileSync(join(dir, 'in.txt'), 'abc');
  const r = await warren(['fn', 'invoke', 'cli', '--language', 'python3', '--file', join(dir, 'sol.py'), '--stdin-file', join(dir, 'in.txt')]);
  t.is(r.stdout, 'ABC');
  t.is(r.code, 3);
  t.regex(r.stderr, /runtime_error/);
  const c = await warren(['fn', 'invoke', 'cli', '--', 'sh', '-c', 'echo hi; exit 0']);
  t.is(c.code, 0);
  t.is(c.stdout, 'hi\n');
  const to = await warren(['fn', 'invoke', 'cli', '--timeout', '200', '--', 'sleep', '5']);
  t.is(to.code, 124);
  const bad = await warren(['fn', 'invoke', 'cli', '--language', 'cobol', '--code', 'x']);
  t.is(bad.code, 1);
  t.regex(bad.stderr, /INVALID_ARGUMENT: unknown language/);
});

maybe('warren fn judge: verdict table, exit 0 only on AC', async (t) => {
  writeFileSync(join(dir, 'sol.c'), '#include <stdio.h>\nint main(){int a,b; scanf("%d %d",&a,&b); printf("%d\\n", a+b);}\n');
  writeFileSync(join(dir, 'tests.json'), JSON.stringify([{ stdin: '1 2', expected: '3' }, { stdin: '2 2', expected: '4' }]));
  const ok = await warren(['fn', 'judge', 'cli', '--language', 'c', '--file', join(dir, 'sol.c'), '--tests', join(dir, 'tests.json'), '--checker', 'tokens']);
  t.is(ok.code, 0, ok.stderr);
  t.regex(ok.stdout, /AC 2\/2 passed/);
  writeFileSync(join(dir, 'tests2.json'), JSON.stringify([{ stdin: '1 2', expected: '4' }]));
  const wa = await warren(['fn', 'judge', 'cli', '--language', 'c', '--file', join(dir, 'sol.c'), '--tests', join(dir, 'tests2.json')]);
  t.is(wa.code, 1);
  t.regex(wa.stdout, /WA 0\/1 passed/);
});

maybe('warren fn pools: live stats', async (t) => {
  const r = await warren(['fn', 'pools']);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /POOL\s+IMAGE\s+STATE\s+MIN\/MAX\s+WARM\s+BUSY\s+STARTING\s+QUEUED\s+INVOCATIONS\s+P50 MS\s+P99 MS/);
  t.regex(r.stdout, /cli\s+judge\s+ready\s+1\/2/);
  const j = await warren(['fn', 'pools', '--json']);
  const pools = JSON.parse(j.stdout) as Array<{ name: string; invocations: number; p50Ms: number }>;
  t.true(pools[0]!.invocations >= 4);
  t.true(pools[0]!.p50Ms > 0);
});

maybe('warren fn languages: toolkit, kind and pools of each language, and the unavailable ones with the reason', async (t) => {
  const r = await warren(['fn', 'languages']);
  t.is(r.code, 0, r.stderr);
  t.regex(r.stdout, /LANGUAGE\s+ALIASES\s+TOOLKIT\s+KIND\s+POOLS/);
  t.regex(r.stdout, /python3\s+python,py\s+\(judge image\)\s+interpreted\s+cli/);
  t.regex(r.stdout, /java\s+-\s+java\s+compiled\s+-/);
  t.regex(r.stdout, /pytest\s+-\s+python\s+tests\s+cli/);
  t.regex(r.stdout, /unavailable:\n\s+julia: Julia is not packaged by Debian 12/);
});
