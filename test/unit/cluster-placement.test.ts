/**
 * Placement rules (src/cluster/placement.ts) with a seeded random source:
 * spread over live load, the filter and its reasons, the bounded bonus for
 * layer holders, the on-prem threshold and overflow eligibility; the cluster
 * credential (signed records, shim tokens); job status arithmetic.
 */
import test from 'ava';
import { ClusterCredential, canonical } from '../../src/cluster/credential';
import { jobStatus, validateJobRequest, type JobSpec } from '../../src/cluster/jobs';
import { indicesOf, toRanges, type ShareProgress } from '../../src/cluster/node-agent';
import { type NodeRecord, nodeOfSandbox, placeMany, resolveLayers } from '../../src/cluster/placement';
import { WarrenError } from '../../src/errors';

/** mulberry32: a small seeded generator, so that every run places the same way. */
function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const BUSYBOX = { name: 'busybox', digest: 'sha256:bb', kind: 'base', layers: ['sha256:bb'] };
const PY = { name: 'python', digest: 'sha256:py', kind: 'base', layers: ['sha256:py2', 'sha256:py1'] };

function node(id: string, o: Partial<NodeRecord> = {}): NodeRecord {
  return {
    id,
    url: `http://127.0.0.1:1/${id}`,
    shim: `http://127.0.0.1:2/${id}`,
    pool: 'onprem',
    labels: {},
    epoch: 1,
    capacity: { sandboxes: 1000, cpus: 2, memoryMb: 24000 },
    used: { sandboxes: 0, creating: 0, memoryAvailableMb: 20000, load1: 0 },
    backends: ['container'],
    images: [BUSYBOX],
    layers: ['sha256:bb'],
    lazy: false,
    accounts: {},
    fenced: false,
    at: 0,
    ...o,
  };
}

const REQ = { backend: 'container' as const, image: 'busybox', workspaces: [], toolkits: [] };

test('power-of-two choices spread a burst evenly over equal nodes', (t) => {
  const nodes = Array.from({ length: 8 }, (_, i) => node(`n${i}`));
  const r = placeMany(nodes, REQ, 4000, { rng: rng(1) });
  t.is(r.unplaced, 0);
  const counts = [...r.counts.values()];
  t.is(counts.length, 8);
  const mean = 4000 / 8;
  t.true(Math.max(...counts) / mean < 1.05, `imbalance ${JSON.stringify(counts)}`);
});

test('placement follows live load: a loaded node gets fewer', (t) => {
  const nodes = [node('idle'), node('busy', { used: { sandboxes: 600, creating: 0, memoryAvailableMb: 0, load1: 0 } })];
  const r = placeMany(nodes, REQ, 400, { rng: rng(2) });
  t.true((r.counts.get('idle') ?? 0) > (r.counts.get('busy') ?? 0) * 3, JSON.stringify([...r.counts]));
});

test('the filter says why a node is out: backend, labels, image, fenced, capacity', (t) => {
  const nodes = [
    node('vm', { backends: ['microvm'] }),
    node('gpu', { labels: { gpu: 'yes' } }),
    node('plain'),
    node('noimg', { images: [], layers: [] }),
    node('fenced', { fenced: true, labels: { gpu: 'yes' } }),
  ];
  const r = placeMany(nodes, { ...REQ, nodeSelector: { gpu: 'yes' } }, 10, { rng: rng(3) });
  t.deepEqual([...r.counts.keys()], ['gpu']);
  const why = Object.fromEntries(r.explain.nodes.map((v) => [v.node, v.excluded ?? null]));
  t.regex(why.vm!, /no container backend/);
  t.regex(why.plain!, /label gpu=yes/);
  t.regex(why.fenced!, /fenced/);
  t.is(why.gpu, null);
  const full = placeMany([node('a', { capacity: { sandboxes: 3, cpus: 2, memoryMb: 1 } })], REQ, 5, { rng: rng(4) });
  t.is(full.counts.get('a'), 3);
  t.is(full.unplaced, 2);
  const missing = placeMany([node('a')], { ...REQ, image: 'python' }, 1, { rng: rng(5) });
  t.is(missing.unplaced, 1);
  t.regex(missing.explain.nodes[0]!.excluded!, /does not hold python/);
  // a workspace named by a layer digest (a pack's layer) goes where that layer is
  const packed = placeMany([node('a'), node('b', { layers: ['sha256:bb', 'sha256:pack1'] })], { ...REQ, workspaces: ['sha256:pack1'] }, 4, { rng: rng(6) });
  t.deepEqual([...packed.counts], [['b', 4]]);
  t.regex(packed.explain.nodes.find((n) => n.node === 'a')!.excluded!, /does not hold sha256:pack1/);
});

