/**
 * Attacks on publication: a runtime account (and a second builder) try every
 * way of naming a builder's unpublished content - its name, its image digest,
 * its pack layer digest, in the image, workspaces and toolkits slots, and in a
 * FnCall pool - and every listing. Each must be refused, a refused digest must
 * answer exactly like a digest that does not exist, and listings must not
 * show the content. Publishing grants a stack, not its parts: a lower layer
 * whose secret an upper, published layer deletes stays unusable on its own.
 */
import { randomBytes } from 'node:crypto';
import { testUnless } from '../helpers/skip';
import { WarrenError } from '../../src/errors';
import { integrationSkipReason, rawRequest, withGateway } from '../integration/gateway-fixture';

const skip = integrationSkipReason();
const it = testUnless(skip);

async function outcome(p: Promise<unknown>): Promise<string> {
  try {
    const v = await p;
    const id = (v as { id?: string } | null)?.id;
    return id === undefined ? 'ok' : `created ${id}`;
  } catch (err) {
    if (err instanceof WarrenError) return `${err.status} ${err.code} ${err.message.replace(/sha256:[0-9a-f]{64}/g, 'sha256:X')}`;
    throw err;
  }
}

it(`unpublished content cannot be named by any reference in any slot, nor seen in listings`, async (t) => {
  await withGateway(t, async ({ admin, account, url }) => {
    const builder = account('builder');
    const other = account('builder');
    const runtime = account('runtime');

    const work = await builder.client.createSandbox({ image: 'busybox' });
    await work.exec('mkdir -p /root && echo hidden-answer > /root/secret');
    const secret = await work.pack({ name: 'secret-env' });
    t.false(secret.environment.published);
    // The published successor deletes the secret; its stack still lists the lower layer.
    const next = await builder.client.createSandbox({ image: 'secret-env' });
    await next.exec('rm /root/secret && echo public > /root/readme');
    const pub = await next.pack({ name: 'public-env', publish: true });
    await next.delete();
    const lowerLayer = secret.layer;
    t.true(pub.image.layers.includes(lowerLayer), 'the published stack contains the secret layer under a deletion');
    t.not(pub.layer, lowerLayer);

    const random = `sha256:${randomBytes(32).toString('hex')}`;
    for (const who of [runtime, other]) {
      const c = who.client;
      t.regex(await outcome(c.createSandbox({ image: 'secret-env' })), /^403 FORBIDDEN/, 'by name');
      const notImage = await outcome(c.createSandbox({ image: random }));
      t.regex(notImage, /^404 IMAGE_NOT_FOUND/);
      t.is(await outcome(c.createSandbox({ image: secret.image.digest })), notImage, 'by image digest: as if it did not exist');
      t.is(await outcome(c.createSandbox({ image: lowerLayer })), notImage, 'by layer digest as the image');
      for (const slot of ['workspaces', 'toolkits'] as const) {
        const notLayer = await outcome(c.createSandbox({ image: 'busybox', [slot]: [random] }));
        t.regex(notLayer, /^404 LAYER_NOT_FOUND/);
        t.is(await outcome(c.createSandbox({ image: 'busybox', [slot]: [lowerLayer] })), notLayer, `layer digest in ${slot}`);
        t.is(await outcome(c.createSandbox({ image: 'busybox', [slot]: [secret.image.digest] })), notLayer, `image digest in ${slot}`);
        t.regex(await outcome(c.createSandbox({ image: 'busybox', [slot]: ['secret-env'] })), /^(403 FORBIDDEN|404 LAYER_NOT_FOUND)/, `name in ${slot}`);
      }
      // Published stack: usable whole, but its lower (unpublished) layer is not usable alone.
      const pubBox = await c.createSandbox({ image: 'public-env' });
      t.is((await pubBox.exec('cat /root/readme; test -e /root/secret && echo LEAK; true')).stdout, 'public\n');
      await pubBox.delete();
      t.is(await outcome(c.createSandbox({ image: 'busybox', workspaces: [pub.layer] })), await outcome(c.createSandbox({ image: 'busybox', workspaces: [random] })), 'the published top layer alone is a part, not the stack');

      // Listings show nothing of the unpublished environment.
      const images = await c.images.list();
      t.false(images.some((i) => i.name === 'secret-env' || i.digest === secret.image.digest), 'GET /v1/images hides it');
      t.true(images.some((i) => i.name === 'public-env') && images.some((i) => i.name === 'busybox'));
      const envs = await c.listEnvironments();
      t.deepEqual(envs.map((e) => e.name), ['public-env']);
      const raw = await rawRequest(url, { path: '/v1/images', token: who.token });
      t.false(raw.text.includes('"secret-env"'));
    }

    // A FnCall pool is no way around it (the second builder may create pools).
    const pool = await rawRequest(url, {
      method: 'POST',
      path: '/v1/functions',
      token: other.token,
      body: JSON.stringify({ name: 'steal', image: 'busybox', layers: [lowerLayer], min: 0, max: 1 }),
    });
    t.is(pool.status, 404, pool.text);
    t.is(pool.json?.error?.code ?? pool.json?.code, 'LAYER_NOT_FOUND', pool.text);
    const pool2 = await rawRequest(url, { method: 'POST', path: '/v1/functions', token: other.token, body: JSON.stringify({ name: 'steal2', image: 'secret-env', min: 0, max: 1 }) });
    t.is(pool2.status, 403, pool2.text);

    // The node image's own layer is public content: usable by digest by anyone.
    const busybox = (await runtime.client.images.list()).find((i) => i.name === 'busybox')!;
    const byDigest = await runtime.client.createSandbox({ image: busybox.layers[0]! });
    await byDigest.delete();

    // The owner may use its own layers alone; admins anything.
    const own = await builder.client.createSandbox({ image: 'busybox', workspaces: [lowerLayer] });
    t.is((await own.exec('cat /root/secret')).stdout, 'hidden-answer\n');
    await own.delete();
    const adm = await admin.createSandbox({ image: 'busybox', toolkits: [lowerLayer] });
    t.is((await adm.exec('cat /root/secret')).stdout, 'hidden-answer\n');
    await adm.delete();
    t.true((await admin.images.list()).some((i) => i.name === 'secret-env'));

    // Publishing the environment opens exactly its names and digests.
    await builder.client.publishEnvironment('secret-env');
    const now = await runtime.client.createSandbox({ image: secret.image.digest });
    t.is((await now.exec('cat /root/secret')).stdout, 'hidden-answer\n');
    await now.delete();
    t.regex(await outcome(runtime.client.createSandbox({ image: 'busybox', workspaces: [lowerLayer] })), /^404 LAYER_NOT_FOUND/, 'still a part of a stack, not usable alone');
    await work.delete();
  });
});
