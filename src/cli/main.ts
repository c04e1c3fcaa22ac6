/**
 * `warren <command>`: the command-line client (and `warren up`, the server).
 * See docs/cli.md. Errors print `warren: CODE: message` and exit non-zero:
 * 2 for usage errors, 1 for failures; `exec` exits with the command's code.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { WarrenError } from '../errors';
import { type CreateSandboxRequest, type ImportProgress, type SandboxInfo, WarrenClient } from '../sdk';
import { ProgressPrinter, formatTable } from './output';
import { runShell } from './shell';
import type { NodeClusterOptions } from '../gateway/up';
import { cmdGateway, cmdJob, cmdNode, cmdNodes } from './cluster';
import { lookupTable } from '../validation';

export const DEFAULT_URL = 'http://127.0.0.1:7070';
export const DEFAULT_DATA_DIR = '/var/lib/warren';

export class UsageError extends Error {}

export interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  env: NodeJS.ProcessEnv;
}

const defaultIo: Io = {
  out: (s) => process.stdout.write(s),
  err: (s) => process.stderr.write(s),
  env: process.env,
};

const COMMON = {
  url: { type: 'string' },
  token: { type: 'string' },
  'data-dir': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
} as const satisfies ParseArgsConfig['options'];

const USAGE = `usage: warren <command> [options]

commands:
  up --listen HOST:PORT --data-dir DIR [--otlp URL] [--allow-origin ORIGIN]... [--no-default-image] [--node-id ID] [--e2b-port PORT]
     [--policy-dir DIR] [--zram-swap-mb N] [--zswap] [--scrub PATTERN]... [--quota-sandboxes N] [--quota-cpu N] [--quota-memory MB]
     [--no-network] [--bridge NAME] [--subnet CIDR] [--nft-table NAME] [--dns-upstream IP[:PORT]]... [--netns-warm N]
     [--shell-stall-timeout-ms MS] [--shell-buffer-budget-mib N]
     [--idempotency-window DURATION (e.g. 24h, 30m, 90s, 500ms; default 24h)] [--idempotency-max-output-mib N] [--registry-config FILE]
     [--pull-mode lazy|eager] [--lazy-cache-mib N] [--shim-listen HOST:PORT --shim-token-file FILE]   (docs/shim-protocol.md)
     [--prepared N (sandboxes made ahead per recent shape; 0: off; default 2)]   (docs/density.md)
  node --etcd URL[,URL...] --cluster-credential FILE [--pool onprem|overflow] [--node-label K=V]... [--max-sandboxes N]
       [--lease-ttl S] [--create-window N] [--advertise URL] [--advertise-shim URL] [--lazy-layers [--pull-staged eager|on-demand]] <up options>      a cluster node (docs/cluster.md)
  gateway --etcd URL[,URL...] --cluster-credential FILE --listen HOST:PORT --admin-token-file FILE [--overflow-threshold F]
  gateway --node URL --shim-token-file FILE --listen HOST:PORT --data-dir DIR [--e2b-port PORT]   one node over the shim protocol
  job create COUNT [create options] [--concurrency N] [--quota all|upTo] [--node-label K=V]... [--no-watch] | job watch|pause|resume|cancel|rm ID | job ls
  nodes [--json]                                   a cluster's nodes: pool, epoch, load, capacity (through a cluster gateway)
  nodes forget NODE                                forget a node gone for good: its lost epochs and quota blocks (admin)
  create [--image I] [--backend B] [--cpu N] [--memory MB] [--pids N] [--disk MB]
         [--priority normal|idle] [--user U] [--env K=V]... [--label K=V]...
         [--workspace W]... [--toolkit T]... [--ttl S] [--idle S] [--on-idle pause|hibernate|stop|delete|reclaim]
         [--net SERVICE[,SERVICE...]|none]               prints the sandbox id
  network ID [SERVICE=on|off]...                   a sandbox's services, address, DNS bindings and denials; change them live
  exec ID [--timeout MS] [--cwd DIR] [--user U] [--env K=V]... [--stdin] [--idempotency-key K] -- CMD [ARG...]
  shell ID [--session S] [--mode pty|command]      interactive terminal (Ctrl-] detaches)
  ls [--label K=V]... [--json]
  rm ID...
  image ls [--json] | image import NAME PATH [--kind K] | image build NAME [--suite S] [--include PKG]...
  image push IMAGE HOST[:PORT]/REPO[:TAG] | image pull HOST[:PORT]/REPO[:TAG] [--name N] [--lazy|--eager]
  image stage IMAGE --registry HOST[:PORT]/REPO | image rm NAME | image layers [DIGEST]... [--json]
  account create NAME [--role admin|builder|runtime]
  doctor [--json]                                  what this node's kernel supports and which enforcer is active
  policy validate [DIR] | apply | show             the security policy (docs/security.md)
  fn pools|create|rm|invoke|judge ...              FnCall warm pools (warren fn --help)
  pause|resume ID... | --label K=V...              freeze and give memory back / thaw (a job by label)
  hibernate ID | extend ID (--seconds N|--ttl N)   CRIU checkpoint; push the ttl out
  pack ID NAME [--scrub P]... [--publish] [--squash]   pack_diff: the sandbox's changes become an environment
  env ls|publish|unpublish [NAME] | quota [ACCOUNT] [--sandboxes N] [--cpu N] [--memory MB]
  screenshot ID OUT.png [--width W]                the screen of a vm sandbox as PNG
  input ID JSON                                    keyboard/pointer actions for a vm sandbox (docs/vm.md)
  vnc ID [--listen HOST:PORT]                      a vm's live view on a local port for any VNC viewer
  version

connection: --url URL (or WARREN_URL, default ${DEFAULT_URL})
            --token T (or WARREN_TOKEN, or the admin token in --data-dir DIR / WARREN_DATA_DIR, default ${DEFAULT_DATA_DIR})
`;

function parse<O extends NonNullable<ParseArgsConfig['options']>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options: { ...COMMON, ...options }, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

export type Values = Record<string, string | boolean | string[] | undefined>;

export function str(v: Values, name: string): string | undefined {
  const x = v[name];
  return typeof x === 'string' ? x : undefined;
}

export function num(v: Values, name: string): number | undefined {
  const s = str(v, name);
  if (s === undefined) return undefined;
  const n = Number(s);
  if (s.trim() === '' || !Number.isFinite(n)) throw new UsageError(`--${name} must be a number (got ${JSON.stringify(s)})`);
  return n;
}

export function keyValues(items: string[], flag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of items) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new UsageError(`--${flag} expects KEY=VALUE (got ${JSON.stringify(item)})`);
    Object.defineProperty(out, item.slice(0, eq), { value: item.slice(eq + 1), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

/** Connection settings: flags, then environment, then the admin token file in the data dir. */
export function connection(v: Values, env: NodeJS.ProcessEnv): { url: string; token: string | undefined } {
  const url = str(v, 'url') ?? env.WARREN_URL ?? DEFAULT_URL;
  let token = str(v, 'token') ?? env.WARREN_TOKEN;
  if (token === undefined || token === '') {
    const dataDir = str(v, 'data-dir') ?? env.WARREN_DATA_DIR ?? DEFAULT_DATA_DIR;
    const file = join(dataDir, 'admin.token');
    if (existsSync(file)) {
      try {
        token = readFileSync(file, 'utf8').trim();
      } catch (err) {
        if (str(v, 'data-dir') !== undefined) throw new WarrenError('UNAUTHENTICATED', `cannot read ${file}: ${(err as Error).message}`);
      }
    } else if (str(v, 'data-dir') !== undefined) {
      throw new WarrenError('UNAUTHENTICATED', `no admin token at ${file}`);
    }
  }
  return { url, token: token === '' ? undefined : token };
}

