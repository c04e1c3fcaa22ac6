/**
 * `warren fn ...`: FnCall pools from the command line.
 *
 *   warren fn pools [--json]                       live stats: warm, busy, queued, p50/p99
 *   warren fn languages [--json]
  warren fn create NAME [--image I] [--layer TOOLKIT]... [--min N] [--max N] [--queue N] [--memory MB] [--cpu N] [--pids N] [--wait]
 *   warren fn rm NAME
 *   warren fn invoke POOL (--language L (--file SRC | --code CODE) | -- CMD [ARG...])
 *                    [--stdin-file F] [--timeout MS] [--cpu-ms MS] [--memory MB] [--put PATH=LOCALFILE]... [--json]
 *   warren fn judge POOL --language L (--file SRC | --code CODE) --tests TESTS.json
 *                    [--checker exact|tokens|float(EPS)] [--stop] [--timeout MS] [--json]
 *
 * `invoke` prints the program's stdout and stderr and exits with its exit code
 * (124 on timeout); `judge` prints a verdict table and exits 0 only on AC.
 */
import { readFileSync } from 'node:fs';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { WarrenClient } from '../sdk';
import type { InvokeOptions, JudgeOptions, PoolOptions } from '../sdk/functions';
import { UsageError, connection } from './main';
import { formatTable } from './output';

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  env: NodeJS.ProcessEnv;
}

const COMMON = { url: { type: 'string' }, token: { type: 'string' }, 'data-dir': { type: 'string' }, help: { type: 'boolean', short: 'h' }, json: { type: 'boolean' } } as const satisfies ParseArgsConfig['options'];

export const FN_USAGE = `usage:
  warren fn pools [--json]
  warren fn languages [--json]
  warren fn create NAME [--image I] [--layer TOOLKIT]... [--min N] [--max N] [--queue N] [--memory MB] [--cpu N] [--pids N] [--wait]
  warren fn rm NAME
  warren fn invoke POOL (--language L (--file SRC | --code CODE) | -- CMD [ARG...])
                   [--stdin-file F] [--timeout MS] [--cpu-ms MS] [--memory MB] [--put PATH=LOCALFILE]... [--json]
  warren fn judge POOL --language L (--file SRC | --code CODE) --tests TESTS.json
                   [--checker exact|tokens|float(EPS)] [--stop] [--timeout MS] [--json]
`;

function parse<O extends NonNullable<ParseArgsConfig['options']>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options: { ...COMMON, ...options }, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

function int(v: unknown, name: string): number | undefined {
  if (v === undefined) return undefined;
  const n = Number(v);
  if (typeof v !== 'string' || v.trim() === '' || !Number.isFinite(n)) throw new UsageError(`--${name} must be a number (got ${JSON.stringify(v)})`);
  return n;
}

function client(values: Record<string, unknown>, io: Io): WarrenClient {
  const c = connection(values as Record<string, string | boolean | string[] | undefined>, io.env);
  return new WarrenClient({ url: c.url, token: c.token, connections: 4 });
}

function source(values: { file?: string; code?: string }): string {
  if ((values.file === undefined) === (values.code === undefined)) throw new UsageError('give --file SRC or --code CODE');
  return values.code ?? readFileSync(values.file!, 'utf8');
}

function ms(x: number | null): string {
  return x === null ? '-' : x.toFixed(1);
}

