/**
 * npm run bench:lazy — a fresh node starting the default image from a registry,
 * lazy against eager, side by side in one run (interleaved rounds):
 *
 *   eager  pull downloads every layer (verified), then create + first exec;
 *   lazy   pull fetches the manifest, config and chunk indexes; create mounts the
 *          layer through warren-lazyfs and the first exec reads what it needs.
 *
 * Time to first exec = pull + create + `python3 -c ...` answered; bytes fetched are
 * what the pull downloaded plus what warren-lazyfs fetched (its counters; a proxy
 * in front of the registry would add its own latency to every lazy read). Every round is a
 * new node (new data dir, empty chunk cache). The registry (docker-registry on
 * loopback, its own storage) is started by the benchmark and removed afterwards.
 * Needs root; conditions first, then the table; JSON to bench/results/lazy-layers.json.
 */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os, { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ShimNode } from '../src/shim/node';
import { pullImage, pushImage } from '../src/shim/layers/remote';
import { lazyUnavailableReason } from '../src/shim/layers/lazy';
import { openDatabase } from '../src/state/db';
import { withTestStore } from '../test/helpers/images';
import { registryReason, startRegistry } from '../test/helpers/registry';
import { spec } from '../test/helpers/warren';
import { conditions, percentile, printTable } from './stats';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const CMD = ['python3', '-c', 'import json, sys; print(json.dumps({"ok": sys.version_info[0]}))'];
const MIB = 1024 * 1024;

interface Sample {
  mode: 'lazy' | 'eager';
  pullMs: number;
  createMs: number;
  execMs: number;
  totalMs: number;
  bytes: number;
  requests: number;
}

async function main(): Promise<void> {
  const why = registryReason ?? lazyUnavailableReason() ?? (process.getuid?.() === 0 ? null : 'needs root');
  if (why) {
    console.log(`bench:lazy skipped: ${why}`);
    return;
  }
  const registry = await startRegistry();
  const samples: Sample[] = [];
  let imageBytes = 0;
  const cond: Record<string, string> = { ...conditions(), load: os.loadavg().map((x) => x.toFixed(1)).join(' '), registry: 'docker-registry 2.8 on loopback (filesystem storage)', rounds: String(ROUNDS) };
  try {
    const ref = `${registry.host}/warren/default:bench`;
    await withTestStore(async ({ store }) => {
      const img = await store.buildDebian({ name: 'default' });
      imageBytes = img.sizeBytes;
      const t0 = Date.now();
      const pushed = await pushImage(store, 'default', ref);
      cond.image = `default (Debian bookworm minbase + python3, git): ${img.layers.length} layer(s), ${(img.sizeBytes / MIB).toFixed(1)} MiB, lz4hc`;
      cond.push = `${Date.now() - t0} ms (${(pushed.bytesUploaded / MIB).toFixed(1)} MiB uploaded)`;
      cond.chunk = '64 KiB chunks, each verified (sha256) before it is served';
    });
    console.log('# conditions');
    for (const [k, v] of Object.entries(cond)) console.log(`${k}: ${v}`);

    for (let round = 0; round < ROUNDS; round++) {
      for (const mode of round % 2 === 0 ? (['eager', 'lazy'] as const) : (['lazy', 'eager'] as const)) {
        const dataDir = mkdtempSync(join(tmpdir(), `warren-bench-lazy-${mode}-`));
        const db = openDatabase(join(dataDir, 'warren.db'));
        const node = new ShimNode({ dataDir, db, nodeId: `bl${round}${mode[0]}` });
        try {
          await node.start();
          const t0 = performance.now();
          const pulled = await pullImage(node.layers, ref, { name: 'default', mode });
          const t1 = performance.now();
          const sb = await node.createSandbox(spec({ image: 'default', memoryMb: 512 }));
          const t2 = performance.now();
          const r = await node.exec(sb.id, { cmd: CMD });
          const t3 = performance.now();
          if (r.exitCode !== 0 || !r.stdout.includes('"ok": 3')) throw new Error(`exec failed: ${r.stdout} ${r.stderr}`);
          const lazy = node.layers.lazyStats();
          const bytes = pulled.bytesFetched + (lazy?.fetchedBytes ?? 0);
          samples.push({ mode, pullMs: t1 - t0, createMs: t2 - t1, execMs: t3 - t2, totalMs: t3 - t0, bytes, requests: lazy?.fetches ?? 0 });
          await node.deleteSandbox(sb.id);
        } finally {
          for (const s of node.listSandboxes()) await node.deleteSandbox(s.id).catch(() => undefined);
          await node.close();
          node.layers.unmountUnused();
          await node.layers.closeLazy();
          db.close();
          rmSync(dataDir, { recursive: true, force: true });
        }
      }
    }
  } finally {
    await registry.stop();
  }

  const rows: Array<Record<string, string>> = [];
  const summary: Record<string, unknown> = {};
  const med = (m: string, k: keyof Sample) => percentile(samples.filter((s) => s.mode === m).map((s) => s[k] as number), 50);
  for (const mode of ['eager', 'lazy']) {
    const bytes = med(mode, 'bytes');
    rows.push({
      mode,
      'pull ms': med(mode, 'pullMs').toFixed(0),
      'create ms': med(mode, 'createMs').toFixed(0),
      'first exec ms': med(mode, 'execMs').toFixed(0),
      'time to first exec ms': med(mode, 'totalMs').toFixed(0),
      'MiB fetched': (bytes / MIB).toFixed(2),
      'range requests': med(mode, 'requests').toFixed(0),
      '% of image': ((100 * bytes) / imageBytes).toFixed(1),
    });
    summary[mode] = { pullMs: med(mode, 'pullMs'), createMs: med(mode, 'createMs'), execMs: med(mode, 'execMs'), totalMs: med(mode, 'totalMs'), bytes };
  }
  console.log(`\n# fresh node, default image from the registry (median of ${ROUNDS})`);
  printTable(rows);
  const ratioTime = med('eager', 'totalMs') / med('lazy', 'totalMs');
  const ratioBytes = med('eager', 'bytes') / Math.max(1, med('lazy', 'bytes'));
  console.log(`\nlazy vs eager: ${ratioTime.toFixed(2)}x faster to first exec, ${ratioBytes.toFixed(1)}x fewer bytes fetched`);
  mkdirSync(join(__dirname, '..', '..', 'bench', 'results'), { recursive: true });
  writeFileSync(join(__dirname, '..', '..', 'bench', 'results', 'lazy-layers.json'), JSON.stringify({ conditions: cond, summary, samples, ratioTime, ratioBytes }, null, 2));
}

main().catch((err) => {
  console.error(err);
  process.exitCode = 1;
});