export function clientFor(v: Values, io: Io): WarrenClient {
  const c = connection(v, io.env);
  return new WarrenClient({ url: c.url, token: c.token, connections: 4 });
}

function warrenVersion(): string {
  for (const rel of ['../../package.json', '../../../package.json']) {
    try {
      const pkg = JSON.parse(readFileSync(join(__dirname, rel), 'utf8')) as { name?: string; version?: string };
      if (pkg.name === 'warren' && pkg.version) return pkg.version;
    } catch {
      /* next */
    }
  }
  return '0.0.0';
}

// ---------------------------------------------------------------- commands

/** ["pypi", "npm=off"] -> {pypi: true, npm: false} ("none" alone: network with every service off). */
export function parseServices(items: string[], flag: string): Record<string, boolean> {
  const out: Record<string, boolean> = {};
  for (const item of items) {
    if (item === 'none') continue;
    const m = /^([a-z0-9][a-z0-9._-]{0,62})(?:=(on|off|true|false))?$/.exec(item);
    if (!m) throw new UsageError(`--${flag} expects SERVICE or SERVICE=on|off (got ${JSON.stringify(item)})`);
    out[m[1]!] = m[2] === undefined || m[2] === 'on' || m[2] === 'true';
  }
  return out;
}

/** "1.2.3.4" or "1.2.3.4:5353" (an upstream resolver). */
function parseEndpoint(text: string): { address: string; port: number } {
  const m = /^(\d{1,3}(?:\.\d{1,3}){3})(?::(\d{1,5}))?$/.exec(text);
  if (!m || (m[2] !== undefined && Number(m[2]) > 65535)) throw new UsageError(`--dns-upstream expects IPv4[:PORT] (got ${JSON.stringify(text)})`);
  return { address: m[1]!, port: m[2] === undefined ? 53 : Number(m[2]) };
}

/** "24h", "30m", "90s", "500ms", or a bare number of seconds. */
export function parseDurationMs(text: string, flag: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(text.trim());
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 } as const;
  const ms = m ? Math.round(Number(m[1]) * unit[(m[2] ?? 's') as keyof typeof unit]) : NaN;
  if (!Number.isSafeInteger(ms) || ms < 1 || ms > 30 * 86_400_000) throw new UsageError(`${flag} expects a duration such as 24h, 30m, 90s or 500ms, at most 30d (got ${JSON.stringify(text)})`);
  return ms;
}

