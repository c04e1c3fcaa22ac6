/**
 * Exec output costs the gateway bounded memory: a real `warren up` in a child
 * process, execs at the largest maxOutputBytes with binary output, clients
 * that never read their answers, and checks of what the answers carry
 * (JSON with base64, NDJSON streaming, the output limit stopping the writer).
 */
import test from 'ava';
import type { ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request } from 'undici';
import { skipReason } from '../../src/features';
import { testUnless } from '../helpers/skip';
import { WarrenClient } from '../../src/sdk';
import { removeTree } from '../../src/shim/layers/sys';
import { busyboxRootfs } from '../helpers/warren';
import { startWarrenProcess, stopNode } from '../helpers/warren-process';
import { peakOver, pollUntil, rssBytes, stuckHttp, type StuckSocket } from '../helpers/slow-client';

const skip = skipReason('native-helper', 'overlayfs', 'erofs', 'namespaces');
const it = testUnless(skip).serial;

const MiB = 1024 * 1024;
const MAX_OUTPUT = 64 * MiB;

interface Node {
  child: ChildProcess;
  url: string;
  port: number;
  token: string;
  client: WarrenClient;
}

let shared: Promise<Node> | null = null;
let cleanup: (() => Promise<void>) | null = null;
test.after.always(async () => {
  await cleanup?.();
});

/** One node for the tests of this file (they run one after another). */
function node(): Promise<Node> {
  shared ??= (async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'warren-execout-'));
    const { child, url } = await startWarrenProcess(dataDir, `x${process.pid.toString(36)}`);
    const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
    const client = new WarrenClient({ url, token });
    cleanup = async () => {
      for (const s of await client.listSandboxes().catch(() => [])) await client.deleteSandbox(s.id).catch(() => undefined);
      await client.close();
      await stopNode(child);
      removeTree(dataDir);
    };
    await client.images.import('busybox', await busyboxRootfs(), { type: 'directory' });
    return { child, url, port: Number(new URL(url).port), token, client };
  })();
  return shared;
}

const fdCount = (pid: number) => readdirSync(`/proc/${pid}/fd`).length;

async function post(n: Node, path: string, body: unknown, headers: Record<string, string> = {}) {
  const res = await request(`${n.url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${n.token}`, 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
    headersTimeout: 120_000,
    bodyTimeout: 120_000,
  });
  return { status: res.statusCode, headers: res.headers, text: await res.body.text() };
}

it(`concurrent worst-case execs whose answers are never read keep the gateway's memory bounded`, async (t) => {
  t.timeout(240_000);
  const n = await node();
  const sb = await n.client.createSandbox({ image: 'busybox', memoryMb: 512 });
  const pid = n.child.pid!;
  const before = rssBytes(pid);
  const fdsBefore = fdCount(pid);
  const N = 8;
  // Each: more than 64 MiB of NUL bytes, the worst case for JSON text (6 bytes each, \u0000), or as base64.
  const bodies = Array.from({ length: N }, (_, i) => ({
    cmd: 'head -c 80000000 /dev/zero',
    maxOutputBytes: MAX_OUTPUT,
    ...(i % 2 === 1 ? { encoding: 'base64' } : {}),
  }));
  const stuck: StuckSocket[] = [];
  t.teardown(() => stuck.forEach((s) => s.destroy()));
  let peak = before;
  const sampler = setInterval(() => (peak = Math.max(peak, rssBytes(pid))), 50);
  t.teardown(() => clearInterval(sampler));
  await Promise.all(
    bodies.map(async (b) => {
      const s = await stuckHttp(n.port, 'POST', `/v1/sandboxes/${sb.id}/exec`, n.token, JSON.stringify(b), 120_000);
      stuck.push(s);
      t.true(s.head.startsWith('HTTP/1.1 200'), s.head.split('\r\n')[0]);
    }),
  );
  // Every exec has ended and its answer is being written to a client that takes nothing.
  peak = Math.max(peak, await peakOver(() => rssBytes(pid), 2000));
  clearInterval(sampler);
  t.log(`gateway RSS ${(before / MiB).toFixed(0)} MiB before, peak ${(peak / MiB).toFixed(0)} MiB with ${N} unread answers of ${MAX_OUTPUT / MiB} MiB output each`);
  t.true(peak - before < 160 * MiB, `gateway grew by ${((peak - before) / MiB).toFixed(0)} MiB`);

  stuck.forEach((s) => s.destroy());
  // The answers' spill files are released (no fds left) and the memory is given back.
  let fds = 0;
  await pollUntil(() => (fds = fdCount(pid)) <= fdsBefore + 2, 20_000, () => `gateway has ${fds} fds, had ${fdsBefore}`);
  let now = 0;
  await pollUntil(() => (now = rssBytes(pid)) - before < 48 * MiB, 30_000, () => `RSS ${(now / MiB).toFixed(0)} MiB, was ${(before / MiB).toFixed(0)} MiB`);
  t.true(now - before < 48 * MiB);
  await n.client.deleteSandbox(sb.id);
});

