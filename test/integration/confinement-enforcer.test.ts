/**
 * with no LSM enforcer, sandbox creation fails with CONFINEMENT_UNAVAILABLE unless the
 * policy explicitly allows unconfined sandboxes. The enforcers are masked with
 * WARREN_FEATURES_DISABLE (this file runs in its own process).
 */
process.env.WARREN_FEATURES_DISABLE = 'landlock,apparmor';

import { cpSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { activeEnforcer, featureReport } from '../../src/features';
import { BUNDLED_POLICY_DIR, PolicyStore, usePolicyStore } from '../../src/security/confinement';
import { rootSkipReason, spec, withShim } from '../helpers/warren';
import { testUnless } from '../helpers/skip';

const why = rootSkipReason();
const it = testUnless(why).serial;

const dir = join(mkdtempSync(join(tmpdir(), 'warren-policy-enf-')), 'policies');
cpSync(BUNDLED_POLICY_DIR, dir, { recursive: true });
const store = new PolicyStore(dir);
usePolicyStore(store);

it('enforcer: reported as none when AppArmor and Landlock are missing', (t) => {
  t.is(activeEnforcer().lsm, 'none');
  t.regex(featureReport('x').enforcer, /^seccomp; /);
  t.regex(featureReport('x').features.landlock!.reason!, /WARREN_FEATURES_DISABLE/);
});

it('enforcer: without one, creating a sandbox fails with CONFINEMENT_UNAVAILABLE and leaves nothing behind', async (t) => {
  await withShim(t, async ({ shim, dataDir }) => {
    const err = await t.throwsAsync(shim.createSandbox(spec()), { code: 'CONFINEMENT_UNAVAILABLE' } as never);
    t.regex(err!.message, /allowUnconfined/);
    t.deepEqual(shim.listSandboxes(), []);
    const { readdirSync } = await import('node:fs');
    t.deepEqual(readdirSync(join(dataDir, 'sandboxes')), []);
  });
});

it('enforcer: with enforcement.allowUnconfined the sandbox runs (seccomp still applied, no Landlock)', async (t) => {
  const p = join(dir, 'profiles.yaml');
  writeFileSync(p, readFileSync(p, 'utf8').replace('allowUnconfined: false', 'allowUnconfined: true'));
  store.apply();
  await withShim(t, async ({ shim }) => {
    const sb = await shim.createSandbox(spec());
    const r = await shim.exec(sb.id, { cmd: 'grep Seccomp: /proc/self/status; echo x > /etc/unconfined-write && echo wrote' });
    t.regex(r.stdout, /Seccomp:\s+2/);
    t.regex(r.stdout, /wrote/);
    await shim.deleteSandbox(sb.id);
  });
});
