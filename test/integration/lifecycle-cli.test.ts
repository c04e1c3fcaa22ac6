/** The lifecycle commands of the `warren` CLI against a live gateway (in-process main(), real shim). */
import { main } from '../../src/cli/main';
import { integrationSkipReason, withGateway } from './gateway-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
const it = testUnless(skip);

async function warren(env: Record<string, string>, ...argv: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await main(argv, { out: (s) => void (out += s), err: (s) => void (err += s), env });
  return { code, out, err };
}

it(`warren create --ttl/--idle, pause, resume, extend, pack, env, quota`, async (t) => {
  await withGateway(t, async ({ url, adminToken, account }) => {
    const env = { WARREN_URL: url, WARREN_TOKEN: adminToken };
    const created = await warren(env, 'create', '--image', 'busybox', '--ttl', '600', '--idle', '300', '--on-idle', 'pause', '--label', 'job=cli');
    t.is(created.code, 0, created.err);
    const id = created.out.trim();
    const paused = await warren(env, 'pause', '--label', 'job=cli');
    t.is(paused.code, 0, paused.err);
    t.regex(paused.out, new RegExp(`${id}\\s+paused\\s+yes`));
    const resumed = await warren(env, 'resume', id);
    t.regex(resumed.out, new RegExp(`${id}\\s+running\\s+yes`));
    const ext = await warren(env, 'extend', id, '--seconds', '60');
    t.is(ext.code, 0, ext.err);
    t.regex(ext.out, /expires at 20\d\d-/);
    const ex = await warren(env, 'exec', id, '--', 'sh', '-c', 'echo hi > /root/srv-file');
    t.is(ex.code, 0, ex.err + ex.out);
    const packed = await warren(env, 'pack', id, 'cli-env', '--scrub', '/tmp/*', '--publish');
    t.is(packed.code, 0, packed.err);
    t.regex(packed.out, /^cli-env sha256:[0-9a-f]{64}\n/);
    t.regex(packed.out, /published: yes/);
    const ls = await warren(env, 'env', 'ls');
    t.regex(ls.out, /cli-env\s+yes/);
    const rt = account('runtime');
    t.is((await warren(env, 'quota', rt.id, '--sandboxes', '1')).code, 0);
    const q = await warren({ WARREN_URL: url, WARREN_TOKEN: rt.token }, 'quota');
    t.regex(q.out, /sandboxes\s+1\s+0/);
    const denied = await warren({ WARREN_URL: url, WARREN_TOKEN: rt.token }, 'pack', id, 'x');
    t.is(denied.code, 1);
    t.regex(denied.err, /FORBIDDEN/);
    t.is((await warren(env, 'rm', id)).code, 0);
    t.is((await warren(env, 'pause')).code, 2, 'usage error without ids or labels');
  });
});
