/**
 * Builder/runtime separation and quotas through the real gateway: builders
 * pack and publish, runtime accounts only create from published environments
 * and never see the builder's residue; quotas answer 429 QUOTA_EXCEEDED; the
 * lifecycle endpoints (pause, resume, label-selector pause, extend) work over
 * HTTP with ownership enforced.
 */
import { WarrenError } from '../../src/errors';
import { feature } from '../../src/features';
import { integrationSkipReason, withGateway } from './gateway-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
const it = testUnless(skip);

async function code(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (err) {
    if (err instanceof WarrenError) return `${err.status} ${err.code}`;
    throw err;
  }
  return 'ok';
}

it(`builders pack and publish; runtime accounts use only published environments and see no residue`, async (t) => {
  await withGateway(t, async ({ admin, account }) => {
    const builder = account('builder');
    const other = account('builder');
    const runtime = account('runtime');

    const work = await builder.client.createSandbox({ image: 'busybox', labels: { job: 'build' } });
    await work.exec('mkdir -p /root/task /root/answers && echo task > /root/task/README && echo 42 > /root/answers/ref.txt && echo "cat /root/answers/ref.txt" > /root/.ash_history && echo t > /tmp/t');

    // runtime may not pack (not even its own sandboxes), nor publish
    const rsb = await runtime.client.createSandbox({ image: 'busybox' });
    t.is(await code(rsb.pack({ name: 'sneaky' })), '403 FORBIDDEN');

    const packed = await work.pack({ name: 'task1', scrub: ['/root/answers'] });
    t.false(packed.environment.published);
    t.is(packed.environment.owner, builder.id);

    t.is(await code(runtime.client.createSandbox({ image: 'task1' })), '403 FORBIDDEN', 'unpublished: runtime may not use it');
    t.is(await code(other.client.createSandbox({ image: 'task1' })), '403 FORBIDDEN', 'another builder neither');
    t.false((await runtime.client.listEnvironments()).some((e) => e.name === 'task1'));
    t.is(await code(runtime.client.publishEnvironment('task1')), '403 FORBIDDEN');
    t.is(await code(other.client.publishEnvironment('task1')), '404 IMAGE_NOT_FOUND', 'other builders do not even see it');
    const own = await builder.client.createSandbox({ image: 'task1' });
    await own.delete();

    t.true((await builder.client.publishEnvironment('task1')).published);
    t.true((await runtime.client.listEnvironments()).some((e) => e.name === 'task1' && e.published));
    const rt = await runtime.client.createSandbox({ image: 'task1' });
    t.is((await rt.exec('cat /root/task/README')).stdout, 'task\n');
    t.is((await rt.exec('for p in /root/answers /root/.ash_history /tmp/t; do test -e $p && echo LEAK $p; done; true')).stdout, '', 'no builder residue');
    t.is(await code(other.client.publishEnvironment('task1', false)), '403 FORBIDDEN', 'only the owner (or an admin) unpublishes');

    // pack with publish:true in one step (builder) and the runtime's create works at once
    const p2 = await work.pack({ name: 'task2', publish: true });
    t.true(p2.environment.published);
    const rt2 = await runtime.client.createSandbox({ image: 'task2' });

    // quotas: 429 with a stable code; admins set them, others may read their own only
    t.is(await code(runtime.client.setQuota(runtime.id, { maxSandboxes: 1 })), '403 FORBIDDEN');
    await admin.setQuota(runtime.id, { maxSandboxes: 3 });
    const q = await runtime.client.quota();
    t.is(q.quota.maxSandboxes, 3);
    t.is(q.usage.sandboxes, 3);
    t.is(await code(runtime.client.createSandbox({ image: 'busybox' })), '429 QUOTA_EXCEEDED');
    await admin.setQuota(runtime.id, { maxSandboxes: null, maxMemoryMb: 3 * 512 + 100 });
    t.is(await code(runtime.client.createSandbox({ image: 'busybox', memoryMb: 256 })), '429 QUOTA_EXCEEDED');
    t.is(await code(runtime.client.createSandbox({ image: 'busybox', memoryMb: 64 })), 'ok');
    await admin.setQuota(runtime.id, { maxMemoryMb: null, maxCpu: 4.5 });
    t.is(await code(runtime.client.createSandbox({ image: 'busybox', cpu: 1 })), '429 QUOTA_EXCEEDED');
    t.is(await code(runtime.client.quota(builder.id)), '403 FORBIDDEN');

    // lifecycle over HTTP, ownership enforced
    t.is(await code(runtime.client.sandbox(work.id).pause()), '404 SANDBOX_NOT_FOUND');
    const paused = await work.pause();
    t.is(paused.state, 'paused');
    t.is((await work.refresh()).state, 'paused');
    t.is((await work.exec('cat /root/task/README')).stdout, 'task\n', 'exec resumed it');
    t.is((await work.refresh()).state, 'running');
    const job = await builder.client.pauseSandboxes({ job: 'build' });
    t.deepEqual(job.map((r) => r.id), [work.id]);
    t.deepEqual((await runtime.client.pauseSandboxes({ job: 'build' })).map((r) => r.id), [], 'a job selector never reaches other accounts');
    t.deepEqual((await builder.client.resumeSandboxes({ job: 'build' })).map((r) => r.state), ['running']);
    t.is(await code(work.extend({ seconds: 60 })), '400 INVALID_ARGUMENT', 'no ttl to extend');
    const ext = await work.extend({ ttlSeconds: 3600 });
    t.true(Date.parse(ext.lifecycle!.expiresAt!) > Date.now() + 3500_000);
    if (!feature('criu').supported) t.is(await code(work.hibernate()), '501 NOT_SUPPORTED', `criu: ${feature('criu').reason}`);

    for (const s of [work, rsb, rt, rt2]) await s.delete().catch(() => undefined);
  });
});
