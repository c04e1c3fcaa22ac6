/**
 * The TypeScript SDK end to end against a real gateway and a REAL shim.
 * Needs root and the container backend; skips with the reason otherwise.
 */
import { WarrenClient, WarrenError } from '../../src/sdk';
import { integrationSkipReason, withGateway } from './gateway-fixture';
import { testUnless } from '../helpers/skip';
import { elapse } from '../helpers/wait';

const skip = integrationSkipReason();
const test = testUnless(skip);

test('health, features, images', async (t) => {
  await withGateway(t, async ({ admin, url }) => {
    const h = await admin.health();
    t.is(h.status, 'ok');
    const f = await admin.features();
    t.true(f.backends.container.available);
    t.true(Object.keys(f.features).length > 0);
    t.true((await admin.images.list()).some((i) => i.name === 'busybox'));
    // health needs no token
    const anon = new WarrenClient({ url });
    t.is((await anon.health()).status, 'ok');
    await t.throwsAsync(anon.listSandboxes(), { instanceOf: WarrenError, code: 'UNAUTHENTICATED' } as never);
    await anon.close();
  });
});

test('sandbox helpers: exec, files, archives, shell', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox', memoryMb: 128, labels: { sdk: 'yes' } });
    t.log(`sandbox ${sb.id}`);
    t.is(sb.state, 'running');
    t.is(sb.info?.image, 'busybox');

    const r = await sb.exec(['echo', 'hello']);
    t.is(r.exitCode, 0);
    t.is(r.stdout, 'hello\n');

    await sb.writeFile('/tmp/a/b.txt', 'contents', 0o640);
    t.is((await sb.readFile('/tmp/a/b.txt')).toString(), 'contents');
    const entries = await sb.listDir('/tmp/a');
    t.is(entries[0]?.name, 'b.txt');
    t.is(entries[0]?.mode, 0o640);

    const tar = await sb.downloadTar('/tmp/a');
    await sb.uploadTar('/copy', tar);
    t.is((await sb.readFile('/copy/a/b.txt')).toString(), 'contents');

    const shell = await sb.shell({ mode: 'command' });
    t.regex(shell.session, /^s-/);
    t.deepEqual(await shell.run('cd /tmp/a && X=42'), { exitCode: 0, stdout: '', stderr: '', timedOut: false });
    t.deepEqual(await shell.run('echo $X; pwd; echo oops >&2; false'), { exitCode: 1, stdout: '42\n/tmp/a\n', stderr: 'oops\n', timedOut: false });
    const timed = await shell.run('sleep 20', { timeoutMs: 300 });
    t.true(timed.timedOut);
    // concurrent runs are queued, not refused
    const [a, b] = await Promise.all([shell.run('echo one'), shell.run('echo two')]);
    t.is(a.stdout, 'one\n');
    t.is(b.stdout, 'two\n');

    // detach and re-attach from the offset: nothing before it is replayed
    const session = shell.session;
    const offset = shell.offset;
    await shell.detach();
    const again = await sb.shell({ session, offset });
    const seen: string[] = [];
    again.on('output', (o) => seen.push(o.data.toString()));
    t.is((await again.run('echo resumed')).stdout, 'resumed\n');
    t.false(seen.join('').includes('one'));
    const exit = await again.close();
    t.truthy(exit);
    t.false((await sb.sessions()).some((s) => s.id === session && s.alive));

    t.deepEqual((await admin.listSandboxes({ labels: { sdk: 'yes' } })).map((s) => s.id), [sb.id]);
    await sb.delete();
    await t.throwsAsync(admin.getSandbox(sb.id), { instanceOf: WarrenError, code: 'SANDBOX_NOT_FOUND' } as never);
  });
});

