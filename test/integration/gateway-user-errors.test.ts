/**
 * Errors that are the user's get stable codes, not 500 INTERNAL, and make no
 * internal-error noise in the gateway's log: writes past a sandbox's disk
 * quota (files API, tar uploads), and requests racing a delete (exec, files,
 * sessions during and after DELETE). Real gateway, real shim.
 */
import { WarrenError } from '../../src/errors';
import { Pool } from 'undici';
import { makeTar } from '../helpers/images';
import { testUnless } from '../helpers/skip';
import { integrationSkipReason, rawRequest, withGateway } from './gateway-fixture';

const test = testUnless(integrationSkipReason());

const MiB = 1024 * 1024;

/** Log lines that say the gateway failed (5xx codes and internal errors). */
function noisy(lines: string[]): string[] {
  return lines.filter((l) => /internal error|error (INTERNAL|NATIVE_ERROR|CGROUP_ERROR|MOUNT_ERROR|SPAWN_ERROR)\b/.test(l));
}

test('writes past the disk quota are 507 DISK_FULL: file upload, tar upload, and a small write into a full disk', async (t) => {
  const logs: string[] = [];
  await withGateway(
    t,
    async ({ url, adminToken, admin }) => {
      const sb = await admin.createSandbox({ image: 'busybox', diskMb: 16 });
      const put = (path: string, body: Buffer) => rawRequest(url, { method: 'PUT', path: `/v1/sandboxes/${sb.id}/files?path=${path}`, token: adminToken, body });
      const big = await put('/work/big', Buffer.alloc(24 * MiB, 1));
      t.is(big.status, 507, big.text);
      t.is(big.json?.error?.code, 'DISK_FULL');
      t.regex(big.json.error.message, /disk|space|quota/i);

      const tar = makeTar([{ name: 'dir/', type: 'dir' }, { name: 'dir/huge', data: Buffer.alloc(24 * MiB, 2) }]);
      const up = await rawRequest(url, { method: 'PUT', path: `/v1/sandboxes/${sb.id}/files/archive?path=/work/x`, token: adminToken, body: tar });
      t.is(up.status, 507, up.text);
      t.is(up.json?.error?.code, 'DISK_FULL');

      // Fill the disk from inside, then even a tiny write is refused the same way.
      await sb.exec('head -c 40000000 /dev/zero > /work/fill; true');
      const small = await put('/work/small', Buffer.from('x'.repeat(8192)));
      t.is(small.status, 507, small.text);
      await t.throwsAsync(sb.writeFile('/work/small2', Buffer.alloc(64 * 1024)), { instanceOf: WarrenError, message: /space|disk|quota/i });
      const e = await sb.writeFile('/work/small3', Buffer.alloc(64 * 1024)).catch((x: WarrenError) => x);
      t.is((e as WarrenError).code, 'DISK_FULL');

      // After freeing space, writes work again: the sandbox was never broken.
      await sb.exec('rm -f /work/fill /work/big');
      t.is((await put('/work/ok', Buffer.from('ok'))).status, 200);
      await sb.delete();
    },
    { onLog: (l) => logs.push(l) },
  );
  t.deepEqual(noisy(logs), []);
});

test('requests racing a delete get 409/404 with stable codes, never 500, and log nothing', async (t) => {
  const logs: string[] = [];
  await withGateway(
    t,
    async ({ url, adminToken, admin }) => {
      for (let round = 0; round < 3; round++) {
        const sb = await admin.createSandbox({ image: 'busybox' });
        const base = `/v1/sandboxes/${sb.id}`;
        // A pool of its own, destroyed at the end: the gateway does not close idle keep-alive connections when it stops.
        const pool = new Pool(url, { connections: 16 });
        t.teardown(() => pool.destroy());
        const req = async (method: string, path: string, body?: unknown) => {
          const headers: Record<string, string> = { authorization: `Bearer ${adminToken}` };
          let payload: Buffer | string | undefined;
          if (body !== undefined) {
            payload = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
            headers['content-type'] = 'application/json';
          }
          const r = await pool.request({ method: method as 'GET', path: base + path, headers, body: payload });
          const text = await r.body.text();
          let json: any;
          try {
            json = JSON.parse(text);
          } catch {
            json = undefined;
          }
          return { status: r.statusCode, text, json };
        };
        const work: Array<Promise<{ what: string; status: number; code?: string }>> = [];
        const track = (what: string, p: Promise<{ status: number; json: any }>) => work.push(p.then((r) => ({ what, status: r.status, code: r.json?.error?.code })));
        for (let i = 0; i < 12; i++) {
          track('exec', req('POST', '/exec', { cmd: 'echo hi; sleep 0.05' }));
          track('write', req('PUT', `/files?path=/tmp/f${i}`, Buffer.from('data')));
          track('read', req('GET', '/files?path=/etc/passwd'));
          track('list', req('GET', '/files/list?path=/'));
          track('tar', req('GET', '/files/archive?path=/etc'));
          track('sessions', req('GET', '/sessions'));
          if (i === 3) track('delete', req('DELETE', ''));
        }
        const shellTries = Array.from({ length: 4 }, () =>
          sb.shell({ mode: 'command' }).then(
            async (sh) => {
              await sh.run('true').catch(() => undefined);
              await sh.detach();
              return 'ok';
            },
            (e: WarrenError) => e.code,
          ),
        );
        const results = await Promise.all(work);
        const shells = await Promise.all(shellTries);
        const bad = results.filter((r) => !(r.status < 300 || (r.status === 409 && r.code === 'SANDBOX_NOT_RUNNING') || (r.status === 404 && r.code === 'SANDBOX_NOT_FOUND')));
        t.deepEqual(bad, [], `round ${round}: answers other than success, 409 SANDBOX_NOT_RUNNING, 404 SANDBOX_NOT_FOUND`);
        t.deepEqual(shells.filter((s) => !['ok', 'SANDBOX_NOT_RUNNING', 'SANDBOX_NOT_FOUND', 'UNAVAILABLE'].includes(s)), []);
        // After the delete: everything is 404.
        for (const [m, p] of [['POST', '/exec'], ['GET', '/files?path=/etc/passwd'], ['GET', '/sessions'], ['DELETE', '']] as const) {
          const r = await req(m, p, m === 'POST' ? { cmd: 'true' } : undefined);
          t.is(r.status, 404, `${m} ${p} after delete: ${r.text}`);
          t.is(r.json?.error?.code, 'SANDBOX_NOT_FOUND');
        }
      }
    },
    { onLog: (l) => logs.push(l) },
  );
  t.deepEqual(noisy(logs), []);
});
