/**
 * REST API against a real gateway and a REAL shim (busybox sandboxes).
 * Needs root and the container backend; skips with the reason otherwise.
 */
import { join } from 'node:path';
import HyperExpress from 'hyper-express';
import { vmBackendStatus } from '../../src/features';
import type { WarrenError } from '../../src/errors';
import { createGateway } from '../../src/gateway/server';
import { WarrenClient } from '../../src/sdk';
import { LocalShim } from '../../src/shim/local';
import { openDatabase } from '../../src/state/db';
import { integrationSkipReason, rawRequest, withGateway } from './gateway-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
const test = testUnless(skip);

test('a second gateway on a port in use is refused, and every connection stays with the first (no SO_REUSEPORT sharing)', async (t) => {
  await withGateway(t, async ({ gateway, shim, dataDir, admin }) => {
    const db = openDatabase(join(dataDir, 'warren.db'));
    try {
      const err = await createGateway({ shim: new LocalShim(shim), db, dataDir, host: '127.0.0.1', port: gateway.port, log: () => undefined }).then(
        async (g) => {
          await g.close();
          return null;
        },
        (e: WarrenError) => e,
      );
      t.is(err?.code, 'UNAVAILABLE');
      t.regex(err?.message ?? '', new RegExp(`cannot listen on 127\\.0\\.0\\.1:${gateway.port}: the port is in use`));
      // nor can a plain uWS server of the same user (it would ask for SO_REUSEPORT)
      const other = new HyperExpress.Server();
      other.get('/v1/health', (_req, res) => void res.status(418).send('not the gateway'));
      const joined = await other.listen(gateway.port, '127.0.0.1').then(
        () => true,
        () => false,
      );
      if (joined) other.close();
      t.false(joined, 'another uWS server shared the port');
      // and every fresh connection reaches the gateway
      const health = { node: shim.nodeId };
      for (let i = 0; i < 20; i++) {
        const c = new WarrenClient({ url: gateway.url, token: 'x' });
        t.like(await c.health(), health);
        await c.close();
      }
      t.is((await admin.health()).status, 'ok');
    } finally {
      db.close();
    }
  });
});

test('health needs no token; everything else does', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    const h = await rawRequest(url, { path: '/v1/health' });
    t.is(h.status, 200);
    t.is(h.json.status, 'ok');
    t.is(typeof h.json.node, 'string');
    t.regex(h.json.version, /^\d+\.\d+\.\d+/);
    t.is(typeof h.json.uptimeS, 'number');

    for (const path of ['/v1/features', '/v1/sandboxes', '/v1/images', '/v1/sandboxes/abc', '/v1/accounts/me']) {
      const none = await rawRequest(url, { path });
      t.is(none.status, 401, path);
      t.is(none.json.error.code, 'UNAUTHENTICATED');
      const wrong = await rawRequest(url, { path, token: 'wrn_' + 'A'.repeat(43) });
      t.is(wrong.status, 401, path);
      t.is(wrong.json.error.code, 'UNAUTHENTICATED');
      const basic = await rawRequest(url, { path, headers: { authorization: `Basic ${adminToken}` } });
      t.is(basic.status, 401, path);
    }
    const f = await rawRequest(url, { path: '/v1/features', token: adminToken });
    t.is(f.status, 200);
    t.is(typeof f.json.backends.container.available, 'boolean');
  });
});

