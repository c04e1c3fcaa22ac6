/**
 * A real OCI registry for tests (Debian's docker-registry, the CNCF distribution
 * registry) on a free loopback port with its own storage directory, and a
 * counting HTTP proxy in front of it so tests can assert how many bytes a node
 * fetched. Both are stopped (by pid / close) and their files removed by stop().
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { waitFor } from './wait';

export const registryReason: string | null = existsSync('/usr/bin/docker-registry') ? null : 'docker-registry is not installed (apt-get install docker-registry)';

export interface TestRegistry {
  /** host:port of the registry itself */
  host: string;
  storage: string;
  /** The file a blob is stored in (filesystem driver layout). */
  blobFile(digest: string): string;
  stop(): Promise<void>;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

export async function startRegistry(): Promise<TestRegistry> {
  const dir = mkdtempSync(join(tmpdir(), 'warren-registry-'));
  const storage = join(dir, 'data');
  let child: ChildProcess | null = null;
  let host = '';
  for (let attempt = 0; attempt < 3 && child === null; attempt++) {
    const port = await freePort();
    host = `127.0.0.1:${port}`;
    const cfg = join(dir, 'registry.yml');
    writeFileSync(
      cfg,
      ['version: 0.1', 'log: {level: error, accesslog: {disabled: true}}', `storage: {filesystem: {rootdirectory: ${storage}}, delete: {enabled: true}}`, `http: {addr: "${host}"}`, ''].join('\n'),
    );
    const c = spawn('docker-registry', ['serve', cfg], { stdio: ['ignore', 'ignore', 'pipe'] });
    let exited = false;
    c.on('exit', () => (exited = true));
    try {
      await waitFor(
        async () => {
          if (exited) return true;
          try {
            const res = await fetch(`http://${host}/v2/`);
            return res.status === 200;
          } catch {
            return false;
          }
        },
        15_000,
        'docker-registry to answer /v2/',
        50,
      );
    } catch {
      /* checked below */
    }
    if (!exited) child = c;
    else c.kill('SIGKILL');
  }
  if (child === null) {
    rmSync(dir, { recursive: true, force: true });
    throw new Error('docker-registry did not start');
  }
  const proc = child;
  return {
    host,
    storage,
    blobFile(digest) {
      const hex = digest.slice('sha256:'.length);
      return join(storage, 'docker/registry/v2/blobs/sha256', hex.slice(0, 2), hex, 'data');
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        const gone = new Promise((r) => proc.once('exit', r));
        proc.kill('SIGTERM');
        await gone;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface ProxyCounts {
  /** Body bytes of answers to GET requests for blobs (what a node fetched). */
  blobBytes: number;
  blobRequests: number;
  /** Range requests seen. */
  rangeRequests: number;
}

export interface CountingProxy {
  /** host:port to give nodes instead of the registry's */
  host: string;
  counts(): Promise<ProxyCounts>;
  reset(): Promise<void>;
  close(): Promise<void>;
}

// The proxy runs in its own process: a lazily mounted layer is read by the kernel on
// behalf of whoever touches it, and the test process itself does (mount(2) blocks it).
const PROXY = String.raw`
const http = require('node:http');
const target = process.argv[1];
const [thost, tport] = target.split(':');
const st = { blobBytes: 0, blobRequests: 0, rangeRequests: 0 };
let me = '';
const server = http.createServer((req, res) => {
  if (req.url === '/__counts') { res.end(JSON.stringify(st)); return; }
  if (req.url === '/__reset') { st.blobBytes = 0; st.blobRequests = 0; st.rangeRequests = 0; res.end('{}'); return; }
  const isBlob = req.method === 'GET' && /\/blobs\/sha256:/.test(req.url || '');
  if (isBlob) st.blobRequests++;
  if (req.headers.range) st.rangeRequests++;
  const up = http.request({ host: thost, port: Number(tport), method: req.method, path: req.url, headers: { ...req.headers, host: target } }, (ur) => {
    const headers = { ...ur.headers };
    if (typeof headers.location === 'string') headers.location = headers.location.replace('http://' + target, 'http://' + me);
    res.writeHead(ur.statusCode || 502, headers);
    ur.on('data', (c) => { if (isBlob) st.blobBytes += c.length; });
    ur.pipe(res);
  });
  up.on('error', () => { res.writeHead(502); res.end(); });
  req.pipe(up);
});
server.keepAliveTimeout = 60000;
server.listen(0, '127.0.0.1', () => { me = '127.0.0.1:' + server.address().port; process.stdout.write(me + '\n'); });
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
`;

/** A loopback HTTP proxy to `target` (host:port), in a child process, counting the blob bytes it passes. */
export async function startCountingProxy(target: string): Promise<CountingProxy> {
  const child = spawn(process.execPath, ['-e', PROXY, target], { stdio: ['pipe', 'pipe', 'inherit'] });
  const host = await new Promise<string>((resolve, reject) => {
    let buf = '';
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      if (buf.includes('\n')) resolve(buf.trim());
    });
    child.once('exit', () => reject(new Error('the counting proxy exited')));
  });
  // One connection per question: a kept-alive socket the proxy closes meanwhile would fail the next one.
  const ask = (path: string) =>
    new Promise<string>((resolve, reject) => {
      const [h, p] = host.split(':');
      const req = http.get({ host: h, port: Number(p), path, agent: false }, (res) => {
        let body = '';
        res.on('data', (d: Buffer) => (body += d.toString()));
        res.on('end', () => resolve(body));
      });
      req.on('error', reject);
    });
  return {
    host,
    async counts() {
      return JSON.parse(await ask('/__counts')) as ProxyCounts;
    },
    async reset() {
      await ask('/__reset');
    },
    async close() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const gone = new Promise((r) => child.once('exit', r));
      child.kill('SIGTERM');
      await gone;
    },
  };
}
