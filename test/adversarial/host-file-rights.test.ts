/**
 * Files the platform reads or writes on behalf of a sandbox program are opened
 * with that program's rights and never through a link out of its area: a
 * FnCall program running as nobody plants links to files it cannot read
 * (/etc/shadow, /root/.profile, /, ../..) and asks for them in fetchFiles and
 * SandboxFusion fetch_files; a sandbox whose user is not root plants the same
 * for the files API. Nothing comes back that the program could not read
 * itself, and nothing is written where it could not write.
 */
import test from 'ava';
import { testUnless } from '../helpers/skip';
import { WarrenError } from '../../src/errors';
import { type FnFixture, integrationSkipReason, openFnFixture, rawRequest } from '../integration/fncall-fixture';
import { spec, withShim } from '../helpers/warren';
import { microvmBackendStatus, skipReason } from '../../src/features';

const skip = integrationSkipReason();
const maybe = testUnless(skip).serial;

let f: FnFixture | undefined;
test.after.always(async () => {
  if (f) await f.close();
});

const PLANT = [
  'ln -s /etc/shadow shadow',
  'ln -s /root/.profile profile',
  'ln -s / slash',
  'ln -s ../../../etc/shadow rel',
  'mkdir -p d && ln -s /etc d/etc',
  'ln -s /proc/self/environ environ',
  'echo mine > own.txt',
  'echo hidden > locked.txt && chmod 000 locked.txt',
  // the program itself is refused: the test is not vacuous
  'cat /etc/shadow >/dev/null 2>&1 && echo CAN-READ-SHADOW; cat /root/.profile >/dev/null 2>&1 && echo CAN-READ-PROFILE; true',
].join('; ');
const ASK = ['shadow', 'profile', 'slash/etc/shadow', 'slash/root/.profile', 'rel', 'd/etc/shadow', 'environ', 'locked.txt', 'own.txt'];

maybe(`FnCall fetchFiles and SandboxFusion fetch_files return only what the program could read itself`, async (t) => {
  f = await openFnFixture();
  await f.pool({ name: 'rights', min: 1, max: 1 });
  const r = await f.admin.functions.invoke('rights', { cmd: ['/bin/sh', '-c', PLANT], fetchFiles: ASK });
  t.is(r.status, 'ok', JSON.stringify(r));
  t.is(r.stdout, '', 'the program (nobody) cannot read them');
  t.deepEqual(Object.keys(r.files ?? {}), ['own.txt']);
  t.is(Buffer.from(r.files!['own.txt']!, 'base64').toString(), 'mine\n');

  // Input files are written as the run user and inside the work dir, whatever links are there.
  const w = await f.admin.functions.invoke('rights', {
    cmd: ['/bin/sh', '-c', 'ln -s /etc etc; ln -s / up; true'],
  });
  t.is(w.status, 'ok');
  const w2 = await f.admin.functions.invoke('rights', {
    cmd: ['/bin/sh', '-c', 'ls -ln in.txt | cut -d" " -f3,4 | tr -s " "; test -e /etc/planted && echo WROTE-ETC; true'],
    files: { 'in.txt': 'x' },
  });
  t.is(w2.status, 'ok', JSON.stringify(w2));
  t.regex(w2.stdout, /^65534/, 'owned by the run user');
  t.notRegex(w2.stdout, /WROTE-ETC/);

  f.shim.functions.updateConfig({ runCodePool: 'rights' });
  const code = [
    'import os',
    "for s, d in [('/etc/shadow', 'shadow'), ('/', 'slash'), ('/root/.profile', 'profile')]:",
    '    os.symlink(s, d)',
    "open('ok.txt', 'w').write('ok')",
  ].join('\n');
  const sf = await rawRequest(f.url, {
    method: 'POST',
    path: '/run_code',
    token: f.adminToken,
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ code, language: 'python', fetch_files: ['shadow', 'slash/etc/shadow', 'profile', 'ok.txt'] }),
  });
  t.is(sf.status, 200, sf.text);
  t.is(sf.json.status, 'Success', sf.text);
  t.deepEqual(Object.keys(sf.json.files), ['ok.txt'], sf.text);
});

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    if (err instanceof WarrenError) return err.code;
    throw err;
  }
}