test('layer holders get a bounded bonus: preferred, but not piled onto', (t) => {
  const holder = node('holder', { images: [BUSYBOX, PY], layers: ['sha256:bb', 'sha256:py1', 'sha256:py2'] });
  const lazy = Array.from({ length: 3 }, (_, i) => node(`lazy${i}`, { lazy: true, images: [BUSYBOX], layers: ['sha256:bb'] }));
  const staged = new Set(['sha256:py1', 'sha256:py2']);
  const r = placeMany([holder, ...lazy], { ...REQ, image: 'python' }, 800, { rng: rng(6), staged, holderBonus: 0.1 });
  const h = r.counts.get('holder') ?? 0;
  const others = lazy.map((n) => r.counts.get(n.id) ?? 0);
  t.true(h > Math.max(...others), `holder ${h} vs ${others}`);
  // the bonus is worth 10% of capacity: the holder ends about 100 sandboxes ahead, not with everything
  t.true(h - Math.max(...others) <= 130, `holder ${h} vs ${others}`);
  t.true(Math.min(...others) > 100);
  // lazy nodes cannot take layers that are not staged
  const unstaged = placeMany([holder, ...lazy], { ...REQ, image: 'python' }, 50, { rng: rng(7) });
  t.deepEqual([...unstaged.counts.keys()], ['holder']);
  t.deepEqual(resolveLayers([holder], { ...REQ, image: 'python' }), ['sha256:py2', 'sha256:py1']);
});

test('a lazy node that failed to load staged layers lately is no candidate for them, and says why', (t) => {
  const holder = node('holder', { images: [BUSYBOX, PY], layers: ['sha256:bb', 'sha256:py1', 'sha256:py2'] });
  const failed = node('failed', { lazy: true, images: [BUSYBOX], layers: ['sha256:bb'], unloadable: ['sha256:py1'] });
  const fine = node('fine', { lazy: true, images: [BUSYBOX], layers: ['sha256:bb'], unloadable: ['sha256:other'] });
  const staged = new Set(['sha256:py1', 'sha256:py2']);
  const r = placeMany([holder, failed, fine], { ...REQ, image: 'python' }, 60, { rng: rng(8), staged, holderBonus: 0 });
  t.is(r.counts.get('failed'), undefined);
  t.true((r.counts.get('fine') ?? 0) > 0, 'a failure with other layers does not count');
  t.regex(r.explain.nodes.find((v) => v.node === 'failed')!.excluded ?? '', /does not hold python, and its last pull of staged layers sha256:py1 failed/);
  // its own images are unaffected
  t.true((placeMany([failed], REQ, 1, { staged }).counts.get('failed') ?? 0) === 1);
});

