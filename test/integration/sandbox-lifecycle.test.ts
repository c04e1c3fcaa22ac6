import { skipReason } from '../../src/features';
import { WarrenError } from '../../src/errors';
import { scanTar } from '../../src/shim/layers/tar';
import { spec, withShim } from '../helpers/warren';
import { execFileSync } from 'node:child_process';
import { writeFileSync, mkdirSync, symlinkSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { tempDir } from '../helpers/tmp';
import { testUnless } from '../helpers/skip';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip);

it(`create -> exec -> files -> delete`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const info = await shim.createSandbox(spec({ labels: { job: 'j1' } }));
    t.is(info.state, 'running');
    t.regex(info.id, new RegExp(`^${shim.nodeId}-[0-9a-f]{16}$`));
    t.deepEqual(shim.listSandboxes({ labels: { job: 'j1' } }).map((s) => s.id), [info.id]);

    const r = await shim.exec(info.id, { cmd: 'echo hi; hostname' });
    t.is(r.stdout, `hi\n${info.id}\n`);

    await shim.writeFile(info.id, '/work/dir/a.txt', Buffer.from('content'), 0o600);
    t.is((await shim.readFile(info.id, '/work/dir/a.txt', 1024)).toString(), 'content');
    t.is((await shim.exec(info.id, { cmd: 'stat -c %a /work/dir/a.txt; cat /work/dir/a.txt' })).stdout, '600\ncontent');
    const listing = await shim.listDir(info.id, '/work/dir');
    t.deepEqual(listing.map((e) => [e.name, e.type, e.size]), [['a.txt', 'file', 7]]);

    // tar upload and download
    const src = tempDir('warren-tar-');
    mkdirSync(join(src, 'pkg'));
    writeFileSync(join(src, 'pkg', 'x.py'), 'print(1)\n');
    const tar = execFileSync('tar', ['-c', '-C', src, 'pkg']);
    t.deepEqual(await shim.uploadTar(info.id, '/work/up', tar), { entries: 2 });
    t.is((await shim.readFile(info.id, '/work/up/pkg/x.py', 100)).toString(), 'print(1)\n');
    const stream = await shim.downloadTar(info.id, '/work/up/pkg');
    const chunks: Buffer[] = [];
    for await (const c of stream) chunks.push(c as Buffer);
    t.deepEqual(scanTar(Buffer.concat(chunks)).map((e) => e.path.replace(/\/$/, '')).sort(), ['pkg', 'pkg/x.py']);

    await shim.deleteSandbox(info.id);
    t.throws(() => shim.getSandbox(info.id), { code: 'SANDBOX_NOT_FOUND' } as never);
  });
});

it(`file paths cannot escape the sandbox`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const { id } = await shim.createSandbox(spec());
    await shim.exec(id, { cmd: 'ln -s / /rootlink; ln -s ../../../../../../etc /up; echo sandbox > /etc/marker' });
    // symlinks are resolved as the sandbox sees them: they never reach host files
    const hostHostname = readFileSync('/etc/hostname', 'utf8');
    const viaLink = (await shim.readFile(id, '/rootlink/etc/hostname', 4096).catch((e: WarrenError) => Buffer.from(e.code))).toString();
    t.not(viaLink, hostHostname);
    const up = await shim.readFile(id, '/up/marker', 100).catch((e: WarrenError) => Buffer.from(e.code));
    t.true(['sandbox\n', 'PATH_ESCAPE'].includes(up.toString()));
    for (const bad of ['/proc/1/root/etc/passwd', '/proc/self/root/etc/hostname']) {
      // refused either as an escape or because the sandbox's own rights do not reach /proc/1/root
      const err = await t.throwsAsync(shim.readFile(id, bad, 4096));
      t.true(err instanceof WarrenError && ['PATH_ESCAPE', 'FORBIDDEN'].includes(err.code), `${bad}: ${err instanceof WarrenError ? err.code : ''} ${err?.message}`);
    }
    // a tar with an escaping entry is refused before anything is written
    const src = tempDir('warren-tar-');
    writeFileSync(join(src, 'evil'), 'x');
    symlinkSync('/etc', join(src, 'link'));
    const evil = execFileSync('tar', ['-c', '-C', src, '--transform', 's,^evil,../../evil,', 'evil']);
    const err = await t.throwsAsync(shim.uploadTar(id, '/work', evil));
    t.is((err as WarrenError).code, 'ARCHIVE_ESCAPE');
    t.is((await shim.exec(id, { cmd: 'ls /work 2>&1; ls /evil 2>&1' })).exitCode, 1);
  });
});

