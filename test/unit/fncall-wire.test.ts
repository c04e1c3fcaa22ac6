import test from 'ava';
import { WarrenError } from '../../src/errors';
import { check, parseChecker, verdictOf } from '../../src/shim/fncall/checkers';
import { textResult } from '../../src/shim/fncall/container';
import { fitToPolicy, toRunCodeResponse, validateRunCode } from '../../src/shim/fncall/sandboxfusion';
import { DEFAULT_LIMITS, validateBatch, validateInvoke, validateJudge, validateLanguage, validatePoolSpec, validateSandboxPath, validateWorkPath } from '../../src/shim/fncall/wire';
import { poolLanguages, poolLayerStack } from '../../src/shim/fncall/toolkits';
import { expandArgv } from '../../src/shim/fncall/languages';
import { debianLayerCacheKey } from '../../src/shim/layers/debian';

const host = { cpus: 2, memoryMb: 24000 };

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return err instanceof WarrenError ? err.code : `not a WarrenError: ${err}`;
  }
  return 'no error';
}

test('work paths: relative or under /work; no .., no absolute elsewhere', (t) => {
  t.is(validateWorkPath('a/b.txt', 'f'), 'a/b.txt');
  t.is(validateWorkPath('/work/a//./b', 'f'), 'a/b');
  t.is(code(() => validateWorkPath('../x', 'f')), 'PATH_ESCAPE');
  t.is(code(() => validateWorkPath('a/../../x', 'f')), 'PATH_ESCAPE');
  t.is(code(() => validateWorkPath('/etc/passwd', 'f')), 'PATH_ESCAPE');
  t.is(code(() => validateWorkPath('/workx/a', 'f')), 'PATH_ESCAPE');
  t.is(code(() => validateWorkPath('/work', 'f')), 'PATH_ESCAPE');
  t.is(code(() => validateWorkPath('a\0b', 'f')), 'PATH_ESCAPE');
  t.is(code(() => validateWorkPath('', 'f')), 'INVALID_ARGUMENT');
});

test('invoke: cmd xor code+language, limits in range, unknown fields', (t) => {
  const r = validateInvoke({ code: 'print(1)', language: 'python', files: { 'x.txt': 'hi' }, stdin: 'in', timeoutMs: 1000 });
  t.is(r.language, 'python3');
  t.is(r.files[0]!.path, 'x.txt');
  t.is(r.stdin.toString(), 'in');
  t.deepEqual(validateInvoke({ cmd: 'echo hi' }).cmd, ['/bin/sh', '-c', 'echo hi']);
  t.is(code(() => validateInvoke({})), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ code: 'x' })), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ language: 'c' })), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ code: 'x', language: 'fortran' })), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ cmd: ['x'], code: 'y', language: 'c' })), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ cmd: [] })), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ cmd: ['x'], timeoutMs: 0 })), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validateInvoke({ cmd: ['x'], cpuMs: 1.5 })), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validateInvoke({ cmd: ['x'], memoryMb: 1e9 })), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validateInvoke({ cmd: ['x'], maxOutputBytes: -1 })), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validateInvoke({ cmd: ['x'], timeoutMs: '5' })), 'INVALID_ARGUMENT');
  t.is(code(() => validateInvoke({ cmd: ['x'], nope: 1 })), 'UNKNOWN_FIELD');
  t.is(code(() => validateInvoke({ cmd: ['x'], files: { '../a': 'x' } })), 'PATH_ESCAPE');
  t.is(code(() => validateInvoke({ cmd: ['x'], files: [{ path: '/etc/x', content: 'x' }] })), 'PATH_ESCAPE');
  t.is(code(() => validateInvoke({ cmd: ['x'], stdin: 'a', stdinBase64: 'YQ==' })), 'INVALID_ARGUMENT');
  t.deepEqual(validateInvoke({ cmd: ['x'], stdinBase64: '/w==' }).stdin, Buffer.from([255]));
});

test('judge and batch validation', (t) => {
  const j = validateJudge({ code: 'x', language: 'c++', tests: [{ stdin: '1', expected: '2' }], checker: 'float(1e-3)', stopOnFirstFailure: true });
  t.is(j.language, 'cpp');
  t.deepEqual(j.checker, { kind: 'float', eps: 1e-3 });
  t.is(code(() => validateJudge({ code: 'x', language: 'c', tests: [] })), 'INVALID_ARGUMENT');
  t.is(code(() => validateJudge({ code: 'x', language: 'c', tests: [{ expected: '1' }], checker: 'regex' })), 'INVALID_ARGUMENT');
  t.is(code(() => validateJudge({ code: 'x', language: 'c', tests: [{ expected: '1' }], checker: 'float(-1)' })), 'LIMIT_OUT_OF_RANGE');
  t.is(validateBatch({ invocations: [{ cmd: ['a'] }, { cmd: ['b'] }], concurrency: 2 }).invocations.length, 2);
  t.is(code(() => validateBatch({ invocations: [{ cmd: ['a'] }, { bad: 1 }] })), 'UNKNOWN_FIELD');
});

