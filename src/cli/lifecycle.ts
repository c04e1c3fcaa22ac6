/**
 * Lifecycle commands (docs/lifecycle.md):
 *
 *   warren pause ID... | warren pause --label K=V...      freeze + give memory back (a job by label)
 *   warren resume ID... | warren resume --label K=V...
 *   warren hibernate ID                                    CRIU checkpoint (where supported)
 *   warren extend ID (--seconds N | --ttl N)
 *   warren pack ID NAME [--scrub PATTERN]... [--publish] [--squash] [--compression lz4|lz4hc|none]
 *   warren env ls [--json] | warren env publish NAME | warren env unpublish NAME
 *   warren quota [ACCOUNT] [--sandboxes N|none] [--cpu N|none] [--memory MB|none]
 */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { WarrenClient } from '../sdk';
import type { PackRequest, PauseResult, ResumeResult } from '../shim/types';
import { UsageError, connection } from './main';
import { formatTable } from './output';

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  env: NodeJS.ProcessEnv;
}

const COMMON = { url: { type: 'string' }, token: { type: 'string' }, 'data-dir': { type: 'string' }, help: { type: 'boolean', short: 'h' }, json: { type: 'boolean' } } as const satisfies ParseArgsConfig['options'];

export const LIFECYCLE_USAGE = `lifecycle:
  warren pause ID... | warren pause --label K=V...       freeze and give the memory back
  warren resume ID... | warren resume --label K=V...
  warren hibernate ID                                     CRIU checkpoint to disk (where supported)
  warren extend ID (--seconds N | --ttl N)                push the ttl out
  warren pack ID NAME [--scrub PATTERN]... [--publish] [--squash] [--compression lz4|lz4hc|none]
  warren env ls [--json] | warren env publish NAME | warren env unpublish NAME
  warren quota [ACCOUNT] [--sandboxes N|none] [--cpu N|none] [--memory MB|none]
`;

function parse<O extends NonNullable<ParseArgsConfig['options']>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options: { ...COMMON, ...options }, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

function client(values: Record<string, unknown>, io: Io): WarrenClient {
  const c = connection(values as Record<string, string | boolean | string[] | undefined>, io.env);
  return new WarrenClient({ url: c.url, token: c.token, connections: 4 });
}

function labels(items: string[] | undefined): Record<string, string> | undefined {
  if (!items || items.length === 0) return undefined;
  const out: Record<string, string> = {};
  for (const item of items) {
    const eq = item.indexOf('=');
    if (eq <= 0) throw new UsageError(`--label expects KEY=VALUE (got ${JSON.stringify(item)})`);
    Object.defineProperty(out, item.slice(0, eq), { value: item.slice(eq + 1), enumerable: true, writable: true, configurable: true });
  }
  return out;
}

function number(v: string | undefined, flag: string, allowNone = false): number | null | undefined {
  if (v === undefined) return undefined;
  if (allowNone && v === 'none') return null;
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n)) throw new UsageError(`--${flag} must be a number${allowNone ? ' or "none"' : ''} (got ${JSON.stringify(v)})`);
  return n;
}

const mib = (b: number) => (b / 1048576).toFixed(1);

function pauseRows(rows: PauseResult[]): string {
  return formatTable(
    rows.map((r) => ({ ID: r.id, STATE: r.state, CHANGED: r.changed ? 'yes' : 'no', 'RELEASED MiB': mib(r.releasedBytes), 'NOW MiB': mib(r.memoryAfterBytes), RECLAIM: r.reclaim, MS: r.durationMs.toFixed(0), NOTE: r.note ?? '' })),
    ['ID', 'STATE', 'CHANGED', 'RELEASED MiB', 'NOW MiB', 'RECLAIM', 'MS', 'NOTE'],
  );
}

function resumeRows(rows: ResumeResult[]): string {
  return formatTable(rows.map((r) => ({ ID: r.id, STATE: r.state, CHANGED: r.changed ? 'yes' : 'no', MS: r.durationMs.toFixed(1) })), ['ID', 'STATE', 'CHANGED', 'MS']);
}

async function pauseOrResume(kind: 'pause' | 'resume', args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { label: { type: 'string', multiple: true } });
  if (values.help) return usage(io);
  const sel = labels(values.label);
  if ((sel === undefined) === (positionals.length === 0)) throw new UsageError(`usage: warren ${kind} ID... | warren ${kind} --label K=V...`);
  const c = client(values, io);
  try {
    let rows: Array<PauseResult | ResumeResult>;
    if (sel) rows = kind === 'pause' ? await c.pauseSandboxes(sel) : await c.resumeSandboxes(sel);
    else rows = await Promise.all(positionals.map((id) => (kind === 'pause' ? c.sandbox(id).pause() : c.sandbox(id).resume())));
    if (values.json) io.out(`${JSON.stringify(rows, null, 2)}\n`);
    else io.out(kind === 'pause' ? pauseRows(rows as PauseResult[]) : resumeRows(rows as ResumeResult[]));
    return 0;
  } finally {
    await c.close();
  }
}

export async function cmdPause(args: string[], io: Io): Promise<number> {
  return pauseOrResume('pause', args, io);
}

export async function cmdResume(args: string[], io: Io): Promise<number> {
  return pauseOrResume('resume', args, io);
}

export async function cmdHibernate(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {});
  if (values.help) return usage(io);
  if (positionals.length !== 1) throw new UsageError('usage: warren hibernate ID');
  const c = client(values, io);
  try {
    const r = await c.sandbox(positionals[0]!).hibernate();
    io.out(values.json ? `${JSON.stringify(r, null, 2)}\n` : pauseRows([r]));
    return 0;
  } finally {
    await c.close();
  }
}

