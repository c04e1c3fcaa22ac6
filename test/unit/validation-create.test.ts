import test from 'ava';
import { WarrenError, type ErrorCode } from '../../src/errors';
import { LIMITS, validateCreateRequest, type CreateContext } from '../../src/validation';

const ctx: CreateContext = { owner: 'acct-1', host: { cpus: 8, memoryMb: 32768 }, availableBackends: ['container'] };

function code(t: import('ava').ExecutionContext, fn: () => unknown, expected: ErrorCode, field?: string): WarrenError {
  const err = t.throws(fn) as WarrenError;
  t.true(err instanceof WarrenError, `expected a WarrenError, got ${String(err)}`);
  t.is(err.code, expected, err.message);
  if (field !== undefined) t.is(err.details?.field, field, err.message);
  return err;
}

test('defaults: empty body gives the documented defaults and the caller as owner', (t) => {
  for (const body of [undefined, {}]) {
    const spec = validateCreateRequest(body, ctx);
    t.deepEqual(spec, {
      backend: 'container',
      image: 'default',
      workspaces: [],
      toolkits: [],
      cpu: 1,
      memoryMb: 512,
      pids: 1024,
      diskMb: null,
      priority: 'normal',
      user: 'root',
      env: {},
      labels: {},
      owner: 'acct-1',
    });
  }
});

test('a full valid request passes through', (t) => {
  const spec = validateCreateRequest(
    {
      backend: 'container',
      image: 'busybox:1.36',
      workspaces: ['ws-a'],
      toolkits: ['sha256:' + 'a'.repeat(64)],
      cpu: 0.5,
      memoryMb: 256,
      pids: 64,
      diskMb: 1024,
      network: { pypi: false },
      priority: 'idle',
      user: '1000:1000',
      env: { FOO: 'bar', _X1: '' },
      labels: { 'app.kubernetes.io/name': 'x', team: 'rl' },
    },
    ctx,
  );
  t.is(spec.cpu, 0.5);
  t.is(spec.image, 'busybox:1.36');
  t.deepEqual(spec.toolkits, ['sha256:' + 'a'.repeat(64)]);
  t.is(spec.priority, 'idle');
  t.is(spec.diskMb, 1024);
  t.deepEqual(spec.env, { FOO: 'bar', _X1: '' });
});

test('owner cannot be chosen by the client', (t) => {
  code(t, () => validateCreateRequest({ owner: 'someone-else' }, ctx), 'UNKNOWN_FIELD', 'owner');
});

test('unknown fields are refused and named', (t) => {
  const err = code(t, () => validateCreateRequest({ image: 'default', memroyMb: 512 }, ctx), 'UNKNOWN_FIELD', 'memroyMb');
  t.regex(err.message, /memroyMb/);
  t.is(err.status, 400);
});

test('body must be an object', (t) => {
  for (const body of [null, [], 'x', 3, true]) code(t, () => validateCreateRequest(body, ctx), 'INVALID_ARGUMENT');
});

test('wrong types are INVALID_ARGUMENT', (t) => {
  code(t, () => validateCreateRequest({ cpu: '1' }, ctx), 'INVALID_ARGUMENT', 'cpu');
  code(t, () => validateCreateRequest({ memoryMb: '512' }, ctx), 'INVALID_ARGUMENT', 'memoryMb');
  code(t, () => validateCreateRequest({ pids: true }, ctx), 'INVALID_ARGUMENT', 'pids');
  code(t, () => validateCreateRequest({ image: 5 }, ctx), 'INVALID_ID');
  code(t, () => validateCreateRequest({ workspaces: 'ws' }, ctx), 'INVALID_ARGUMENT', 'workspaces');
  code(t, () => validateCreateRequest({ env: ['A=1'] }, ctx), 'INVALID_ARGUMENT', 'env');
  code(t, () => validateCreateRequest({ env: { A: 1 } }, ctx), 'INVALID_ARGUMENT', 'env.A');
  code(t, () => validateCreateRequest({ labels: { a: null } }, ctx), 'INVALID_ARGUMENT', 'labels.a');
  code(t, () => validateCreateRequest({ priority: 'high' }, ctx), 'INVALID_ARGUMENT', 'priority');
  code(t, () => validateCreateRequest({ backend: 'docker' }, ctx), 'INVALID_ARGUMENT', 'backend');
  code(t, () => validateCreateRequest({ network: true }, ctx), 'INVALID_ARGUMENT', 'network');
  code(t, () => validateCreateRequest({ network: { pypi: 'yes' } }, ctx), 'INVALID_ARGUMENT', 'network.pypi');
  code(t, () => validateCreateRequest({ user: 'root; rm -rf /' }, ctx), 'INVALID_ARGUMENT', 'user');
});

const absurd: Array<[string, unknown]> = [
  ['negative', -1],
  ['zero', 0],
  ['NaN', NaN],
  ['Infinity', Infinity],
  ['-Infinity', -Infinity],
  ['2^64', 2 ** 64],
  ['MAX_VALUE', Number.MAX_VALUE],
];

