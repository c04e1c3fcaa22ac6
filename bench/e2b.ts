/**
 * npm run bench:e2b: E2B's own SDK against Warren's E2B surface, side by side
 * with Warren's native SDK in the same run, on one `warren up` (loopback):
 *
 *  - create -> first command: `Sandbox.create()` + `commands.run('true')`
 *    against `createSandbox()` + `exec(['/bin/bash', '-l', '-c', 'true'])` as
 *    `user` (the command E2B's SDK runs);
 *  - round trip of `commands.run('true')` against the same native exec;
 *  - the surface without a process: `commands.list()` (a unary Connect call)
 *    against the native `GET /v1/sandboxes/:id`, through each SDK and through
 *    one fetch client (what the servers alone add).
 *
 * The difference of the medians is what the E2B surface adds. Conditions are
 * printed first; results go to bench/results/e2b.json.
 */
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { Sandbox } from 'e2b';
import { WarrenClient } from '../src/sdk';
import { conditions, percentile, printTable } from './stats';

const CREATES = Number(process.env.BENCH_CREATES ?? 30);
const RTT = Number(process.env.BENCH_RTT ?? 300);
const CMD = ['/bin/bash', '-l', '-c', 'true'];

async function main(): Promise<void> {
  const cond = conditions();
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
  console.log(`load average: ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);
  console.log(`creates: ${CREATES} per side; round trips: ${RTT} per side; e2b SDK 2.51.0 over HTTP/1.1 keep-alive`);
  const dataDir = mkdtempSync(join(os.tmpdir(), 'warren-bench-e2b-'));
  const cli = join(__dirname, '../src/cli/main.js');
  const child = spawn(process.execPath, [cli, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-network', '--e2b-port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const urls = await new Promise<{ url: string; e2b: string }>((resolve, reject) => {
    let out = '';
    const onData = (c: Buffer) => {
      out += c.toString();
      const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
      const e = /E2B API on (http:\/\/[\d.:]+)/.exec(out);
      if (m && e) resolve({ url: m[1]!, e2b: e[1]! });
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.once('exit', (code) => reject(new Error(`warren up exited ${code}: ${out}`)));
  });
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const client = new WarrenClient({ url: urls.url, token });
  const e2bOpts = { apiKey: token, apiUrl: `${urls.e2b}/e2b`, sandboxUrl: urls.e2b, domain: 'warren.bench' };
  const results: Record<string, unknown> = { conditions: cond };
  try {
    // Warm both paths (the first create maps the default image's layers).
    for (let i = 0; i < 3; i++) {
      const s = await Sandbox.create(e2bOpts);
      await s.commands.run('true');
      await s.kill();
      const n = await client.createSandbox({});
      await n.exec(CMD, { user: 'root' });
      await client.deleteSandbox(n.id);
    }

    const e2bCreate: number[] = [];
    const nativeCreate: number[] = [];
    for (let i = 0; i < CREATES; i++) {
      // Alternate so that drift on the machine hits both sides alike.
      let t0 = performance.now();
      const s = await Sandbox.create(e2bOpts);
      await s.commands.run('true');
      e2bCreate.push(performance.now() - t0);
      await s.kill();
      t0 = performance.now();
      const n = await client.createSandbox({});
      const r = await n.exec(CMD, { user: 'root' });
      nativeCreate.push(performance.now() - t0);
      if (r.exitCode !== 0) throw new Error(`native exec failed: ${JSON.stringify(r)}`);
      await client.deleteSandbox(n.id);
    }

    const s = await Sandbox.create(e2bOpts);
    const n = await client.createSandbox({});
    // The E2B side made the `user` account in its sandbox; the native side runs as root (the same bash -l).
    const e2bRtt: number[] = [];
    const nativeRtt: number[] = [];
    for (let i = 0; i < 20; i++) {
      await s.commands.run('true');
      await n.exec(CMD, { user: 'root' });
    }
    for (let i = 0; i < RTT; i++) {
      let t0 = performance.now();
      await s.commands.run('true');
      e2bRtt.push(performance.now() - t0);
      t0 = performance.now();
      await n.exec(CMD, { user: 'root' });
      nativeRtt.push(performance.now() - t0);
    }
    // The surface itself, without a process: a unary Connect call (process.List) against a native GET.
    const e2bRpc: number[] = [];
    const nativeGet: number[] = [];
    for (let i = 0; i < RTT; i++) {
      let t0 = performance.now();
      await s.commands.list();
      e2bRpc.push(performance.now() - t0);
      t0 = performance.now();
      await client.getSandbox(n.id);
      nativeGet.push(performance.now() - t0);
    }
    // The same, with one HTTP client for both (fetch, keep-alive): only the servers differ.
    const info = (await (await fetch(`${urls.e2b}/e2b/sandboxes/${s.sandboxId}`, { headers: { 'x-api-key': token } })).json()) as { envdAccessToken: string };
    const rawE2b: number[] = [];
    const rawNative: number[] = [];
    const rpcHeaders = { 'content-type': 'application/json', 'e2b-sandbox-id': s.sandboxId, 'x-access-token': info.envdAccessToken };
    for (let i = 0; i < RTT; i++) {
      let t0 = performance.now();
      await (await fetch(`${urls.e2b}/process.Process/List`, { method: 'POST', headers: rpcHeaders, body: '{}' })).text();
      rawE2b.push(performance.now() - t0);
      t0 = performance.now();
      await (await fetch(`${urls.url}/v1/sandboxes/${n.id}`, { headers: { authorization: `Bearer ${token}` } })).text();
      rawNative.push(performance.now() - t0);
    }
    await s.kill();
    await client.deleteSandbox(n.id);

    const row = (what: string, e: number[], nat: number[]) => ({
      measure: what,
      'e2b p50': `${percentile(e, 50).toFixed(2)} ms`,
      'e2b p99': `${percentile(e, 99).toFixed(2)} ms`,
      'native p50': `${percentile(nat, 50).toFixed(2)} ms`,
      'native p99': `${percentile(nat, 99).toFixed(2)} ms`,
      'added p50': `${(percentile(e, 50) - percentile(nat, 50)).toFixed(2)} ms`,
    });
    console.log('\n# E2B SDK vs native SDK (same node, same run)');
    printTable([row("create -> first commands.run('true')", e2bCreate, nativeCreate), row("commands.run('true') round trip", e2bRtt, nativeRtt), row('commands.list() vs GET /v1/sandboxes/:id', e2bRpc, nativeGet), row('same fetch client: List RPC vs GET', rawE2b, rawNative)]);
    results.raw = { e2b: { p50: percentile(rawE2b, 50), p99: percentile(rawE2b, 99) }, native: { p50: percentile(rawNative, 50), p99: percentile(rawNative, 99) } };
    results.unary = { e2b: { p50: percentile(e2bRpc, 50), p99: percentile(e2bRpc, 99) }, native: { p50: percentile(nativeGet, 50), p99: percentile(nativeGet, 99) } };
    results.create = { e2b: { p50: percentile(e2bCreate, 50), p99: percentile(e2bCreate, 99) }, native: { p50: percentile(nativeCreate, 50), p99: percentile(nativeCreate, 99) } };
    results.rtt = { e2b: { p50: percentile(e2bRtt, 50), p99: percentile(e2bRtt, 99) }, native: { p50: percentile(nativeRtt, 50), p99: percentile(nativeRtt, 99) } };
    mkdirSync(join(__dirname, '../../bench/results'), { recursive: true });
    writeFileSync(join(__dirname, '../../bench/results/e2b.json'), JSON.stringify(results, null, 2));
  } finally {
    const list = await client.listSandboxes().catch(() => []);
    for (const sb of list) await client.deleteSandbox(sb.id).catch(() => undefined);
    child.kill('SIGTERM');
    await new Promise((r) => child.once('exit', r));
    await rm(dataDir, { recursive: true, force: true }).catch(() => undefined);
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
