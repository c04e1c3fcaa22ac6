/**
 * A node and its gateway as two processes joined only by the shim protocol:
 * `warren up --shim-listen` and `warren gateway --node`. Through the gateway:
 * the native SDK (sandboxes, exec, files, shell sessions) and E2B's own SDK
 * (commands, files, watches). A gateway killed with -9 and started again
 * loses nothing: the sandbox is there, the session is attached again with its
 * output. A gateway without the node's token does not start.
 */
import test from 'ava';
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { Sandbox } from 'e2b';
import { WarrenClient } from '../../src/sdk';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';
import { waitFor } from '../helpers/wait';
import { rootSkipReason } from '../helpers/warren';

const CLI = resolve(__dirname, '../../src/cli/main.js');
const it = testUnless(rootSkipReason()).serial;

interface Proc {
  child: ChildProcess;
  out: () => string;
  /** The first match of `re` in the output (waits for it). */
  line(re: RegExp, ms?: number): Promise<RegExpExecArray>;
}

function start(args: string[]): Proc {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let text = '';
  child.stdout!.on('data', (c: Buffer) => (text += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (text += c.toString()));
  return {
    child,
    out: () => text,
    async line(re, ms = 300_000) {
      let m: RegExpExecArray | null = null;
      await waitFor(() => (m = re.exec(text)) !== null || child.exitCode !== null, ms, `${re} in the output of warren ${args[0]}`, 50);
      if (m === null) throw new Error(`warren ${args[0]} exited ${child.exitCode}: ${text}`);
      return m;
    },
  };
}

async function stop(p: Proc | null, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (p === null || p.child.exitCode !== null || p.child.signalCode !== null) return;
  const exited = new Promise<void>((r) => p.child.once('exit', () => r()));
  p.child.kill(signal);
  await exited;
}

let node: Proc | null = null;
let gateway: Proc | null = null;
let nodeDir = '';
let gwDir = '';
let shimUrl = '';
let tokenFile = '';

async function startGateway(): Promise<{ url: string; e2bUrl: string }> {
  gateway = start(['gateway', '--node', shimUrl, '--shim-token-file', tokenFile, '--listen', '127.0.0.1:0', '--data-dir', gwDir, '--e2b-port', '0']);
  const url = (await gateway.line(/is listening on (http:\/\/[\d.:]+)/))[1]!;
  const e2bUrl = (await gateway.line(/E2B API on (http:\/\/[\d.:]+)/))[1]!;
  return { url, e2bUrl };
}

test.before(async () => {
  if (rootSkipReason() !== null) return;
  nodeDir = tempDir('warren-split-node-');
  gwDir = tempDir('warren-split-gw-');
  tokenFile = join(nodeDir, 'shim.token');
  node = start(['up', '--listen', '127.0.0.1:0', '--data-dir', nodeDir, '--node-id', 'split', '--no-network', '--shim-listen', '127.0.0.1:0', '--shim-token-file', tokenFile]);
  shimUrl = (await node.line(/Shim protocol on (http:\/\/[\d.:]+)/))[1]!;
});

test.after.always(async () => {
  await stop(gateway);
  await stop(node);
});

it('the gateway serves the native SDK, shells and E2B for a node it reaches only over the shim protocol', async (t) => {
  const { url, e2bUrl } = await startGateway();
  const token = readFileSync(join(gwDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url, token });
  const e2bOpts = { apiKey: token, apiUrl: `${e2bUrl}/e2b`, sandboxUrl: e2bUrl, domain: 'warren.test', requestTimeoutMs: 60_000 };
  try {
    t.is((await client.features()).node, 'split');
    const sb = await client.createSandbox({ image: 'default', labels: { suite: 'split' } });
    t.true(sb.id.startsWith('split-'));
    t.is((await sb.exec(['python3', '-c', 'print(6*7)'])).stdout, '42\n');
    await sb.writeFile('/tmp/note', 'through the protocol');
    t.is((await sb.readFile('/tmp/note')).toString(), 'through the protocol');
    const sh = await sb.shell();
    const seen: string[] = [];
    sh.on('output', (o: { data: Buffer | string }) => seen.push(o.data.toString()));
    t.is((await sh.run('echo before-restart')).exitCode, 0);
    const session = sh.session;
    await sh.detach();

    // E2B's own SDK through the same gateway
    const e = await Sandbox.create({ ...e2bOpts, metadata: { suite: 'split' } });
    try {
      t.is((await e.commands.run('echo "$((6*7))"')).stdout, '42\n');
      await e.files.write('notes/a.txt', 'hello');
      t.is(await e.files.read('notes/a.txt'), 'hello');
      const events: string[] = [];
      const w = await e.files.watchDir('notes', (ev) => void events.push(`${ev.type} ${ev.name}`), { timeoutMs: 0 });
      await e.files.write('notes/b.txt', 'x');
      await waitFor(() => events.some((x) => x.endsWith(' b.txt')), 15_000, `a watch event for b.txt (got ${events.join(', ')})`);
      await w.stop();
    } finally {
      await e.kill();
    }

    // kill -9 the gateway, start it again: the sandbox and its session are still the node's
    await stop(gateway, 'SIGKILL');
    const again = await startGateway();
    const c2 = new WarrenClient({ url: again.url, token });
    try {
      const back = await c2.getSandbox(sb.id);
      t.is(back.info?.labels.suite, 'split');
      const sh2 = await back.shell({ session, offset: 0 });
      const replay: string[] = [];
      sh2.on('output', (o: { data: Buffer | string }) => replay.push(o.data.toString()));
      t.is((await sh2.run('echo after-restart')).exitCode, 0);
      await waitFor(() => replay.join('').includes('before-restart') && replay.join('').includes('after-restart'), 10_000, 'the replayed and the new output');
      await sh2.close();
      await back.delete();
      t.deepEqual((await c2.listSandboxes({ labels: { suite: 'split' } })).map((s) => s.id), []);
    } finally {
      await c2.close();
    }
  } finally {
    await client.close();
  }
  // The node itself agrees: nothing of these tests is left on it.
  const nodeToken = readFileSync(join(nodeDir, 'admin.token'), 'utf8').trim();
  const nodeUrl = (await node!.line(/Warren is listening on (http:\/\/[\d.:]+)/))[1]!;
  const direct = new WarrenClient({ url: nodeUrl, token: nodeToken });
  try {
    t.deepEqual((await direct.listSandboxes()).map((s) => s.id), []);
  } finally {
    await direct.close();
  }
});

it('a gateway without the node\'s token does not start, and says why', async (t) => {
  const wrong = join(gwDir, 'wrong.token');
  writeFileSync(wrong, `${'0'.repeat(64)}\n`, { mode: 0o600 });
  const g = start(['gateway', '--node', shimUrl, '--shim-token-file', wrong, '--listen', '127.0.0.1:0', '--data-dir', tempDir('warren-split-bad-')]);
  const code = await new Promise<number | null>((r) => g.child.once('exit', (c) => r(c)));
  t.not(code, 0);
  t.regex(g.out(), /UNAUTHENTICATED|cluster token|shim protocol/);
  const usage = start(['gateway', '--node', shimUrl, '--listen', '127.0.0.1:0', '--data-dir', gwDir]);
  t.not(await new Promise<number | null>((r) => usage.child.once('exit', (c) => r(c))), 0);
  t.regex(usage.out(), /--shim-token-file/);
});
