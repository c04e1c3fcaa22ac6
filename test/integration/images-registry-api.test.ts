/**
 * The registry routes through a real gateway and the SDK: push, pull (lazy) under
 * another name, the node's layer states, staging, and the refusals (validation,
 * permissions) that come before any connection to a registry.
 */
import { lazyUnavailableReason } from '../../src/shim/layers/lazy';
import { registryReason, startRegistry, type TestRegistry } from '../helpers/registry';
import { testUnless } from '../helpers/skip';
import { integrationSkipReason, withGateway } from './gateway-fixture';

const test = testUnless(integrationSkipReason() ?? registryReason ?? lazyUnavailableReason());

let registry: TestRegistry;
test.before(async () => {
  registry = await startRegistry();
});
test.after.always(async () => {
  await registry?.stop();
});

test.serial('SDK: push an image, pull it back lazily under another name, see its layer states, stage it', async (t) => {
  await withGateway(t, async ({ admin, account }) => {
    const phases = new Set<string>();
    const pushed = await admin.images.push('busybox', `${registry.host}/warren/busybox:api`, { onProgress: (p) => phases.add(p.phase) });
    t.true(phases.has('push'));
    t.regex(pushed.manifestDigest, /^sha256:[a-f0-9]{64}$/);
    const bb = (await admin.images.list()).find((i) => i.name === 'busybox')!;
    t.deepEqual(pushed.layers.map((l) => l.digest), bb.layers);
    // The layer is local on this node already: pulling under another name fetches nothing and keeps it local.
    const again = await admin.images.pull(`${registry.host}/warren/busybox:api`, { name: 'bb-pulled', mode: 'lazy' });
    t.is(again.digest, bb.digest);
    t.deepEqual((await admin.images.layers(bb.layers)).map((l) => l.state), ['local']);
    t.deepEqual((await admin.images.layers(['sha256:' + '0'.repeat(64)])).map((l) => l.state), ['absent']);
    const staged = await admin.images.stage('busybox', `${registry.host}/overflow/pool`);
    t.is(staged.ref, `${registry.host}/overflow/pool:${bb.digest.replace(':', '-')}`);

    // Refusals before any registry is contacted.
    await t.throwsAsync(admin.images.push('busybox', 'not a ref'), { code: 'INVALID_ARGUMENT' });
    await t.throwsAsync(admin.images.stage('busybox', `${registry.host}/overflow/pool:tag`), { code: 'INVALID_ARGUMENT' });
    await t.throwsAsync(admin.images.pull(`${registry.host}/warren/missing:x`, { name: 'm' }), { code: 'IMAGE_NOT_FOUND' });
    const builder = account('builder');
    await t.throwsAsync(builder.client.images.push('busybox', `${registry.host}/warren/x:y`), { code: 'FORBIDDEN' });
    await t.throwsAsync(builder.client.images.pull(`${registry.host}/warren/busybox:api`, { name: 'b2' }), { code: 'FORBIDDEN' });
  });
});