export async function cmdUp(args: string[], io: Io, cluster?: NodeClusterOptions): Promise<number> {
  // A server whose log destination goes away (its stdout or stderr a pipe whose reader exited)
  // keeps serving; the lines it writes are lost instead of the write error ending the process.
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined);
  const { values } = parse(args, {
    listen: { type: 'string' },
    otlp: { type: 'string' },
    'allow-origin': { type: 'string', multiple: true },
    'policy-dir': { type: 'string' },
    'no-default-image': { type: 'boolean' },
    'node-id': { type: 'string' },
    'zram-swap-mb': { type: 'string' },
    zswap: { type: 'boolean' },
    scrub: { type: 'string', multiple: true },
    'quota-sandboxes': { type: 'string' },
    'quota-cpu': { type: 'string' },
    'quota-memory': { type: 'string' },
    'no-network': { type: 'boolean' },
    bridge: { type: 'string' },
    subnet: { type: 'string' },
    'nft-table': { type: 'string' },
    'dns-upstream': { type: 'string', multiple: true },
    'netns-warm': { type: 'string' },
    'e2b-port': { type: 'string' },
    'shell-stall-timeout-ms': { type: 'string' },
    'shell-buffer-budget-mib': { type: 'string' },
    'idempotency-window': { type: 'string' },
    'idempotency-max-output-mib': { type: 'string' },
    'registry-config': { type: 'string' },
    'pull-mode': { type: 'string' },
    'lazy-cache-mib': { type: 'string' },
    'shim-listen': { type: 'string' },
    'shim-token-file': { type: 'string' },
    prepared: { type: 'string' },
  });
  if (values.help) return usage(io);
  const listen = values.listen ?? '127.0.0.1:7070';
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(listen);
  if (!m || Number(m[2]) > 65535) throw new UsageError(`--listen expects HOST:PORT (got ${JSON.stringify(listen)})`);
  const host = m[1]!.replace(/^\[|\]$/g, '');
  const port = Number(m[2]);
  const dataDir = values['data-dir'] ?? io.env.WARREN_DATA_DIR ?? DEFAULT_DATA_DIR;
  const progress = new ProgressPrinter(process.stderr);
  // Loaded lazily: only `up` needs the node side (native helper, kernel features).
  const { startWarren } = await import('../gateway/up');
  io.err(`warren: starting (data dir ${dataDir})\n`);
  const opts: Parameters<typeof startWarren>[0] = {
    dataDir,
    host,
    port,
    onProgress: (p: ImportProgress) => progress.update(p),
    ensureDefaultImage: !values['no-default-image'],
    log: (line) => io.err(`${line}\n`),
  };
  if (values.otlp) opts.otlpEndpoint = values.otlp;
  if (values['node-id']) opts.nodeId = values['node-id'];
  if (values['allow-origin']) opts.allowedOrigins = values['allow-origin'];
  if (values['policy-dir']) opts.policyDir = values['policy-dir'];
  const zram = num(values, 'zram-swap-mb');
  if (zram !== undefined || values.scrub || values.zswap) {
    opts.lifecycle = { ...(zram !== undefined ? { zramSwapMb: zram } : {}), ...(values.scrub ? { scrub: values.scrub } : {}), ...(values.zswap ? { zswap: true } : {}) };
  }
  const qs = num(values, 'quota-sandboxes');
  const qc = num(values, 'quota-cpu');
  const qm = num(values, 'quota-memory');
  if (qs !== undefined || qc !== undefined || qm !== undefined) opts.defaultQuota = { maxSandboxes: qs ?? null, maxCpu: qc ?? null, maxMemoryMb: qm ?? null };
  const e2bPort = num(values, 'e2b-port');
  if (e2bPort !== undefined) {
    if (!Number.isInteger(e2bPort) || e2bPort < 0 || e2bPort > 65535) throw new UsageError(`--e2b-port expects a port number (got ${values['e2b-port']})`);
    opts.e2bPort = e2bPort;
  }
  const stall = num(values, 'shell-stall-timeout-ms');
  const budget = num(values, 'shell-buffer-budget-mib');
  if (stall !== undefined || budget !== undefined) {
    opts.shell = { ...(stall !== undefined ? { stallTimeoutMs: stall } : {}), ...(budget !== undefined ? { bufferBudgetBytes: budget * 1024 * 1024 } : {}) };
  }
  const idemWindow = values['idempotency-window'] === undefined ? undefined : parseDurationMs(values['idempotency-window'], '--idempotency-window');
  const idemOutput = num(values, 'idempotency-max-output-mib');
  if (idemOutput !== undefined && (!Number.isInteger(idemOutput) || idemOutput < 0 || idemOutput > 64)) {
    throw new UsageError(`--idempotency-max-output-mib expects an integer in 0..64 (got ${values['idempotency-max-output-mib']})`);
  }
  if (idemWindow !== undefined || idemOutput !== undefined) {
    opts.idempotency = { ...(idemWindow !== undefined ? { windowMs: idemWindow } : {}), ...(idemOutput !== undefined ? { maxStoredOutputBytes: idemOutput * 1024 * 1024 } : {}) };
  }
  const layers: NonNullable<typeof opts.layers> = {};
  if (values['registry-config']) {
    try {
      layers.registries = JSON.parse(readFileSync(values['registry-config'], 'utf8')) as NonNullable<typeof layers.registries>;
    } catch (err) {
      throw new UsageError(`--registry-config: cannot read ${values['registry-config']}: ${(err as Error).message}`);
    }
  }
  if (values['pull-mode']) {
    if (values['pull-mode'] !== 'lazy' && values['pull-mode'] !== 'eager') throw new UsageError('--pull-mode expects lazy or eager');
    layers.pullMode = values['pull-mode'];
  }
  const cacheMib = num(values, 'lazy-cache-mib');
  if (cacheMib !== undefined) layers.lazyCacheBytes = Math.floor(cacheMib * 1024 * 1024);
  if (Object.keys(layers).length > 0) opts.layers = layers;
  if (cluster) opts.cluster = cluster;
  const prepared = num(values, 'prepared');
  if (prepared !== undefined) {
    if (!Number.isInteger(prepared) || prepared < 0 || prepared > 64) throw new UsageError(`--prepared expects an integer in 0..64 (got ${values.prepared})`);
    opts.prepared = { perShape: prepared };
  }
  if (values['no-network']) opts.network = false;
  else {
    const net: NonNullable<Exclude<typeof opts.network, false>> = {};
    if (values.bridge) net.bridge = values.bridge;
    if (values.subnet) net.subnet = values.subnet;
    if (values['nft-table']) net.nftTable = values['nft-table'];
    const warm = num(values, 'netns-warm');
    if (warm !== undefined) net.warm = warm;
    if (values['dns-upstream']) net.upstreams = values['dns-upstream'].map(parseEndpoint);
    opts.network = net;
  }
  if (values['shim-listen'] !== undefined) {
    const sm = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(values['shim-listen']);
    if (!sm || Number(sm[2]) > 65535) throw new UsageError(`--shim-listen expects HOST:PORT (got ${JSON.stringify(values['shim-listen'])})`);
    const host = sm[1]!.replace(/^\[|\]$/g, '');
    if (cluster) {
      // a cluster node's token comes from the cluster credential
      if (values['shim-token-file']) throw new UsageError('a cluster node derives its shim token from --cluster-credential: drop --shim-token-file');
      opts.shimListen = { host, port: Number(sm[2]), token: '' };
    } else {
      if (!values['shim-token-file']) throw new UsageError('--shim-listen needs --shim-token-file FILE (read when it exists, else created; give the same file to the gateways)');
      const { readOrCreateShimToken } = await import('../shim/remote/token');
      opts.shimListen = { host, port: Number(sm[2]), token: readOrCreateShimToken(values['shim-token-file']) };
    }
  } else if (values['shim-token-file']) throw new UsageError('--shim-token-file goes with --shim-listen');
  const warren = await startWarren(opts);
  progress.finish();
  // The signal handlers are in place before the server says it is listening: a supervisor that
  // sends SIGHUP or SIGTERM as soon as it reads that line must not meet the default action.
  const stopped = new Promise<void>((resolve) => {
    let stopping = false;
    const stop = (sig: NodeJS.Signals) => {
      if (stopping) {
        io.err(`warren: ${sig} again, exiting now\n`);
        process.exit(1);
      }
      stopping = true;
      io.err(`warren: ${sig}, shutting down (sandboxes keep running)\n`);
      warren.close().then(resolve, (err) => {
        io.err(`warren: error while stopping: ${(err as Error).message}\n`);
        resolve();
      });
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
    // SIGHUP: re-read the policy directory (validated as a whole; the last good policy stays on error; audited)
    process.on('SIGHUP', () => {
      void import('../security/confinement').then(({ policyStore }) => {
        try {
          const r = policyStore().apply();
          io.err(`warren: SIGHUP: policy applied (${r.changes.length} change${r.changes.length === 1 ? '' : 's'})\n`);
        } catch (err) {
          io.err(`warren: SIGHUP: policy rejected, the last good one stays: ${(err as Error).message}\n`);
        }
      });
    });
  });
  io.out(`Warren is listening on ${warren.url}\n`);
  if (warren.shimUrl) io.out(`Shim protocol on ${warren.shimUrl}\n`);
  if (warren.e2bUrl) io.out(`E2B API on ${warren.e2bUrl} (E2B_API_URL=${warren.e2bUrl}/e2b E2B_SANDBOX_URL=${warren.e2bUrl})\n`);
  if (warren.adminToken) {
    io.out(`Admin token (shown once; saved in ${join(dataDir, 'admin.token')}, mode 0600):\n${warren.adminToken}\n`);
  }
  await stopped;
  // Idle keep-alive connections must not hold the process open after a clean stop.
  setTimeout(() => process.exit(0), 2000).unref();
  return 0;
}