for (const field of ['cpu', 'memoryMb', 'pids', 'diskMb'] as const) {
  for (const [name, value] of absurd) {
    test(`${field} = ${name} is LIMIT_OUT_OF_RANGE naming the field and range`, (t) => {
      const err = code(t, () => validateCreateRequest({ [field]: value }, ctx), 'LIMIT_OUT_OF_RANGE', field);
      t.is(typeof err.details?.min, 'number');
      t.is(typeof err.details?.max, 'number');
      t.regex(err.message, new RegExp(`${field} must be .* in [0-9.]+\\.\\.[0-9]+`));
    });
  }
}

test('non-integers are refused where integers are needed, allowed for cpu', (t) => {
  code(t, () => validateCreateRequest({ memoryMb: 512.5 }, ctx), 'LIMIT_OUT_OF_RANGE', 'memoryMb');
  code(t, () => validateCreateRequest({ pids: 10.1 }, ctx), 'LIMIT_OUT_OF_RANGE', 'pids');
  code(t, () => validateCreateRequest({ diskMb: 100.5 }, ctx), 'LIMIT_OUT_OF_RANGE', 'diskMb');
  t.is(validateCreateRequest({ cpu: 1.25 }, ctx).cpu, 1.25);
});

test('range bounds are inclusive', (t) => {
  t.is(validateCreateRequest({ cpu: 0.01 }, ctx).cpu, 0.01);
  t.is(validateCreateRequest({ memoryMb: 16 }, ctx).memoryMb, 16);
  t.is(validateCreateRequest({ pids: 8 }, ctx).pids, 8);
  t.is(validateCreateRequest({ pids: LIMITS.pids.max }, ctx).pids, LIMITS.pids.max);
  code(t, () => validateCreateRequest({ cpu: 0.009 }, ctx), 'LIMIT_OUT_OF_RANGE', 'cpu');
  code(t, () => validateCreateRequest({ memoryMb: 15 }, ctx), 'LIMIT_OUT_OF_RANGE', 'memoryMb');
  code(t, () => validateCreateRequest({ pids: 7 }, ctx), 'LIMIT_OUT_OF_RANGE', 'pids');
  code(t, () => validateCreateRequest({ pids: LIMITS.pids.max + 1 }, ctx), 'LIMIT_OUT_OF_RANGE', 'pids');
});

test('limits beyond the host capacity are refused with the host bound in the range', (t) => {
  const small: CreateContext = { ...ctx, host: { cpus: 2, memoryMb: 1024 } };
  const cpu = code(t, () => validateCreateRequest({ cpu: 4 }, small), 'LIMIT_OUT_OF_RANGE', 'cpu');
  t.is(cpu.details?.max, 2);
  const mem = code(t, () => validateCreateRequest({ memoryMb: 2048 }, small), 'LIMIT_OUT_OF_RANGE', 'memoryMb');
  t.is(mem.details?.max, 1024);
  t.is(validateCreateRequest({ cpu: 2, memoryMb: 1024 }, small).memoryMb, 1024);
  // cpu is capped at 64 even on a huge host
  code(t, () => validateCreateRequest({ cpu: 65 }, { ...ctx, host: { cpus: 256, memoryMb: 1 << 20 } }), 'LIMIT_OUT_OF_RANGE', 'cpu');
});

test('backends the node does not offer are NOT_SUPPORTED (501)', (t) => {
  for (const backend of ['microvm', 'vm', 'fncall']) {
    const err = code(t, () => validateCreateRequest({ backend }, ctx), 'NOT_SUPPORTED', 'backend');
    t.is(err.status, 501);
  }
  t.is(validateCreateRequest({ backend: 'microvm' }, { ...ctx, availableBackends: ['container', 'microvm'] }).backend, 'microvm');
  code(t, () => validateCreateRequest({}, { ...ctx, availableBackends: [] }), 'NOT_SUPPORTED', 'backend');
});

test('network services are validated into spec.network; lifetime fields are validated', (t) => {
  // lifetime policies: accepted into spec.lifetime
  t.deepEqual(validateCreateRequest({ ttlSeconds: 60 }, ctx).lifetime, { ttlSeconds: 60 });
  t.deepEqual(validateCreateRequest({ idleSeconds: 60, onIdle: 'stop' }, ctx).lifetime, { idleSeconds: 60, onIdle: 'stop' });
  t.is(validateCreateRequest({}, ctx).lifetime, undefined);
  code(t, () => validateCreateRequest({ onIdle: 'pause' }, ctx), 'INVALID_ARGUMENT', 'onIdle');
  t.deepEqual(validateCreateRequest({ network: { pypi: true, npm: false } }, ctx).network, { pypi: true, npm: false });
  t.is(validateCreateRequest({}, ctx).network, undefined, 'absent: the account default decides');
  // but they are still validated first
  code(t, () => validateCreateRequest({ ttlSeconds: -5 }, ctx), 'LIMIT_OUT_OF_RANGE', 'ttlSeconds');
  code(t, () => validateCreateRequest({ onIdle: 'explode' }, ctx), 'INVALID_ARGUMENT', 'onIdle');
  code(t, () => validateCreateRequest({ network: { 'Bad Service': false } }, ctx), 'INVALID_ARGUMENT');
  // all-false: a network namespace with everything denied (services can be enabled later)
  t.deepEqual(validateCreateRequest({ network: { pypi: false, github: false } }, ctx).network, { pypi: false, github: false });
  const many = Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`s${i}`, true]));
  code(t, () => validateCreateRequest({ network: many }, ctx), 'LIMIT_OUT_OF_RANGE', 'network');
});

