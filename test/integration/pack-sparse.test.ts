/**
 * pack_diff and sparse files: holes stay holes on the host disk and in the
 * layer, and the pack budget of the sandbox's profile (limits.packMb counted
 * in apparent sizes, limits.packSeconds) refuses with a clear error before a
 * copy or an image build can fill the disk or run for minutes.
 */
import { cpSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { testUnless } from '../helpers/skip';
import { WarrenError } from '../../src/errors';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import { rootSkipReason, spec, withShim } from '../helpers/warren';

const skip = rootSkipReason();
const it = testUnless(skip).serial;

// A policy whose default profile has a 64 GiB, 3 s pack budget: the size budget is far above
// what the slow pack below holds, so that its image work is many times the time budget on any
// machine (mkfs.erofs reads holes as zeros, a few GB/s at best).
const dir = mkdtempSync(join(tmpdir(), 'warren-policy-'));
cpSync(BUNDLED_POLICY_DIR, dir, { recursive: true });
const profiles = join(dir, 'profiles.yaml');
writeFileSync(profiles, readFileSync(profiles, 'utf8').replace('packMb: 8192 ', 'packMb: 65536 ').replace('packSeconds: 600 ', 'packSeconds: 3   '));
usePolicyStore(new PolicyStore(dir));
test.after.always(() => rmSync(dir, { recursive: true, force: true }));

async function codeOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
    return 'ok';
  } catch (err) {
    if (err instanceof WarrenError) return `${err.code}: ${err.message}`;
    throw err;
  }
}

it(`seventeen 4 GiB sparse files: refused by the pack budget before anything is copied`, async (t) => {
  await withShim(t, async ({ shim, dataDir }) => {
    const sb = await shim.createSandbox(spec({ diskMb: 64 }));
    t.is((await shim.exec(sb.id, { cmd: 'cd /root && truncate -s 4G f1 f2 f3 f4 f5 f6 f7 f8 f9 f10 f11 f12 f13 f14 f15 f16 f17 && du -ck f* | tail -1' })).stdout, '0\ttotal\n');
    const started = Date.now();
    const res = await codeOf(shim.packSandbox(sb.id, { name: 'sparse-big', compression: 'none' }, 'test'));
    t.regex(res, /^PAYLOAD_TOO_LARGE: .*73014444032 bytes .*limits\.packMb/);
    t.true(Date.now() - started < 5000, `refused in ${Date.now() - started} ms`);
    t.deepEqual(readdirSync(join(dataDir, 'lifecycle', 'tmp')).filter((n) => n.startsWith('pack-')), [], 'no scratch left');
    t.is((await shim.exec(sb.id, { cmd: 'echo alive' })).stdout, 'alive\n', 'the sandbox is thawed');
    await shim.deleteSandbox(sb.id);
  });
});

it(`a sparse file keeps its holes: small layer, exact content in the next sandbox`, async (t) => {
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec({ diskMb: 64 }));
    await shim.exec(sb.id, { cmd: 'truncate -s 32M /root/sparse && printf end | dd of=/root/sparse bs=1 seek=33554429 conv=notrunc 2>/dev/null && md5sum /root/sparse > /root/sum' });
    const sum = (await shim.exec(sb.id, { cmd: 'cat /root/sum' })).stdout;
    const packed = await shim.packSandbox(sb.id, { name: 'sparse-small', compression: 'none' }, 'test');
    const blob = (shim as unknown as { layers: { blobPath(d: string): string } }).layers.blobPath(packed.layer);
    const st = statSync(blob);
    t.log(`layer ${st.size} bytes (${st.blocks * 512} allocated) for a 32 MiB sparse file, pack ${packed.durationMs} ms`);
    t.true(st.blocks * 512 < 1024 * 1024, `the layer allocates ${st.blocks * 512} bytes`);
    const next = await shim.createSandbox(spec({ image: 'sparse-small', diskMb: 64 }));
    t.is((await shim.exec(next.id, { cmd: 'md5sum /root/sparse' })).stdout, sum);
    t.is((await shim.exec(next.id, { cmd: 'stat -c %s /root/sparse' })).stdout, '33554432\n');
    await shim.deleteSandbox(next.id);
    await shim.deleteSandbox(sb.id);
  });
});

it(`the pack time budget stops the image build with TIMEOUT and leaves nothing`, async (t) => {
  await withShim(t, async ({ shim, dataDir }) => {
    const sb = await shim.createSandbox(spec({ diskMb: 64 }));
    // 60 GiB of holes in 4 GiB files (RLIMIT_FSIZE of the profile): inside the size budget, 20 s or more of image work.
    t.is((await shim.exec(sb.id, { cmd: 'mkdir /root/slow && cd /root/slow && for i in $(seq 15); do truncate -s 4G f$i; done && stat -c %s f* | awk \'{ s += $1 } END { print s }\'' })).stdout, '64424509440\n');
    const started = Date.now();
    const res = await codeOf(shim.packSandbox(sb.id, { name: 'sparse-slow', compression: 'lz4' }, 'test'));
    t.regex(res, /^TIMEOUT: .*3 s .*limits\.packSeconds/);
    t.true(Date.now() - started < 15_000, `stopped after ${Date.now() - started} ms`);
    t.deepEqual(readdirSync(join(dataDir, 'lifecycle', 'tmp')).filter((n) => n.startsWith('pack-')), [], 'no scratch left');
    t.false(shim.listImages().some((i) => i.name === 'sparse-slow'));
    await shim.deleteSandbox(sb.id);
  });
});