async function cmdCreate(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {
    image: { type: 'string' },
    backend: { type: 'string' },
    cpu: { type: 'string' },
    memory: { type: 'string' },
    pids: { type: 'string' },
    disk: { type: 'string' },
    priority: { type: 'string' },
    user: { type: 'string' },
    env: { type: 'string', multiple: true },
    label: { type: 'string', multiple: true },
    workspace: { type: 'string', multiple: true },
    toolkit: { type: 'string', multiple: true },
    ttl: { type: 'string' },
    idle: { type: 'string' },
    'on-idle': { type: 'string' },
    net: { type: 'string', multiple: true },
    json: { type: 'boolean' },
  });
  if (values.help) return usage(io);
  if (positionals.length > 0) throw new UsageError(`create takes no positional arguments (got ${positionals.join(' ')})`);
  const req: CreateSandboxRequest = {};
  if (values.image) req.image = values.image;
  if (values.backend) req.backend = values.backend as CreateSandboxRequest['backend'];
  const cpu = num(values, 'cpu');
  if (cpu !== undefined) req.cpu = cpu;
  const mem = num(values, 'memory');
  if (mem !== undefined) req.memoryMb = mem;
  const pids = num(values, 'pids');
  if (pids !== undefined) req.pids = pids;
  const disk = num(values, 'disk');
  if (disk !== undefined) req.diskMb = disk;
  if (values.priority) req.priority = values.priority as CreateSandboxRequest['priority'];
  if (values.user) req.user = values.user;
  if (values.env) req.env = keyValues(values.env, 'env');
  if (values.label) req.labels = keyValues(values.label, 'label');
  if (values.workspace) req.workspaces = values.workspace;
  if (values.toolkit) req.toolkits = values.toolkit;
  const ttl = num(values, 'ttl');
  if (ttl !== undefined) req.ttlSeconds = ttl;
  const idle = num(values, 'idle');
  if (idle !== undefined) req.idleSeconds = idle;
  if (values['on-idle']) req.onIdle = values['on-idle'] as CreateSandboxRequest['onIdle'];
  if (values.net) req.network = parseServices(values.net.flatMap((v) => v.split(',')).filter((v) => v !== ''), 'net');
  const client = clientFor(values, io);
  try {
    const sb = await client.createSandbox(req);
    io.out(values.json ? `${JSON.stringify(sb.info, null, 2)}\n` : `${sb.id}\n`);
    return 0;
  } finally {
    await client.close();
  }
}