test('pty shells: raw bytes out, write, resize', async (t) => {
  await withGateway(t, async ({ admin }) => {
    const sb = await admin.createSandbox({ image: 'busybox' });
    const chunks: Buffer[] = [];
    const sh = await sb.shell({ mode: 'pty', cols: 90, rows: 20, onOutput: (o) => chunks.push(o.data) });
    t.is(sh.mode, 'pty');
    const until = async (needle: string) => {
      const deadline = Date.now() + 10_000;
      while (!Buffer.concat(chunks).toString().includes(needle)) {
        if (Date.now() > deadline) {
          // what the session itself holds, from its first byte, through a second attachment:
          // tells input that never reached the shell from output that never reached this client
          const held: Buffer[] = [];
          const again = await sb.shell({ session: sh.session, offset: 0, reconnect: false, onOutput: (o) => held.push(o.data) });
          await elapse(2000, 'the replay of the whole session');
          await again.detach();
          throw new Error(`no ${needle} in ${JSON.stringify(Buffer.concat(chunks).toString())} (offset ${sh.offset}); the session holds ${JSON.stringify(Buffer.concat(held).toString())}`);
        }
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    sh.write('stty size\r');
    await until('20 90');
    sh.resize(132, 43);
    sh.write('stty size\r');
    await until('43 132');
    t.true(sh.offset > 0);
    sh.write('exit 3\r');
    await sh.waitClosed();
    t.is(sh.exit?.exitCode, 3);
    await sb.delete();
  });
});

test('errors are WarrenErrors with the server codes', async (t) => {
  await withGateway(t, async ({ admin, account }) => {
    const cases: Array<[Promise<unknown>, string]> = [
      [admin.createSandbox({ image: 'busybox', memoryMb: -1 }), 'LIMIT_OUT_OF_RANGE'],
      [admin.createSandbox({ image: 'busybox', ttlSeconds: 0 }), 'LIMIT_OUT_OF_RANGE'],
      [admin.createSandbox({ image: 'missing-image' }), 'IMAGE_NOT_FOUND'],
      [admin.createSandbox({ image: 'busybox', bogus: true } as never), 'UNKNOWN_FIELD'],
      [admin.getSandbox('Bad_Id'), 'INVALID_ID'],
      [admin.getSandbox('zz-missing'), 'SANDBOX_NOT_FOUND'],
      [admin.sandbox('zz-missing').shell(), 'SANDBOX_NOT_FOUND'],
    ];
    for (const [p, code] of cases) {
      const err = (await t.throwsAsync(p)) as WarrenError;
      t.true(err instanceof WarrenError);
      t.is(err.code, code as WarrenError['code'], err.message);
    }
    const sb = await admin.createSandbox({ image: 'busybox' });
    const bob = account('runtime');
    for (const p of [bob.client.getSandbox(sb.id), bob.client.sandbox(sb.id).exec('true'), bob.client.sandbox(sb.id).shell(), bob.client.deleteSandbox(sb.id)]) {
      const err = (await t.throwsAsync(p)) as WarrenError;
      t.is(err.code, 'SANDBOX_NOT_FOUND');
    }
    await t.throwsAsync(sb.readFile('/nope'), { code: 'FILE_NOT_FOUND' } as never);
    await t.throwsAsync(sb.readFile('../etc/shadow'), { code: 'PATH_ESCAPE' } as never);
    const sh = await sb.shell();
    await t.throwsAsync(sh.run(''), { code: 'INVALID_ARGUMENT' } as never);
    await sh.close();
    await sb.delete();
    const down = new WarrenClient({ url: 'http://127.0.0.1:9', token: 'x' });
    await t.throwsAsync(down.health(), { code: 'UNAVAILABLE' } as never);
    await down.close();
  });
});

test('images.import reports progress and returns the image; failures throw', async (t) => {
  await withGateway(t, async ({ admin, account }) => {
    const { busyboxRootfs } = await import('../helpers/warren');
    const progress: string[] = [];
    const image = await admin.images.import('bb-sdk', await busyboxRootfs(), { onProgress: (p) => progress.push(`${p.phase}: ${p.message}`) });
    t.is(image.name, 'bb-sdk');
    t.regex(image.digest, /^sha256:[0-9a-f]{64}$/);
    t.true(progress.length >= 1);
    const sb = await admin.createSandbox({ image: 'bb-sdk' });
    t.is((await sb.exec(['echo', 'from-import'])).stdout, 'from-import\n');
    await sb.delete();
    await t.throwsAsync(admin.images.import('bad', '/nonexistent/dir'), { instanceOf: WarrenError });
    await t.throwsAsync(account('runtime').client.images.build('x'), { code: 'FORBIDDEN' } as never);
  });
});
