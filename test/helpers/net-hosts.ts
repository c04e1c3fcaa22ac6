/**
 * Test "hosts" that live on this machine only: a network namespace behind a
 * veth pair (a /30 in 10.231.0.0/16, not on any Warren bridge) running an HTTP
 * server and a UDP echo on one port. Nothing leaves the machine.
 *
 * Blocks are claimed with `ip netns add wth-<block>`, which fails when the name
 * exists, so concurrent test processes never get the same block.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync, readdirSync } from 'node:fs';
import { formatIpv4, parseIpv4, runTool, runToolChecked } from '../../src/shim/network/host-net';

const TEST_RANGE = parseIpv4('10.231.0.0')!;
const BLOCKS = 65536 / 4;

export interface TestHost {
  name: string;
  /** The test host's address (inside its namespace). */
  address: string;
  /** The host side of the veth pair; the machine routes to `address` through it. */
  hostAddress: string;
  port: number;
  netns: string;
  hostVeth: string;
  close(): Promise<void>;
}

const SERVER_SCRIPT = `
const http = require('node:http');
const dgram = require('node:dgram');
const port = Number(process.env.TEST_HOST_PORT);
const body = process.env.TEST_HOST_BODY;
let listening = 0;
const ready = () => { if (++listening === 2) process.stdout.write('ready\\n'); };
http.createServer((req, res) => {
  req.resume();
  res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}).listen(port, '0.0.0.0', ready);
const udp = dgram.createSocket('udp4');
udp.on('message', (msg, from) => udp.send(msg, from.port, from.address));
udp.bind(port, '0.0.0.0', ready);
// The test process holds our stdin; when it goes away, so do we.
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

async function claimBlock(requested: number | null): Promise<number> {
  const candidates = requested !== null ? [requested] : Array.from({ length: 32 }, () => Math.floor(Math.random() * BLOCKS));
  let lastError = '';
  for (const block of candidates) {
    if (block === 0) continue;
    const r = await runTool('ip', ['netns', 'add', `wth-${block}`]);
    if (r.code === 0) return block;
    lastError = r.stderr.trim();
    if (!/exists/i.test(lastError)) break;
  }
  throw new Error(`cannot claim a test host block in 10.231.0.0/16: ${lastError}`);
}

export async function startTestHost(opts: { name: string; address?: string; port: number; body: string }): Promise<TestHost> {
  let requestedBlock: number | null = null;
  let offsetInBlock = 2;
  if (opts.address !== undefined) {
    const value = parseIpv4(opts.address);
    if (value === null || value >>> 16 !== TEST_RANGE >>> 16 || (value & 3) === 0 || (value & 3) === 3) {
      throw new Error(`test host address ${opts.address} must be a host address of a /30 in 10.231.0.0/16`);
    }
    requestedBlock = (value - TEST_RANGE) >>> 2;
    offsetInBlock = value & 3;
  }
  const block = await claimBlock(requestedBlock);
  const netns = `wth-${block}`;
  const hostVeth = `wthv${block}`;
  const base = TEST_RANGE + block * 4;
  const address = formatIpv4(base + offsetInBlock);
  const hostAddress = formatIpv4(base + (offsetInBlock === 1 ? 2 : 1));

  let server: ChildProcess | null = null;
  const cleanup = async (): Promise<void> => {
    if (server !== null && server.exitCode === null && server.signalCode === null) {
      const exited = new Promise<void>((resolve) => server!.once('exit', () => resolve()));
      server.stdin?.end();
      const killTimer = setTimeout(() => server?.kill('SIGKILL'), 2000);
      await exited;
      clearTimeout(killTimer);
    }
    server = null;
    const commands: string[] = [];
    if (existsSync(`/sys/class/net/${hostVeth}`)) commands.push(`link delete dev ${hostVeth}`);
    if (existsSync(`/run/netns/${netns}`)) commands.push(`netns delete ${netns}`);
    if (commands.length > 0) await runTool('ip', ['-force', '-batch', '-'], { input: commands.join('\n') + '\n' });
  };

  try {
    await runToolChecked('ip', ['-batch', '-'], {
      input: [
        `link add ${hostVeth} type veth peer name eth0 netns ${netns}`,
        `address add ${hostAddress}/30 dev ${hostVeth}`,
        `link set dev ${hostVeth} up`,
        '',
      ].join('\n'),
      what: `test host ${opts.name}: veth`,
    });
    await runToolChecked('ip', ['-n', netns, '-batch', '-'], {
      input: ['link set dev lo up', `address add ${address}/30 dev eth0`, 'link set dev eth0 up', `route add default via ${hostAddress}`, ''].join('\n'),
      what: `test host ${opts.name}: addresses`,
    });
    const child = spawn('ip', ['netns', 'exec', netns, process.execPath, '-e', SERVER_SCRIPT], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, TEST_HOST_PORT: String(opts.port), TEST_HOST_BODY: opts.body },
    });
    server = child;
    await new Promise<void>((resolve, reject) => {
      let stdout = '';
      let stderr = '';
      const timer = setTimeout(() => reject(new Error(`test host ${opts.name} did not start: ${stderr}`)), 10_000);
      child.stdout!.setEncoding('utf8').on('data', (chunk: string) => {
        stdout += chunk;
        if (stdout.includes('ready\n')) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.stderr!.setEncoding('utf8').on('data', (chunk: string) => (stderr += chunk));
      child.once('exit', (code, signal) => {
        clearTimeout(timer);
        reject(new Error(`test host ${opts.name} exited (${code ?? signal}): ${stderr}`));
      });
    });
  } catch (err) {
    await cleanup();
    throw err;
  }
  return { name: opts.name, address, hostAddress, port: opts.port, netns, hostVeth, close: cleanup };
}

export interface NetResources {
  /** Namespaces in /run/netns whose name starts with the prefix. */
  netns: number;
  bridgeExists: boolean;
  /** Interfaces attached to the bridge (0 when there is no bridge). */
  bridgePorts: number;
  /** Whether `inet <nftTable>` exists (false when no table name was given). */
  nftTable: boolean;
  /** How many of the given interface names still exist. */
  interfaces: number;
}

/** What a pool or host network could leak, for leak checks. */
export async function netResources(prefix: string, scope: { bridge?: string; nftTable?: string; interfaces?: readonly string[] } = {}): Promise<NetResources> {
  const netns = existsSync('/run/netns') ? readdirSync('/run/netns').filter((n) => n.startsWith(prefix)).length : 0;
  const bridgeExists = scope.bridge !== undefined && existsSync(`/sys/class/net/${scope.bridge}/bridge`);
  const bridgePorts = bridgeExists ? readdirSync(`/sys/class/net/${scope.bridge}/brif`).length : 0;
  const nftTable = scope.nftTable !== undefined && (await runTool('nft', ['list', 'table', 'inet', scope.nftTable])).code === 0;
  const interfaces = (scope.interfaces ?? []).filter((name) => existsSync(`/sys/class/net/${name}`)).length;
  return { netns, bridgeExists, bridgePorts, nftTable, interfaces };
}