async function cmdNetwork(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { json: { type: 'boolean' } });
  if (values.help) return usage(io);
  const [id, ...changes] = positionals;
  if (id === undefined) throw new UsageError('usage: warren network ID [SERVICE=on|off]...');
  const change = parseServices(changes, 'network');
  if (changes.some((c) => !c.includes('='))) throw new UsageError('changes are SERVICE=on or SERVICE=off');
  const client = clientFor(values, io);
  try {
    const sb = client.sandbox(id);
    const info = changes.length > 0 ? await sb.setNetwork(change) : await sb.network();
    if (values.json) {
      io.out(`${JSON.stringify(info, null, 2)}\n`);
      return 0;
    }
    const on = Object.entries(info.services).filter(([, v]) => v).map(([k]) => k);
    io.out(`address   ${info.address}\nresolver  ${info.resolver}\nservices  ${on.length ? on.join(', ') : '(none)'}\n`);
    if (info.bindings.length) io.out(`bindings\n${info.bindings.map((b) => `  ${b.service.padEnd(12)} ${b.name} -> ${b.address} (${b.expiresInS}s)`).join('\n')}\n`);
    if (info.denials.length) io.out(`recent denials\n${info.denials.slice(-10).map((d) => `  ${d.at} ${d.destination}/${d.proto} (${d.service}, ${d.hook}, ${d.reason})`).join('\n')}\n`);
    return 0;
  } finally {
    await client.close();
  }
}