test('error bodies: unknown route, bad JSON, unknown fields, unknown query parameters', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    const nf = await rawRequest(url, { path: '/v1/nope', token: adminToken });
    t.is(nf.status, 404);
    t.deepEqual(Object.keys(nf.json), ['error']);
    t.is(nf.json.error.code, 'NOT_FOUND');

    const bad = await rawRequest(url, { method: 'POST', path: '/v1/sandboxes', token: adminToken, body: '{"image":', headers: { 'content-type': 'application/json' } });
    t.is(bad.status, 400);
    t.is(bad.json.error.code, 'INVALID_ARGUMENT');

    const unk = await rawRequest(url, { method: 'POST', path: '/v1/sandboxes', token: adminToken, body: '{"image":"busybox","gpu":1}' });
    t.is(unk.status, 400);
    t.is(unk.json.error.code, 'UNKNOWN_FIELD');
    t.regex(unk.json.error.message, /gpu/);

    const q = await rawRequest(url, { path: '/v1/sandboxes?lable=a=b', token: adminToken });
    t.is(q.status, 400);
    t.is(q.json.error.code, 'UNKNOWN_FIELD');

    const range = await rawRequest(url, { method: 'POST', path: '/v1/sandboxes', token: adminToken, body: JSON.stringify({ image: 'busybox', memoryMb: 2 ** 64 }) });
    t.is(range.status, 400);
    t.is(range.json.error.code, 'LIMIT_OUT_OF_RANGE');
    t.is(range.json.error.details.field, 'memoryMb');

    // a vm boots its desktop image, never a layer image; where the backend is missing, the create is NOT_SUPPORTED
    const vm = await rawRequest(url, { method: 'POST', path: '/v1/sandboxes', token: adminToken, body: JSON.stringify({ image: 'busybox', backend: 'vm' }) });
    if (vmBackendStatus().available) {
      t.is(vm.status, 400);
      t.is(vm.json.error.code, 'INVALID_ARGUMENT');
      t.is(vm.json.error.details.field, 'image');
    } else {
      t.is(vm.status, 501);
      t.is(vm.json.error.code, 'NOT_SUPPORTED');
    }

    const img = await rawRequest(url, { method: 'POST', path: '/v1/sandboxes', token: adminToken, body: JSON.stringify({ image: 'no-such-image' }) });
    t.is(img.status, 404);
    t.is(img.json.error.code, 'IMAGE_NOT_FOUND');
  });
});

test('bad ids in URLs are INVALID_ID', async (t) => {
  await withGateway(t, async ({ url, adminToken }) => {
    for (const id of ['UPPER', '..%2F..%2Fetc', 'a%00b', 'a.b', 'x'.repeat(64), '-x']) {
      for (const [method, suffix] of [['GET', ''], ['DELETE', ''], ['POST', '/exec'], ['GET', '/files?path=/etc/passwd'], ['GET', '/sessions']] as const) {
        const r = await rawRequest(url, { method, path: `/v1/sandboxes/${id}${suffix}`, token: adminToken, body: method === 'POST' ? '{"cmd":"true"}' : undefined });
        t.is(r.status, 400, `${method} ${id}${suffix}: ${r.text}`);
        t.is(r.json.error.code, 'INVALID_ID');
      }
    }
  });
});

test('sandbox lifecycle: create 201, get, list with label filter, exec, delete 204, then 404', async (t) => {
  await withGateway(t, async ({ url, adminToken, admin }) => {
    const created = await rawRequest(url, { method: 'POST', path: '/v1/sandboxes', token: adminToken, body: JSON.stringify({ image: 'busybox', cpu: 0.5, memoryMb: 128, labels: { suite: 'gw', n: '1' } }) });
    t.is(created.status, 201, created.text);
    const id = created.json.id as string;
    t.log(`sandbox ${id}`);
    t.regex(id, /^[a-z0-9][a-z0-9-]{0,62}$/);
    t.is(created.json.state, 'running');
    t.deepEqual(created.json.limits, { cpu: 0.5, memoryMb: 128, pids: 1024, diskMb: null });

    const other = await admin.createSandbox({ image: 'busybox', labels: { suite: 'gw', n: '2' } });
    const all = await admin.listSandboxes();
    t.true(all.some((s) => s.id === id) && all.some((s) => s.id === other.id));
    const one = await admin.listSandboxes({ labels: { suite: 'gw', n: '1' } });
    t.deepEqual(one.map((s) => s.id), [id]);

    const exec = await rawRequest(url, { method: 'POST', path: `/v1/sandboxes/${id}/exec`, token: adminToken, body: JSON.stringify({ cmd: ['sh', '-c', 'echo out; echo err >&2; exit 7'] }) });
    t.is(exec.status, 200);
    t.is(exec.json.exitCode, 7);
    t.is(exec.json.stdout, 'out\n');
    t.is(exec.json.stderr, 'err\n');
    for (const k of ['status', 'durationMs', 'truncated']) t.true(k in exec.json, k);

    const del = await rawRequest(url, { method: 'DELETE', path: `/v1/sandboxes/${id}`, token: adminToken });
    t.is(del.status, 204);
    t.is(del.text, '');
    const gone = await rawRequest(url, { path: `/v1/sandboxes/${id}`, token: adminToken });
    t.is(gone.status, 404);
    t.is(gone.json.error.code, 'SANDBOX_NOT_FOUND');
    await admin.deleteSandbox(other.id);
  });
});

