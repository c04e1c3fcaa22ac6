/**
 * The dashboard's routes on a real gateway and node: static files with their
 * CSP, the read-only /v1/ui views and their ownership rule, and the shell
 * WebSocket from the gateway's own origin. (The browser itself: test/ui.)
 */
import { existsSync } from 'node:fs';
import WebSocket from 'ws';
import { UI_DIR } from '../../src/gateway/routes/ui';
import { testUnless } from '../helpers/skip';
import { integrationSkipReason, rawRequest, withGateway } from './gateway-fixture';

const test = testUnless(integrationSkipReason() ?? (existsSync(UI_DIR) ? null : `the dashboard is not built in ${UI_DIR} (npm run build:ui)`));

/** Open a shell WebSocket as a browser would; resolves with the hello frame's type or the refusal status. */
function browserShell(url: string, id: string, token: string, origin: string, host?: string): Promise<{ ok: boolean; status?: number; code?: string; hello?: string }> {
  return new Promise((resolve) => {
    const opts: WebSocket.ClientOptions = { origin, perMessageDeflate: false };
    if (host) opts.headers = { host };
    const ws = new WebSocket(`${url.replace(/^http/, 'ws')}/v1/sandboxes/${id}/shell`, ['warren.v1', `bearer.${token}`], opts);
    ws.once('message', (d: Buffer) => {
      resolve({ ok: true, hello: JSON.parse(d.toString()).type });
      ws.close();
    });
    ws.once('unexpected-response', (_req, res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ ok: false, status: res.statusCode ?? 0, code: JSON.parse(body).error.code }));
    });
    ws.once('error', () => undefined);
  });
}

test('static files: the page with a per-answer nonce and a strict CSP; nothing outside dist/ui', async (t) => {
  await withGateway(t, async ({ url }) => {
    const redirect = await rawRequest(url, { path: '/ui' });
    t.is(redirect.status, 302);
    t.is(redirect.headers.location, '/ui/');
    const a = await rawRequest(url, { path: '/ui/' });
    const b = await rawRequest(url, { path: '/ui/index.html' });
    t.is(a.status, 200);
    t.regex(String(a.headers['content-type']), /^text\/html/);
    const csp = String(a.headers['content-security-policy']);
    const nonce = /'nonce-([^']+)'/.exec(csp)?.[1];
    t.truthy(nonce);
    t.true(a.text.includes(`nonce="${nonce}"`), 'the page carries the nonce of its own CSP');
    t.notRegex(a.text, /__CSP_NONCE__/);
    t.not(nonce, /'nonce-([^']+)'/.exec(String(b.headers['content-security-policy']))?.[1], 'a new nonce per answer');
    t.is(a.headers['x-content-type-options'], 'nosniff');
    t.is(a.headers['x-frame-options'], 'DENY');
    const js = await rawRequest(url, { path: '/ui/app.js' });
    t.is(js.status, 200);
    t.regex(String(js.headers['content-type']), /^text\/javascript/);
    t.false(/https?:\/\/(?!www\.w3\.org)[a-z0-9.-]+\.[a-z]{2,}\/[^\s"']*\.(js|css)\b/.test(js.text), 'no remote scripts or styles referenced');
    for (const path of ['/ui/..%2f..%2fpackage.json', '/ui/%2e%2e', '/ui/nothing.js', '/ui/app.ts']) {
      const r = await rawRequest(url, { path });
      t.is(r.status, 404, path);
      t.is(r.json?.error?.code, 'NOT_FOUND', path);
    }
  });
});

