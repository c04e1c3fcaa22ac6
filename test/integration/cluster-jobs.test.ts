/**
 * Cluster jobs on a real cluster on this machine: 3 etcd members, one `warren gateway` and 3
 * `warren node` processes on loopback (n1 and n2 labelled tier=jobs, n2 started with a create
 * window of 2; n3 labelled tier=spare). The tests run in order on that one cluster:
 *
 * - the placement explanation a job records when asked (`?explain=1`), one verdict per node;
 * - the `warren job` CLI as a user runs it (create with its progress output, watch, ls, pause,
 *   resume, rm, and its errors), as child processes against the gateway;
 * - a job cancelled while it creates: the nodes stop creating, what was made stays until rm;
 * - a node's create window bounds the creates of a job in flight on that node;
 * - a node woken after its lease expired refuses creates (NODE_FENCED) while it removes the
 *   sandboxes of the lost epoch, then registers again with the next epoch.
 *
 * The nodes export their spans over OTLP to a collector in this test: the span of each create
 * (`warren.sandbox.create`, carrying the sandbox id) says when that create ran on its node, which
 * is how the creates in flight on a node are counted.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { type IncomingMessage, type Server, createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import type { TestFn } from 'ava';
import anyTest from 'ava';
import { type JobStatus, WarrenClient, WarrenError } from '../../src/sdk';
import type { JobEvent } from '../../src/sdk/jobs';
import { ClusterFixture, type NodeOptions, type NodeProc, etcdReason } from '../helpers/cluster';
import { testUnless } from '../helpers/skip';
import { elapse, waitFor, waitForValue, within } from '../helpers/wait';

const test = testUnless(etcdReason, anyTest as TestFn<unknown>);
const CLI = join(__dirname, '../../src/cli/main.js');
const JOB_ID = /^job-[0-9a-f]{16}$/;

/** The cluster fixture, with every node exporting its spans to `otlp`. */
class TracedCluster extends ClusterFixture {
  constructor(private readonly otlp: string) {
    super();
  }

  override nodeArgs(id: string, dataDir: string, o: NodeOptions): string[] {
    return [...super.nodeArgs(id, dataDir, o), '--otlp', this.otlp];
  }
}

/** When one create ran on its node (ns on that node's clock). */
interface CreateSpan {
  start: bigint;
  end: bigint;
}

/** Create spans by sandbox id, as the nodes export them. */
const createSpans = new Map<string, CreateSpan>();
/** Why an export the collector received could not be read, if one could not. */
let badExport: string | null = null;
let collector: Server | null = null;
let f: TracedCluster;

function nanos(v: unknown): bigint {
  if (typeof v === 'string' || typeof v === 'number') return BigInt(v);
  throw new Error(`not an OTLP timestamp: ${JSON.stringify(v)}`);
}

interface OtlpTraces {
  resourceSpans?: { scopeSpans?: { spans?: { name: string; startTimeUnixNano: unknown; endTimeUnixNano: unknown; attributes?: { key: string; value: { stringValue?: string } }[] }[] }[] }[];
}

function collect(body: string): void {
  const traces = JSON.parse(body) as OtlpTraces;
  for (const rs of traces.resourceSpans ?? []) {
    for (const ss of rs.scopeSpans ?? []) {
      for (const s of ss.spans ?? []) {
        if (s.name !== 'warren.sandbox.create') continue;
        const id = s.attributes?.find((a) => a.key === 'warren.sandbox.id')?.value.stringValue;
        if (id !== undefined) createSpans.set(id, { start: nanos(s.startTimeUnixNano), end: nanos(s.endTimeUnixNano) });
      }
    }
  }
}

function readBody(req: IncomingMessage): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')));
    req.on('error', reject);
  });
}