test("other accounts' sandboxes are 404, indistinguishable from missing ones", async (t) => {
  await withGateway(t, async ({ url, admin, account }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    const bob = account('runtime');
    const missing = 'zz-0000000000000000';
    const requests: Array<[string, string, string | undefined]> = [
      ['GET', '', undefined],
      ['DELETE', '', undefined],
      ['POST', '/exec', '{"cmd":"true"}'],
      ['GET', '/files?path=/etc/passwd', undefined],
      ['PUT', '/files?path=/tmp/x', 'data'],
      ['GET', '/files/list?path=/', undefined],
      ['GET', '/files/archive?path=/etc', undefined],
      ['GET', '/sessions', undefined],
    ];
    for (const [method, suffix, body] of requests) {
      const theirs = await rawRequest(url, { method, path: `/v1/sandboxes/${sb.id}${suffix}`, token: bob.token, body });
      const none = await rawRequest(url, { method, path: `/v1/sandboxes/${missing}${suffix}`, token: bob.token, body });
      t.is(theirs.status, 404, `${method} ${suffix}`);
      t.is(theirs.json.error.code, 'SANDBOX_NOT_FOUND');
      t.is(none.json.error.code, 'SANDBOX_NOT_FOUND');
      t.is(theirs.json.error.message.replace(sb.id, 'ID'), none.json.error.message.replace(missing, 'ID'));
    }
    t.deepEqual(await bob.client.listSandboxes(), []);
    t.deepEqual(await bob.client.listSandboxes({ owner: 'anyone' }), []);
    // still alive for its owner
    t.is((await admin.getSandbox(sb.id)).state, 'running');

    // bob's own sandbox: visible to bob and admin, without the host pid for bob
    const mine = await bob.client.createSandbox({ image: 'busybox' });
    t.is(mine.info?.pid, undefined);
    t.deepEqual((await bob.client.listSandboxes()).map((s) => s.id), [mine.id]);
    t.is((await admin.getSandbox(mine.id)).info?.owner, bob.id);
    await bob.client.deleteSandbox(mine.id);
    await admin.deleteSandbox(sb.id);
  });
});

test('roles: accounts are admin-only; runtime cannot import images', async (t) => {
  await withGateway(t, async ({ url, admin, account }) => {
    const rt = account('runtime');
    const builder = account('builder');
    const r1 = await rawRequest(url, { method: 'POST', path: '/v1/accounts', token: rt.token, body: '{"name":"x","role":"admin"}' });
    t.is(r1.status, 403);
    t.is(r1.json.error.code, 'FORBIDDEN');
    const r2 = await rawRequest(url, { method: 'POST', path: '/v1/images', token: rt.token, body: '{"name":"x","source":{"type":"debootstrap"}}' });
    t.is(r2.status, 403);
    const r3 = await rawRequest(url, { method: 'POST', path: '/v1/images', token: builder.token, body: '{"name":"x","source":{"type":"directory","path":"/etc"}}' });
    t.is(r3.status, 403, 'host paths are admin-only');
    const created = await admin.createAccount('carol', 'builder');
    t.regex(created.token, /^wrn_/);
    t.is((await new (admin.constructor as typeof import('../../src/sdk').WarrenClient)({ url, token: created.token }).whoami()).name, 'carol');
    t.true((await admin.listAccounts()).some((a) => a.name === 'carol'));
  });
});