test('/v1/ui views: authenticated, own sandboxes only for runtime accounts, node-wide series for admins', async (t) => {
  await withGateway(t, async ({ url, admin, adminToken, account }) => {
    const alice = account('runtime');
    const bob = account('runtime');
    const sb = await alice.client.createSandbox({ image: 'busybox', memoryMb: 64, labels: { who: 'alice' } });
    for (const path of ['/v1/ui/metrics', '/v1/ui/usage', '/v1/ui/denials', `/v1/ui/sandboxes/${sb.id}/usage`, '/v1/ui/policy']) {
      t.is((await rawRequest(url, { path })).status, 401, `${path} needs a token`);
    }
    const mine = await rawRequest(url, { path: '/v1/ui/usage', token: alice.token });
    t.is(mine.status, 200);
    t.true(mine.json.sandboxes[sb.id].memoryBytes > 0, 'memory read from the cgroup');
    t.deepEqual(Object.keys((await rawRequest(url, { path: '/v1/ui/usage', token: bob.token })).json.sandboxes), [], "bob sees none of alice's");
    const foreign = await rawRequest(url, { path: `/v1/ui/sandboxes/${sb.id}/usage`, token: bob.token });
    t.deepEqual([foreign.status, foreign.json.error.code], [404, 'SANDBOX_NOT_FOUND']);
    t.is((await rawRequest(url, { path: `/v1/ui/sandboxes/${sb.id}/usage`, token: alice.token })).json.samples.length >= 1, true);

    const bm = (await rawRequest(url, { path: '/v1/ui/metrics', token: bob.token })).json;
    t.is(bm.scope, 'account');
    t.is(bm.live.at(-1).v, 0, "bob's own live count");
    t.is(bm.createMs, undefined, 'node-wide series are for admins');
    const am = (await rawRequest(url, { path: '/v1/ui/metrics', token: adminToken })).json;
    t.is(am.scope, 'node');
    t.true(am.live.at(-1).v >= 1);
    t.true(am.createMs.some((s: { v: number }) => s.v > 0), 'the create latency was kept');
    t.is((await rawRequest(url, { path: '/v1/ui/metrics?since=x', token: adminToken })).json.error.code, 'INVALID_ARGUMENT');
    t.is((await rawRequest(url, { path: '/v1/ui/metrics?other=1', token: adminToken })).json.error.code, 'UNKNOWN_FIELD');
    const later = (await rawRequest(url, { path: `/v1/ui/metrics?since=${am.now}`, token: adminToken })).json;
    t.true(later.live.every((p: { t: number }) => p.t > am.now));

    // watching is not touching: usage polls leave a paused sandbox paused
    await sb.pause();
    const released = (await rawRequest(url, { path: '/v1/ui/metrics', token: adminToken })).json.pauseReleasedBytes;
    t.true(released.length >= 1, 'the pause was recorded');
    for (let i = 0; i < 3; i++) await rawRequest(url, { path: '/v1/ui/usage', token: alice.token });
    t.is((await admin.getSandbox(sb.id)).info!.state, 'paused');

    t.is((await rawRequest(url, { path: '/v1/ui/denials', token: bob.token })).json.denials.length, 0);
    t.is((await rawRequest(url, { path: '/v1/ui/policy', token: bob.token })).json.error.code, 'FORBIDDEN');
    t.is((await rawRequest(url, { method: 'POST', path: '/v1/ui/policy/validate', token: bob.token })).json.error.code, 'FORBIDDEN');
    const v = await rawRequest(url, { method: 'POST', path: '/v1/ui/policy/validate', token: adminToken });
    t.is(v.status, 200);
    t.true(v.json.valid);
    t.deepEqual(v.json.changes, [], 'the directory in force validates with no changes');
    const pol = await rawRequest(url, { path: '/v1/ui/policy', token: adminToken });
    t.is(pol.status, 200);
    t.true(Array.isArray(pol.json.audit));
    await sb.delete();
  });
});

test("shells open from the gateway's own origin; other origins stay refused", async (t) => {
  await withGateway(t, async ({ url, admin, adminToken }) => {
    const sb = await admin.createSandbox({ image: 'busybox', memoryMb: 64 });
    const own = new URL(url).host;
    t.deepEqual(await browserShell(url, sb.id, adminToken, `http://${own}`), { ok: true, hello: 'hello' });
    const evil = await browserShell(url, sb.id, adminToken, 'https://evil.example');
    t.deepEqual([evil.status, evil.code], [403, 'ORIGIN_REFUSED']);
    // a page elsewhere cannot claim our origin: its requests are addressed to its own host
    const spoof = await browserShell(url, sb.id, adminToken, `http://${own}`, 'evil.example');
    t.deepEqual([spoof.status, spoof.code], [403, 'ORIGIN_REFUSED']);
    await sb.delete();
  });
});
