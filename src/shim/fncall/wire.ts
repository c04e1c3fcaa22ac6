/**
 * Wire forms of the FnCall API and their validation. Pure functions: parsed
 * JSON in, validated values out, or a WarrenError with a stable code
 * (INVALID_ARGUMENT, UNKNOWN_FIELD, LIMIT_OUT_OF_RANGE, PATH_ESCAPE,
 * INVALID_ID). See docs/fncall.md.
 */
import { WarrenError } from '../../errors';
import { expectNumber, expectObject, expectString, rejectUnknown, validateEnv, validateImageRef } from '../../validation';
import { parseChecker } from './checkers';
import { LANGUAGE_NAMES, UNAVAILABLE, languageOf } from './languages';
import type { FnCallConfig, InputFile, InvokeRequest, JudgeRequest, Language, PoolLimits, PoolSpec } from './types';

const MIB = 1024 * 1024;

export const FN_LIMITS = {
  timeoutMs: { min: 1, max: 600_000 },
  cpuMs: { min: 1, max: 600_000 },
  memoryMb: { min: 16, max: 65536 },
  maxOutputBytes: { min: 1, max: 64 * MIB },
  files: 256,
  fileBytes: 16 * MIB,
  codeBytes: 4 * MIB,
  stdinBytes: 16 * MIB,
  tests: 1000,
  batch: 1000,
  /** Request bodies of the FnCall routes (files and stdin travel inline). */
  bodyBytes: 64 * MIB,
  poolMax: 512,
  poolQueue: 100_000,
} as const;

export const POOL_NAME_RE = /^[a-z0-9][a-z0-9-]{0,31}$/;

export const DEFAULT_LIMITS: PoolLimits = {
  cpu: 1,
  memoryMb: 512,
  pids: 128,
  fileSizeBytes: 64 * MIB,
  tmpfsBytes: 256 * MIB,
  workBytes: 256 * MIB,
  timeoutMs: 10_000,
  maxTimeoutMs: 60_000,
  maxOutputBytes: 1 * MIB,
};

export function validatePoolName(value: unknown): string {
  if (typeof value !== 'string' || !POOL_NAME_RE.test(value)) {
    throw new WarrenError('INVALID_ID', `invalid pool name ${JSON.stringify(value)?.slice(0, 64)}: must match ${POOL_NAME_RE.source}`, { field: 'name' });
  }
  return value;
}

function optInt(o: Record<string, unknown>, key: string, min: number, max: number, prefix = ''): number | undefined {
  if (o[key] === undefined) return undefined;
  return expectNumber(o[key], prefix + key, min, max, true);
}

