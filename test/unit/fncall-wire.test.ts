import test from 'ava';
import { WarrenError } from '../../src/errors';
import { check, parseChecker, verdictOf } from '../../src/shim/fncall/checkers';
import { textResult } from '../../src/shim/fncall/container';
import { toRunCodeResponse, validateRunCode } from '../../src/shim/fncall/sandboxfusion';
import { validateBatch, validateInvoke, validateJudge, validatePoolSpec, validateWorkPath } from '../../src/shim/fncall/wire';

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
  const r = validateRunCode({ code: 'print(1)', language: 'python', memory_limit_MB: -1, files: { 'a.txt': 'aGk=', 'b.txt': null }, fetch_files: ['a.txt'] });
  t.is(r.timeoutMs, 10_000);
  t.is(r.compileTimeoutMs, 10_000);
  t.is(r.memoryMb, undefined);
  t.is(r.files.length, 1);
  t.is(r.files[0]!.data.toString(), 'hi');
  t.is(code(() => validateRunCode({ code: 'x', language: 'python', run_timeout: -1 })), 'LIMIT_OUT_OF_RANGE');
  t.is(code(() => validateRunCode({ code: 'x', language: 'python', wat: 1 })), 'UNKNOWN_FIELD');
  const base = { exitCode: 0, signal: null, stdout: 'x', stderr: '', truncated: false, wallMs: 1500, cpuMs: 1, memPeakBytes: 1, pool: 'p', queueMs: 0 };
  const ok = toRunCodeResponse({ ...base, status: 'ok', phase: 'run' });
  t.deepEqual(ok, { status: 'Success', message: '', compile_result: null, run_result: { status: 'Finished', execution_time: 1.5, return_code: 0, stdout: 'x', stderr: '' }, executor_pod_name: null, files: {} });
  const tle = toRunCodeResponse({ ...base, status: 'timeout', exitCode: null, signal: 9, phase: 'run' });
  t.is(tle.status, 'Failed');
  t.is(tle.run_result!.status, 'TimeLimitExceeded');
  t.is(tle.run_result!.return_code, -9);
  const ie = toRunCodeResponse({ ...base, status: 'internal_error', phase: 'run', message: 'boom' });
  t.is(ie.status, 'SandboxError');
});