async function readAllStdin(limit: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of process.stdin) {
    size += (c as Buffer).length;
    if (size > limit) throw new UsageError(`--stdin input exceeds ${limit} bytes`);
    chunks.push(c as Buffer);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function cmdExec(args: string[], io: Io): Promise<number> {
  const dash = args.indexOf('--');
  const before = dash === -1 ? args : args.slice(0, dash);
  const cmd = dash === -1 ? [] : args.slice(dash + 1);
  const { values, positionals } = parse(before, {
    timeout: { type: 'string' },
    cwd: { type: 'string' },
    user: { type: 'string' },
    env: { type: 'string', multiple: true },
    stdin: { type: 'boolean' },
    'idempotency-key': { type: 'string' },
  });
  if (values.help) return usage(io);
  const [id, ...rest] = positionals;
  if (id === undefined) throw new UsageError('exec needs a sandbox id: warren exec ID -- CMD [ARG...]');
  const argv = cmd.length > 0 ? cmd : rest;
  if (argv.length === 0) throw new UsageError('exec needs a command after --: warren exec ID -- CMD [ARG...]');
  const opts: Parameters<ReturnType<WarrenClient['sandbox']>['exec']>[1] = {};
  const timeout = num(values, 'timeout');
  if (timeout !== undefined) opts.timeoutMs = timeout;
  if (values.cwd) opts.cwd = values.cwd;
  if (values.user) opts.user = values.user;
  if (values.env) opts.env = keyValues(values.env, 'env');
  if (values.stdin) opts.stdin = await readAllStdin(1024 * 1024);
  if (values['idempotency-key']) opts.idempotencyKey = values['idempotency-key'];
  const client = clientFor(values, io);
  try {
    const r = await client.sandbox(id).exec(argv, opts);
    if (r.stdout) io.out(r.stdout);
    if (r.stderr) io.err(r.stderr);
    if (r.truncated) io.err('warren: output was truncated (maxOutputBytes)\n');
    if (r.status === 'timeout') {
      io.err('warren: command timed out\n');
      return 124;
    }
    if (r.exitCode !== null) return r.exitCode;
    if (r.signal !== null) return 128 + r.signal;
    io.err(`warren: command ended with status ${r.status}\n`);
    return 1;
  } finally {
    await client.close();
  }
}

async function cmdShell(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { session: { type: 'string' }, mode: { type: 'string' } });
  if (values.help) return usage(io);
  const id = positionals[0];
  if (id === undefined || positionals.length > 1) throw new UsageError('usage: warren shell ID [--session S] [--mode pty|command]');
  const mode = (values.mode ?? 'pty') as 'pty' | 'command';
  if (mode !== 'pty' && mode !== 'command') throw new UsageError('--mode must be pty or command');
  const client = clientFor(values, io);
  try {
    return await runShell(client, id, { mode, session: values.session, err: io.err });
  } finally {
    await client.close();
  }
}

function labelsText(labels: Record<string, string>): string {
  return Object.entries(labels)
    .map(([k, v]) => `${k}=${v}`)
    .join(',');
}

async function cmdLs(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, { label: { type: 'string', multiple: true }, json: { type: 'boolean' } });
  if (values.help) return usage(io);
  const client = clientFor(values, io);
  try {
    const filter: { labels?: Record<string, string> } = {};
    if (values.label) filter.labels = keyValues(values.label, 'label');
    const list = await client.listSandboxes(filter);
    if (values.json) {
      io.out(`${JSON.stringify(list, null, 2)}\n`);
      return 0;
    }
    const rows = list.map((s: SandboxInfo) => ({
      ID: s.id,
      STATE: s.state,
      BACKEND: s.backend,
      IMAGE: s.image,
      CPU: String(s.limits.cpu),
      'MEM MB': String(s.limits.memoryMb),
      CREATED: s.createdAt,
      LABELS: labelsText(s.labels),
    }));
    io.out(formatTable(rows, ['ID', 'STATE', 'BACKEND', 'IMAGE', 'CPU', 'MEM MB', 'CREATED', 'LABELS']));
    return 0;
  } finally {
    await client.close();
  }
}

async function cmdRm(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {});
  if (values.help) return usage(io);
  if (positionals.length === 0) throw new UsageError('usage: warren rm ID...');
  const client = clientFor(values, io);
  let failed = 0;
  try {
    for (const id of positionals) {
      try {
        await client.deleteSandbox(id);
        io.out(`${id}\n`);
      } catch (err) {
        failed++;
        io.err(`warren: ${id}: ${describeError(err)}\n`);
      }
    }
  } finally {
    await client.close();
  }
  return failed === 0 ? 0 : 1;
}