export function validatePoolSpec(body: unknown, host: { cpus: number; memoryMb: number }): PoolSpec {
  const o = expectObject(body, 'body');
  rejectUnknown(o, ['name', 'image', 'layers', 'min', 'max', 'maxQueue', 'idleSeconds', 'limits']);
  const name = validatePoolName(o.name);
  const image = o.image === undefined ? 'judge' : validateImageRef(o.image, 'image');
  let layers: string[] = [];
  if (o.layers !== undefined) {
    if (!Array.isArray(o.layers) || o.layers.length > 16) throw new WarrenError('INVALID_ARGUMENT', 'layers must be an array of at most 16 image references', { field: 'layers' });
    layers = o.layers.map((l, i) => validateImageRef(l, `layers[${i}]`));
  }
  const min = optInt(o, 'min', 0, FN_LIMITS.poolMax) ?? 1;
  const max = optInt(o, 'max', 1, FN_LIMITS.poolMax) ?? Math.max(min, host.cpus * 2);
  if (min > max) throw new WarrenError('LIMIT_OUT_OF_RANGE', `min (${min}) must not exceed max (${max})`, { field: 'min', min: 0, max });
  const maxQueue = optInt(o, 'maxQueue', 0, FN_LIMITS.poolQueue) ?? Math.max(64, max * 16);
  const idleSeconds = optInt(o, 'idleSeconds', 1, 86_400) ?? 60;
  const limits: PoolLimits = { ...DEFAULT_LIMITS };
  if (o.limits !== undefined) {
    const l = expectObject(o.limits, 'limits');
    rejectUnknown(l, Object.keys(DEFAULT_LIMITS), 'limits');
    if (l.cpu !== undefined) limits.cpu = expectNumber(l.cpu, 'limits.cpu', 0.01, Math.max(1, host.cpus), false);
    limits.memoryMb = optInt(l, 'memoryMb', 16, Math.min(FN_LIMITS.memoryMb.max, host.memoryMb), 'limits.') ?? limits.memoryMb;
    limits.pids = optInt(l, 'pids', 8, 32768, 'limits.') ?? limits.pids;
    limits.fileSizeBytes = optInt(l, 'fileSizeBytes', 4096, 1024 * 1024 * MIB, 'limits.') ?? limits.fileSizeBytes;
    limits.tmpfsBytes = optInt(l, 'tmpfsBytes', 1 * MIB, 64 * 1024 * MIB, 'limits.') ?? limits.tmpfsBytes;
    limits.workBytes = optInt(l, 'workBytes', 1 * MIB, 64 * 1024 * MIB, 'limits.') ?? limits.workBytes;
    limits.maxTimeoutMs = optInt(l, 'maxTimeoutMs', 1, FN_LIMITS.timeoutMs.max, 'limits.') ?? limits.maxTimeoutMs;
    limits.timeoutMs = optInt(l, 'timeoutMs', 1, limits.maxTimeoutMs, 'limits.') ?? Math.min(limits.timeoutMs, limits.maxTimeoutMs);
    limits.maxOutputBytes = optInt(l, 'maxOutputBytes', 1, FN_LIMITS.maxOutputBytes.max, 'limits.') ?? limits.maxOutputBytes;
  }
  return { name, image, layers, min, max, maxQueue, idleSeconds, limits };
}

export function validateLanguage(value: unknown, field = 'language'): Language {
  if (typeof value !== 'string') throw new WarrenError('INVALID_ARGUMENT', `${field} must be a string`, { field });
  const l = languageOf(value);
  if (l === null && Object.prototype.hasOwnProperty.call(UNAVAILABLE, value)) {
    throw new WarrenError('INVALID_ARGUMENT', `language ${value} is not available on this node: ${UNAVAILABLE[value]} (available: ${LANGUAGE_NAMES.join(', ')})`, { field, code: 'UNKNOWN_LANGUAGE', available: LANGUAGE_NAMES });
  }
  if (l === null) {
    throw new WarrenError('INVALID_ARGUMENT', `unknown language ${JSON.stringify(value.slice(0, 32))} (available: ${LANGUAGE_NAMES.join(', ')})`, { field, code: 'UNKNOWN_LANGUAGE', available: LANGUAGE_NAMES });
  }
  return l;
}

/** Absolute directories an invocation can write besides /work (container.ts SCRATCH_TARGETS). */
export const SCRATCH_PATHS = ['/tmp', '/var/tmp', '/mnt', '/home', '/root', '/srv', '/opt', '/media', '/data'];

/**
 * A file path of a request: relative to the work dir ("a/b.txt"), absolute under /work
 * ("/work/a/b.txt"), or absolute under one of the scratch directories ("/mnt/data/x", "/tmp/y").
 * No "..", no NUL. Returns it normalised: relative for the work dir, absolute for the others.
 */
export function validateSandboxPath(value: unknown, field: string): string {
  if (typeof value !== 'string' || value === '') throw new WarrenError('INVALID_ARGUMENT', `${field} must be a non-empty path`, { field });
  const fail = (why: string) => new WarrenError('PATH_ESCAPE', `${field} ${JSON.stringify(value.slice(0, 64))} ${why}`, { field });
  if (value.includes('\0')) throw fail('contains NUL');
  if (Buffer.byteLength(value) > 4096) throw fail('is longer than 4096 bytes');
  const parts: string[] = [];
  for (const part of value.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') throw fail('has a ".." component');
    if (Buffer.byteLength(part) > 255) throw fail('has a component longer than 255 bytes');
    parts.push(part);
  }
  if (!value.startsWith('/')) {
    if (parts.length === 0) throw fail('names the work dir itself');
    return parts.join('/');
  }
  const abs = `/${parts.join('/')}`;
  if (abs === '/work') throw fail('names the work dir itself');
  if (abs.startsWith('/work/')) return abs.slice('/work/'.length);
  for (const d of SCRATCH_PATHS) {
    if (abs === d) throw fail('names a directory');
    if (abs.startsWith(`${d}/`)) return abs;
  }
  throw fail(`is outside the writable directories (/work, ${SCRATCH_PATHS.join(', ')})`);
}