test('above 80% on-prem, eligible requests go to the overflow pool; others stay on-prem', (t) => {
  const onprem = [node('a', { capacity: { sandboxes: 100, cpus: 2, memoryMb: 1 } }), node('b', { capacity: { sandboxes: 100, cpus: 2, memoryMb: 1 } })];
  const overflowLazy = node('cloud', { pool: 'overflow', lazy: true, images: [], layers: [], capacity: { sandboxes: 1000, cpus: 2, memoryMb: 1 } });
  const staged = new Set(['sha256:bb']);
  const r = placeMany([...onprem, overflowLazy], REQ, 200, { rng: rng(8), staged });
  t.is((r.counts.get('a') ?? 0) + (r.counts.get('b') ?? 0), 160, JSON.stringify([...r.counts]));
  t.is(r.counts.get('cloud'), 40);
  t.true(r.explain.overflowEligible);
  // not staged for the overflow pool: all of it on-prem, up to its capacity, and the rest waits
  const r2 = placeMany([...onprem, overflowLazy], REQ, 250, { rng: rng(9) });
  t.is(r2.counts.get('cloud'), undefined);
  t.is(r2.unplaced, 50);
  t.false(r2.explain.overflowEligible);
  // a configurable threshold
  const r3 = placeMany([...onprem, overflowLazy], REQ, 100, { rng: rng(10), staged, overflowThreshold: 0.25 });
  t.is((r3.counts.get('a') ?? 0) + (r3.counts.get('b') ?? 0), 50);
  t.is(r3.counts.get('cloud'), 50);
  // the on-prem pool full below the threshold's reach: overflow takes it
  const tiny = [node('a', { capacity: { sandboxes: 1, cpus: 1, memoryMb: 1 } })];
  const r4 = placeMany([...tiny, overflowLazy], REQ, 3, { rng: rng(11), staged, overflowThreshold: 0.99 });
  t.is(r4.counts.get('cloud'), 2);
});

test('nodes that refused are excluded on the retry; explicit node lists are honoured', (t) => {
  const nodes = [node('a'), node('b'), node('c')];
  const r = placeMany(nodes, REQ, 30, { rng: rng(12), exclude: new Set(['a']) });
  t.false(r.counts.has('a'));
  const only = placeMany(nodes, { ...REQ, nodes: ['c'] }, 5, { rng: rng(13) });
  t.deepEqual([...only.counts], [['c', 5]]);
});

test('32K sandboxes are placed in bulk over 160 nodes', (t) => {
  const nodes = Array.from({ length: 160 }, (_, i) => node(`n${i}`, { capacity: { sandboxes: 400, cpus: 64, memoryMb: 1 } }));
  const r = placeMany(nodes, REQ, 32_768, { rng: rng(14) });
  t.is([...r.counts.values()].reduce((s, n) => s + n, 0) + r.unplaced, 32_768);
  t.is(r.unplaced, 0);
  t.true(Math.max(...r.counts.values()) <= 400);
});

test('sandbox ids name their node; anything else names none', (t) => {
  t.is(nodeOfSandbox('n1-0123456789abcdef'), 'n1');
  t.is(nodeOfSandbox('node-with-dash-0123456789abcdef'), 'node-with-dash');
  t.is(nodeOfSandbox('n1-0123456789abcde'), null);
  t.is(nodeOfSandbox('../etc-0123456789abcdef'), null);
  t.is(nodeOfSandbox('averyveryverylongnodename-0123456789abcdef'), null);
});

test('the cluster credential signs records and derives per-node shim tokens; forgeries fail', (t) => {
  const c = ClusterCredential.fromSecret('x'.repeat(40));
  const other = ClusterCredential.fromSecret('y'.repeat(40));
  const rec = c.sign({ id: 'n1', url: 'http://127.0.0.1:9', epoch: 1 });
  t.deepEqual(c.verify(rec), { id: 'n1', url: 'http://127.0.0.1:9', epoch: 1 });
  t.is(other.verify(rec), null);
  t.is(c.verify({ ...rec, url: 'http://evil:1' }), null);
  t.is(c.verify({ id: 'n1', url: 'x', epoch: 1 } as never), null);
  t.is(canonical({ b: 1, a: [2, { d: 1, c: 2 }] }), '{"a":[2,{"c":2,"d":1}],"b":1}');
  // each node's shim token: the same from every holder of the credential, different per node and per credential
  t.is(c.shimToken('n1'), ClusterCredential.fromSecret('x'.repeat(40)).shimToken('n1'));
  t.not(c.shimToken('n1'), c.shimToken('n2'));
  t.not(c.shimToken('n1'), other.shimToken('n1'));
  t.true(c.shimToken('n1').length >= 32);
  t.throws(() => ClusterCredential.fromSecret('short'), { instanceOf: WarrenError });
});