maybe(`the files API reads and writes with the sandbox user's rights, never through planted links`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec({ user: '65534' }));
    const root = (cmd: string) => shim.exec(sb.id, { cmd, user: 'root' });
    const setup = await root(
      'echo secret > /root/secret && chmod 600 /root/secret && chmod 700 /root && mkdir -p /work/priv && echo conf > /work/priv/app.conf && chmod 700 /work/priv && ' +
        'ln -s /root/secret /tmp/l && ln -s / /tmp/slash && ln -s /work/priv /tmp/etc && chmod 1777 /tmp',
    );
    t.is(setup.exitCode, 0, setup.stderr);
    const asUser = await shim.exec(sb.id, { cmd: 'cat /root/secret /work/priv/app.conf 2>&1; id -u', cwd: '/tmp' });
    t.regex(asUser.stdout, /Permission denied[\s\S]*65534/, 'the sandbox user itself is refused');

    for (const p of ['/root/secret', '/tmp/l', '/tmp/slash/root/secret', '/work/priv/app.conf', '/tmp/etc/app.conf']) {
      t.is(await codeOf(shim.readFile(sb.id, p, 1 << 20)), 'FORBIDDEN', `read ${p}`);
    }
    t.is(await codeOf(shim.listDir(sb.id, '/root')), 'FORBIDDEN');
    for (const p of ['/etc/planted', '/tmp/etc/planted', '/tmp/slash/usr/planted', '/root/planted', '/planted']) {
      t.is(await codeOf(shim.writeFile(sb.id, p, Buffer.from('x'))), 'FORBIDDEN', `write ${p}`);
    }
    t.is((await root('ls /etc/planted /usr/planted /root/planted /work/priv/planted /planted 2>/dev/null | wc -l')).stdout.trim(), '0');

    // What the user may do still works, and what it creates is its own.
    await shim.writeFile(sb.id, '/tmp/mine/deep/file', Buffer.from('hello'));
    t.is((await root('stat -c %u:%g /tmp/mine/deep/file /tmp/mine')).stdout, '65534:65534\n65534:65534\n');
    t.is((await shim.readFile(sb.id, '/tmp/mine/deep/file', 100)).toString(), 'hello');
    t.regex(await codeOf(shim.readFile(sb.id, '/tmp/slash/proc/self/environ', 100)), /PATH_ESCAPE|FILE_NOT_FOUND/);

    // A root sandbox still reads everything of its own.
    const rootBox = await shim.createSandbox(spec());
    await shim.exec(rootBox.id, { cmd: 'echo s > /root/s && chmod 600 /root/s' });
    t.is((await shim.readFile(rootBox.id, '/root/s', 10)).toString(), 's\n');
    await shim.deleteSandbox(rootBox.id);
    await shim.deleteSandbox(sb.id);
  });
});

const vmStatus = microvmBackendStatus();
const vmSkip = skip ?? skipReason('native-helper', 'qemu', 'microvm-guest') ?? (vmStatus.available ? null : `microvm backend unavailable: ${vmStatus.reason}`);

testUnless(vmSkip).serial(`microvm: the files API runs as the sandbox user inside the guest too, never through planted links`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec({ backend: 'microvm', user: '65534', memoryMb: 192, diskMb: 64 }));
    const root = (cmd: string) => shim.exec(sb.id, { cmd, user: 'root' });
    const setup = await root('echo secret > /root/secret && chmod 600 /root/secret && chmod 700 /root && ln -s /root/secret /tmp/l && chmod 1777 /tmp');
    t.is(setup.exitCode, 0, setup.stderr);
    for (const p of ['/root/secret', '/tmp/l']) t.is(await codeOf(shim.readFile(sb.id, p, 1 << 20)), 'FORBIDDEN', `read ${p}`);
    t.is(await codeOf(shim.listDir(sb.id, '/root')), 'FORBIDDEN');
    for (const p of ['/etc/planted', '/root/planted']) t.is(await codeOf(shim.writeFile(sb.id, p, Buffer.from('x'))), 'FORBIDDEN', `write ${p}`);
    t.is((await root('ls /etc/planted /root/planted 2>/dev/null | wc -l')).stdout.trim(), '0');
    // what the user may do still works, and what it creates is its own
    await shim.writeFile(sb.id, '/tmp/mine/deep/file', Buffer.from('hello'));
    t.is((await root('stat -c %u:%g /tmp/mine/deep/file /tmp/mine')).stdout, '65534:65534\n65534:65534\n');
    t.is((await shim.readFile(sb.id, '/tmp/mine/deep/file', 100)).toString(), 'hello');
    // the agent went back to root between requests: an exec as root still reads the secret
    t.is((await root('cat /root/secret')).stdout, 'secret\n');
    await shim.deleteSandbox(sb.id);
  });
});
