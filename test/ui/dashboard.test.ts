/**
 * The dashboard in a real browser (Debian's chromium, headless, driven by
 * puppeteer-core) against a real `warren up`: login (and a stale token),
 * creating a sandbox from the form, a pty terminal that survives a reload,
 * uploads, ownership between runtime accounts, labels with markup shown as
 * text, a FnCall judge, and the live egress-denial feed. The steps share one
 * node and one browser (serial) so the whole file costs seconds.
 *
 * With WARREN_UI_SCREENSHOTS=<dir> the steps also save screenshots of the
 * main pages there (scripts/ui-screenshots.js, for docs/ui).
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import puppeteer, { type Browser, type Page } from 'puppeteer-core';
import { native } from '../../src/native';
import { removeTree } from '../../src/shim/layers/sys';
import { HostNetwork } from '../../src/shim/network/host-net';
import { WarrenClient } from '../../src/sdk';
import { egressSkipReason, SERVICE_PORT, startInternet, type Internet } from '../helpers/network';
import { parseProbeOutput, probeArgv } from '../helpers/net-probe';
import { testUnless } from '../helpers/skip';
import { openTestShim } from '../helpers/warren';
import { kill9, startWarrenProcess, stopGracefully } from '../helpers/warren-process';

const CHROMIUM = '/usr/bin/chromium';

function skipReason(): string | null {
  if (process.getuid?.() !== 0) return 'requires root (sandboxes)';
  if (!existsSync(CHROMIUM)) return `${CHROMIUM} is missing (apt-get install chromium; scripts/setup.sh installs it)`;
  return null;
}

const skip = skipReason();
const test = testUnless(skip);
const it = test.serial;
const netSkip = skip ?? egressSkipReason();
const itNet = testUnless(netSkip).serial;
const shots = process.env.WARREN_UI_SCREENSHOTS;
const tag = `u${process.pid.toString(36)}`;

interface Fixture {
  dataDir: string;
  nodeId: string;
  child: ChildProcess | null;
  url: string;
  adminToken: string;
  admin: WarrenClient;
  alice: { id: string; token: string };
  bob: { id: string; token: string };
  browser: Browser;
  page: Page;
  profile: string;
  net: Internet | null;
  /** Console errors about the Content-Security-Policy (must stay empty). */
  cspViolations: string[];
  sandboxes: string[];
}

let fx: Fixture | null = null;
const XSS_LABEL = '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">';

async function shot(page: Page, name: string): Promise<void> {
  if (!shots) return;
  mkdirSync(shots, { recursive: true });
  await page.evaluate('window.scrollTo(0, 0)');
  await page.screenshot({ path: join(shots, `${name}.png`) as `${string}.png`, fullPage: true });
}

async function text(page: Page, selector: string): Promise<string> {
  return page.$eval(selector, (el) => (el as unknown as { textContent: string }).textContent);
}