test('image references: .. / NUL and bad shapes are INVALID_ID', (t) => {
  for (const image of ['../etc', 'a/b', 'img\0', 'UPPER', '', '-lead', 'a..b', 'x:', ':tag', 'a'.repeat(129)]) {
    code(t, () => validateCreateRequest({ image }, ctx), 'INVALID_ID');
  }
  for (const ws of [['ok', '../x'], ['/abs']]) code(t, () => validateCreateRequest({ workspaces: ws }, ctx), 'INVALID_ID');
  for (const image of ['default', 'busybox', 'name:tag', 'py3.12-slim', 'sha256:' + 'f'.repeat(64)]) {
    t.is(validateCreateRequest({ image }, ctx).image, image);
  }
  code(t, () => validateCreateRequest({ toolkits: Array.from({ length: 17 }, (_, i) => `t${i}`) }, ctx), 'LIMIT_OUT_OF_RANGE', 'toolkits');
});

test('env: names, NUL, sizes', (t) => {
  code(t, () => validateCreateRequest({ env: { '1BAD': 'x' } }, ctx), 'INVALID_ARGUMENT', 'env.1BAD');
  code(t, () => validateCreateRequest({ env: { 'A-B': 'x' } }, ctx), 'INVALID_ARGUMENT', 'env.A-B');
  code(t, () => validateCreateRequest({ env: { 'A=B': 'x' } }, ctx), 'INVALID_ARGUMENT');
  code(t, () => validateCreateRequest({ env: { A: 'x\0y' } }, ctx), 'INVALID_ARGUMENT', 'env.A');
  code(t, () => validateCreateRequest({ env: { A: 'x'.repeat(LIMITS.envValueBytes + 1) } }, ctx), 'LIMIT_OUT_OF_RANGE', 'env.A');
  const many = Object.fromEntries(Array.from({ length: LIMITS.envEntries + 1 }, (_, i) => [`V${i}`, '1']));
  code(t, () => validateCreateRequest({ env: many }, ctx), 'LIMIT_OUT_OF_RANGE', 'env');
  const big = Object.fromEntries(Array.from({ length: 5 }, (_, i) => [`V${i}`, 'x'.repeat(LIMITS.envValueBytes)]));
  code(t, () => validateCreateRequest({ env: big }, ctx), 'LIMIT_OUT_OF_RANGE', 'env');
});

test('env and labels named __proto__ stay plain data (no prototype pollution)', (t) => {
  const body = JSON.parse('{"env":{"__proto__":"x"}}');
  const spec = validateCreateRequest(body, ctx);
  code(t, () => validateCreateRequest(JSON.parse('{"labels":{"__proto__":"y"}}'), ctx), 'INVALID_ARGUMENT', 'labels.__proto__');
  t.is(Object.getPrototypeOf(spec.env), Object.prototype);
  t.is(Object.getOwnPropertyDescriptor(spec.env, '__proto__')?.value, 'x'); // an own key, not the prototype
  t.deepEqual(Object.keys(spec.env), ['__proto__']);
  t.is(({} as Record<string, unknown>).x, undefined);
});

test('labels: keys, values, count', (t) => {
  code(t, () => validateCreateRequest({ labels: { '': 'x' } }, ctx), 'INVALID_ARGUMENT');
  code(t, () => validateCreateRequest({ labels: { 'a b': 'x' } }, ctx), 'INVALID_ARGUMENT');
  code(t, () => validateCreateRequest({ labels: { a: 'v'.repeat(LIMITS.labelValueBytes + 1) } }, ctx), 'LIMIT_OUT_OF_RANGE', 'labels.a');
  code(t, () => validateCreateRequest({ labels: { a: 'x\0' } }, ctx), 'INVALID_ARGUMENT', 'labels.a');
  const many = Object.fromEntries(Array.from({ length: LIMITS.labels + 1 }, (_, i) => [`k${i}`, 'v']));
  code(t, () => validateCreateRequest({ labels: many }, ctx), 'LIMIT_OUT_OF_RANGE', 'labels');
});

test('users', (t) => {
  for (const user of ['root', '0', '1000', '1000:1000', 'nobody', 'build_user', 'svc$']) t.is(validateCreateRequest({ user }, ctx).user, user);
  for (const user of ['', 'Root', '../x', '1000:', 'a b', 'x'.repeat(40), '12345678901']) code(t, () => validateCreateRequest({ user }, ctx), user === '' ? 'INVALID_ARGUMENT' : 'INVALID_ARGUMENT');
});