test.before(async () => {
  collector = createServer((req, res) => {
    void readBody(req).then((body) => {
      try {
        if (req.url === '/v1/traces') collect(body);
        res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      } catch (err) {
        badExport ??= `${req.url} ${req.headers['content-type']}: ${(err as Error).message}`;
        res.writeHead(400).end();
      }
    });
  });
  await new Promise<void>((r) => collector!.listen(0, '127.0.0.1', r));
  // The nodes inherit this: their span batches go out every 200 ms instead of every 5 s.
  process.env.OTEL_BSP_SCHEDULE_DELAY = '200';
  f = new TracedCluster(`http://127.0.0.1:${(collector.address() as AddressInfo).port}`);
  await f.startEtcd(3);
  await f.startGateway();
  await Promise.all([
    f.startNode('n1', { labels: { tier: 'jobs', zone: 'a' } }),
    f.startNode('n2', { labels: { tier: 'jobs', zone: 'b' }, createWindow: 2 }),
    f.startNode('n3', { labels: { tier: 'spare' } }),
  ]);
  await f.waitNodes(['n1', 'n2', 'n3']);
});

test.after.always(async () => {
  await f?.close();
  collector?.close();
});

// ------------------------------------------------------------------ helpers

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** `warren ARGS` as a child process against the gateway with the admin token. */
function cli(args: string[], timeoutMs = 120_000): { child: ChildProcess; stderr: () => string; done: Promise<Run> } {
  const child = spawn(process.execPath, [CLI, ...args], { env: { ...process.env, WARREN_URL: f.gateways[0]!.url, WARREN_TOKEN: f.adminToken }, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (c: Buffer) => (stdout += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  const done = new Promise<Run>((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`warren ${args.join(' ')} did not end within ${timeoutMs} ms; stdout=${stdout} stderr=${stderr}`));
    }, timeoutMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
  return { child, stderr: () => stderr, done };
}

function warren(args: string[], timeoutMs?: number): Promise<Run> {
  return cli(args, timeoutMs).done;
}

/** One line of the CLI's progress bar (src/cli/cluster.ts `bar`). */
interface Bar {
  filled: number;
  percent: number;
  created: number;
  count: number;
  failed: number;
  lost: number;
  state: string;
}

const BAR = /^\[([#.]{30})\]\s+(\d+)% (\d+)\/(\d+) ready, (\d+) failed, (\d+) lost(?:, \d+ waiting)? \(([a-z]+)\)$/;

/** The progress lines of a non-TTY stderr (one per line), and any other line. */
function bars(stderr: string): { bars: Bar[]; other: string[] } {
  const out: Bar[] = [];
  const other: string[] = [];
  for (const line of stderr.split('\n')) {
    if (line === '') continue;
    const m = BAR.exec(line);
    if (m === null) {
      other.push(line);
      continue;
    }
    out.push({ filled: m[1]!.split('#').length - 1, percent: Number(m[2]), created: Number(m[3]), count: Number(m[4]), failed: Number(m[5]), lost: Number(m[6]), state: m[7]! });
  }
  return { bars: out, other };
}

async function failure(p: Promise<unknown>): Promise<{ code: string; message: string }> {
  try {
    await p;
    return { code: 'ok', message: '' };
  } catch (err) {
    return err instanceof WarrenError ? { code: err.code, message: err.message } : { code: String(err), message: String(err) };
  }
}

interface NodeView {
  id: string;
  epoch: number;
  fenced: boolean;
  at: number;
  used: { sandboxes: number; creating: number };
}

function clusterNodes(c: WarrenClient): Promise<{ nodes: NodeView[] }> {
  return c.requestJson('GET', '/v1/cluster/nodes');
}

async function withClient<T>(fn: (c: WarrenClient) => Promise<T>): Promise<T> {
  const c = f.client();
  try {
    return await fn(c);
  } finally {
    await c.close();
  }
}

async function deleteJob(c: WarrenClient, id: string): Promise<JobStatus> {
  await c.jobs.delete(id);
  return waitForValue(() => c.jobs.get(id), (s) => s.state === 'deleted', 60_000, `job ${id} deleted on every node`, 200);
}

/**
 * A span's start is the node's Date.now() (whole milliseconds) and its end that start plus the
 * measured duration: the recorded span is the real one moved up to 1 ms earlier. So the create
 * certainly ran from 1 ms after the recorded start to the recorded end (2 ms: a margin for the
 * clock reads themselves), and creates whose certain parts overlap ran at the same time.
 */
const SPAN_SLACK_NS = 2_000_000n;

/** The most creates of `spans` certainly in flight at one instant (an end and a start at the same instant do not overlap). */
function maxInFlight(spans: readonly CreateSpan[]): number {
  const edges: [bigint, number][] = [];
  for (const s of spans) if (s.start + SPAN_SLACK_NS < s.end) edges.push([s.start + SPAN_SLACK_NS, 1], [s.end, -1]);
  edges.sort((x, y) => (x[0] < y[0] ? -1 : x[0] > y[0] ? 1 : x[1] - y[1]));
  let open = 0;
  let most = 0;
  for (const [, d] of edges) {
    open += d;
    most = Math.max(most, open);
  }
  return most;
}

/** Resolves once `node`'s output written after this call matches `re` (checked on every chunk it writes). */
function nextOutput(node: NodeProc, re: RegExp, timeoutMs: number): Promise<string> {
  const from = node.log.join('').length;
  return new Promise((resolve, reject) => {
    const streams = [node.child.stdout!, node.child.stderr!];
    const check = () => {
      const text = node.log.join('').slice(from);
      if (!re.test(text)) return;
      done();
      resolve(text);
    };
    // the fixture's own listener appends to node.log first (it was added first)
    const onData = () => check();
    const timer = setTimeout(() => {
      done();
      reject(new Error(`node ${node.id} did not write ${re} within ${timeoutMs} ms: ${node.log.join('').slice(from).slice(-2000)}`));
    }, timeoutMs);
    const done = () => {
      clearTimeout(timer);
      for (const s of streams) s.off('data', onData);
    };
    for (const s of streams) s.on('data', onData);
  });
}

interface Verdict {
  node: string;
  pool: string;
  excluded?: string;
  holds: boolean;
  utilisation: number;
  placed: number;
}

interface Explanation {
  pool: string | null;
  overflowEligible: boolean;
  k: number;
  nodes: Verdict[];
}

// ------------------------------------------------------------------ tests

test.serial('a job created with ?explain=1 answers and records a verdict per node: where it placed, and why each other node was left out', async (t) => {
  t.timeout(120_000);
  await withClient(async (c) => {
    // the template asks for tier=jobs nodes, the job for n1 or n3: only n1 is both
    const job = await c.jobs.create({ count: 6, template: { image: 'busybox', placement: { nodeSelector: { tier: 'jobs' } } }, placement: { nodes: ['n1', 'n3'] } }, { explain: true });
    let plain: string | null = null;
    try {
      t.deepEqual(job.placed, { n1: 6 });
      const ex = job.explain as Explanation;
      t.deepEqual(
        ex.nodes.map((v) => v.node).sort(),
        ['n1', 'n2', 'n3'],
        'one verdict for every node of the cluster',
      );
      const v = (id: string) => ex.nodes.find((x) => x.node === id)!;
      t.is(v('n1').excluded, undefined, 'n1 was a candidate');
      t.is(v('n1').placed, 6);
      t.true(v('n1').holds, 'n1 holds the layers of busybox');
      t.is(v('n2').excluded, 'not in the requested nodes');
      t.is(v('n2').placed, 0);
      t.is(v('n3').excluded, 'label tier=jobs not on the node');
      t.is(v('n3').placed, 0);
      t.is(ex.pool, 'onprem');
      t.false(ex.overflowEligible, 'no overflow node here');
      t.is(ex.k, 2);
      for (const x of ex.nodes) t.true(x.utilisation >= 0 && x.utilisation <= 1, `${x.node} utilisation ${x.utilisation}`);
      // the job record keeps the same explanation, with the shares it made
      type Explained = JobStatus & { explain: Explanation | null; shares: { node: string; count: number; epoch: number }[] };
      const rec = await c.requestJson<Explained>('GET', `/v1/jobs/${job.id}`, { query: { explain: '1' } });
      t.deepEqual(rec.explain, ex);
      t.deepEqual(
        rec.shares.map((s) => ({ node: s.node, count: s.count })),
        [{ node: 'n1', count: 6 }],
      );
      const end = await c.jobs.watch(job.id);
      t.is(end.state, 'done');
      t.is(end.nodes.n1?.created, 6);
      t.deepEqual(Object.keys(end.nodes), ['n1']);
      // without ?explain=1 nothing is recorded, but the shares are still shown
      const other = await c.jobs.create({ count: 2, template: { image: 'busybox' }, placement: { nodes: ['n1', 'n2'] } });
      plain = other.id;
      t.is((other as { explain?: unknown }).explain, undefined);
      const otherRec = await c.requestJson<Explained>('GET', `/v1/jobs/${other.id}`, { query: { explain: '1' } });
      t.is(otherRec.explain, null);
      t.is(
        otherRec.shares.reduce((s, x) => s + x.count, 0),
        2,
      );
      t.is((await c.jobs.watch(other.id)).created, 2);
    } finally {
      await deleteJob(c, job.id);
      if (plain !== null) await deleteJob(c, plain);
    }
  });
});

test.serial('`warren job create` prints the id then a progress bar on stderr until done; `job watch`, `job ls`, `job pause`, `job resume` and `job rm` act on the job and say so', async (t) => {
  t.timeout(300_000);
  await f.waitIdle(['n1', 'n2']);
  const made = await warren(['job', 'create', '20', '--image', 'busybox', '--memory', '64', '--concurrency', '4', '--label', 'exp=cli', '--node-label', 'tier=jobs']);
  t.is(made.code, 0, made.stderr);
  const id = made.stdout.trim();
  t.regex(id, JOB_ID);
  t.is(made.stdout, `${id}\n`, 'stdout is the id alone (scripts read it)');
  // stderr is not a TTY here: one line per change of the bar, nothing else
  const progress = bars(made.stderr);
  t.deepEqual(progress.other, [], made.stderr);
  t.true(progress.bars.length >= 2, made.stderr);
  const first = progress.bars[0]!;
  const last = progress.bars[progress.bars.length - 1]!;
  // the stream starts as the job is admitted, before the nodes report 20 made
  t.is(first.state, 'creating', made.stderr);
  t.true(first.created < 20, made.stderr);
  t.deepEqual(last, { filled: 30, percent: 100, created: 20, count: 20, failed: 0, lost: 0, state: 'done' });
  for (let i = 1; i < progress.bars.length; i++) t.true(progress.bars[i]!.created >= progress.bars[i - 1]!.created, `progress never goes back:\n${made.stderr}`);
  t.is(new Set(made.stderr.split('\n').filter((l) => l !== '')).size, progress.bars.length, 'a line is printed only when it changed');

  const c = f.client();
  try {
    const sbs = await c.jobs.sandboxes(id);
    t.is(sbs.length, 20);
    for (const s of sbs) {
      t.is(s.labels.exp, 'cli');
      t.is(s.labels['warren.job'], id);
      t.true(s.node === 'n1' || s.node === 'n2', `--node-label tier=jobs: ${s.id} on ${s.node}`);
      t.is(s.limits.memoryMb, 64);
    }

    // following a job that has ended: its final line, exit 0
    const watched = await warren(['job', 'watch', id]);
    t.is(watched.code, 0, watched.stderr);
    t.is(watched.stdout, '');
    t.deepEqual(bars(watched.stderr), { bars: [last], other: [] });
    const json = await warren(['job', 'watch', id, '--json']);
    t.is(json.code, 0, json.stderr);
    t.is(json.stderr, '', 'with --json there is no bar');
    const events = json.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { type: string; created?: number; state?: string });
    t.is(events[0]!.type, 'status');
    t.like(events[events.length - 1], { type: 'done', created: 20, state: 'done' });

    const row = (out: string) => new RegExp(`^${id}\\s+(\\S+)\\s+20\\s+(\\d+)\\s+0\\s+0\\s+\\S+$`, 'm').exec(out);
    const ls = await warren(['job', 'ls']);
    t.is(ls.code, 0, ls.stderr);
    t.regex(ls.stdout, /^ID\s+STATE\s+COUNT\s+READY\s+FAILED\s+LOST\s+CREATED\n/);
    t.deepEqual(row(ls.stdout)?.slice(1), ['done', '20'], ls.stdout);
    const lsJson = await warren(['job', 'ls', '--json']);
    t.like((JSON.parse(lsJson.stdout) as JobStatus[]).find((j) => j.id === id), { state: 'done', created: 20, labels: { exp: 'cli' } });
    // nothing is left to stop in a job that is done: cancel says so and changes nothing
    const ended = await warren(['job', 'cancel', id]);
    t.is(ended.code, 0, ended.stderr);
    t.is(ended.stdout, `${id} done\n`);
    t.is((await c.jobs.get(id)).state, 'done');

    const paused = await warren(['job', 'pause', id]);
    t.is(paused.code, 0, paused.stderr);
    t.is(paused.stdout, `${id} paused\n`);
    await waitForValue(() => c.jobs.get(id), (s) => s.state === 'paused' && s.paused === 20, 120_000, 'every sandbox of the job paused', 200);
    t.true((await c.jobs.sandboxes(id)).every((s) => s.state === 'paused'));
    t.deepEqual(row((await warren(['job', 'ls'])).stdout)?.slice(1), ['paused', '20']);

    const resumed = await warren(['job', 'resume', id]);
    t.is(resumed.code, 0, resumed.stderr);
    t.is(resumed.stdout, `${id} running\n`);
    await waitForValue(() => c.jobs.get(id), (s) => s.state === 'done' && s.paused === 0, 120_000, 'the job resumed', 200);
    const after = await c.jobs.sandboxes(id);
    t.true(after.every((s) => s.state === 'running'));
    t.is((await (await c.getSandbox(after[0]!.id)).exec(['echo', 'resumed'])).stdout, 'resumed\n');

    const rm = await warren(['job', 'rm', id]);
    t.is(rm.code, 0, rm.stderr);
    t.is(rm.stdout, `${id} deleting\n`);
    const gone = await waitForValue(() => c.jobs.get(id), (s) => s.state === 'deleted', 60_000, 'the job deleted', 200);
    t.is(gone.deleted, 20);
    t.deepEqual(await c.jobs.sandboxes(id), []);
    t.is(row((await warren(['job', 'ls'])).stdout)?.[1], 'deleted');

    // what cannot be done says why, with the exit code of an error (1) or of a usage error (2)
    const late = await warren(['job', 'pause', id]);
    t.is(late.code, 1);
    t.regex(late.stderr, new RegExp(`^warren: SANDBOX_NOT_RUNNING: job ${id} is deleted`));
    const unknown = await warren(['job', 'watch', 'job-0123456789abcdef']);
    t.is(unknown.code, 1);
    t.regex(unknown.stderr, /^warren: JOB_NOT_FOUND: /);
    const noCount = await warren(['job', 'create', '--image', 'busybox']);
    t.is(noCount.code, 2);
    t.regex(noCount.stderr, /job create COUNT/);
    const bare = await warren(['job']);
    t.is(bare.code, 2);
    t.regex(bare.stdout, /^usage: warren job create COUNT/);
  } finally {
    await c.jobs.delete(id).catch(() => undefined);
    await c.close();
  }
});

test.serial('a job cancelled while it creates stops creating: `warren job watch` ends cancelled (exit 1), the nodes make nothing more, and what they made stays until `job rm`', async (t) => {
  t.timeout(240_000);
  await f.waitIdle(['n1', 'n2']);
  // One create at a time per node (a create takes 10-150 ms here): the job would create for 10 s
  // or more, so the cancel (a CLI process to start, however loaded the machine) lands during it.
  const COUNT = 2000;
  const made = await warren(['job', 'create', String(COUNT), '--image', 'busybox', '--concurrency', '1', '--node-label', 'tier=jobs', '--label', 'exp=cancel', '--no-watch']);
  t.is(made.code, 0, made.stderr);
  const id = made.stdout.trim();
  t.regex(id, JOB_ID);
  t.is(made.stderr, '', '--no-watch prints no progress');
  const watcher = cli(['job', 'watch', id]);
  const c = f.client();
  try {
    await waitFor(() => bars(watcher.stderr()).bars.length > 0, 30_000, 'the watch printed its first line');
    await waitForValue(() => c.jobs.get(id), (s) => s.created >= 2, 60_000, 'the job made its first sandboxes', 20);
    const before = await c.jobs.get(id);
    t.is(before.state, 'creating');
    const cancel = await warren(['job', 'cancel', id]);
    t.is(cancel.code, 0, cancel.stderr);
    t.is(cancel.stdout, `${id} cancelled\n`);

    const w = await within(watcher.done, 60_000, 'the watch ends once the job is cancelled');
    t.is(w.code, 1, 'a job that did not end done exits 1');
    const lines = bars(w.stderr);
    t.deepEqual(lines.other, [], w.stderr);
    const end = lines.bars[lines.bars.length - 1]!;
    t.is(end.state, 'cancelled', w.stderr);
    t.true(end.created >= 2 && end.created < COUNT, w.stderr);
    t.true(lines.bars.length >= 2 && lines.bars.slice(0, -1).every((b) => b.state === 'creating'), `the watch showed the job creating before it ended:\n${w.stderr}`);

    // Every node applied the cancel (its share says so) ...
    const seen = await waitForValue(() => c.jobs.get(id), (s) => s.state === 'cancelled' && ['n1', 'n2'].every((n) => s.nodes[n]?.state === 'cancelled'), 30_000, 'both shares cancelled', 100);
    t.true(seen.created < COUNT, JSON.stringify(seen.nodes));
    // ... so no create of the job starts there any more; a node record written after that with
    // nothing being created means the creates in flight at the cancel have ended too.
    const applied = Date.now();
    await waitForValue(() => clusterNodes(c), (r) => ['n1', 'n2'].every((n) => r.nodes.some((x) => x.id === n && x.at > applied && x.used.creating === 0)), 30_000, 'n1 and n2 report no create in flight', 100);
    // the progress records catch up with the last creates (they are written every 250 ms)
    const [settled, kept] = await waitForValue(
      () => Promise.all([c.jobs.get(id), c.jobs.sandboxes(id)]),
      ([s, l]) => s.created === l.length,
      10_000,
      'the status counts every sandbox of the job that exists',
      100,
    );
    t.true(settled.created >= 2 && settled.created < COUNT, `created ${settled.created}`);
    t.true(
      kept.every((s) => s.state === 'running'),
      'a cancel stops creating; it does not stop or delete what was made',
    );
    // and `--concurrency 1` held: one create at a time on each node
    await waitFor(() => badExport !== null || kept.every((s) => createSpans.has(s.id)), 30_000, 'the create spans of the job', 50);
    t.is(badExport, null);
    for (const n of ['n1', 'n2']) {
      const spans = kept.filter((s) => s.node === n).map((s) => createSpans.get(s.id)!);
      t.true(spans.length > 0, `${n} made some of the job`);
      t.is(maxInFlight(spans), 1, `${n}: one create at a time`);
    }
    await elapse(1500, 'a cancelled job must make nothing more: a node that kept creating would show it in this window');
    const later = await c.jobs.get(id);
    t.is(later.state, 'cancelled');
    t.is(later.created, settled.created);
    t.is((await c.jobs.sandboxes(id)).length, kept.length);
    t.is((await (await c.getSandbox(kept[0]!.id)).exec(['echo', 'still here'])).stdout, 'still here\n');

    const rm = await warren(['job', 'rm', id]);
    t.is(rm.code, 0, rm.stderr);
    t.is(rm.stdout, `${id} deleting\n`);
    const gone = await waitForValue(() => c.jobs.get(id), (s) => s.state === 'deleted', 60_000, 'the cancelled job deleted', 200);
    t.is(gone.deleted, kept.length);
    t.deepEqual(await c.jobs.sandboxes(id), []);
  } finally {
    watcher.child.kill('SIGKILL');
    await c.jobs.delete(id).catch(() => undefined);
    await c.close();
  }
});

test.serial('a node started with a create window of 2 never has more than 2 of a job’s creates in flight, while a node with the default window runs more of the same job at once', async (t) => {
  t.timeout(180_000);
  await f.waitIdle(['n1', 'n2']);
  await withClient(async (c) => {
    // the job allows 8 creates in flight per node: n1 (window 8) may use them all, n2 (window 2) two
    const job = await c.jobs.create({ count: 32, template: { image: 'busybox' }, concurrency: 8, placement: { nodes: ['n1', 'n2'] } });
    try {
      const end = await c.jobs.watch(job.id);
      t.is(end.state, 'done', JSON.stringify(end.nodes));
      const ids = (await c.jobs.sandboxes(job.id)).map((s) => s.id);
      t.is(ids.length, 32);
      // a stream that starts after every batch was written still gets every sandbox, each once
      const late: string[] = [];
      const again = await c.jobs.watch(job.id, (ev: JobEvent) => {
        if (ev.type === 'sandboxes') late.push(...ev.ids);
      });
      t.is(again.state, 'done');
      t.deepEqual([...late].sort(), [...ids].sort());
      await waitFor(() => badExport !== null || ids.every((id) => createSpans.has(id)), 30_000, 'the create span of every sandbox of the job', 50);
      t.is(badExport, null);
      // Each span runs from the start of the node's create to its end, around every await of it:
      // whenever a create is waiting on anything, its span is open, so the open spans at an
      // instant are the creates in flight on that node then.
      const on = (node: string) => ids.filter((id) => id.startsWith(`${node}-`)).map((id) => createSpans.get(id)!);
      const n1 = on('n1');
      const n2 = on('n2');
      const ms = (l: CreateSpan[]) => l.map((s) => Number(s.end - s.start) / 1e6).sort((x, y) => x - y);
      t.log(`create ms on n1: ${ms(n1).map((x) => x.toFixed(1)).join(' ')}; on n2: ${ms(n2).map((x) => x.toFixed(1)).join(' ')}`);
      t.true(n1.length >= 6 && n2.length >= 6, `placed n1 ${n1.length}, n2 ${n2.length}: enough on each to fill its window`);
      t.is(maxInFlight(n2), 2, `n2 (window 2): at most 2 at once, and its window was used`);
      t.true(maxInFlight(n1) > 2, `n1 (default window) ran ${maxInFlight(n1)} at once: the job itself allowed more than n2 ran`);
    } finally {
      await deleteJob(c, job.id);
    }
  });
});

test.serial('a node woken after its lease expired refuses creates with NODE_FENCED while it removes the sandboxes of the lost epoch, then registers again with epoch + 1 and admits again', async (t) => {
  t.timeout(180_000);
  const DOOMED = 96;
  const n3 = f.node('n3');
  const c = f.client();
  const local = new WarrenClient({ url: n3.url, token: n3.adminToken });
  let jobId: string | null = null;
  try {
    // Sandboxes for the fenced node to remove: removing them keeps it fenced for a while (8 at a
    // time), long enough to ask it for a create in that state once it says it is fencing.
    const job = await c.jobs.create({ count: DOOMED, template: { image: 'busybox' }, placement: { nodes: ['n3'] } });
    jobId = job.id;
    const done = await c.jobs.watch(job.id);
    t.is(done.nodes.n3?.created, DOOMED);
    const epoch = (await clusterNodes(c)).nodes.find((n) => n.id === 'n3')!.epoch;
    // what n3 writes once it wakes and learns that its lease is gone
    const fencing = nextOutput(n3, /node n3 lost its lease \(/, 90_000);
    fencing.catch(() => undefined);
    n3.child.kill('SIGSTOP');
    try {
      await waitFor(async () => !(await clusterNodes(c)).nodes.some((n) => n.id === 'n3'), 30_000, 'the lease of n3 expired', 100);
      const lost = await waitForValue(() => c.jobs.get(job.id), (s) => s.lost === DOOMED, 15_000, 'the job counts the sandboxes of n3 lost', 100);
      t.is(lost.state, 'partial');
    } finally {
      n3.child.kill('SIGCONT');
    }
    await fencing;
    const fencedAt = Date.now();
    const refused = await failure(local.createSandbox({ image: 'busybox' }));
    const refusedAfterMs = Date.now() - fencedAt;
    t.is(refused.code, 'NODE_FENCED', `a create asked of n3 once it said it was fencing: ${refused.message}`);
    t.regex(refused.message, /not registered in the cluster/);

    const back = await waitForValue(() => clusterNodes(c), (r) => r.nodes.some((n) => n.id === 'n3' && n.epoch === epoch + 1 && !n.fenced), 30_000, 'n3 registered again', 100);
    t.truthy(back);
    t.log(`refused ${refusedAfterMs} ms after n3 said it was fencing; registered again ${Date.now() - fencedAt} ms after (gateway view, polled every 100 ms)`);
    // in n3's own words: fenced, removed the lost epoch's sandboxes, then registered with the next epoch
    // (its output comes through a pipe, which may lag behind what the gateway already shows)
    await waitFor(() => n3.log.join('').includes(`node n3 registered (epoch ${epoch + 1},`), 30_000, 'n3 to say it registered again', 50);
    const text = n3.log.join('');
    const fenced = text.lastIndexOf('node n3 lost its lease (');
    const removed = /removed (\d+) sandbox\(es\) of the lost epoch/g;
    removed.lastIndex = fenced;
    const r = removed.exec(text);
    const registered = text.indexOf(`node n3 registered (epoch ${epoch + 1},`, fenced);
    t.true(fenced >= 0 && r !== null && registered > r.index, text.slice(Math.max(0, fenced)).slice(0, 2000));
    t.is(Number(r?.[1]), DOOMED);
    t.deepEqual(await local.listSandboxes(), [], 'nothing of the lost epoch is left on n3');

    // registered again, n3 admits creates: through its own API and placed by the gateway
    const mine = await local.createSandbox({ image: 'busybox' });
    t.is((await mine.exec(['echo', 'admitted'])).stdout, 'admitted\n');
    await mine.delete();
    const placed = await c.requestJson<{ id: string; node: string }>('POST', '/v1/sandboxes', { json: { image: 'busybox', placement: { nodes: ['n3'] } } });
    t.is(placed.node, 'n3');
    await c.deleteSandbox(placed.id);
    const gone = await deleteJob(c, job.id);
    t.is(gone.lost, DOOMED);
    jobId = null;
  } finally {
    n3.child.kill('SIGCONT');
    if (jobId !== null) await c.jobs.delete(jobId).catch(() => undefined);
    await local.close();
    await c.close();
  }
});