/** Wait until `selector`'s text matches. */
async function waitText(page: Page, selector: string, re: RegExp, timeout = 15_000): Promise<string> {
  const until = Date.now() + timeout;
  let last = '';
  while (Date.now() < until) {
    last = (await page.$(selector)) ? await text(page, selector) : '';
    if (re.test(last)) return last;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${selector}: ${re} not seen within ${timeout} ms; last text: ${last.slice(0, 600)}`);
}

/** Click through the DOM (not at screen coordinates: polled content above may move the element meanwhile). */
async function press(page: Page, selector: string): Promise<void> {
  await page.waitForSelector(selector);
  await page.$eval(selector, (el) => (el as unknown as { click(): void }).click());
}

async function login(page: Page, url: string, token: string): Promise<void> {
  await page.goto(`${url}/ui/`, { waitUntil: 'domcontentloaded' });
  // start from the login page whoever was logged in before
  await page.evaluate('sessionStorage.removeItem("warren.token")');
  await page.reload({ waitUntil: 'domcontentloaded' });
  await page.waitForSelector('#token');
  await page.type('#token', token);
  await press(page, '#login-submit');
  await page.waitForSelector('#who');
}

/** The rows xterm.js renders (its DOM renderer), as text. */
async function terminalRows(page: Page): Promise<string[]> {
  return page.$$eval('.xterm-rows > div', (rows) => rows.map((r) => (r as unknown as { textContent: string }).textContent.replace(/\u00a0/g, ' ').trimEnd()));
}

test.before(async () => {
  if (skip !== null) return;
  const dataDir = mkdtempSync(join(tmpdir(), 'warren-ui-'));
  const nodeId = tag;
  let net: Internet | null = null;
  let child: ChildProcess | null = null;
  let browser: Browser | null = null;
  let admin: WarrenClient | null = null;
  const profile = mkdtempSync(join(tmpdir(), 'warren-ui-chromium-'));
  try {
    net = netSkip === null ? await startInternet(tag) : null;
    {
      // the judge image (python3, bash) in this data dir, from the node cache
      const f = await openTestShim({ dataDir, nodeId });
      await f.shim.functions.ensureJudgeImage();
      await f.shim.close();
      f.shim.layers.unmountUnused();
    }
    const proc = await startWarrenProcess(dataDir, nodeId, net?.upArgs ?? []);
    child = proc.child;
    const adminToken = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    admin = new WarrenClient({ url: proc.url, token: adminToken });
    const a = await admin.createAccount('ui-alice', 'runtime');
    const b = await admin.createAccount('ui-bob', 'runtime');
    await admin.functions.create({ name: 'ui-py', image: 'judge', min: 1, max: 1 }, { wait: true });
    browser = await puppeteer.launch({
      executablePath: CHROMIUM,
      headless: true,
      userDataDir: profile,
      args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--disable-dev-shm-usage'],
      defaultViewport: { width: 1360, height: 860 },
    });
    const page = await browser.newPage();
    const cspViolations: string[] = [];
    page.on('console', (m) => {
      if (/Content.Security.Policy/i.test(m.text())) cspViolations.push(m.text());
    });
    fx = { dataDir, nodeId, child: proc.child, url: proc.url, adminToken, admin, alice: { id: a.id, token: a.token }, bob: { id: b.id, token: b.token }, browser, page, profile, net, cspViolations, sandboxes: [] };
  } catch (err) {
    // nothing of a half-made fixture may outlive the run
    await browser?.close().catch(() => undefined);
    await admin?.close().catch(() => undefined);
    if (child) await kill9(child);
    if (net) {
      await new HostNetwork({ bridge: net.network.bridge, subnet: net.network.subnet, nftTable: net.network.nftTable }).teardown().catch(() => undefined);
      await net.close();
    }
    rmSync(profile, { recursive: true, force: true });
    rmSync(`/sys/fs/bpf/warren/${nodeId}`, { recursive: true, force: true });
    try {
      removeTree(dataDir);
    } catch {
      /* best effort */
    }
    throw err;
  }
});

test.after.always(async () => {
  if (fx === null) return;
  const f = fx;
  await f.browser.close().catch(() => undefined);
  rmSync(f.profile, { recursive: true, force: true });
  for (const id of f.sandboxes) await f.admin.deleteSandbox(id).catch(() => undefined);
  await f.admin.functions.delete('ui-py').catch(() => undefined);
  await f.admin.close().catch(() => undefined);
  if (f.child) await stopGracefully(f.child).catch(() => (f.child ? kill9(f.child) : undefined));
  if (f.net) {
    await new HostNetwork({ bridge: f.net.network.bridge, subnet: f.net.network.subnet, nftTable: f.net.network.nftTable }).teardown().catch(() => undefined);
    await f.net.close();
  }
  rmSync(`/sys/fs/bpf/warren/${f.nodeId}`, { recursive: true, force: true });
  try {
    removeTree(f.dataDir);
  } catch {
    /* best effort */
  }
});

it(`a stale token gets the login page with the API's error; /ui has a strict CSP`, async (t) => {
  const { page, url } = fx!;
  const res = await page.goto(`${url}/ui/`, { waitUntil: 'domcontentloaded' });
  const csp = res!.headers()['content-security-policy'] ?? '';
  t.regex(csp, /default-src 'none'/);
  t.regex(csp, /script-src 'self'(;|$)/, 'no inline or remote scripts');
  t.notRegex(csp, /unsafe-inline|unsafe-eval|https?:/);
  await page.waitForSelector('#token');
  await page.type('#token', 'wrn_this-token-was-never-issued');
  await press(page, '#login-submit');
  const err = await waitText(page, '#login-error', /UNAUTHENTICATED/);
  t.regex(err, /UNAUTHENTICATED/);
  t.is(await page.evaluate('sessionStorage.getItem("warren.token")'), null, 'the bad token is forgotten');
  await shot(page, 'login');
});

