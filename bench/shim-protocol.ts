/**
 * npm run bench:shim: what the shim protocol costs over the in-process
 * binding, on one node in one run. The same calls go through LocalShim (the
 * baseline, what `warren up` runs) and through RemoteShim over loopback to a
 * shim server serving that same LocalShim, alternated sample by sample:
 *
 *  - getSandbox (a JSON call with no work behind it: the protocol's floor)
 *  - exec `true`, and an exec of 1 MiB of output (captured)
 *  - a shell session's `run true` (WebSocket frames both ways)
 *  - readFile of 1 MiB (a raw answer body)
 *  - create → first exec → delete of a `default` sandbox
 *
 * Conditions are printed first; results go to bench/results/shim-protocol.json.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import os from 'node:os';
import { join } from 'node:path';
import { LocalShim } from '../src/shim/local';
import { openShim } from '../src/shim/node';
import { RemoteShim } from '../src/shim/remote/client';
import { serveShim } from '../src/shim/remote/server';
import type { SandboxSpec, Shim } from '../src/shim/types';
import { openDatabase } from '../src/state/db';
import { conditions, percentile, printTable } from './stats';

const N = Number(process.env.BENCH_N ?? 200);
let runs = 0;

async function main(): Promise<void> {
  const cond = { ...conditions(), loadavg: os.loadavg().map((l) => l.toFixed(1)).join(' '), samples: `${N} per side, alternated (create: ${Math.ceil(N / 4)})`, transport: 'loopback TCP, one keep-alive pool' };
  for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);
  const dataDir = mkdtempSync(join(os.tmpdir(), 'warren-bench-shim-'));
  const db = openDatabase(join(dataDir, 'warren.db'));
  const node = await openShim({ dataDir, db, ensureDefaultImage: true, nodeId: 'bshim' });
  const local = new LocalShim(node);
  const token = randomBytes(24).toString('hex');
  const server = await serveShim({ shim: local, token, host: '127.0.0.1', port: 0 });
  const remote = await RemoteShim.connect({ url: server.url, token });
  const sides: Array<[string, Shim]> = [
    ['in-process', local],
    ['shim protocol', remote],
  ];
  try {
    const base = await defaults();
    const sb = await local.createSandbox(base);
    await local.exec(sb.id, { cmd: "head -c 1048576 /dev/zero > /tmp/mib" });
    const sessions = new Map<string, Awaited<ReturnType<Shim['openSession']>>>();
    for (const [name, s] of sides) {
      const att = await s.openSession(sb.id, { mode: 'command' });
      att.onOutput(() => undefined);
      sessions.set(name, att);
    }
    const cases: Array<[string, (s: Shim, side: string) => Promise<unknown>, number]> = [
      ['getSandbox', (s) => s.getSandbox(sb.id), N],
      ['exec true', (s) => s.exec(sb.id, { cmd: ['true'] }), N],
      ['exec, 1 MiB captured output', async (s) => (await s.execCaptured(sb.id, { cmd: ['cat', '/tmp/mib'], maxOutputBytes: 2 << 20 })).release(), N],
      ['session run true', (_s, side) => sessions.get(side)!.run(`r${++runs}`, 'true'), N],
      ['readFile 1 MiB', (s) => s.readFile(sb.id, '/tmp/mib', 2 << 20), N],
      ['create, first exec, delete', async (s) => {
        const x = await s.createSandbox(base);
        await s.exec(x.id, { cmd: ['true'] });
        await s.deleteSandbox(x.id);
      }, Math.ceil(N / 4)],
    ];
    const ms = (v: number) => `${v.toFixed(2)} ms`;
    const rows: Array<Record<string, string>> = [];
    const out: Record<string, unknown> = { conditions: cond };
    for (const [what, fn, n] of cases) {
      for (const [name, s] of sides) for (let i = 0; i < 5; i++) await fn(s, name);
      const samples = new Map<string, number[]>(sides.map(([name]) => [name, []]));
      for (let i = 0; i < n; i++) {
        for (const [name, s] of i % 2 === 0 ? sides : [...sides].reverse()) {
          const t0 = performance.now();
          await fn(s, name);
          samples.get(name)!.push(performance.now() - t0);
        }
      }
      const l = samples.get('in-process')!;
      const r = samples.get('shim protocol')!;
      rows.push({ what, 'in-process p50': ms(percentile(l, 50)), 'protocol p50': ms(percentile(r, 50)), 'protocol p99': ms(percentile(r, 99)), 'ratio p50': (percentile(r, 50) / percentile(l, 50)).toFixed(2), 'added p50': ms(percentile(r, 50) - percentile(l, 50)) });
      out[what] = { local: { p50: percentile(l, 50), p99: percentile(l, 99) }, remote: { p50: percentile(r, 50), p99: percentile(r, 99) } };
    }
    printTable(rows);
    mkdirSync(join(__dirname, '../../bench/results'), { recursive: true });
    writeFileSync(join(__dirname, '../../bench/results/shim-protocol.json'), JSON.stringify(out, null, 2));
    for (const att of sessions.values()) await att.close();
    await local.deleteSandbox(sb.id);
  } finally {
    await remote.close();
    await server.close();
    await node.close();
    node.layers.unmountUnused();
    db.close();
    await rm(dataDir, { recursive: true, force: true }).catch(() => undefined);
  }
}

/** The create request's defaults as the gateway fills them in. */
async function defaults(): Promise<SandboxSpec> {
  const { validateCreateRequest } = await import('../src/validation');
  return validateCreateRequest({ image: 'default' }, { owner: 'bench', host: { cpus: os.cpus().length, memoryMb: Math.floor(os.totalmem() / 2 ** 20) } });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
