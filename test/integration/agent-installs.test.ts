/**
 * Agents install packages: in a default sandbox on the Debian image, root
 * changes its whole own root filesystem - dpkg and apt install a .deb built in
 * the test (offline), and /usr, /etc, /var/lib/dpkg take writes - while the
 * kernel's interfaces stay read-only. The warren-strict profile keeps the
 * system directories protected (its documented trade-off: installs fail).
 */
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import test from 'ava';
import { testUnless } from '../helpers/skip';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import { debianCachePath } from '../../src/shim/layers/debian';
import { rootSkipReason, spec, withShim } from '../helpers/warren';

const cachePath = debianCachePath({});
// WARREN_TEST_DEBIAN=1 (what scripts/test.sh sets) builds the image when it is not cached; a build
// that another test file started meanwhile is waited for (the store locks the cache entry).
const skip = rootSkipReason() ?? (existsSync(cachePath) || process.env.WARREN_TEST_DEBIAN === '1' ? null : `no cached Debian image ${cachePath} (set WARREN_TEST_DEBIAN=1 to build it)`);
const it = testUnless(skip).serial;

const dir = mkdtempSync(join(tmpdir(), 'warren-policy-'));
cpSync(BUNDLED_POLICY_DIR, dir, { recursive: true });
const accounts = join(dir, 'accounts.yaml');
writeFileSync(accounts, readFileSync(accounts, 'utf8').replace('accounts: {}', 'accounts:\n  strict-owner:\n    profile: warren-strict'));
usePolicyStore(new PolicyStore(dir));
test.after.always(() => rmSync(dir, { recursive: true, force: true }));

const BUILD_DEB = [
  'set -e',
  'mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/bin /tmp/pkg/etc/warren-hello',
  'printf "Package: warren-hello\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@example.invalid>\\nDescription: test\\n" > /tmp/pkg/DEBIAN/control',
  'printf "#!/bin/sh\\necho hello from a package\\n" > /tmp/pkg/usr/bin/warren-hello && chmod 755 /tmp/pkg/usr/bin/warren-hello',
  'echo conf > /tmp/pkg/etc/warren-hello/conf',
  'dpkg-deb --root-owner-group --build /tmp/pkg /tmp/warren-hello.deb >/dev/null',
].join('\n');

it(`default profile: dpkg and apt install a local package; /usr, /etc, /var/lib/dpkg are writable; /proc and /sys are not`, async (t) => {
  t.timeout(20 * 60_000); // the first build of the Debian image (debootstrap) on a cold machine
  await withShim(t, async ({ shim }) => {
    await shim.layers.buildDebian({ name: 'default' });
    const sb = await shim.createSandbox(spec({ image: 'default' }));
    const build = await shim.exec(sb.id, { cmd: BUILD_DEB });
    t.is(build.exitCode, 0, build.stderr);
    const dpkg = await shim.exec(sb.id, { cmd: "dpkg -i /tmp/warren-hello.deb 2>&1 && warren-hello && dpkg-query -W -f='${Status}\\n' warren-hello" });
    t.is(dpkg.exitCode, 0, dpkg.stdout);
    t.regex(dpkg.stdout, /hello from a package\ninstall ok installed\n$/);
    const apt = await shim.exec(sb.id, { cmd: 'dpkg -r warren-hello >/dev/null 2>&1 && apt-get install -y -q /tmp/warren-hello.deb 2>&1 && warren-hello' });
    t.is(apt.exitCode, 0, apt.stdout);
    t.regex(apt.stdout, /hello from a package\n$/);
    const writes = await shim.exec(sb.id, { cmd: 'echo x > /etc/agent.conf && echo y > /usr/local/bin/tool && mkdir -p /usr/lib/python3/dist-packages/agentpkg && touch /var/lib/dpkg/agent && rm /etc/agent.conf && echo ok' });
    t.is(writes.stdout, 'ok\n', writes.stderr);
    for (const p of ['/proc/sys/kernel/hostname', '/sys/kernel/profiling']) {
      const r = await shim.exec(sb.id, { cmd: `(echo 1 > ${p}) 2>&1; echo rc=$?` });
      t.regex(r.stdout, /rc=[1-9]/, `${p} stays read-only: ${r.stdout}`);
    }
    await shim.deleteSandbox(sb.id);
  });
});

it(`warren-strict keeps /usr and /etc read-only, so installs fail (its trade-off)`, async (t) => {
  t.timeout(20 * 60_000); // the first build of the Debian image (debootstrap) on a cold machine
  await withShim(t, async ({ shim }) => {
    await shim.layers.buildDebian({ name: 'default' });
    const sb = await shim.createSandbox(spec({ image: 'default', owner: 'strict-owner' }));
    const build = await shim.exec(sb.id, { cmd: BUILD_DEB });
    t.is(build.exitCode, 0, build.stderr);
    const dpkg = await shim.exec(sb.id, { cmd: 'dpkg -i /tmp/warren-hello.deb 2>&1' });
    t.not(dpkg.exitCode, 0, dpkg.stdout);
    const w = await shim.exec(sb.id, { cmd: '(echo x > /etc/agent.conf) 2>&1; (echo y > /usr/local/bin/tool) 2>&1; echo done' });
    t.regex(w.stdout, /Permission denied[\s\S]*Permission denied[\s\S]*done/);
    t.is((await shim.exec(sb.id, { cmd: 'echo ok > /root/ok && cat /root/ok' })).stdout, 'ok\n', 'its own directories stay writable');
    await shim.deleteSandbox(sb.id);
  });
});