async function cmdImage(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  const { values, positionals } = parse(rest, {
    kind: { type: 'string' },
    suite: { type: 'string' },
    include: { type: 'string', multiple: true },
    type: { type: 'string' },
    json: { type: 'boolean' },
    name: { type: 'string' },
    lazy: { type: 'boolean' },
    eager: { type: 'boolean' },
    registry: { type: 'string' },
  });
  if (values.help || sub === undefined) return usage(io, sub === undefined ? 2 : 0);
  const client = clientFor(values, io);
  const progress = new ProgressPrinter(process.stderr);
  try {
    switch (sub) {
      case 'ls': {
        const images = await client.images.list();
        if (values.json) {
          io.out(`${JSON.stringify(images, null, 2)}\n`);
          return 0;
        }
        io.out(
          formatTable(
            images.map((i) => ({ NAME: i.name, KIND: i.kind, DIGEST: i.digest.slice(0, 19), LAYERS: String(i.layers.length), SIZE: humanBytes(i.sizeBytes), CREATED: i.createdAt })),
            ['NAME', 'KIND', 'DIGEST', 'LAYERS', 'SIZE', 'CREATED'],
          ),
        );
        return 0;
      }
      case 'import': {
        const [name, path] = positionals;
        if (name === undefined || path === undefined || positionals.length > 2) throw new UsageError('usage: warren image import NAME PATH [--kind base|workspace|toolkit]');
        const opts: Parameters<WarrenClient['images']['import']>[2] = { onProgress: (p) => progress.update(p) };
        if (values.kind) opts.kind = values.kind as 'base';
        if (values.type) opts.type = values.type as 'directory';
        const image = await client.images.import(name, path, opts);
        progress.finish();
        io.out(`${image.name} ${image.digest}\n`);
        return 0;
      }
      case 'build': {
        const [name] = positionals;
        if (name === undefined || positionals.length > 1) throw new UsageError('usage: warren image build NAME [--suite S] [--include PKG]...');
        const opts: Parameters<WarrenClient['images']['build']>[1] = { onProgress: (p) => progress.update(p) };
        if (values.suite) opts.suite = values.suite;
        if (values.include) opts.include = values.include;
        const image = await client.images.build(name, opts);
        progress.finish();
        io.out(`${image.name} ${image.digest}\n`);
        return 0;
      }
      case 'push': {
        const [image, ref] = positionals;
        if (image === undefined || ref === undefined || positionals.length > 2) throw new UsageError('usage: warren image push IMAGE REGISTRY/REPO[:TAG]');
        const r = await client.images.push(image, ref, { onProgress: (p) => progress.update(p) });
        progress.finish();
        if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
        else io.out(`${r.ref}@${r.manifestDigest} (${r.layers.filter((l) => l.uploaded).length}/${r.layers.length} layers uploaded, ${humanBytes(r.bytesUploaded)})\n`);
        return 0;
      }
      case 'rm': {
        const [name] = positionals;
        if (name === undefined || positionals.length > 1) throw new UsageError('usage: warren image rm NAME');
        const r = await client.images.delete(name);
        if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
        else io.out(`${r.name} removed (${r.removedLayers.length} layer${r.removedLayers.length === 1 ? '' : 's'} deleted)\n`);
        return 0;
      }
      case 'stage': {
        const [image] = positionals;
        if (image === undefined || positionals.length > 1 || !values.registry) throw new UsageError('usage: warren image stage IMAGE --registry REGISTRY/REPO');
        const r = await client.images.stage(image, values.registry, { onProgress: (p) => progress.update(p) });
        progress.finish();
        if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
        else io.out(`${r.ref}@${r.manifestDigest} (${r.layers.filter((l) => l.uploaded).length}/${r.layers.length} layers uploaded, ${humanBytes(r.bytesUploaded)})\n`);
        return 0;
      }
      case 'pull': {
        const [ref] = positionals;
        if (ref === undefined || positionals.length > 1) throw new UsageError('usage: warren image pull REGISTRY/REPO[:TAG] [--name N] [--lazy|--eager]');
        if (values.lazy && values.eager) throw new UsageError('--lazy and --eager exclude each other');
        const opts: Parameters<WarrenClient['images']['pull']>[1] = { onProgress: (p) => progress.update(p) };
        if (values.name) opts.name = values.name;
        if (values.lazy) opts.mode = 'lazy';
        if (values.eager) opts.mode = 'eager';
        const image = await client.images.pull(ref, opts);
        progress.finish();
        io.out(`${image.name} ${image.digest}\n`);
        return 0;
      }
      case 'layers': {
        const layers = await client.images.layers(positionals.length > 0 ? positionals : undefined);
        if (values.json) io.out(`${JSON.stringify(layers, null, 2)}\n`);
        else io.out(formatTable(layers.map((l) => ({ DIGEST: l.digest, STATE: l.state, MOUNTED: l.mounted ? 'yes' : 'no' })), ['DIGEST', 'STATE', 'MOUNTED']));
        return 0;
      }
      default:
        throw new UsageError(`unknown image command ${JSON.stringify(sub)} (ls, import, build, push, pull, stage, layers)`);
    }
  } finally {
    progress.finish();
    await client.close();
  }
}

async function cmdAccount(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  const { values, positionals } = parse(rest, { role: { type: 'string' }, json: { type: 'boolean' } });
  if (values.help) return usage(io);
  const client = clientFor(values, io);
  try {
    if (sub === 'create') {
      const [name] = positionals;
      if (name === undefined) throw new UsageError('usage: warren account create NAME [--role admin|builder|runtime]');
      const a = await client.createAccount(name, (values.role ?? 'runtime') as 'runtime');
      io.out(values.json ? `${JSON.stringify(a, null, 2)}\n` : `${a.id} ${a.role}\ntoken (shown once): ${a.token}\n`);
      return 0;
    }
    if (sub === 'ls') {
      const accounts = await client.listAccounts();
      io.out(formatTable(accounts.map((a) => ({ ID: a.id, NAME: a.name, ROLE: a.role, CREATED: a.createdAt })), ['ID', 'NAME', 'ROLE', 'CREATED']));
      return 0;
    }
    throw new UsageError('usage: warren account create NAME [--role R] | warren account ls');
  } finally {
    await client.close();
  }
}

