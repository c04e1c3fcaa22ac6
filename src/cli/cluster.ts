/**
 * The cluster commands: `warren node` (a node joining a cluster),
 * `warren gateway` (a stateless cluster gateway) and `warren job`
 * (bursts of sandboxes with a progress bar). docs/cluster.md.
 */
import type { CreateSandboxRequest, JobEvent, JobStatus } from '../sdk';
import type { NodeClusterOptions } from '../gateway/up';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { type Io, UsageError, clientFor, cmdUp, keyValues, num } from './main';
import { formatTable } from './output';

const COMMON = {
  url: { type: 'string' },
  token: { type: 'string' },
  'data-dir': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

function parse<O extends NonNullable<ParseArgsConfig['options']>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options: { ...COMMON, ...options }, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

/** Take `--name value` options out of `args` (the rest goes to `warren up`'s parser). */
function take(args: string[], names: readonly string[]): { picked: Record<string, string[]>; rest: string[] } {
  const picked: Record<string, string[]> = {};
  const rest: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const a = args[i]!;
    const eq = a.indexOf('=');
    const name = a.startsWith('--') ? (eq > 0 ? a.slice(2, eq) : a.slice(2)) : '';
    if (names.includes(name)) {
      const value = eq > 0 ? a.slice(eq + 1) : args[++i];
      if (value === undefined) throw new UsageError(`--${name} needs a value`);
      (picked[name] ??= []).push(value);
    } else rest.push(a);
  }
  return { picked, rest };
}

function one(p: Record<string, string[]>, name: string): string | undefined {
  const v = p[name];
  if (v && v.length > 1) throw new UsageError(`--${name} given more than once`);
  return v?.[0];
}

function endpoints(text: string | undefined): string[] {
  if (!text) throw new UsageError('--etcd URL[,URL...] is required');
  return text
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '')
    .map((s) => (/^https?:\/\//.test(s) ? s : `http://${s}`));
}

function positiveInt(text: string | undefined, flag: string): number | undefined {
  if (text === undefined) return undefined;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`--${flag} expects a positive integer (got ${JSON.stringify(text)})`);
  return n;
}

export async function cmdNode(args: string[], io: Io): Promise<number> {
  const lazy = args.includes('--lazy-layers');
  const { picked, rest } = take(
    args.filter((a) => a !== '--lazy-layers'),
    ['etcd', 'cluster-credential', 'pool', 'node-label', 'max-sandboxes', 'lease-ttl', 'create-window', 'advertise', 'advertise-shim', 'pull-staged'],
  );
  if (rest.includes('--help') || rest.includes('-h')) return cmdUp(['--help'], io);
  const credentialFile = one(picked, 'cluster-credential');
  if (!credentialFile) throw new UsageError('--cluster-credential FILE is required (the secret shared by the nodes and gateways)');
  const pool = one(picked, 'pool') ?? 'onprem';
  if (pool !== 'onprem' && pool !== 'overflow') throw new UsageError(`--pool must be onprem or overflow (got ${pool})`);
  const cluster: NodeClusterOptions = {
    etcd: { endpoints: endpoints(one(picked, 'etcd')) },
    credentialFile,
    pool,
    labels: keyValues(picked['node-label'] ?? [], 'node-label'),
    maxSandboxes: positiveInt(one(picked, 'max-sandboxes'), 'max-sandboxes') ?? 1000,
  };
  const ttl = positiveInt(one(picked, 'lease-ttl'), 'lease-ttl');
  if (ttl !== undefined) cluster.leaseTtlS = ttl;
  const window = positiveInt(one(picked, 'create-window'), 'create-window');
  if (window !== undefined) cluster.createWindow = window;
  if (lazy) cluster.lazyLayers = true;
  const pullStaged = one(picked, 'pull-staged');
  if (pullStaged !== undefined) {
    if (pullStaged !== 'eager' && pullStaged !== 'on-demand') throw new UsageError(`--pull-staged must be eager or on-demand (got ${JSON.stringify(pullStaged)})`);
    if (!lazy) throw new UsageError('--pull-staged needs --lazy-layers (only a node that mounts layers on demand pulls staged images)');
    cluster.pullStaged = pullStaged;
  }
  const adv = one(picked, 'advertise');
  if (adv !== undefined) cluster.advertiseUrl = adv;
  const advShim = one(picked, 'advertise-shim');
  if (advShim !== undefined) cluster.advertiseShimUrl = advShim;
  return cmdUp(rest, io, cluster);
}