/** Request paths: see validateSandboxPath. */
export const validateWorkPath = validateSandboxPath;

function validateFiles(value: unknown, field: string, base64Only: boolean, pathOf: (v: unknown, field: string) => string = validateSandboxPath): InputFile[] {
  if (value === undefined || value === null) return [];
  const out: InputFile[] = [];
  const add = (path: string, content: unknown, mode: unknown, f: string) => {
    let data: Buffer;
    if (typeof content === 'string') data = Buffer.from(content, base64Only ? 'base64' : 'utf8');
    else if (typeof content === 'object' && content !== null && !Array.isArray(content)) {
      const c = content as Record<string, unknown>;
      rejectUnknown(c, ['content', 'base64', 'mode'], f);
      if ((c.content === undefined) === (c.base64 === undefined)) throw new WarrenError('INVALID_ARGUMENT', `${f} needs exactly one of content or base64`, { field: f });
      data = c.base64 !== undefined ? Buffer.from(expectString(c.base64, `${f}.base64`, { allowEmpty: true }), 'base64') : Buffer.from(expectString(c.content, `${f}.content`, { allowEmpty: true, allowNul: true }), 'utf8');
      mode = c.mode;
    } else throw new WarrenError('INVALID_ARGUMENT', `${f} must be a string or {content|base64, mode?}`, { field: f });
    if (data.length > FN_LIMITS.fileBytes) throw new WarrenError('LIMIT_OUT_OF_RANGE', `${f} is larger than ${FN_LIMITS.fileBytes} bytes`, { field: f, min: 0, max: FN_LIMITS.fileBytes });
    const m = mode === undefined ? 0o644 : expectNumber(mode, `${f}.mode`, 0, 0o777, true);
    out.push({ path: pathOf(path, `${f} path`), data, mode: m });
  };
  if (Array.isArray(value)) {
    value.forEach((v, i) => {
      const o = expectObject(v, `${field}[${i}]`);
      rejectUnknown(o, ['path', 'content', 'base64', 'mode'], `${field}[${i}]`);
      add(o.path as string, { ...(o.content !== undefined ? { content: o.content } : {}), ...(o.base64 !== undefined ? { base64: o.base64 } : {}) }, o.mode, `${field}[${i}]`);
    });
  } else {
    const o = expectObject(value, field);
    for (const [k, v] of Object.entries(o)) {
      if (v === null && base64Only) continue; // SandboxFusion: null content means "no file"
      add(k, v, undefined, `${field}[${JSON.stringify(k).slice(0, 64)}]`);
    }
  }
  if (out.length > FN_LIMITS.files) throw new WarrenError('LIMIT_OUT_OF_RANGE', `at most ${FN_LIMITS.files} files`, { field, min: 0, max: FN_LIMITS.files });
  return out;
}

export { validateFiles };

const INVOKE_FIELDS = ['cmd', 'code', 'language', 'files', 'stdin', 'stdinBase64', 'env', 'timeoutMs', 'cpuMs', 'memoryMb', 'maxOutputBytes', 'compileTimeoutMs', 'fetchFiles'];

function limitFields(o: Record<string, unknown>, prefix: string): Pick<InvokeRequest, 'timeoutMs' | 'cpuMs' | 'memoryMb' | 'maxOutputBytes' | 'compileTimeoutMs'> {
  const r: Pick<InvokeRequest, 'timeoutMs' | 'cpuMs' | 'memoryMb' | 'maxOutputBytes' | 'compileTimeoutMs'> = {};
  const t = optInt(o, 'timeoutMs', FN_LIMITS.timeoutMs.min, FN_LIMITS.timeoutMs.max, prefix);
  if (t !== undefined) r.timeoutMs = t;
  const c = optInt(o, 'cpuMs', FN_LIMITS.cpuMs.min, FN_LIMITS.cpuMs.max, prefix);
  if (c !== undefined) r.cpuMs = c;
  const m = optInt(o, 'memoryMb', FN_LIMITS.memoryMb.min, FN_LIMITS.memoryMb.max, prefix);
  if (m !== undefined) r.memoryMb = m;
  const out = optInt(o, 'maxOutputBytes', FN_LIMITS.maxOutputBytes.min, FN_LIMITS.maxOutputBytes.max, prefix);
  if (out !== undefined) r.maxOutputBytes = out;
  const ct = optInt(o, 'compileTimeoutMs', FN_LIMITS.timeoutMs.min, FN_LIMITS.timeoutMs.max, prefix);
  if (ct !== undefined) r.compileTimeoutMs = ct;
  return r;
}