test('pool specs', (t) => {
  const p = validatePoolSpec({ name: 'py', min: 2, max: 8, limits: { memoryMb: 256 } }, host);
  t.is(p.image, 'judge');
  t.is(p.limits.memoryMb, 256);
  t.is(p.limits.pids, 128);
  t.is(code(() => validatePoolSpec({ name: 'Bad' }, host)), 'INVALID_ID');
  t.is(code(() => validatePoolSpec({ name: 'a', min: 5, max: 2 }, host)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validatePoolSpec({ name: 'a', max: 0 }, host)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validatePoolSpec({ name: 'a', limits: { memoryMb: 10 ** 6 } }, host)), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validatePoolSpec({ name: 'a', limits: { bogus: 1 } }, host)), 'UNKNOWN_FIELD');
});

test('checkers', (t) => {
  t.true(check(parseChecker('exact'), 'a\nb\n', 'a\nb'));
  t.true(check(parseChecker('exact'), 'a\r\nb\r\n', 'a\nb\n'));
  t.false(check(parseChecker('exact'), 'a  b', 'a b'));
  t.true(check(parseChecker('tokens'), ' a\n\tb  ', 'a b'));
  t.false(check(parseChecker('tokens'), 'a b c', 'a b'));
  const fl = parseChecker('float(1e-6)');
  t.true(check(fl, '0.3333333 x', '0.33333333 x'));
  t.false(check(fl, '0.3334', '0.3333'));
  t.true(check(fl, '1000000.5', '1000000.0')); // relative
  t.false(check(fl, 'nan', '1'));
  t.true(check(parseChecker({ kind: 'float', eps: 0.1 }), '1.05', '1'));
  t.is(verdictOf('timeout'), 'TLE');
  t.is(verdictOf('memory_limit'), 'MLE');
  t.is(verdictOf('signal'), 'RE');
});

test('non-UTF-8 output keeps the exact bytes; a truncated multi-byte tail does not count', (t) => {
  t.deepEqual(textResult(Buffer.from('hé'), false), { text: 'hé' });
  t.is(textResult(Buffer.from([0xff]), false).base64, '/w==');
  t.is(textResult(Buffer.from('hé').subarray(0, 2), true).base64, undefined);
});

test('SandboxFusion request defaults and response mapping', (t) => {
  const r = validateRunCode({ code: 'print(1)', language: 'python', memory_limit_MB: -1, files: { 'a.txt': 'aGk=', 'b.txt': null }, fetch_files: ['a.txt', '/mnt/b'] });
  t.is(r.runTimeoutS, 10);
  t.is(r.compileTimeoutS, 10);
  t.is(r.memoryLimitMb, null);
  t.deepEqual(r.fetchFiles, ['a.txt', '/mnt/b']);
  t.is(r.files.length, 1);
  t.is(r.files[0]!.data.toString(), 'hi');
  t.is(code(() => validateRunCode({ code: 'x', language: 'python', run_timeout: -1 })), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validateRunCode({ code: 'x', language: 'python', fetch_files: ['/etc/passwd'] })), 'PATH_ESCAPE');
  // SandboxFusion ignores fields it does not know, and coerces numeric strings
  t.notThrows(() => validateRunCode({ code: 'x', language: 'python', wat: 1, run_timeout: '3' }));
  const limits = { ...DEFAULT_LIMITS, memoryMb: 512, maxTimeoutMs: 60_000 };
  const verl = fitToPolicy(validateRunCode({ code: 'x', language: 'python', memory_limit_MB: 1024, run_timeout: 30 }), limits);
  t.is(verl.memoryMb, 512);
  t.is(verl.timeoutMs, 30_000);
  const unlimited = fitToPolicy(validateRunCode({ code: 'x', language: 'python', run_timeout: 0, compile_timeout: 1e6 }), limits);
  t.is(unlimited.timeoutMs, 60_000);
  t.is(unlimited.compileTimeoutMs, 60_000);
  const base = { exitCode: 0, signal: null, stdout: 'x', stderr: '', truncated: false, wallMs: 1500, cpuMs: 1, memPeakBytes: 1, pool: 'p', queueMs: 0 };
  const ok = toRunCodeResponse({ ...base, status: 'ok', phase: 'run' });
  t.deepEqual(ok, { status: 'Success', message: '', compile_result: null, run_result: { status: 'Finished', execution_time: 1.5, return_code: 0, stdout: 'x', stderr: '' }, executor_pod_name: null, files: {} });
  const tle = toRunCodeResponse({ ...base, status: 'timeout', exitCode: null, signal: 9, phase: 'run' });
  t.is(tle.status, 'Failed');
  t.is(tle.message, '');
  t.is(tle.run_result!.status, 'TimeLimitExceeded');
  t.is(tle.run_result!.return_code, null);
  const oom = toRunCodeResponse({ ...base, status: 'memory_limit', exitCode: null, signal: 9, phase: 'run' });
  t.is(oom.run_result!.status, 'Finished');
  t.is(oom.run_result!.return_code, -9);
  const ie = toRunCodeResponse({ ...base, status: 'internal_error', phase: 'run', message: 'boom' });
  t.is(ie.status, 'SandboxError');
  t.is(ie.message, 'boom');
});