export async function cmdExtend(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { seconds: { type: 'string' }, ttl: { type: 'string' } });
  if (values.help) return usage(io);
  const seconds = number(values.seconds, 'seconds');
  const ttl = number(values.ttl, 'ttl');
  if (positionals.length !== 1 || (seconds === undefined) === (ttl === undefined)) throw new UsageError('usage: warren extend ID (--seconds N | --ttl N)');
  const c = client(values, io);
  try {
    const info = await c.sandbox(positionals[0]!).extend(seconds !== undefined ? { seconds: seconds! } : { ttlSeconds: ttl! });
    io.out(values.json ? `${JSON.stringify(info, null, 2)}\n` : `${info.id} expires at ${info.lifecycle?.expiresAt}\n`);
    return 0;
  } finally {
    await c.close();
  }
}

export async function cmdPack(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { scrub: { type: 'string', multiple: true }, publish: { type: 'boolean' }, squash: { type: 'boolean' }, compression: { type: 'string' } });
  if (values.help) return usage(io);
  const [id, name] = positionals;
  if (id === undefined || name === undefined || positionals.length > 2) throw new UsageError('usage: warren pack ID NAME [--scrub PATTERN]... [--publish] [--squash] [--compression C]');
  const req: PackRequest = { name };
  if (values.scrub) req.scrub = values.scrub;
  if (values.publish) req.publish = true;
  if (values.squash) req.squash = true;
  if (values.compression) req.compression = values.compression as PackRequest['compression'];
  const c = client(values, io);
  try {
    const r = await c.sandbox(id).pack(req);
    if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
    else {
      io.out(`${r.image.name} ${r.image.digest}\n`);
      io.out(`layer ${r.layer}: ${(r.diffBytes / 1e6).toFixed(1)} MB in ${r.diffEntries} entries, frozen ${r.frozenMs.toFixed(0)} ms, ${r.durationMs} ms in all${r.squashed ? ', chain squashed' : ''}\n`);
      io.out(`scrubbed: ${r.scrubbed.length ? r.scrubbed.join(' ') : '(nothing)'}\n`);
      io.out(`published: ${r.environment.published ? 'yes' : 'no (warren env publish ' + r.image.name + ')'}\n`);
    }
    return 0;
  } finally {
    await c.close();
  }
}

export async function cmdEnv(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  const { values, positionals } = parse(rest, {});
  if (values.help || sub === undefined) return usage(io, sub === undefined ? 2 : 0);
  const c = client(values, io);
  try {
    if (sub === 'ls') {
      const envs = await c.listEnvironments();
      if (values.json) io.out(`${JSON.stringify(envs, null, 2)}\n`);
      else
        io.out(
          formatTable(
            envs.map((e) => ({ NAME: e.name, PUBLISHED: e.published ? 'yes' : 'no', OWNER: e.owner, PARENT: e.parent, 'PACK LAYERS': String(e.diffLayers.length), CREATED: e.createdAt })),
            ['NAME', 'PUBLISHED', 'OWNER', 'PARENT', 'PACK LAYERS', 'CREATED'],
          ),
        );
      return 0;
    }
    if (sub === 'publish' || sub === 'unpublish') {
      if (positionals.length !== 1) throw new UsageError(`usage: warren env ${sub} NAME`);
      const e = await c.publishEnvironment(positionals[0]!, sub === 'publish');
      io.out(`${e.name} ${e.published ? 'published' : 'unpublished'}\n`);
      return 0;
    }
    throw new UsageError(`unknown env command ${JSON.stringify(sub)} (ls, publish, unpublish)`);
  } finally {
    await c.close();
  }
}

export async function cmdQuota(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { sandboxes: { type: 'string' }, cpu: { type: 'string' }, memory: { type: 'string' } });
  if (values.help) return usage(io);
  if (positionals.length > 1) throw new UsageError('usage: warren quota [ACCOUNT] [--sandboxes N|none] [--cpu N|none] [--memory MB|none]');
  const account = positionals[0] ?? 'me';
  const patch: { maxSandboxes?: number | null; maxCpu?: number | null; maxMemoryMb?: number | null } = {};
  const s = number(values.sandboxes, 'sandboxes', true);
  const cpu = number(values.cpu, 'cpu', true);
  const mem = number(values.memory, 'memory', true);
  if (s !== undefined) patch.maxSandboxes = s;
  if (cpu !== undefined) patch.maxCpu = cpu;
  if (mem !== undefined) patch.maxMemoryMb = mem;
  const c = client(values, io);
  try {
    if (Object.keys(patch).length > 0) {
      if (account === 'me') throw new UsageError('setting a quota needs the ACCOUNT id');
      await c.setQuota(account, patch);
    }
    const q = await c.quota(account);
    if (values.json) io.out(`${JSON.stringify(q, null, 2)}\n`);
    else {
      const lim = (v: number | null) => (v === null ? 'unlimited' : String(v));
      io.out(
        formatTable(
          [
            { WHAT: 'sandboxes', LIMIT: lim(q.quota.maxSandboxes), USED: String(q.usage.sandboxes) },
            { WHAT: 'cpu', LIMIT: lim(q.quota.maxCpu), USED: String(q.usage.cpu) },
            { WHAT: 'memory MB', LIMIT: lim(q.quota.maxMemoryMb), USED: String(q.usage.memoryMb) },
          ],
          ['WHAT', 'LIMIT', 'USED'],
        ),
      );
    }
    return 0;
  } finally {
    await c.close();
  }
}

function usage(io: Io, code = 0): number {
  (code === 0 ? io.out : io.err)(LIFECYCLE_USAGE);
  return code;
}