async function cmdDoctor(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, { json: { type: 'boolean' } });
  if (values.help) return usage(io);
  const client = clientFor(values, io);
  try {
    const report = await client.features();
    if (values.json) {
      io.out(`${JSON.stringify(report, null, 2)}\n`);
    } else {
      io.out(`node ${report.node}, kernel ${report.kernel}, cgroup v${report.cgroup.version}`);
      io.out(report.cgroup.controllers.length ? ` (${report.cgroup.controllers.join(' ')})` : '');
      io.out(report.cgroup.bpfHierarchy ? `, BPF hierarchy ${report.cgroup.bpfHierarchy}\n` : '\n');
      io.out(`enforcer: ${report.enforcer}\n\n`);
      const rows = Object.entries(report.features).map(([name, f]) => ({
        FEATURE: name,
        SUPPORTED: f.supported ? 'yes' : 'no',
        REASON: f.reason ?? '',
        'WHAT WARREN DOES': f.action ?? (f.supported ? 'uses it' : ''),
      }));
      io.out(formatTable(rows, ['FEATURE', 'SUPPORTED', 'REASON', 'WHAT WARREN DOES']));
      io.out('\n');
      const backends = Object.entries(report.backends).map(([name, b]) => ({ BACKEND: name, AVAILABLE: b.available ? 'yes' : 'no', ACCELERATOR: b.accelerator ?? '', REASON: b.reason ?? '' }));
      io.out(formatTable(backends, ['BACKEND', 'AVAILABLE', 'ACCELERATOR', 'REASON']));
    }
    return report.backends.container?.available ? 0 : 1;
  } finally {
    await client.close();
  }
}

async function cmdVersion(args: string[], io: Io): Promise<number> {
  const { values } = parse(args, {});
  if (values.help) return usage(io);
  io.out(`warren ${warrenVersion()} (node ${process.version})\n`);
  if (values.url !== undefined || io.env.WARREN_URL !== undefined) {
    const client = clientFor(values, io);
    try {
      const h = await client.health();
      io.out(`server ${h.version} on node ${h.node}, up ${h.uptimeS}s\n`);
    } finally {
      await client.close();
    }
  }
  return 0;
}

function usage(io: Io, code = 0): number {
  (code === 0 ? io.out : io.err)(USAGE);
  return code;
}

function humanBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function describeError(err: unknown): string {
  if (err instanceof WarrenError) return `${err.code}: ${err.message}`;
  return err instanceof Error ? err.message : String(err);
}

const COMMANDS: Record<string, (args: string[], io: Io) => Promise<number>> = lookupTable({
  up: cmdUp,
  node: cmdNode,
  gateway: cmdGateway,
  job: cmdJob,
  nodes: cmdNodes,
  create: cmdCreate,
  exec: cmdExec,
  shell: cmdShell,
  ls: cmdLs,
  rm: cmdRm,
  image: cmdImage,
  account: cmdAccount,
  doctor: cmdDoctor,
  version: cmdVersion,
  // FnCall (src/cli/fn.ts), loaded on use.
  fn: async (args, io) => (await import('./fn')).cmdFn(args, io),
  // Security policy (src/cli/policy.ts), loaded on use.
  policy: async (args, io) => (await import('./policy')).cmdPolicy(args, io),
  // Lifecycle (src/cli/lifecycle.ts), loaded on use.
  pause: async (args, io) => (await import('./lifecycle')).cmdPause(args, io),
  resume: async (args, io) => (await import('./lifecycle')).cmdResume(args, io),
  hibernate: async (args, io) => (await import('./lifecycle')).cmdHibernate(args, io),
  extend: async (args, io) => (await import('./lifecycle')).cmdExtend(args, io),
  pack: async (args, io) => (await import('./lifecycle')).cmdPack(args, io),
  network: cmdNetwork,
  env: async (args, io) => (await import('./lifecycle')).cmdEnv(args, io),
  quota: async (args, io) => (await import('./lifecycle')).cmdQuota(args, io),
  // Computer use (src/cli/screen.ts), loaded on use.
  screenshot: async (args, io) => (await import('./screen')).cmdScreenshot(args, io),
  input: async (args, io) => (await import('./screen')).cmdInput(args, io),
  vnc: async (args, io) => (await import('./screen')).cmdVnc(args, io),
});

/** Run the CLI; resolves with the exit code. */
export async function main(argv: string[], io: Io = defaultIo): Promise<number> {
  const [command, ...args] = argv;
  if (command === undefined || command === 'help' || command === '--help' || command === '-h') return usage(io, command === undefined ? 2 : 0);
  if (command === '--version') return cmdVersion([], io);
  const fn = COMMANDS[command];
  if (fn === undefined) {
    io.err(`warren: unknown command ${JSON.stringify(command)}\n\n${USAGE}`);
    return 2;
  }
  try {
    return await fn(args, io);
  } catch (err) {
    if (err instanceof UsageError) {
      io.err(`warren: ${err.message}\n(see warren --help)\n`);
      return 2;
    }
    io.err(`warren: ${describeError(err)}\n`);
    if (err instanceof WarrenError && err.code === 'UNAUTHENTICATED') {
      io.err('warren: pass --token, set WARREN_TOKEN, or point --data-dir at the server data dir holding admin.token\n');
    }
    return 1;
  }
}

if (require.main === module) {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err) => {
      process.stderr.write(`warren: ${describeError(err)}\n`);
      process.exitCode = 1;
    },
  );
}