test('request paths: relative and /work paths are the work dir, scratch directories are absolute, the rest is refused', (t) => {
  t.is(validateSandboxPath('a/./b.txt', 'f'), 'a/b.txt');
  t.is(validateSandboxPath('/work/a', 'f'), 'a');
  t.is(validateSandboxPath('/mnt//x/y', 'f'), '/mnt/x/y');
  t.is(validateSandboxPath('/tmp/z', 'f'), '/tmp/z');
  for (const bad of ['/etc/passwd', '/mnt', '/work', '/tmp/../etc/x', 'a/../../b', '/proc/1/root/x']) t.is(code(() => validateSandboxPath(bad, 'f')), 'PATH_ESCAPE', bad);
});

test('languages: SandboxFusion names and aliases; unavailable ones name the reason; unknown ones list the available', (t) => {
  for (const [name, want] of [['python', 'python3'], ['js', 'nodejs'], ['ts', 'typescript'], ['R', 'R'], ['kotlin_script', 'kotlin_script'], ['D_ut', 'D_ut'], ['go_test', 'go_test']]) t.is(validateLanguage(name), want);
  const e = t.throws(() => validateLanguage('julia')) as WarrenError;
  t.regex(e.message, /not available on this node: Julia is not packaged by Debian 12.*available: python3/);
  const u = t.throws(() => validateLanguage('cobol')) as WarrenError;
  t.regex(u.message, /unknown language "cobol" \(available: python3, pytest, bash/);
  t.is(u.details?.code, 'UNKNOWN_LANGUAGE');
});

test('toolkits: a pool stacks what it names, what that is built on, and the python toolkit; languages follow', (t) => {
  t.deepEqual(poolLayerStack({ image: 'judge', layers: ['kotlin'] }), ['kotlin', 'java', 'python']);
  t.deepEqual(poolLayerStack({ image: 'judge', layers: ['scala', 'java', 'mine'] }), ['mine', 'scala', 'java', 'python']);
  t.deepEqual(poolLayerStack({ image: 'other', layers: ['mine'] }), ['mine']);
  const langs = poolLanguages({ image: 'judge', layers: ['scala'] });
  for (const l of ['python3', 'pytest', 'cpp', 'java', 'junit', 'scala']) t.true(langs.includes(l), l);
  t.false(langs.includes('go'));
  t.false(poolLanguages({ image: 'other', layers: [] }).includes('pytest'));
  t.not(debianLayerCacheKey({ packages: ['golang-go'], below: ['sha256:a'] }), debianLayerCacheKey({ packages: ['golang-go'], below: ['sha256:b'] }));
  t.is(debianLayerCacheKey({ packages: ['b', 'a'], below: ['sha256:a'] }), debianLayerCacheKey({ packages: ['a', 'b', 'a'], below: ['sha256:a'] }));
  t.deepEqual(expandArgv(['java', '-XX:MaxRAM={memoryMb}m', '{class}', '{nope}'], { memoryMb: '256', class: 'Main' }), ['java', '-XX:MaxRAM=256m', 'Main', '{nope}']);
});

test('names of Object.prototype members are no language and no toolkit', (t) => {
  for (const name of ['constructor', 'toString', '__proto__', 'hasOwnProperty']) {
    t.throws(() => validateLanguage(name), { instanceOf: WarrenError, code: 'INVALID_ARGUMENT' } as never, name);
    t.deepEqual(poolLayerStack({ image: 'judge', layers: [name] }), [name, 'python'], `${name} is a layer of the caller's, looked up as such`);
  }
});
