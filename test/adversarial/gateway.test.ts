/**
 * Adversarial suite, part 4: gateway abuse (research/security_anchors.md E.42-E.46).
 * A real gateway with real accounts; each request is an attack, each answer must be the refusal.
 */
import WebSocket from 'ws';
import { integrationSkipReason, withGateway } from '../integration/gateway-fixture';
import { WarrenError } from '../../src/errors';
import { testUnless } from '../helpers/skip';
import { REPO_ROOT } from './helpers';

const why = integrationSkipReason();
const it = testUnless(why);

/** Outcome of a WebSocket upgrade: 'open', or the HTTP status / close code that refused it. */
function upgrade(url: string, opts: { token?: string; origin?: string; protocols?: string[] }): Promise<string> {
  return new Promise((resolve) => {
    const headers: Record<string, string> = {};
    if (opts.token) headers.authorization = `Bearer ${opts.token}`;
    const wsOpts: WebSocket.ClientOptions = { headers, perMessageDeflate: false, handshakeTimeout: 10_000 };
    if (opts.origin) wsOpts.origin = opts.origin;
    const ws = new WebSocket(url, opts.protocols ?? [], wsOpts);
    ws.on('unexpected-response', (_req, res) => {
      resolve(`http ${res.statusCode}`);
      ws.terminate();
    });
    ws.on('open', () => {
      // some servers refuse after the upgrade with a close frame
      const timer = setTimeout(() => {
        resolve('open');
        ws.close();
      }, 500);
      ws.on('close', (code) => {
        clearTimeout(timer);
        resolve(`close ${code}`);
      });
    });
    ws.on('error', (err) => resolve(`error ${err.message}`));
  });
}

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'accepted';
  } catch (err) {
    return err instanceof WarrenError ? err.code : String(err);
  }
}

/** A one-entry ustar archive (enough to carry a hostile name). */
function tarWith(name: string, data: string, type = '0', link = ''): Buffer {
  const h = Buffer.alloc(512);
  h.write(name, 0, 100);
  h.write('0000644\0', 100);
  h.write('0000000\0', 108);
  h.write('0000000\0', 116);
  h.write(`${Buffer.byteLength(data).toString(8).padStart(11, '0')}\0`, 124);
  h.write('00000000000\0', 136);
  h.write('        ', 148);
  h.write(type, 156);
  h.write(link, 157, 100);
  h.write('ustar\0', 257);
  h.write('00', 263);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148);
  const body = Buffer.alloc(Math.ceil(Buffer.byteLength(data) / 512) * 512);
  body.write(data);
  return Buffer.concat([h, body, Buffer.alloc(1024)]);
}

it('gateway: WebSocket upgrades with a foreign Origin are refused', async (t) => {
  await withGateway(
    t,
    async ({ url, admin, adminToken }) => {
      const sb = await admin.createSandbox({ image: 'busybox' });
      const ws = `${url.replace(/^http/, 'ws')}/v1/sandboxes/${sb.id}/shell`;
      const outcome = await upgrade(ws, { token: adminToken, origin: 'https://evil.example' });
      t.not(outcome, 'open', outcome);
      t.regex(outcome, /http 403|close 10\d\d|close 4\d\d\d/);
    },
    { allowedOrigins: ['https://ide.example'] },
  );
});

it('gateway: WebSocket upgrades with another account\'s token, or none, are refused', async (t) => {
  await withGateway(t, async ({ url, account }) => {
    const alice = account();
    const mallory = account();
    const sb = await alice.client.createSandbox({ image: 'busybox' });
    const ws = `${url.replace(/^http/, 'ws')}/v1/sandboxes/${sb.id}/shell`;
    const foreign = await upgrade(ws, { token: mallory.token });
    t.not(foreign, 'open', foreign);
    const none = await upgrade(ws, {});
    t.not(none, 'open', none);
    const bogus = await upgrade(ws, { token: 'wrn_' + 'A'.repeat(43) });
    t.not(bogus, 'open', bogus);
  });
});

it('gateway: a token cannot be reused across accounts (exec, files, delete on another account\'s sandbox)', async (t) => {
  await withGateway(t, async ({ account }) => {
    const alice = account();
    const mallory = account();
    const sb = await alice.client.createSandbox({ image: 'busybox' });
    const stolen = mallory.client.sandbox(sb.id);
    t.is(await code(stolen.exec('echo pwned')), 'SANDBOX_NOT_FOUND');
    t.is(await code(stolen.readFile('/etc/passwd')), 'SANDBOX_NOT_FOUND');
    t.is(await code(stolen.writeFile('/tmp/x', 'x')), 'SANDBOX_NOT_FOUND');
    t.is(await code(mallory.client.deleteSandbox(sb.id)), 'SANDBOX_NOT_FOUND');
    t.is((await sb.exec('echo still-mine')).stdout, 'still-mine\n');
  });
});