function stdinOf(o: Record<string, unknown>, field: string): Buffer {
  if (o.stdin !== undefined && o.stdinBase64 !== undefined) throw new WarrenError('INVALID_ARGUMENT', `give ${field} or ${field}Base64, not both`, { field });
  let b = Buffer.alloc(0);
  if (o.stdin !== undefined && o.stdin !== null) b = Buffer.from(expectString(o.stdin, field, { allowEmpty: true, allowNul: true }), 'utf8');
  if (o.stdinBase64 !== undefined) b = Buffer.from(expectString(o.stdinBase64, `${field}Base64`, { allowEmpty: true }), 'base64');
  if (b.length > FN_LIMITS.stdinBytes) throw new WarrenError('LIMIT_OUT_OF_RANGE', `${field} is larger than ${FN_LIMITS.stdinBytes} bytes`, { field, min: 0, max: FN_LIMITS.stdinBytes });
  return b;
}

export function validateInvoke(body: unknown, prefix = ''): InvokeRequest {
  const o = expectObject(body, prefix || 'body');
  rejectUnknown(o, INVOKE_FIELDS, prefix.replace(/\.$/, ''));
  const req: InvokeRequest = { files: validateFiles(o.files, `${prefix}files`, false), stdin: stdinOf(o, `${prefix}stdin`), env: {}, fetchFiles: [], ...limitFields(o, prefix) };
  if (o.env !== undefined) req.env = validateEnv(o.env, `${prefix}env`);
  const hasCmd = o.cmd !== undefined;
  const hasCode = o.code !== undefined || o.language !== undefined;
  if (hasCmd === hasCode) {
    throw new WarrenError('INVALID_ARGUMENT', `${prefix}give either cmd, or code and language`, { field: `${prefix}${hasCmd ? 'code' : 'cmd'}` });
  }
  if (hasCmd) {
    if (typeof o.cmd === 'string') req.cmd = ['/bin/sh', '-c', expectString(o.cmd, `${prefix}cmd`, { maxBytes: 256 * 1024 })];
    else if (Array.isArray(o.cmd) && o.cmd.length > 0 && o.cmd.length <= 4096) req.cmd = o.cmd.map((a, i) => expectString(a, `${prefix}cmd[${i}]`, { allowEmpty: i > 0, maxBytes: 128 * 1024 }));
    else throw new WarrenError('INVALID_ARGUMENT', `${prefix}cmd must be a string or a non-empty array of strings`, { field: `${prefix}cmd` });
  } else {
    if (o.code === undefined) throw new WarrenError('INVALID_ARGUMENT', `${prefix}code is required with language`, { field: `${prefix}code` });
    req.code = expectString(o.code, `${prefix}code`, { allowEmpty: true, allowNul: true, maxBytes: FN_LIMITS.codeBytes });
    if (o.language === undefined) throw new WarrenError('INVALID_ARGUMENT', `${prefix}language is required with code`, { field: `${prefix}language` });
    req.language = validateLanguage(o.language, `${prefix}language`);
  }
  if (o.fetchFiles !== undefined) {
    if (!Array.isArray(o.fetchFiles) || o.fetchFiles.length > FN_LIMITS.files) throw new WarrenError('INVALID_ARGUMENT', `${prefix}fetchFiles must be an array of at most ${FN_LIMITS.files} paths`, { field: `${prefix}fetchFiles` });
    req.fetchFiles = o.fetchFiles.map((p, i) => validateWorkPath(p, `${prefix}fetchFiles[${i}]`));
  }
  return req;
}