it(`the output limit stops a writer that would never stop, and the answer says truncated`, async (t) => {
  const n = await node();
  const sb = await n.client.createSandbox({ image: 'busybox' });
  const started = Date.now();
  const r = await sb.exec('yes', { maxOutputBytes: 1 * MiB, timeoutMs: 60_000 });
  t.true(Date.now() - started < 30_000, `took ${Date.now() - started} ms`);
  t.not(r.status, 'timeout');
  t.is(r.signal, 13, 'yes was stopped by SIGPIPE at the limit');
  t.true(r.truncated);
  t.is(r.stdout.length, 1 * MiB);
  // A shell that goes on after the cut keeps running, and what it writes to the other stream is kept.
  const r2 = await sb.exec('yes | head -c 5000000; echo after-the-cut >&2', { maxOutputBytes: 100_000 });
  t.true(r2.truncated);
  t.is(r2.stdout.length, 100_000);
  t.is(r2.stderr, 'after-the-cut\n');
  t.is(r2.exitCode, 0);
  // Exactly at the limit is not truncated.
  const r3 = await sb.exec('printf 12345', { maxOutputBytes: 5 });
  t.deepEqual([r3.stdout, r3.truncated], ['12345', false]);
  await n.client.deleteSandbox(sb.id);
});

it(`binary output: base64 JSON answers carry the exact bytes; the default stays UTF-8 text`, async (t) => {
  const n = await node();
  const sb = await n.client.createSandbox({ image: 'busybox' });
  // 3 MiB of random bytes (large: written in pieces, spilled on the node), and its digest from inside.
  await sb.exec('head -c 3145728 /dev/urandom > /tmp/blob');
  const digest = (await sb.exec('sha256sum /tmp/blob')).stdout.split(' ')[0];
  const res = await post(n, `/v1/sandboxes/${sb.id}/exec`, { cmd: 'cat /tmp/blob; printf "\\377err" >&2', encoding: 'base64', maxOutputBytes: 8 * MiB });
  t.is(res.status, 200);
  const body = JSON.parse(res.text);
  t.is(body.encoding, 'base64');
  const bytes = Buffer.from(body.stdout, 'base64');
  t.is(bytes.length, 3145728);
  t.is(createHash('sha256').update(bytes).digest('hex'), digest);
  t.deepEqual(Buffer.from(body.stderr, 'base64'), Buffer.from([0xff, 0x65, 0x72, 0x72]));
  t.like(body, { exitCode: 0, status: 'ok', truncated: false });
  // The SDK asks for base64 and hands back bytes.
  const raw = await sb.execBytes('cat /tmp/blob', { maxOutputBytes: 8 * MiB });
  t.is(createHash('sha256').update(raw.stdout).digest('hex'), digest);
  // Large UTF-8 text written in pieces is the same text, multibyte characters across piece borders included.
  const text = await post(n, `/v1/sandboxes/${sb.id}/exec`, { cmd: "i=0; while [ $i -lt 40000 ]; do printf 'ünï€😀\\n'; i=$((i+1)); done", maxOutputBytes: 8 * MiB });
  const tb = JSON.parse(text.text);
  t.is(tb.stdout, 'ünï€😀\n'.repeat(40000));
  t.is(tb.encoding, undefined);
  await n.client.deleteSandbox(sb.id);
});

it(`NDJSON exec streams output while the command runs, then one exit line`, async (t) => {
  const n = await node();
  const sb = await n.client.createSandbox({ image: 'busybox' });
  const res = await request(`${n.url}/v1/sandboxes/${sb.id}/exec`, {
    method: 'POST',
    headers: { authorization: `Bearer ${n.token}`, 'content-type': 'application/json', accept: 'application/x-ndjson' },
    body: JSON.stringify({ cmd: 'echo first; sleep 1; printf "\\000\\001\\002" >&2; echo last; exit 3' }),
  });
  t.is(res.statusCode, 200);
  t.is(res.headers['content-type'], 'application/x-ndjson');
  const lines: Array<{ at: number; v: Record<string, any> }> = [];
  const t0 = Date.now();
  let buf = '';
  for await (const chunk of res.body) {
    buf += (chunk as Buffer).toString('utf8');
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      lines.push({ at: Date.now() - t0, v: JSON.parse(buf.slice(0, nl)) });
      buf = buf.slice(nl + 1);
    }
  }
  const types = lines.map((l) => l.v.type);
  t.is(types.at(-1), 'exit');
  t.like(lines.at(-1)!.v, { exitCode: 3, status: 'error', truncated: false });
  const first = lines.find((l) => l.v.type === 'stdout' && l.v.data.includes('first'))!;
  const exit = lines.at(-1)!;
  t.true(exit.at - first.at >= 800, `first output came ${exit.at - first.at} ms before the end`);
  const err = lines.filter((l) => l.v.type === 'stderr');
  t.deepEqual(Buffer.concat(err.map((l) => Buffer.from(l.v.data, l.v.encoding === 'base64' ? 'base64' : 'utf8'))), Buffer.from([0, 1, 2]));
  const out = lines.filter((l) => l.v.type === 'stdout').map((l) => l.v.data).join('');
  t.is(out, 'first\nlast\n');
  // The SDK reads the same stream.
  const seen: string[] = [];
  const outcome = await sb.execStream('echo a; echo b >&2', { onStdout: (b) => seen.push(`out:${b}`), onStderr: (b) => seen.push(`err:${b}`) });
  t.like(outcome, { exitCode: 0, status: 'ok' });
  t.deepEqual(seen.sort(), ['err:b\n', 'out:a\n']);
  await n.client.deleteSandbox(sb.id);
});