it(`unknown images and layers create nothing`, async (t) => {
  await withShim(t, async ({ shim }) => {
    await t.throwsAsync(shim.createSandbox(spec({ image: 'nope' })), { code: 'IMAGE_NOT_FOUND' } as never);
    await t.throwsAsync(shim.createSandbox(spec({ workspaces: ['missing-ws'] })), { code: 'LAYER_NOT_FOUND' } as never);
    t.is(shim.listSandboxes().length, 0);
  });
});

it(`workspace and toolkit layers stack over the image`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const ws = tempDir('warren-ws-');
    mkdirSync(join(ws, 'workspace'));
    writeFileSync(join(ws, 'workspace', 'README'), 'repo\n');
    const tk = tempDir('warren-tk-');
    mkdirSync(join(tk, 'opt', 'tool'), { recursive: true });
    writeFileSync(join(tk, 'opt', 'tool', 'run'), '#!/bin/sh\necho tool\n', { mode: 0o755 });
    await shim.importImage({ name: 'repo-x', kind: 'workspace', source: { type: 'directory', path: ws } });
    await shim.importImage({ name: 'tool-y', kind: 'toolkit', source: { type: 'directory', path: tk } });
    const { id, layers } = await shim.createSandbox(spec({ workspaces: ['repo-x'], toolkits: ['tool-y'] }));
    t.is(layers.length, 3);
    t.is((await shim.exec(id, { cmd: 'cat /workspace/README; /opt/tool/run; echo new > /workspace/README' })).stdout, 'repo\ntool\n');
    const other = await shim.createSandbox(spec({ workspaces: ['repo-x'] }));
    t.is((await shim.exec(other.id, { cmd: 'cat /workspace/README' })).stdout, 'repo\n', 'layers are read-only and shared');
  });
});

it(`an owner's usage counts a create from its createdAt on, before it is live (what the cluster's node records rely on)`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const owner = `acct-usage-${process.pid}`;
    const samples: { at: number; sandboxes: number; cpu: number }[] = [];
    let done = false;
    const sample = (): void => {
      const at = Date.now();
      const u = shim.usageByOwner().get(owner);
      samples.push({ at, sandboxes: u?.sandboxes ?? 0, cpu: u?.cpu ?? 0 });
      if (!done) setImmediate(sample);
    };
    sample();
    const info = await shim.createSandbox({ ...spec(), owner, cpu: 0.5 });
    done = true;
    const created = Date.parse(info.createdAt);
    const after = samples.filter((s) => s.at > created);
    t.true(after.length > 0, 'sampled between createdAt and the end of the create');
    for (const s of after) t.deepEqual([s.sandboxes, s.cpu], [1, 0.5], `at ${s.at} (createdAt ${created})`);
    t.deepEqual(shim.usageByOwner().get(owner), { sandboxes: 1, cpu: 0.5, memoryMb: info.limits.memoryMb });
    await shim.deleteSandbox(info.id);
    t.is(shim.usageByOwner().get(owner), undefined);
    // a refused create is not counted
    await t.throwsAsync(shim.createSandbox({ ...spec(), owner, image: 'no-such-image' }));
    t.is(shim.usageByOwner().get(owner), undefined);
  });
});