export function validateJudge(body: unknown): JudgeRequest {
  const o = expectObject(body, 'body');
  rejectUnknown(o, ['code', 'language', 'tests', 'checker', 'stopOnFirstFailure', 'timeoutMs', 'cpuMs', 'memoryMb', 'maxOutputBytes', 'compileTimeoutMs']);
  if (o.code === undefined) throw new WarrenError('INVALID_ARGUMENT', 'code is required', { field: 'code' });
  const code = expectString(o.code, 'code', { allowEmpty: true, allowNul: true, maxBytes: FN_LIMITS.codeBytes });
  if (o.language === undefined) throw new WarrenError('INVALID_ARGUMENT', 'language is required', { field: 'language' });
  const language = validateLanguage(o.language);
  if (!Array.isArray(o.tests) || o.tests.length === 0 || o.tests.length > FN_LIMITS.tests) {
    throw new WarrenError('INVALID_ARGUMENT', `tests must be an array of 1..${FN_LIMITS.tests} {stdin, expected}`, { field: 'tests' });
  }
  const tests = o.tests.map((t, i) => {
    const to = expectObject(t, `tests[${i}]`);
    rejectUnknown(to, ['stdin', 'expected'], `tests[${i}]`);
    const stdin = to.stdin === undefined ? '' : expectString(to.stdin, `tests[${i}].stdin`, { allowEmpty: true, allowNul: true, maxBytes: FN_LIMITS.stdinBytes });
    const expected = expectString(to.expected, `tests[${i}].expected`, { allowEmpty: true, allowNul: true, maxBytes: FN_LIMITS.stdinBytes });
    return { stdin: Buffer.from(stdin, 'utf8'), expected };
  });
  let stop = false;
  if (o.stopOnFirstFailure !== undefined) {
    if (typeof o.stopOnFirstFailure !== 'boolean') throw new WarrenError('INVALID_ARGUMENT', 'stopOnFirstFailure must be a boolean', { field: 'stopOnFirstFailure' });
    stop = o.stopOnFirstFailure;
  }
  return { code, language, tests, checker: parseChecker(o.checker), stopOnFirstFailure: stop, ...limitFields(o, '') };
}

export function validateBatch(body: unknown): { invocations: InvokeRequest[]; concurrency?: number } {
  const o = expectObject(body, 'body');
  rejectUnknown(o, ['invocations', 'concurrency']);
  if (!Array.isArray(o.invocations) || o.invocations.length === 0 || o.invocations.length > FN_LIMITS.batch) {
    throw new WarrenError('INVALID_ARGUMENT', `invocations must be an array of 1..${FN_LIMITS.batch} invoke requests`, { field: 'invocations' });
  }
  const invocations = o.invocations.map((x, i) => validateInvoke(x, `invocations[${i}].`));
  const out: { invocations: InvokeRequest[]; concurrency?: number } = { invocations };
  const c = optInt(o, 'concurrency', 1, FN_LIMITS.poolMax);
  if (c !== undefined) out.concurrency = c;
  return out;
}

export function validateConfig(value: unknown): FnCallConfig {
  const o = expectObject(value, 'fncall config');
  rejectUnknown(o, ['pools', 'accountConcurrency', 'runCodePool', 'runCodeAnonymous']);
  const cfg: FnCallConfig = {};
  if (o.pools !== undefined) {
    if (!Array.isArray(o.pools)) throw new WarrenError('INVALID_ARGUMENT', 'pools must be an array', { field: 'pools' });
    cfg.pools = o.pools.map((p) => expectObject(p, 'pools[]') as unknown as PoolSpec);
  }
  if (o.accountConcurrency !== undefined) cfg.accountConcurrency = expectNumber(o.accountConcurrency, 'accountConcurrency', 1, 100_000, true);
  if (o.runCodePool !== undefined) cfg.runCodePool = validatePoolName(o.runCodePool);
  if (o.runCodeAnonymous !== undefined) {
    if (typeof o.runCodeAnonymous !== 'boolean') throw new WarrenError('INVALID_ARGUMENT', 'runCodeAnonymous must be a boolean', { field: 'runCodeAnonymous' });
    cfg.runCodeAnonymous = o.runCodeAnonymous;
  }
  return cfg;
}