it(`create from the form (with a ttl); filters; a label with markup renders as text`, async (t) => {
  const f = fx!;
  const { page } = f;
  await login(page, f.url, f.alice.token);
  await page.goto(`${f.url}/ui/#/sandboxes?create=1`);
  await page.waitForSelector('#create-form');
  await page.$eval('#create-image', (el) => ((el as unknown as { value: string }).value = ''));
  await page.type('#create-image', 'judge');
  await page.type('#create-labels', `purpose=ui-test\nxss=${XSS_LABEL}`);
  await page.type('#create-ttl', '3600');
  await press(page, '#create-submit');
  await page.waitForFunction('/^#\\/sandboxes\\/[a-z0-9-]+$/.test(location.hash)', { timeout: 20_000 });
  const id = String(await page.evaluate('location.hash.split("/")[2]'));
  f.sandboxes.push(id);
  const sb = await f.admin.getSandbox(id);
  t.is(sb.info!.owner, f.alice.id, 'created as the logged-in account');
  t.is(sb.info!.labels.xss, XSS_LABEL);
  const main = await waitText(page, '#main', /running/);
  t.regex(await waitText(page, '#lifecycle', /expires/), /expiresin (59m|1h)/, 'the ttl from the form is the lifecycle clock');
  t.true(main.includes(XSS_LABEL), 'the label is shown verbatim, as text');
  t.is(await page.evaluate('window.__pwned'), undefined, 'nothing in the label ran');
  t.is(await page.evaluate('document.querySelectorAll("#main script, #main img").length'), 0, 'no element came from the label');
  await page.goto(`${f.url}/ui/#/sandboxes`);
  await waitText(page, '#sandbox-list', new RegExp(id));
  t.true((await text(page, '#sandbox-list')).includes(XSS_LABEL));
  t.is(await page.evaluate('window.__pwned'), undefined);
  await waitText(page, '#sandbox-list', /\d+(\.\d)? (KiB|MiB) \/ 512 MiB/);
  // filters: by label (server side) and by state
  await page.type('#filter-label', 'purpose=nope');
  await page.$eval('#filter-label', (el) => (el as unknown as { dispatchEvent(e: unknown): void }).dispatchEvent(new (globalThis as unknown as { Event: new (n: string) => unknown }).Event('change')));
  await waitText(page, '#sandbox-list', /no sandboxes/);
  t.regex(String(await page.evaluate('location.hash')), /label=purpose%3Dnope/, 'the filter is in the URL');
  await page.$eval('#filter-label', (el) => ((el as unknown as { value: string }).value = ''));
  await page.type('#filter-label', 'purpose=ui-test');
  await page.$eval('#filter-label', (el) => (el as unknown as { dispatchEvent(e: unknown): void }).dispatchEvent(new (globalThis as unknown as { Event: new (n: string) => unknown }).Event('change')));
  await waitText(page, '#sandbox-list', new RegExp(id));
  await page.select('#filter-state', 'paused');
  await waitText(page, '#sandbox-list', /no sandboxes/);
  await page.select('#filter-state', '');
  await waitText(page, '#sandbox-list', new RegExp(id));
  await shot(page, 'sandboxes');
});