export async function cmdFn(argv: string[], io: Io): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === 'help' || sub === '--help' || sub === '-h') {
    (sub === undefined ? io.err : io.out)(FN_USAGE);
    return sub === undefined ? 2 : 0;
  }
  switch (sub) {
    case 'pools':
    case 'ls': {
      const { values } = parse(rest, {});
      const c = client(values, io);
      try {
        const pools = await c.functions.list();
        if (values.json) {
          io.out(`${JSON.stringify(pools, null, 2)}\n`);
          return 0;
        }
        const rows = pools.map((p) => ({
          POOL: p.name,
          IMAGE: p.image,
          STATE: p.state,
          'MIN/MAX': `${p.min}/${p.max}`,
          WARM: String(p.warm),
          BUSY: String(p.busy),
          STARTING: String(p.starting),
          QUEUED: String(p.queued),
          INVOCATIONS: String(p.invocations),
          'P50 MS': ms(p.p50Ms),
          'P99 MS': ms(p.p99Ms),
        }));
        io.out(formatTable(rows, ['POOL', 'IMAGE', 'STATE', 'MIN/MAX', 'WARM', 'BUSY', 'STARTING', 'QUEUED', 'INVOCATIONS', 'P50 MS', 'P99 MS']));
        return 0;
      } finally {
        await c.close();
      }
    }
    case 'languages': {
      const { values } = parse(rest, {});
      const c = client(values, io);
      try {
        const info = await c.functions.languages();
        if (values.json) {
          io.out(`${JSON.stringify(info, null, 2)}\n`);
          return 0;
        }
        const rows = info.available.map((l) => ({
          LANGUAGE: l.name,
          ALIASES: l.aliases.join(',') || '-',
          TOOLKIT: l.toolkit ?? '(judge image)',
          KIND: l.testRunner ? 'tests' : l.compiled ? 'compiled' : 'interpreted',
          POOLS: l.pools.join(',') || '-',
        }));
        io.out(formatTable(rows, ['LANGUAGE', 'ALIASES', 'TOOLKIT', 'KIND', 'POOLS']));
        io.out(`\nunavailable:\n${info.unavailable.map((u) => `  ${u.name}: ${u.reason}`).join('\n')}\n`);
        return 0;
      } finally {
        await c.close();
      }
    }
    case 'create': {
      const { values, positionals } = parse(rest, {
        layer: { type: 'string', multiple: true },
        image: { type: 'string' },
        min: { type: 'string' },
        max: { type: 'string' },
        queue: { type: 'string' },
        memory: { type: 'string' },
        cpu: { type: 'string' },
        pids: { type: 'string' },
        wait: { type: 'boolean' },
      });
      const [name] = positionals;
      if (name === undefined || positionals.length > 1) throw new UsageError('usage: warren fn create NAME [options]');
      const spec: PoolOptions = { name };
      if (values.image) spec.image = values.image;
      if (values.layer && values.layer.length > 0) spec.layers = values.layer;
      const min = int(values.min, 'min');
      if (min !== undefined) spec.min = min;
      const max = int(values.max, 'max');
      if (max !== undefined) spec.max = max;
      const queue = int(values.queue, 'queue');
      if (queue !== undefined) spec.maxQueue = queue;
      const limits: NonNullable<PoolOptions['limits']> = {};
      const mem = int(values.memory, 'memory');
      if (mem !== undefined) limits.memoryMb = mem;
      const cpu = int(values.cpu, 'cpu');
      if (cpu !== undefined) limits.cpu = cpu;
      const pids = int(values.pids, 'pids');
      if (pids !== undefined) limits.pids = pids;
      if (Object.keys(limits).length > 0) spec.limits = limits;
      const c = client(values, io);
      try {
        const p = await c.functions.create(spec, { wait: values.wait === true });
        io.out(values.json ? `${JSON.stringify(p, null, 2)}\n` : `${p.name} ${p.state} warm=${p.warm}\n`);
        return 0;
      } finally {
        await c.close();
      }
    }
    case 'rm': {
      const { values, positionals } = parse(rest, {});
      if (positionals.length === 0) throw new UsageError('usage: warren fn rm NAME...');
      const c = client(values, io);
      try {
        for (const p of positionals) {
          await c.functions.delete(p);
          io.out(`${p}\n`);
        }
        return 0;
      } finally {
        await c.close();
      }
    }
    case 'invoke': {
      const dash = rest.indexOf('--');
      const before = dash === -1 ? rest : rest.slice(0, dash);
      const cmd = dash === -1 ? [] : rest.slice(dash + 1);
      const { values, positionals } = parse(before, {
        language: { type: 'string' },
        file: { type: 'string' },
        code: { type: 'string' },
        'stdin-file': { type: 'string' },
        timeout: { type: 'string' },
        'cpu-ms': { type: 'string' },
        memory: { type: 'string' },
        put: { type: 'string', multiple: true },
      });
      const [pool] = positionals;
      if (pool === undefined || positionals.length > 1) throw new UsageError('usage: warren fn invoke POOL (--language L --file SRC | -- CMD...)');
      const req: InvokeOptions = {};
      if (cmd.length > 0) {
        if (values.language || values.file || values.code) throw new UsageError('give either -- CMD or --language with --file/--code');
        req.cmd = cmd;
      } else {
        if (!values.language) throw new UsageError('--language is required without -- CMD');
        req.language = values.language;
        req.code = source(values);
      }
      if (values['stdin-file']) req.stdin = readFileSync(values['stdin-file'], 'utf8');
      const t = int(values.timeout, 'timeout');
      if (t !== undefined) req.timeoutMs = t;
      const cpu = int(values['cpu-ms'], 'cpu-ms');
      if (cpu !== undefined) req.cpuMs = cpu;
      const mem = int(values.memory, 'memory');
      if (mem !== undefined) req.memoryMb = mem;
      if (values.put) {
        req.files = {};
        for (const item of values.put) {
          const eq = item.indexOf('=');
          if (eq <= 0) throw new UsageError(`--put expects PATH=LOCALFILE (got ${JSON.stringify(item)})`);
          req.files[item.slice(0, eq)] = { base64: readFileSync(item.slice(eq + 1)).toString('base64') };
        }
      }
      const c = client(values, io);
      try {
        const r = await c.functions.invoke(pool, req);
        if (values.json) {
          io.out(`${JSON.stringify(r, null, 2)}\n`);
          return r.status === 'ok' ? 0 : 1;
        }
        if (r.phase === 'compile') {
          io.err(r.compile?.stderr ?? r.stderr);
          io.err(`warren: compile step: ${r.status}\n`);
          return 1;
        }
        io.out(r.stdout);
        io.err(r.stderr);
        if (r.truncated) io.err('warren: output was truncated\n');
        if (r.status !== 'ok') io.err(`warren: ${r.status}${r.limit ? ` (${r.limit})` : ''}${r.message ? `: ${r.message}` : ''}; wall ${r.wallMs} ms, cpu ${r.cpuMs} ms\n`);
        if (r.status === 'timeout') return 124;
        if (r.exitCode !== null) return r.exitCode;
        if (r.signal !== null) return 128 + r.signal;
        return 1;
      } finally {
        await c.close();
      }
    }
    case 'judge': {
      const { values, positionals } = parse(rest, {
        language: { type: 'string' },
        file: { type: 'string' },
        code: { type: 'string' },
        tests: { type: 'string' },
        checker: { type: 'string' },
        stop: { type: 'boolean' },
        timeout: { type: 'string' },
      });
      const [pool] = positionals;
      if (pool === undefined || !values.language || !values.tests) throw new UsageError('usage: warren fn judge POOL --language L --file SRC --tests TESTS.json');
      let tests: JudgeOptions['tests'];
      try {
        tests = JSON.parse(readFileSync(values.tests, 'utf8')) as JudgeOptions['tests'];
      } catch (err) {
        throw new UsageError(`--tests: ${(err as Error).message}`);
      }
      const req: JudgeOptions = { code: source(values), language: values.language, tests };
      if (values.checker) req.checker = values.checker;
      if (values.stop) req.stopOnFirstFailure = true;
      const t = int(values.timeout, 'timeout');
      if (t !== undefined) req.timeoutMs = t;
      const c = client(values, io);
      try {
        const r = await c.functions.judge(pool, req);
        if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
        else {
          if (r.verdict === 'CE' && r.compile) io.err(r.compile.stderr);
          io.out(formatTable(r.tests.map((x) => ({ TEST: String(x.index), VERDICT: x.verdict, STATUS: x.status, 'WALL MS': x.wallMs.toFixed(1), 'CPU MS': x.cpuMs.toFixed(1), 'MEM MB': (x.memPeakBytes / 1048576).toFixed(1) })), ['TEST', 'VERDICT', 'STATUS', 'WALL MS', 'CPU MS', 'MEM MB']));
          io.out(`${r.verdict} ${r.passed}/${r.total} passed\n`);
        }
        return r.verdict === 'AC' ? 0 : 1;
      } finally {
        await c.close();
      }
    }
    default:
      throw new UsageError(`unknown fn command ${JSON.stringify(sub)} (pools, create, rm, invoke, judge)`);
  }
}