test('job requests are checked before anything is placed', (t) => {
  const bad = (body: unknown, re: RegExp) => t.throws(() => validateJobRequest(body), { instanceOf: WarrenError, message: re });
  bad({ count: 40_000, template: {} }, /count/);
  bad({ count: 0, template: {} }, /count/);
  bad({ count: 1.5, template: {} }, /count/);
  bad({ count: 10 }, /template/);
  bad({ count: 10, template: {}, labels: { 'warren.job': 'x' } }, /reserved/);
  bad({ count: 10, template: {}, quota: 'some' }, /quota/);
  bad({ count: 10, template: {}, what: 1 }, /what/);
  bad({ count: 10, template: {}, placement: { nodes: ['../x'] } }, /placement.nodes/);
  t.like(validateJobRequest({ count: 32_768, template: {} }), { count: 32_768, concurrency: 64, quota: 'all' });
});

test('index ranges round-trip', (t) => {
  t.deepEqual(toRanges([0, 1, 2, 5, 6, 9]), [
    { from: 0, count: 3 },
    { from: 5, count: 2 },
    { from: 9, count: 1 },
  ]);
  t.deepEqual([...indicesOf(toRanges([3, 4, 8]))], [3, 4, 8]);
});

test('job status: lost nodes count their sandboxes lost, the rest of their share pending', (t) => {
  const spec = {
    id: 'job-1',
    owner: 'a',
    count: 10,
    shares: [
      { node: 'n1', share: 's1', epoch: 1, count: 6, ranges: [{ from: 0, count: 6 }] },
      { node: 'n2', share: 's2', epoch: 3, count: 4, ranges: [{ from: 6, count: 4 }] },
    ],
    pending: [],
    handled: [],
    labels: {},
    createdAt: 'now',
  } as unknown as JobSpec;
  const prog = (node: string, share: string, epoch: number, created: number, state: ShareProgress['state'], failed = 0): ShareProgress => ({
    job: 'job-1', share, node, epoch, assigned: 0, created, failed, refused: 0, paused: 0, releasedBytes: 0, deleted: 0, state, errors: failed ? { SPAWN_ERROR: failed } : {}, failures: [], batch: { seq: 0, ids: [] }, at: 0,
  });
  const progress = new Map([
    ['n1/s1', prog('n1', 's1', 1, 5, 'done', 1)],
    ['n2/s2', prog('n2', 's2', 3, 2, 'creating')],
  ]);
  const live = jobStatus(spec, 'running', progress, () => false);
  t.like(live, { state: 'creating', created: 7, failed: 1, lost: 0, pending: 0 });
  const lost = jobStatus(spec, 'running', progress, (n, e) => n === 'n2' && e === 3);
  t.like(lost, { created: 5, lost: 2, pending: 2, state: 'creating' });
  t.is(lost.nodes.n2!.state, 'lost');
  // the two it never made were placed again on n1 and made there
  const again = { ...spec, handled: ['n2/s2'], shares: [...spec.shares, { node: 'n1', share: 's3', epoch: 1, count: 2, ranges: [{ from: 8, count: 2 }] }] };
  t.like(jobStatus(again, 'running', progress, (n, e) => n === 'n2' && e === 3), { state: 'creating', pending: 0 });
  progress.set('n1/s3', prog('n1', 's3', 1, 2, 'done'));
  t.like(jobStatus(again, 'running', progress, (n, e) => n === 'n2' && e === 3), { state: 'partial', created: 7, lost: 2, failed: 1, pending: 0 });
  t.like(jobStatus(spec, 'paused', progress, () => false), { state: 'paused' });
});
