/**
 * The `warren` CLI (bin/warren) as a user runs it, against a real gateway and
 * a REAL shim. Needs root and the container backend; skips with the reason
 * otherwise.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { integrationSkipReason, withGateway } from './gateway-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
const test = testUnless(skip);

const ROOT = join(__dirname, '..', '..', '..');
const BIN = join(ROOT, 'bin', 'warren');

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

function warren(args: string[], env: Record<string, string>, input?: string, timeoutMs = 60_000): Promise<Run> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [BIN, ...args], { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`warren ${args.join(' ')} timed out; stdout=${stdout} stderr=${stderr}`));
    }, timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    if (input !== undefined) child.stdin.end(input);
    else child.stdin.end();
  });
}

test('create, ls, exec, rm, image ls, doctor, version against a live gateway', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    const env = { WARREN_URL: url, WARREN_TOKEN: adminToken };

    const created = await warren(['create', '--image', 'busybox', '--cpu', '0.5', '--memory', '128', '--label', 'cli=yes', '--env', 'GREETING=hello'], env);
    t.is(created.code, 0, created.stderr);
    const id = created.stdout.trim();
    t.regex(id, /^[a-z0-9][a-z0-9-]{0,62}$/);
    t.log(`sandbox ${id}`);

    const ls = await warren(['ls'], env);
    t.is(ls.code, 0);
    t.regex(ls.stdout, /^ID\s+STATE/);
    t.true(ls.stdout.includes(id));
    t.true(ls.stdout.includes('cli=yes'));
    const lsJson = JSON.parse((await warren(['ls', '--json', '--label', 'cli=yes'], env)).stdout);
    t.deepEqual(lsJson.map((s: { id: string }) => s.id), [id]);
    t.deepEqual(JSON.parse((await warren(['ls', '--json', '--label', 'cli=no'], env)).stdout), []);

    const ok = await warren(['exec', id, '--', 'sh', '-c', 'echo $GREETING; echo to-stderr >&2'], env);
    t.is(ok.code, 0);
    t.is(ok.stdout, 'hello\n');
    t.is(ok.stderr, 'to-stderr\n');
    const fail = await warren(['exec', id, '--', 'sh', '-c', 'exit 42'], env);
    t.is(fail.code, 42);
    const stdin = await warren(['exec', id, '--stdin', '--', 'tr', 'a-z', 'A-Z'], env, 'shout\n');
    t.is(stdin.stdout, 'SHOUT\n');
    const timeout = await warren(['exec', id, '--timeout', '300', '--', 'sleep', '20'], env);
    t.is(timeout.code, 124);

    const images = await warren(['image', 'ls'], env);
    t.is(images.code, 0);
    t.regex(images.stdout, /busybox/);

    const doctor = await warren(['doctor'], env);
    t.is(doctor.code, 0, doctor.stderr);
    t.regex(doctor.stdout, /FEATURE\s+SUPPORTED\s+REASON\s+WHAT WARREN DOES/);
    t.regex(doctor.stdout, /container\s+yes/);

    const version = await warren(['version'], env);
    t.regex(version.stdout, /^warren \d+\.\d+\.\d+/m);
    t.regex(version.stdout, /^server \d+\.\d+\.\d+ on node /m);

    const rm = await warren(['rm', id, 'zz-missing'], env);
    t.is(rm.code, 1);
    t.is(rm.stdout.trim(), id);
    t.regex(rm.stderr, /zz-missing: SANDBOX_NOT_FOUND/);

    const gone = await warren(['exec', id, '--', 'true'], env);
    t.is(gone.code, 1);
    t.regex(gone.stderr, /^warren: SANDBOX_NOT_FOUND: /);
  });
});

test('errors: bad token, bad limits, bad ids give the stable code and exit 1', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    const bad = await warren(['ls'], { WARREN_URL: url, WARREN_TOKEN: 'wrn_' + 'C'.repeat(43) });
    t.is(bad.code, 1);
    t.regex(bad.stderr, /UNAUTHENTICATED/);
    const env = { WARREN_URL: url, WARREN_TOKEN: adminToken };
    const mem = await warren(['create', '--image', 'busybox', '--memory', '0'], env);
    t.is(mem.code, 1);
    t.regex(mem.stderr, /LIMIT_OUT_OF_RANGE: memoryMb must be an integer in 16\.\.\d+/);
    const id = await warren(['exec', 'Bad..Id', '--', 'true'], env);
    t.is(id.code, 1);
    t.regex(id.stderr, /INVALID_ID/);
    const usage = await warren(['exec'], env);
    t.is(usage.code, 2);
  });
});

test('account create prints a token that works', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    const r = await warren(['account', 'create', 'ci-bot', '--role', 'runtime', '--json'], { WARREN_URL: url, WARREN_TOKEN: adminToken });
    t.is(r.code, 0, r.stderr);
    const acct = JSON.parse(r.stdout);
    t.is(acct.role, 'runtime');
    const ls = await warren(['ls', '--json'], { WARREN_URL: url, WARREN_TOKEN: acct.token });
    t.deepEqual(JSON.parse(ls.stdout), []);
  });
});

test('shell over a pipe (no tty): pty session, exit code propagates', async (t) => {
  await withGateway(t, async ({ url, adminToken, admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    const r = await warren(['shell', sb.id], { WARREN_URL: url, WARREN_TOKEN: adminToken }, 'echo shell-$((20+1))\rexit 9\r');
    t.is(r.code, 9, r.stderr);
    t.regex(r.stdout, /shell-21/);
    await sb.delete();
  });
});

test('warren up: listens, prints the admin token once (0600 file), stops cleanly on SIGTERM', async (t) => {
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-up-'));
  try {
    const start = () =>
      new Promise<{ url: string; token: string | null; stop(): Promise<{ code: number | null; stderr: string }> }>((resolve, reject) => {
        const child = spawn(process.execPath, [BIN, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-default-image', '--no-network'], { stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '';
        let stderr = '';
        const timer = setTimeout(() => reject(new Error(`warren up did not start: ${stdout} ${stderr}`)), 60_000);
        const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
        child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
        child.stdout.on('data', (c: Buffer) => {
          stdout += c.toString();
          const m = /listening on (http:\/\/\S+)/.exec(stdout);
          if (!m) return;
          // the token line, if any, follows in the same write
          setTimeout(() => {
            clearTimeout(timer);
            const tok = /^(wrn_[A-Za-z0-9_-]{43})$/m.exec(stdout);
            resolve({
              url: m[1]!,
              token: tok ? tok[1]! : null,
              stop: async () => {
                child.kill('SIGTERM');
                return { code: await exited, stderr };
              },
            });
          }, 200);
        });
        child.on('error', reject);
      });

    const first = await start();
    t.regex(first.url, /^http:\/\/127\.0\.0\.1:\d+$/);
    t.not(first.url, 'http://127.0.0.1:0');
    t.truthy(first.token, 'first start prints the admin token');
    const file = join(dataDir, 'admin.token');
    t.is(statSync(file).mode & 0o777, 0o600);
    t.is(readFileSync(file, 'utf8').trim(), first.token!);
    const h = await warren(['version', '--url', first.url], {});
    t.regex(h.stdout, /^server /m);
    const ls = await warren(['ls', '--url', first.url, '--data-dir', dataDir], {});
    t.is(ls.code, 0, ls.stderr);
    const stopped = await first.stop();
    t.is(stopped.code, 0, stopped.stderr);

    const second = await start();
    t.is(second.token, null, 'later starts do not print the token');
    t.is((await second.stop()).code, 0);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});
