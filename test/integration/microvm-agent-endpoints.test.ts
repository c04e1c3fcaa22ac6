/**
 * The guest agent's listening endpoints, run on the host: where a VMM has no
 * virtio-serial (Firecracker), the agent and its session servers listen and
 * accept host connections (vsock in a guest), and the newest connection
 * replaces the one before. This machine has no vsock transport to run that
 * over (no vsock_loopback, no vhost-vsock), so the same code runs here over
 * unix sockets ("unix:PATH" endpoints, which take the same listen/accept path
 * as "vsock:PORT"), with the real warren-agent as pid 1 of a pid namespace
 * (chrooted into a busybox root, as in a guest) and the real warren-vmshell.
 * A unix socket server in front of them speaks Firecracker's host-side vsock
 * handshake ("CONNECT <port>" -> "OK <n>", or a close when nothing listens),
 * so the host's dialer and `warren-vmshell --vsock` are exercised end to end.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { skipReason } from '../../src/features';
import { AgentClient } from '../../src/shim/backends/microvm/agent-client';
import { AgentType, encodeExec } from '../../src/shim/backends/microvm/agent-protocol';
import { vsockDial } from '../../src/shim/backends/microvm/firecracker';
import { agentBinary, vmshellBinary } from '../../src/shim/backends/microvm/guest';
import { testUnless } from '../helpers/skip';
import { tempDir } from '../helpers/tmp';
import { busyboxRootfs } from '../helpers/warren';

const reason = skipReason('namespaces') ?? (existsSync(agentBinary()) && existsSync(vmshellBinary()) ? null : `the guest agent is not built (${agentBinary()})`);
const t0 = testUnless(reason);

let dir: string;
let agent: ChildProcess | null = null;
let hybrid: net.Server | null = null;
/** The ports the handshake server was asked for, in order. */
const connects: number[] = [];
const AGENT_PORT = 1024;
const FIRST_SESSION = 1025;

/** The agent's endpoint for vsock port `port`: the agent's own at 1024, the sessions' s0.sock, s1.sock after it. */
function endpoint(port: number): string {
  return port === AGENT_PORT ? join(dir, 'agent.sock') : join(dir, `s${port - FIRST_SESSION}.sock`);
}

t0.before(async () => {
  dir = tempDir('warren-agent-ep-');
  const root = await busyboxRootfs();
  // its own pid namespace: pid 1 there, as in a guest, and whatever it does to "all processes" stays there
  agent = spawn('unshare', ['--mount', '--pid', '--fork', '--kill-child', '--mount-proc', agentBinary()], {
    env: { PATH: '/usr/bin:/bin', WARREN_AGENT_PORT: `unix:${endpoint(AGENT_PORT)}`, WARREN_ROOT: root, WARREN_SESSION_PORTS: [0, 1].map((i) => `unix:${endpoint(FIRST_SESSION + i)}`).join(',') },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  // Firecracker's host side of a hybrid vsock: CONNECT <port> reaches the guest's listener on that port, or closes
  hybrid = net.createServer((client) => {
    client.on('error', () => undefined);
    let line = '';
    const onData = (c: Buffer) => {
      line += c.toString('latin1');
      const m = /^CONNECT (\d+)\n/.exec(line);
      if (m === null) {
        if (line.length > 32) client.destroy();
        return;
      }
      client.off('data', onData);
      connects.push(Number(m[1]));
      client.pause();
      const guest = net.createConnection({ path: endpoint(Number(m[1])) });
      guest.on('error', () => client.destroy());
      guest.once('connect', () => {
        client.write(`OK ${40000 + Number(m[1])}\n`);
        const rest = Buffer.from(line.slice(m[0].length), 'latin1');
        if (rest.length > 0) guest.write(rest);
        client.pipe(guest);
        guest.pipe(client);
        client.resume();
      });
      client.on('close', () => guest.destroy());
      guest.on('close', () => client.destroy());
    };
    client.on('data', onData);
  });
  await new Promise<void>((r) => hybrid!.listen(join(dir, 'v.sock'), r));
});

t0.after.always(async () => {
  agent?.kill('SIGKILL');
  await new Promise<void>((r) => (hybrid ? hybrid.close(() => r()) : r()));
});

/** Run argv through the agent; its stdout and exit code. */
function run(client: AgentClient, argv: string[]): Promise<{ stdout: string; code: number }> {
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`${argv.join(' ')}: no exit within 10 s`)), 10_000);
    const chan = client.open({
      frame: (f) => {
        if (f.type === AgentType.ERR) {
          clearTimeout(timer);
          reject(new Error(`exec refused: ${f.payload.subarray(4).toString()}`));
        } else if (f.type === AgentType.OUT && f.payload[0] === 1) out += f.payload.subarray(1).toString();
        else if (f.type === AgentType.EXIT) {
          clearTimeout(timer);
          client.releaseChannel(chan);
          // output still in flight arrives before EXIT: the agent drains the pipes first
          resolve({ stdout: out, code: f.payload.readUInt32LE(0) });
        }
      },
      fail: (err) => {
        clearTimeout(timer);
        reject(err);
      },
    });
    client.send(encodeExec(chan, { argv, env: ['PATH=/bin:/usr/bin'], cwd: '/', uid: 0, gid: 0 }));
  });
}

