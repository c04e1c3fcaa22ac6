/**
 * Adversarial suite, part 5: reward tampering (research/security_anchors.md D.36-D.40).
 * The agent's sandbox tries to find the answers, the hidden tests or the judge, and to change
 * what the verifier will see. The verdict must come from an environment the agent cannot touch.
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import test from 'ava';
import { integrationSkipReason, withGateway } from '../integration/gateway-fixture';
import { box, refused, sharedNode } from './helpers';

const node = sharedNode(2);
const { it } = node;
const HIDDEN = 'HIDDEN-ANSWER-5b1e9c';

it('reward: the verifier\'s hidden tests and answers are never visible in the agent\'s sandbox', async (t) => {
  const [agent, verifier] = node.boxes;
  await node.shim.writeFile(verifier!.id, '/root/tests/test_hidden.py', Buffer.from(`assert solve() == "${HIDDEN}"\n`));
  await verifier!.sh(`echo ${HIDDEN} > /tmp/expected; mkdir -p /work; cp /root/tests/test_hidden.py /work/`);
  // the needle comes from a file: the next test reads every command line in this sandbox
  await node.shim.writeFile(agent!.id, '/tmp/needle', Buffer.from(`${HIDDEN}\n`));
  const r = await agent!.sh(`grep -rls -f /tmp/needle /bin /etc /home /root /tmp /usr /var /work /opt /srv /mnt /dev/shm 2>/dev/null | grep -v '^/tmp/pattern$' | grep -v '^/tmp/needle$'; find / -xdev -name test_hidden.py 2>/dev/null; echo end`, { timeoutMs: 60_000 });
  t.is(r.stdout.trim(), 'end');
});

it('reward: the verifier\'s environment and command lines are not readable from the agent (/proc/*/environ, cmdline)', async (t) => {
  const [agent, verifier] = node.boxes;
  const judge = await node.shim.execStream(verifier!.id, { cmd: ['sleep', '300'], env: { EXPECTED: HIDDEN } });
  try {
    // the pattern comes from a file, so no command line of the agent's own contains it
    await node.shim.writeFile(agent!.id, '/tmp/pattern', Buffer.from(`${HIDDEN}\n`));
    const r = await agent!.sh(`cat /proc/*/environ /proc/*/cmdline 2>/dev/null | tr '\\0' '\\n' | grep -c -f /tmp/pattern; echo end`);
    t.regex(r.stdout, /^0\nend\n$/);
  } finally {
    judge.kill();
  }
});

it('reward: what the agent patches in the image (sitecustomize, profile, binaries, conftest) stays in its own sandbox; a fresh verifier sees the image pristine', async (t) => {
  const agent = node.boxes[0]!;
  const image = 'md5sum /bin/busybox /etc/profile 2>&1; ls -l /bin/true 2>&1; ls /bin/sitecustomize.py /root/tests/conftest.py /tmp/poison 2>&1';
  const before = (await agent.sh(image)).stdout;
  // The default profile lets a sandbox change its whole own root filesystem: these writes succeed,
  // and land in the agent's own writable layer, never in the shared read-only layers.
  const patched = await agent.sh(
    'echo "import os" > /bin/sitecustomize.py && echo "export EVIL=1" >> /etc/profile && rm /bin/true && printf "#!/bin/sh\\nexit 0\\n" > /bin/true && chmod +x /bin/true && ' +
      'mkdir -p /root/tests && echo "def test_x(): assert True  # tampered" > /root/tests/conftest.py && echo poisoned > /tmp/poison && echo patched',
  );
  t.is(patched.stdout.trim(), 'patched', patched.stderr);
  t.not((await agent.sh(image)).stdout, before, 'the agent sees its own changes');
  const fresh = await box(node.shim);
  try {
    t.is((await fresh.sh(image)).stdout, before, 'a fresh sandbox of the same image sees none of them');
  } finally {
    await node.shim.deleteSandbox(fresh.id);
  }
});

it('reward: the agent cannot reach a verifier sandbox over the network or its unix sockets', async (t) => {
  const [agent, verifier] = node.boxes;
  const server = await node.shim.execStream(verifier!.id, { cmd: ['/usr/local/bin/attack', 'abstract-listen', 'verifier-ctl'] });
  try {
    await new Promise<void>((res) => server.stdout.once('data', () => res()));
    refused(t, await agent!.attack('abstract-connect', 'verifier-ctl'));
    const r = await agent!.sh('ip addr 2>/dev/null | grep -c "inet " ; cat /proc/net/unix | grep -c verifier-ctl');
    t.regex(r.stdout, /\n0\n$/);
  } finally {
    server.kill();
  }
});

// FnCall judge: through the gateway's /v1/functions API.
const fnRoutes = existsSync(join(__dirname, '..', '..', 'src', 'gateway', 'routes', 'functions.js'));
const why = integrationSkipReason() ?? (fnRoutes ? null : 'the FnCall backend (/v1/functions) is not in this build');
(why === null ? test : (title: string, _fn: unknown) => test.skip(`${title} (skipped: ${why})`, () => undefined))(
  'reward: a judge run in FnCall cannot be influenced from the agent\'s sandbox',
  async (t) => {
    await withGateway(t, async ({ admin, account }) => {
      const agentAcct = account('runtime');
      const agent = await agentAcct.client.createSandbox({ image: 'busybox' });
      // the agent plants things wherever it can and looks for the judge
      await agent.exec('echo AGENT-POISON > /tmp/poison; echo AGENT-POISON > /dev/shm/poison; echo "export X=AGENT-POISON" > /root/.profile; kill -9 -1 2>/dev/null; true');
      await admin.functions.create({ name: 'adv-judge', image: 'busybox', min: 1, max: 1 }, { wait: true });
      try {
        const seen = await agent.exec('ps; ls /dev/shm /tmp; cat /proc/net/unix');
        t.false(/adv-judge|warren-fncall/.test(seen.stdout));
        const res = (await admin.functions.invoke('adv-judge', {
          cmd: ['/bin/sh', '-c', 'cat /tmp/poison /dev/shm/poison /root/.profile 2>/dev/null; echo verdict=$(( 6 * 7 ))'],
          timeoutMs: 10_000,
        })) as { stdout: string; exitCode: number | null };
        t.false(res.stdout.includes('AGENT-POISON'));
        t.regex(res.stdout, /verdict=42/);
      } finally {
        await admin.functions.delete('adv-judge').catch(() => undefined);
      }
    });
  },
);