it(`terminal: echo $((6*7)) prints 42, a reload re-attaches to the same session, resize reaches the pty, copy and paste`, async (t) => {
  const f = fx!;
  const { page } = f;
  const id = f.sandboxes[0]!;
  await page.goto(`${f.url}/ui/#/sandboxes/${id}/terminal`);
  await page.waitForSelector('.xterm-helper-textarea');
  await page.waitForFunction('document.querySelector("#term-status")?.dataset.session', { timeout: 15_000 });
  const session = String(await page.evaluate('document.querySelector("#term-status").dataset.session'));
  // type once the shell shows its prompt (keys typed earlier are echoed by the tty before bash draws it)
  const prompt = Date.now() + 10_000;
  while (!(await terminalRows(page)).some((r) => /[#$]$/.test(r)) && Date.now() < prompt) await new Promise((r) => setTimeout(r, 100));
  await page.focus('.xterm-helper-textarea');
  await page.keyboard.type('echo $((6*7))\n');
  const deadline = Date.now() + 10_000;
  while (!(await terminalRows(page)).includes('42') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  t.true((await terminalRows(page)).includes('42'), `42 on a line of its own: ${JSON.stringify(await terminalRows(page))}`);
  t.true(String(await page.evaluate('location.hash')).includes(`session=${session}`), 'the session id is in the URL');
  const sessions = (await f.admin.getSandbox(id).then((s) => s.sessions())).filter((s) => s.alive);
  t.is(sessions.length, 1);
  await shot(page, 'terminal');

  await page.reload({ waitUntil: 'domcontentloaded' });
  await page.waitForFunction('document.querySelector("#term-status")?.dataset.session', { timeout: 15_000 });
  t.is(await page.evaluate('document.querySelector("#term-status").dataset.session'), session, 'the same session after a reload');
  const again = Date.now() + 10_000;
  while (!(await terminalRows(page)).includes('42') && Date.now() < again) await new Promise((r) => setTimeout(r, 100));
  t.true((await terminalRows(page)).includes('42'), 'its output is replayed');
  await page.focus('.xterm-helper-textarea');
  await page.keyboard.type('echo again-$((2+3))\n');
  const more = Date.now() + 10_000;
  while (!(await terminalRows(page)).includes('again-5') && Date.now() < more) await new Promise((r) => setTimeout(r, 100));
  t.true((await terminalRows(page)).includes('again-5'), 'and it still takes input');
  t.is((await (await f.admin.getSandbox(id)).sessions()).filter((s) => s.alive).length, 1, 'no second session was opened');

  // resize: the terminal follows the window, and the pty with it
  const size = async (): Promise<string> => {
    const marker = `size-${Math.random().toString(36).slice(2, 8)}`;
    await page.keyboard.type(`echo ${marker} $(stty size)\n`);
    const until = Date.now() + 10_000;
    for (;;) {
      const line = (await terminalRows(page)).find((r) => r.startsWith(`${marker} `));
      if (line) return line.slice(marker.length + 1);
      if (Date.now() > until) throw new Error(`no stty output: ${JSON.stringify(await terminalRows(page))}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  const before = await size();
  await page.setViewport({ width: 900, height: 700 });
  const resizeBy = Date.now() + 10_000;
  let after = await size();
  while (after === before && Date.now() < resizeBy) after = await size();
  t.not(after, before, `stty size follows the window (${before} -> ${after})`);
  await page.setViewport({ width: 1360, height: 860 });

  // paste from the clipboard into the shell, copy a selected line back out
  await f.browser.defaultBrowserContext().overridePermissions(f.url, ['clipboard-read', 'clipboard-write', 'clipboard-sanitized-write']);
  await page.evaluate('navigator.clipboard.writeText("echo pasted-$((20+22))")');
  await press(page, '#term-paste');
  await page.focus('.xterm-helper-textarea');
  await page.keyboard.press('Enter');
  const pasted = Date.now() + 10_000;
  while (!(await terminalRows(page)).includes('pasted-42') && Date.now() < pasted) await new Promise((r) => setTimeout(r, 100));
  t.true((await terminalRows(page)).includes('pasted-42'), 'the pasted command ran');
  const rowIndex = (await terminalRows(page)).indexOf('pasted-42');
  const row = (await page.$$('.xterm-rows > div'))[rowIndex]!;
  const box = (await row.boundingBox())!;
  await page.mouse.click(box.x + 20, box.y + box.height / 2, { count: 3 });
  await press(page, '#term-copy');
  t.regex(String(await page.evaluate('navigator.clipboard.readText()')), /^pasted-42\s*$/, 'the selected line was copied');
});

it(`files: upload a file, see it listed, view it as text, download it`, async (t) => {
  const f = fx!;
  const { page } = f;
  const id = f.sandboxes[0]!;
  const local = join(f.profile, '<i>up load.txt');
  writeFileSync(local, 'hello from the browser <b>not bold</b>\n');
  await page.goto(`${f.url}/ui/#/sandboxes/${id}/files?path=%2Ftmp`);
  await page.waitForSelector('#upload-input');
  const input = await page.$('#upload-input');
  await (input as unknown as { uploadFile(p: string): Promise<void> }).uploadFile(local);
  await press(page, '#upload-submit');
  await waitText(page, '#file-list', /<i>up load\.txt/);
  const sb = await f.admin.getSandbox(id);
  t.is((await sb.readFile('/tmp/<i>up load.txt')).toString(), 'hello from the browser <b>not bold</b>\n', 'the bytes arrived');
  await page.$$eval('#file-list a.file', (as) => {
    for (const a of as) if ((a as unknown as { textContent: string }).textContent.includes('up load')) (a as unknown as { click(): void }).click();
  });
  const shown = await waitText(page, '#file-viewer', /hello from the browser/);
  t.true(shown.includes('<b>not bold</b>'), 'file content shown as text');
  t.is(await page.evaluate('document.querySelectorAll("#main i, #main b").length'), 0, 'no markup from names or content');
  // download: the bytes come back through the browser's own download
  const downloads = join(f.profile, 'downloads');
  mkdirSync(downloads);
  const cdp = await page.createCDPSession();
  await cdp.send('Browser.setDownloadBehavior', { behavior: 'allow', downloadPath: downloads });
  await page.$$eval('#file-viewer button', (bs) => (bs[0] as unknown as { click(): void }).click());
  const downloaded = Date.now() + 10_000;
  let got: string[] = [];
  while (Date.now() < downloaded) {
    got = readdirSync(downloads).filter((n) => !n.endsWith('.crdownload'));
    if (got.length > 0) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  t.is(got.length, 1, 'one file downloaded');
  t.is(readFileSync(join(downloads, got[0]!), 'utf8'), 'hello from the browser <b>not bold</b>\n');
  await cdp.detach();
  await shot(page, 'files');
});

it(`a runtime account cannot see another account's sandbox`, async (t) => {
  const f = fx!;
  const { page } = f;
  const id = f.sandboxes[0]!;
  await login(page, f.url, f.bob.token);
  t.regex(await text(page, '#who'), /ui-bob \(runtime\)/);
  await page.goto(`${f.url}/ui/#/sandboxes`);
  await waitText(page, '#sandbox-list', /no sandboxes/);
  t.false((await text(page, '#sandbox-list')).includes(id));
  await page.goto(`${f.url}/ui/#/sandboxes/${id}`);
  const main = await waitText(page, '#main', /SANDBOX_NOT_FOUND/);
  t.false(main.includes('ui-test'), 'nothing of it is shown');
  await page.goto(`${f.url}/ui/#/network`);
  await waitText(page, '#policy', /FORBIDDEN/);
  t.regex(await text(page, '#policy'), /shown to admins/);
});

it(`FnCall: a judge run from the form gets its verdict`, async (t) => {
  const f = fx!;
  const { page } = f;
  await login(page, f.url, f.alice.token);
  await page.goto(`${f.url}/ui/#/fncall`);
  await waitText(page, '#pools', /ui-py/);
  await page.waitForFunction('document.querySelector("#fn-pool").value === "ui-py"');
  await press(page, '#fn-submit');
  const verdict = await waitText(page, '#fn-verdict', /^(AC|WA|RE|TLE|MLE|CE|OLE|IE)$/, 30_000);
  t.is(verdict, 'AC');
  t.regex(await text(page, '#fn-result'), /2 \/ 2 passed/);
  await waitText(page, '#pools', /ui-py.*ready/);
  // the sampled latency of the pool appears with the next sample (every 2 s)
  await waitText(page, '#pool-plots', /p50 \d/);
  await shot(page, 'fncall');
});

itNet(`network: a denied connect shows in the live feed; admins validate the policy`, async (t) => {
  const f = fx!;
  const { page } = f;
  const net = f.net!;
  const sb = await f.admin.createSandbox({ image: 'judge', network: { pypi: true }, memoryMb: 256, labels: { purpose: 'ui-denials' } });
  f.sandboxes.push(sb.id);
  const probe = parseProbeOutput((await sb.exec(probeArgv([{ kind: 'tcp', host: net.npm.address, port: SERVICE_PORT }]))).stdout);
  t.is(probe[0]!.outcome, 'EPERM', 'the kernel denied it');
  await login(page, f.url, f.adminToken);
  await page.goto(`${f.url}/ui/#/network`);
  const feed = await waitText(page, '#denials', new RegExp(net.npm.address.replace(/\./g, '\\.')));
  t.true(feed.includes(sb.id), 'with the sandbox');
  await press(page, '#policy-validate');
  await waitText(page, '#policy-outcome', /valid/);
  t.regex(await text(page, '#policy'), /Audit log/);
  await shot(page, 'network');
  await page.goto(`${f.url}/ui/#/sandboxes/${sb.id}`);
  await waitText(page, '#sandbox-network', new RegExp(net.npm.address.replace(/\./g, '\\.')));
  await waitText(page, '#usage-plots', /current \d/);
  // two samples give a cpu figure
  await waitText(page, '#usage-plots', /cpu % \d/);
  await shot(page, 'sandbox');
});

it(`overview plots and the nodes page say what is absent; no CSP violations`, async (t) => {
  const f = fx!;
  const { page } = f;
  await login(page, f.url, f.adminToken);
  // pause from the list: the memory it gives back is plotted on the overview
  await page.goto(`${f.url}/ui/#/sandboxes`);
  await waitText(page, '#sandbox-list', new RegExp(f.sandboxes[0]!));
  await page.$$eval('#sandbox-list tr', (rows, id) => {
    for (const r of rows) {
      const row = r as unknown as { textContent: string; querySelectorAll(s: string): { textContent: string; click(): void }[] };
      if (!row.textContent.includes(id)) continue;
      for (const b of row.querySelectorAll('button')) if (b.textContent === 'Pause') b.click();
    }
  }, f.sandboxes[0]!);
  t.regex(await waitText(page, '#status', /released/), /paused .* released/);
  t.is((await f.admin.getSandbox(f.sandboxes[0]!)).info!.state, 'paused');
  await page.goto(`${f.url}/ui/#/overview`);
  await waitText(page, '#overview-plots', /released \d/);
  await waitText(page, '#overview-plots', /Create latency/);
  t.is(await page.evaluate('document.querySelectorAll("#overview-plots svg").length') as number >= 1, true, 'at least one plot drawn');
  await shot(page, 'overview');
  await page.goto(`${f.url}/ui/#/nodes`);
  const nodes = await waitText(page, '#nodes', /cluster not configured/);
  t.true(nodes.includes(f.nodeId));
  await waitText(page, '#jobs', /cluster not configured/);
  await shot(page, 'nodes');
  await press(page, '#logout');
  await page.waitForSelector('#token');
  t.is(await page.evaluate('sessionStorage.getItem("warren.token")'), null, 'logging out forgets the token');
  t.deepEqual(f.cspViolations, [], 'the page runs under its CSP without violations (xterm styles carry the nonce)');
  // the sandboxes are gone after delete (nothing leaks)
  for (const id of f.sandboxes) await f.admin.deleteSandbox(id);
  for (const id of f.sandboxes) t.false(native.cgroupExists(id), `cgroup of ${id} removed`);
  f.sandboxes = [];
});