function ended(client: AgentClient, ms: number): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    client.onEnd(() => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

t0.serial('the agent accepts a host connection, and a newer one replaces it: the older is closed, the newer served', async (t) => {
  const a = await AgentClient.connect(endpoint(AGENT_PORT), 10_000);
  t.deepEqual(await run(a, ['echo', 'first']), { stdout: 'first\n', code: 0 });
  const b = await AgentClient.connect(endpoint(AGENT_PORT), 5000);
  t.true(await ended(a, 5000), 'the older connection is closed by the agent');
  t.deepEqual(await run(b, ['sh', '-c', 'echo $((6 * 7)); exit 5']), { stdout: '42\n', code: 5 });
  // a host that closes and comes back is served again, from a clean frame boundary
  b.close();
  const c = await AgentClient.connect(endpoint(AGENT_PORT), 5000);
  t.deepEqual(await run(c, ['cat', '/etc/hostname']).then((r) => r.code), 0);
  t.regex((await run(c, ['sh', '-c', 'echo $$ $PPID'])).stdout, /^\d+ 1\n$/, 'commands are children of the agent, pid 1 of its namespace');
  c.close();
});

t0.serial("through Firecracker's vsock handshake: the host's dialer reaches the agent, a port nothing listens on is closed", async (t) => {
  const client = await AgentClient.connect(() => vsockDial(join(dir, 'v.sock'), AGENT_PORT, 2000), 10_000);
  t.deepEqual(await run(client, ['echo', 'over vsock']), { stdout: 'over vsock\n', code: 0 });
  client.close();
  const err = await t.throwsAsync(vsockDial(join(dir, 'v.sock'), 4242, 2000));
  t.regex(err!.message, /closed before OK/);
});

/** A shell session through warren-vmshell: what it printed and how it ended. */
function session(extra: string[], input: string): Promise<{ stdout: string; code: number | null }> {
  return new Promise((resolve, reject) => {
    const p = spawn(vmshellBinary(), ['--dir', dir, '--slots', '2', ...extra, '--mode', 'command', '--cwd', '/', '--uid', '0', '--gid', '0', '--env', 'PATH=/bin:/usr/bin', '--', '/bin/sh'], { stdio: ['pipe', 'pipe', 'inherit'] });
    let out = '';
    const timer = setTimeout(() => {
      p.kill('SIGKILL');
      reject(new Error(`session did not end within 15 s (so far: ${JSON.stringify(out)})`));
    }, 15_000);
    p.stdout!.on('data', (c: Buffer) => (out += c.toString()));
    p.on('exit', (code) => {
      clearTimeout(timer);
      resolve({ stdout: out, code });
    });
    p.stdin!.end(input);
  });
}

t0.serial('shell sessions reach the session servers through their own sockets, and with --vsock through the handshake', async (t) => {
  connects.length = 0;
  t.deepEqual(await session([], 'echo direct; exit 3\n'), { stdout: 'direct\n', code: 3 });
  t.deepEqual(connects, [], 'without --vsock the bridge connects to the slot socket itself');
  t.deepEqual(await session(['--vsock', String(FIRST_SESSION)], 'echo "over vsock $((1 + 1))"; exit 4\n'), { stdout: 'over vsock 2\n', code: 4 });
  t.deepEqual(connects, [FIRST_SESSION], 'slot 0 is vsock port FIRST');
  // a session server serves one session after another on its port
  t.deepEqual(await session(['--vsock', String(FIRST_SESSION)], 'echo again\n'), { stdout: 'again\n', code: 0 });
});