export async function cmdGateway(args: string[], io: Io): Promise<number> {
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined);
  const { values } = parse(args, {
    etcd: { type: 'string' },
    'cluster-credential': { type: 'string' },
    listen: { type: 'string' },
    'admin-token-file': { type: 'string' },
    'overflow-threshold': { type: 'string' },
    k: { type: 'string' },
    'quota-sandboxes': { type: 'string' },
    node: { type: 'string' },
    'shim-token-file': { type: 'string' },
    'e2b-port': { type: 'string' },
  });
  if (values.help) {
    io.out('usage: warren gateway --etcd URL[,URL...] --cluster-credential FILE --listen HOST:PORT --admin-token-file FILE [--data-dir DIR] [--overflow-threshold 0.8] [--k 2] [--quota-sandboxes N]\n');
    io.out('       warren gateway --node URL --shim-token-file FILE --listen HOST:PORT --data-dir DIR [--e2b-port PORT] [--quota-sandboxes N]\n');
    return 0;
  }
  const listen = values.listen ?? '127.0.0.1:7070';
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(listen);
  if (!m || Number(m[2]) > 65535) throw new UsageError(`--listen expects HOST:PORT (got ${JSON.stringify(listen)})`);
  if (values.node !== undefined) return remoteGateway(values, m[1]!.replace(/^\[|\]$/g, ''), Number(m[2]), io);
  if (!values['cluster-credential']) throw new UsageError('--cluster-credential FILE is required');
  if (!values['admin-token-file']) throw new UsageError('--admin-token-file FILE is required (read when it exists, else created)');
  const threshold = num(values, 'overflow-threshold');
  if (threshold !== undefined && !(threshold > 0 && threshold <= 1)) throw new UsageError('--overflow-threshold expects a fraction in (0, 1]');
  const { ClusterCredential } = await import('../cluster/credential');
  const { startClusterGateway } = await import('../cluster/gateway');
  const gwOpts: Parameters<typeof startClusterGateway>[0] = {
    etcd: { endpoints: endpoints(values.etcd) },
    credential: ClusterCredential.readFile(values['cluster-credential']),
    host: m[1]!.replace(/^\[|\]$/g, ''),
    port: Number(m[2]),
    adminTokenFile: values['admin-token-file'],
    log: (l) => io.err(`${l}\n`),
  };
  if (values['data-dir'] !== undefined) gwOpts.dataDir = values['data-dir'];
  if (threshold !== undefined) gwOpts.overflowThreshold = threshold;
  const k = positiveInt(values.k, 'k');
  if (k !== undefined) gwOpts.k = k;
  const qs = num(values, 'quota-sandboxes');
  if (qs !== undefined) gwOpts.defaultQuota = { maxSandboxes: qs, maxCpu: null, maxMemoryMb: null };
  const gw = await startClusterGateway(gwOpts);
  const stopped = new Promise<void>((resolve) => {
    const stop = (sig: NodeJS.Signals) => {
      io.err(`warren: ${sig}, gateway shutting down\n`);
      void gw.close().finally(resolve);
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  io.out(`Warren gateway is listening on ${gw.url}\n`);
  if (gw.adminToken) io.out(`Admin token (shown once; saved in ${values['admin-token-file']}, mode 0600):\n${gw.adminToken}\n`);
  await stopped;
  setTimeout(() => process.exit(0), 1000).unref();
  return 0;
}

/** `warren gateway --node URL`: the gateway API for one node over the shim protocol. */
async function remoteGateway(values: Record<string, string | boolean | undefined>, host: string, port: number, io: Io): Promise<number> {
  if (values.etcd !== undefined || values['cluster-credential'] !== undefined) throw new UsageError('--node is one node over the shim protocol; --etcd and --cluster-credential are for a cluster gateway');
  const tokenFile = values['shim-token-file'];
  if (typeof tokenFile !== 'string') throw new UsageError('--node needs --shim-token-file FILE (the file the node was started with)');
  const dataDir = values['data-dir'];
  if (typeof dataDir !== 'string') throw new UsageError('--node needs --data-dir DIR (the gateway keeps its accounts and idempotency keys there)');
  const nodeUrl = String(values.node);
  if (!/^https?:\/\/[^\s/]+\/?$/.test(nodeUrl)) throw new UsageError(`--node expects http://HOST:PORT (got ${JSON.stringify(nodeUrl)})`);
  const { readShimToken } = await import('../shim/remote/token');
  const { startRemoteGateway } = await import('../gateway/remote');
  const opts: Parameters<typeof startRemoteGateway>[0] = { nodeUrl, token: readShimToken(tokenFile), dataDir, host, port, log: (l) => io.err(`${l}\n`) };
  const e2b = num(values, 'e2b-port');
  if (e2b !== undefined) {
    if (!Number.isInteger(e2b) || e2b < 0 || e2b > 65535) throw new UsageError(`--e2b-port expects a port number (got ${String(values['e2b-port'])})`);
    opts.e2bPort = e2b;
  }
  const qs = num(values, 'quota-sandboxes');
  if (qs !== undefined) opts.defaultQuota = { maxSandboxes: qs, maxCpu: null, maxMemoryMb: null };
  const gw = await startRemoteGateway(opts);
  const stopped = new Promise<void>((resolve) => {
    const stop = (sig: NodeJS.Signals) => {
      io.err(`warren: ${sig}, gateway shutting down (the node and its sandboxes keep running)\n`);
      void gw.close().finally(resolve);
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  io.out(`Warren gateway for node ${gw.nodeId} is listening on ${gw.url}\n`);
  if (gw.e2bUrl) io.out(`E2B API on ${gw.e2bUrl} (E2B_API_URL=${gw.e2bUrl}/e2b E2B_SANDBOX_URL=${gw.e2bUrl})\n`);
  if (gw.adminToken) io.out(`Admin token (shown once; saved in ${dataDir}/admin.token, mode 0600):\n${gw.adminToken}\n`);
  await stopped;
  setTimeout(() => process.exit(0), 1000).unref();
  return 0;
}

function bar(st: { created: number; failed: number; lost: number; count: number; state: string; pending?: number }, width = 30): string {
  const done = st.created + st.failed + st.lost;
  const f = st.count === 0 ? 1 : Math.min(1, done / st.count);
  const filled = Math.round(f * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${String(Math.round(f * 100)).padStart(3)}% ${st.created}/${st.count} ready, ${st.failed} failed, ${st.lost} lost${st.pending ? `, ${st.pending} waiting` : ''} (${st.state})`;
}

async function watchJob(io: Io, client: ReturnType<typeof clientFor>, id: string, json: boolean): Promise<JobStatus> {
  const tty = process.stderr.isTTY;
  let last = '';
  const end = await client.jobs.watch(id, (ev: JobEvent) => {
    if (json) {
      io.out(`${JSON.stringify(ev)}\n`);
      return;
    }
    if (ev.type === 'progress' || ev.type === 'status' || ev.type === 'done') {
      const line = bar(ev);
      if (line === last) return;
      last = line;
      io.err(tty ? `\r\x1b[2K${line}` : `${line}\n`);
    } else if (ev.type === 'lost') {
      io.err(`${tty ? '\n' : ''}node ${ev.node} lost its lease: ${ev.count} sandbox(es) lost\n`);
    }
  });
  if (tty && !json) io.err('\n');
  return end;
}

export async function cmdJob(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  const { values, positionals } = parse(rest, {
    image: { type: 'string' },
    backend: { type: 'string' },
    cpu: { type: 'string' },
    memory: { type: 'string' },
    env: { type: 'string', multiple: true },
    label: { type: 'string', multiple: true },
    ttl: { type: 'string' },
    concurrency: { type: 'string' },
    quota: { type: 'string' },
    'node-label': { type: 'string', multiple: true },
    'no-watch': { type: 'boolean' },
    json: { type: 'boolean' },
  });
  if (values.help || sub === undefined) {
    io.out('usage: warren job create COUNT [--image I] [--backend B] [--cpu N] [--memory MB] [--env K=V]... [--label K=V]... [--ttl S]\n                  [--concurrency N] [--quota all|upTo] [--node-label K=V]... [--no-watch] [--json]\n       warren job watch ID [--json] | pause ID | resume ID | cancel ID | rm ID | ls [--json]\n');
    return sub === undefined ? 2 : 0;
  }
  const client = clientFor(values, io);
  try {
    if (sub === 'create') {
      const count = positiveInt(positionals[0], 'count');
      if (count === undefined) throw new UsageError('job create COUNT: the number of sandboxes');
      const template: CreateSandboxRequest = {};
      if (values.image) template.image = values.image;
      if (values.backend) template.backend = values.backend as CreateSandboxRequest['backend'];
      const cpu = num(values, 'cpu');
      if (cpu !== undefined) template.cpu = cpu;
      const mem = num(values, 'memory');
      if (mem !== undefined) template.memoryMb = mem;
      if (values.env) template.env = keyValues(values.env, 'env');
      const ttl = num(values, 'ttl');
      if (ttl !== undefined) template.ttlSeconds = ttl;
      const req: Parameters<typeof client.jobs.create>[0] = { count, template };
      if (values.label) req.labels = keyValues(values.label, 'label');
      const conc = positiveInt(values.concurrency, 'concurrency');
      if (conc !== undefined) req.concurrency = conc;
      if (values.quota !== undefined) {
        if (values.quota !== 'all' && values.quota !== 'upTo') throw new UsageError('--quota must be all or upTo');
        req.quota = values.quota;
      }
      if (values['node-label']) req.placement = { nodeSelector: keyValues(values['node-label'], 'node-label') };
      const job = await client.jobs.create(req);
      io.out(values.json ? `${JSON.stringify(job)}\n` : `${job.id}\n`);
      if (job.count < job.requested) io.err(`warren: quota: ${job.count} of ${job.requested} admitted\n`);
      if (values['no-watch']) return 0;
      const end = await watchJob(io, client, job.id, values.json === true);
      return end.state === 'done' ? 0 : 1;
    }
    const id = positionals[0];
    if (sub === 'ls') {
      const jobs = await client.jobs.list();
      if (values.json) io.out(`${JSON.stringify(jobs)}\n`);
      else io.out(formatTable(jobs.map((j) => ({ ID: j.id, STATE: j.state, COUNT: String(j.count), READY: String(j.created), FAILED: String(j.failed), LOST: String(j.lost), CREATED: j.createdAt })), ['ID', 'STATE', 'COUNT', 'READY', 'FAILED', 'LOST', 'CREATED']));
      return 0;
    }
    if (id === undefined) throw new UsageError(`job ${sub} ID`);
    if (sub === 'watch') {
      const end = await watchJob(io, client, id, values.json === true);
      return end.state === 'done' ? 0 : 1;
    }
    if (sub === 'pause' || sub === 'resume' || sub === 'cancel' || sub === 'rm') {
      const r = await (sub === 'pause' ? client.jobs.pause(id) : sub === 'resume' ? client.jobs.resume(id) : sub === 'cancel' ? client.jobs.cancel(id) : client.jobs.delete(id));
      io.out(`${r.id} ${r.state}\n`);
      return 0;
    }
    throw new UsageError(`unknown job command ${JSON.stringify(sub)}`);
  } finally {
    await client.close();
  }
}

/** `warren nodes`: the nodes of a cluster, through a cluster gateway (admin). */
export async function cmdNodes(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { json: { type: 'boolean' } });
  if (values.help) {
    io.out(
      'usage: warren nodes [--json]          the nodes of a cluster as their records say (through a cluster gateway; admin)\n' +
        '       warren nodes forget NODE       forget a node that is gone for good: its lost epochs and quota blocks\n',
    );
    return 0;
  }
  if (positionals.length > 0 && positionals[0] !== 'forget') throw new UsageError(`unknown nodes command ${JSON.stringify(positionals[0])} (forget)`);
  if (positionals[0] === 'forget' && positionals.length !== 2) throw new UsageError('usage: warren nodes forget NODE');
  const client = clientFor(values, io);
  try {
    if (positionals[0] === 'forget') {
      const r = await client.forgetNode(positionals[1]!);
      if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
      else io.out(`forgot node ${r.node}: lost epochs ${r.lostEpochs.join(', ') || 'none'}, ${r.quotaBlocks} quota block(s)\n`);
      return 0;
    }
    const r = await client.clusterNodes();
    if (values.json) {
      io.out(`${JSON.stringify(r, null, 2)}\n`);
      return 0;
    }
    const rows = r.nodes
      .sort((a, b) => (a.id < b.id ? -1 : 1))
      .map((n) => ({
        NODE: n.id,
        POOL: n.pool,
        EPOCH: String(n.epoch),
        STATE: n.fenced ? 'fenced' : 'ready',
        SANDBOXES: `${n.used.sandboxes}/${n.capacity.sandboxes}`,
        CREATING: String(n.used.creating + n.pending),
        CPUS: String(n.capacity.cpus),
        'MEM FREE MB': String(n.used.memoryAvailableMb),
        LOAD1: n.used.load1.toFixed(2),
        BACKENDS: n.backends.join(','),
        LABELS: Object.entries(n.labels)
          .map(([k, v]) => `${k}=${v}`)
          .join(','),
        'RECORD AGE': `${(n.recordAgeMs / 1000).toFixed(1)}s`,
      }));
    io.out(formatTable(rows, ['NODE', 'POOL', 'EPOCH', 'STATE', 'SANDBOXES', 'CREATING', 'CPUS', 'MEM FREE MB', 'LOAD1', 'BACKENDS', 'LABELS', 'RECORD AGE']));
    for (const l of r.lost) io.out(`lost: ${l.node} (epoch ${l.epochs.join(', ')})\n`);
    return 0;
  } finally {
    await client.close();
  }
}