test('files: write, read, list, modes, path escapes, missing files', async (t) => {
  await withGateway(t, async ({ url, adminToken, admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    const bytes = Buffer.from([0, 1, 2, 255, 254, 10, 13]);
    const put = await rawRequest(url, { method: 'PUT', path: `/v1/sandboxes/${sb.id}/files?path=/tmp/dir/bin.dat&mode=600`, token: adminToken, body: bytes });
    t.is(put.status, 200, put.text);
    t.deepEqual(put.json, { path: '/tmp/dir/bin.dat', bytes: bytes.length });
    const get = await rawRequest(url, { path: `/v1/sandboxes/${sb.id}/files?path=/tmp//dir/./bin.dat`, token: adminToken });
    t.is(get.status, 200);
    t.is(get.headers['content-type'], 'application/octet-stream');
    t.deepEqual(await sb.readFile('/tmp/dir/bin.dat'), bytes);
    const entries = await sb.listDir('/tmp/dir');
    t.deepEqual(entries.map((e) => [e.name, e.type, e.size, e.mode]), [['bin.dat', 'file', bytes.length, 0o600]]);
    t.is((await sb.exec(['stat', '-c', '%a', '/tmp/dir/bin.dat'])).stdout.trim(), '600');

    for (const p of ['../etc/passwd', '/tmp/../../etc/passwd', 'relative', '/a%00b']) {
      const r = await rawRequest(url, { path: `/v1/sandboxes/${sb.id}/files?path=${p}`, token: adminToken });
      t.is(r.status, 400, p);
      t.is(r.json.error.code, 'PATH_ESCAPE', p);
    }
    const noPath = await rawRequest(url, { path: `/v1/sandboxes/${sb.id}/files`, token: adminToken });
    t.is(noPath.json.error.code, 'INVALID_ARGUMENT');
    const missing = await rawRequest(url, { path: `/v1/sandboxes/${sb.id}/files?path=/no/such/file`, token: adminToken });
    t.is(missing.status, 404);
    t.is(missing.json.error.code, 'FILE_NOT_FOUND');
    const badMode = await rawRequest(url, { method: 'PUT', path: `/v1/sandboxes/${sb.id}/files?path=/tmp/m&mode=999`, token: adminToken, body: 'x' });
    t.is(badMode.json.error.code, 'INVALID_ARGUMENT');
    await sb.delete();
  });
});

test('archives: upload a tar into a directory and download it back', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    await sb.exec(['sh', '-c', 'mkdir -p /work/src && echo hello > /work/src/a.txt && echo world > /work/src/b.txt']);
    const tar = await sb.downloadTar('/work/src');
    t.true(tar.length >= 1024);
    t.is(tar.length % 512, 0);
    const r = await sb.uploadTar('/restore', tar);
    t.true(r.entries >= 2);
    t.is((await sb.exec(['cat', '/restore/src/a.txt', '/restore/src/b.txt'])).stdout, 'hello\nworld\n');
    await t.throwsAsync(sb.uploadTar('/bad', Buffer.from('not a tar archive at all'.repeat(40))), { instanceOf: Error });
    await sb.delete();
  });
});

test('body limits: JSON over 1 MiB and uploads over the limit are 413 PAYLOAD_TOO_LARGE', async (t) => {
  await withGateway(
    t,
    async ({ url, adminToken, admin }) => {
      const sb = await admin.createSandbox({ image: 'busybox' });
      const bigJson = JSON.stringify({ cmd: 'true', stdin: 'x'.repeat(1024 * 1024 + 10) });
      const r1 = await rawRequest(url, { method: 'POST', path: `/v1/sandboxes/${sb.id}/exec`, token: adminToken, body: bigJson });
      t.is(r1.status, 413);
      t.is(r1.json.error.code, 'PAYLOAD_TOO_LARGE');
      const r2 = await rawRequest(url, { method: 'PUT', path: `/v1/sandboxes/${sb.id}/files?path=/tmp/big`, token: adminToken, body: Buffer.alloc(2 * 1024 * 1024 + 1) });
      t.is(r2.status, 413);
      t.is(r2.json.error.code, 'PAYLOAD_TOO_LARGE');
      const r3 = await rawRequest(url, { method: 'PUT', path: `/v1/sandboxes/${sb.id}/files/archive?path=/tmp`, token: adminToken, body: Buffer.alloc(3 * 1024 * 1024) });
      t.is(r3.status, 413);
      // at the limit is fine, and the server is still healthy afterwards
      await sb.writeFile('/tmp/ok', Buffer.alloc(2 * 1024 * 1024, 7));
      t.is((await sb.readFile('/tmp/ok')).length, 2 * 1024 * 1024);
      t.is((await admin.health()).status, 'ok');
      await sb.delete();
    },
    { uploadLimitBytes: 2 * 1024 * 1024 },
  );
});