it('gateway: requests without a valid token are 401', async (t) => {
  await withGateway(t, async ({ url }) => {
    const { WarrenClient } = await import('../../src/sdk');
    const anon = new WarrenClient({ url });
    const forged = new WarrenClient({ url, token: 'wrn_' + 'B'.repeat(43) });
    try {
      t.is(await code(anon.listSandboxes()), 'UNAUTHENTICATED');
      t.is(await code(forged.createSandbox({ image: 'busybox' })), 'UNAUTHENTICATED');
    } finally {
      await anon.close();
      await forged.close();
    }
  });
});

it('gateway: an oversized upload is refused with 413 and nothing is written', async (t) => {
  await withGateway(
    t,
    async ({ admin }) => {
      const sb = await admin.createSandbox({ image: 'busybox' });
      t.is(await code(sb.writeFile('/tmp/big', Buffer.alloc(2 * 1024 * 1024))), 'PAYLOAD_TOO_LARGE');
      t.is((await sb.exec('ls /tmp/big 2>&1 || echo none')).stdout.trim().endsWith('none'), true);
    },
    { uploadLimitBytes: 1024 * 1024 },
  );
});

it('gateway: path escapes in the files API stay inside the sandbox', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    for (const p of [`/../../../..${REPO_ROOT}/package.json`, `../..${REPO_ROOT}/package.json`, `/proc/1/root${REPO_ROOT}/package.json`]) {
      const r = await sb.readFile(p).then((b) => b.toString(), (e: WarrenError) => e.code);
      t.false(r.includes('"name": "warren"'), `read ${p}`);
    }
  });
});

it('gateway: a symlink planted in the sandbox (link -> /) cannot make the files API read or write the host', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    await sb.exec(`ln -s / /tmp/host; ln -s ${REPO_ROOT}/package.json /tmp/pkg; ln -s /etc /tmp/etc`);
    for (const p of [`/tmp/host${REPO_ROOT}/package.json`, '/tmp/pkg']) {
      const r = await sb.readFile(p).then((b) => b.toString(), (e: WarrenError) => e.code);
      t.false(r.includes('"name": "warren"'), `read ${p}: ${r.slice(0, 40)}`);
    }
    await code(sb.writeFile('/tmp/etc/warren-planted', 'x'));
    const { existsSync } = await import('node:fs');
    t.false(existsSync('/etc/warren-planted'), 'wrote through the symlink to the host');
  });
});

it('gateway: tar uploads with ../ entries or escaping symlinks are refused before anything is written', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    t.regex(await code(sb.uploadTar('/tmp', tarWith('../../../tmp/evil', 'x'))), /ARCHIVE_ESCAPE|INVALID_ARCHIVE|PATH_ESCAPE/);
    t.regex(await code(sb.uploadTar('/tmp', tarWith('/etc/evil', 'x'))), /ARCHIVE_ESCAPE|INVALID_ARCHIVE|PATH_ESCAPE|accepted/);
    const linked = await code(sb.uploadTar('/tmp', tarWith('up', '', '2', '../../../../etc')));
    t.log(`symlink entry: ${linked}`);
    const { existsSync } = await import('node:fs');
    t.false(existsSync('/tmp/evil'));
    t.false(existsSync('/etc/evil'));
  });
});

it('gateway: hostile sandbox ids are rejected with 400 before reaching the node', async (t) => {
  await withGateway(t, async ({ admin }) => {
    for (const id of ['..', '../etc', 'a/b', 'x'.repeat(10_000), 'A%00B', '-1']) {
      const r = await code(admin.sandbox(id).refresh());
      t.true(['INVALID_ID', 'SANDBOX_NOT_FOUND', 'NOT_FOUND', 'INVALID_ARGUMENT'].includes(r), `${id.slice(0, 20)}: ${r}`);
    }
  });
});

it('gateway: out-of-range limits (negative, 2^64, NaN-like) are rejected', async (t) => {
  await withGateway(t, async ({ admin }) => {
    for (const bad of [{ memoryMb: -1 }, { pids: 2 ** 64 }, { diskMb: 1 }, { cpu: 1e9 }]) {
      const r = await code(admin.createSandbox({ image: 'busybox', ...(bad as object) }));
      t.true(['LIMIT_OUT_OF_RANGE', 'INVALID_ARGUMENT'].includes(r), `${JSON.stringify(bad)}: ${r}`);
    }
  });
});

it('gateway: the security policy endpoints are admin-only', async (t) => {
  await withGateway(t, async ({ account, admin }) => {
    const user = account('runtime');
    t.is(await code(user.client.requestJson('POST', '/v1/policy/apply')), 'FORBIDDEN');
    t.is(await code(user.client.requestJson('GET', '/v1/policy')), 'FORBIDDEN');
    const p = await admin.requestJson<{ enforcer: string }>('GET', '/v1/policy');
    t.regex(p.enforcer, /landlock|apparmor/);
  });
});

it('gateway: /v1/features names the active enforcer', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const f = await admin.features();
    t.regex(f.enforcer, /seccomp/);
    t.regex(f.enforcer, /landlock \(ABI \d+\)|apparmor/);
    t.true(f.features.landlock!.supported || f.features.apparmor!.supported);
    t.is(typeof f.features['bpf-lsm']!.supported, 'boolean');
  });
});