test('exec: stdin, env, cwd, timeouts, argv vs shell string', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox', env: { FROM_SPEC: 'spec' } });
    t.is((await sb.exec(['cat'], { stdin: 'piped\n' })).stdout, 'piped\n');
    t.is((await sb.exec('echo $FROM_SPEC-$X', { env: { X: 'req' } })).stdout, 'spec-req\n');
    t.is((await sb.exec(['pwd'], { cwd: '/tmp' })).stdout, '/tmp\n');
    t.is((await sb.exec(['echo', '$HOME;', '`id`'])).stdout, '$HOME; `id`\n');
    const slow = await sb.exec(['sleep', '600'], { timeoutMs: 300 });
    t.is(slow.status, 'timeout');
    t.true(slow.durationMs < 300_000, 'the timeout, not the command, ended it');
    await sb.delete();
  });
});

test('images: removal is refused while a sandbox uses the image, then takes it out of the list; layers other images use stay', async (t) => {
  await withGateway(t, async ({ url, adminToken, admin, account }) => {
    const { busyboxRootfs } = await import('../helpers/warren');
    await admin.images.import('bb-gone', await busyboxRootfs());
    const sb = await admin.createSandbox({ image: 'bb-gone' });
    const codeOf = async (p: Promise<unknown>) => (await p.then(() => 'none', (e: WarrenError) => e.code)) as string;
    t.is(await codeOf(admin.images.delete('bb-gone')), 'IMAGE_IN_USE');
    t.is((await sb.exec(['echo', 'still-here'])).stdout, 'still-here\n', 'the refused removal left the sandbox alone');
    await sb.delete();
    const runtime = account('runtime').client;
    t.is(await codeOf(runtime.images.delete('bb-gone')), 'FORBIDDEN');
    const removed = await admin.images.delete('bb-gone');
    t.is(removed.name, 'bb-gone');
    // the same content as busybox: its layer is busybox's too and stays
    t.deepEqual(removed.removedLayers, []);
    t.false((await admin.images.list()).some((i) => i.name === 'bb-gone'));
    t.is(await codeOf(admin.images.delete('bb-gone')), 'IMAGE_NOT_FOUND');
    const other = await admin.createSandbox({ image: 'busybox' });
    t.is((await other.exec(['true'])).exitCode, 0);
    await other.delete();
    const refused: Array<[string, string]> = [
      ['UPPER', 'INVALID_ID'],
      ['a%2F..%2Fb', 'INVALID_ID'],
      ['%E0%A4%A', 'INVALID_ARGUMENT'],
      [`sha256:${'0'.repeat(64)}`, 'INVALID_ARGUMENT'],
    ];
    for (const [bad, code] of refused) {
      const res = await rawRequest(url, { method: 'DELETE', path: `/v1/images/${bad}`, token: adminToken });
      t.is(res.status, 400, `${bad}: ${res.text}`);
      t.is(JSON.parse(res.text).error.code, code, bad);
    }
  });
});

test('images: list, and an import streamed as NDJSON progress ending in done', async (t) => {
  await withGateway(t, async ({ url, adminToken, admin }) => {
    const images = await admin.images.list();
    const busybox = images.find((i) => i.name === 'busybox');
    t.truthy(busybox);
    const { busyboxRootfs } = await import('../helpers/warren');
    const dir = await busyboxRootfs();
    const res = await rawRequest(url, { method: 'POST', path: '/v1/images', token: adminToken, body: JSON.stringify({ name: 'bb-copy', source: { type: 'directory', path: dir } }) });
    t.is(res.status, 200);
    t.regex(String(res.headers['content-type']), /application\/x-ndjson/);
    const lines = res.text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    t.true(lines.length >= 2);
    t.true(lines.slice(0, -1).every((l) => l.type === 'progress'));
    const last = lines[lines.length - 1];
    t.is(last.type, 'done');
    t.is(last.image.name, 'bb-copy');
    t.true((await admin.images.list()).some((i) => i.name === 'bb-copy'));

    const failed = await rawRequest(url, { method: 'POST', path: '/v1/images', token: adminToken, body: JSON.stringify({ name: 'nope', source: { type: 'directory', path: '/nonexistent/rootfs' } }) });
    const flines = failed.text.split('\n').filter(Boolean).map((l) => JSON.parse(l));
    const flast = flines[flines.length - 1];
    t.is(flast.type, 'error');
    t.is(typeof flast.error.code, 'string');
  });
});
