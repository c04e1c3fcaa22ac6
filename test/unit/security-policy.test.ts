/**
 * The security team's policy directory: validation with file and line, rejection of
 * malformed / half-written / symlinked / contradictory files as a whole, atomic apply with the
 * last good policy kept, and the audit log.
 */
import { cpSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import test from 'ava';
import { PolicyError, loadPolicy } from '../../src/security/policy';
import { BUNDLED_POLICY_DIR, PolicyStore, nsexecConfineArgs } from '../../src/security/confinement';
import { WarrenError } from '../../src/errors';
import { tempDir } from '../helpers/tmp';

function copy(): string {
  const d = join(tempDir('warren-policy-'), 'policies');
  cpSync(BUNDLED_POLICY_DIR, d, { recursive: true });
  return d;
}

function issuesOf(fn: () => unknown): PolicyError['issues'] {
  try {
    fn();
  } catch (err) {
    if (err instanceof WarrenError && err.code === 'POLICY_INVALID') return (err as PolicyError).issues;
    throw err;
  }
  throw new Error('policy was accepted');
}

function edit(dir: string, file: string, from: string, to: string): void {
  const p = join(dir, file);
  const text = readFileSync(p, 'utf8');
  if (!text.includes(from)) throw new Error(`${from} not in ${file}`);
  writeFileSync(p, text.replace(from, to));
}

test('policy: the bundled policies/ directory is valid', (t) => {
  const p = loadPolicy(BUNDLED_POLICY_DIR);
  t.deepEqual(Object.keys(p.profiles).sort(), ['warren-builder', 'warren-default', 'warren-fncall', 'warren-strict']);
  t.false(p.enforcement.allowUnconfined);
  t.is(p.accounts.defaultProfile, 'warren-default');
  t.false(p.seccomp.default!.allow.ptrace);
  t.false(p.seccomp.default!.allow.ioUring);
  t.true(p.profiles['warren-fncall']!.landlock.scope.signals);
});

test('policy: malformed YAML is rejected with the file and line', (t) => {
  const d = copy();
  edit(d, 'seccomp.yaml', '      ptrace: false', '      ptrace: [false');
  const issues = issuesOf(() => loadPolicy(d));
  t.is(issues[0]!.file, 'seccomp.yaml');
  t.true(issues[0]!.line >= 12, `line ${issues[0]!.line}`);
});

test('policy: unknown keys and wrong types name the file, line and key', (t) => {
  const d = copy();
  edit(d, 'profiles.yaml', '      openFiles: 4096', '      openFiles: many\n      opneFiles: 1');
  const issues = issuesOf(() => loadPolicy(d));
  const text = issues.map((i) => `${i.file}:${i.line}: ${i.message}`).join('\n');
  t.regex(text, /profiles\.yaml:\d+: profiles\.warren-default\.limits\.openFiles must be an integer/);
  t.regex(text, /profiles\.yaml:\d+: unknown key profiles\.warren-default\.limits\.opneFiles/);
  const line = readFileSync(join(d, 'profiles.yaml'), 'utf8').split('\n').findIndex((l) => l.includes('opneFiles')) + 1;
  t.true(issues.some((i) => i.line === line && i.message.includes('opneFiles')));
});

test('policy: a half-written file (truncated, no final newline) is rejected', (t) => {
  const d = copy();
  const p = join(d, 'profiles.yaml');
  const text = readFileSync(p, 'utf8');
  // cut at a line boundary, so what is left is still valid YAML with complete profiles
  const cut = text.lastIndexOf('\n  warren-builder:');
  writeFileSync(p, text.slice(0, cut + 1));
  const issues = issuesOf(() => loadPolicy(d));
  t.true(issues.every((i) => i.file === 'profiles.yaml'));
  t.regex(issues[0]!.message, /document-end/);
});

test('policy: a truncated file that still parses is rejected for what is missing', (t) => {
  const d = copy();
  writeFileSync(join(d, 'accounts.yaml'), 'version: 1\n...\n');
  const issues = issuesOf(() => loadPolicy(d));
  t.regex(issues.map((i) => i.message).join(';'), /missing key defaults/);
});

test('policy: symlinked files and a symlinked directory are refused', (t) => {
  const d = copy();
  const target = join(d, '..', 'elsewhere.yaml');
  cpSync(join(d, 'services.yaml'), target);
  rmSync(join(d, 'services.yaml'));
  symlinkSync(target, join(d, 'services.yaml'));
  t.regex(issuesOf(() => loadPolicy(d))[0]!.message, /symbolic link/);
  const d2 = copy();
  const link = `${d2}-link`;
  symlinkSync(d2, link);
  t.regex(issuesOf(() => loadPolicy(link))[0]!.message, /symbolic link/);
});

test('policy: contradictions are rejected (path both read-only and writable, /proc writable, dangling references, one host in two services, 0.0.0.0/0)', (t) => {
  const d = copy();
  edit(d, 'profiles.yaml', 'writable: [/tmp, /var/tmp, /work, /root, /home, /mnt, /srv, /opt, /media, /data, /dev]', 'writable: [/tmp, /proc, /var/tmp, /work, /root, /dev]');
  edit(d, 'profiles.yaml', "writable: ['/*']", "writable: ['/*', /tmp, /etc]");
  edit(d, 'profiles.yaml', 'readOnly: [/]\n      # full access: every top-level directory (', 'readOnly: [/, /tmp]\n      # full access: every top-level directory (');
  edit(d, 'profiles.yaml', 'protected: [/proc, /sys]', 'protected: [/proc]');
  edit(d, 'profiles.yaml', 'seccomp: default                # a', 'seccomp: nonexistent                # a');
  edit(d, 'accounts.yaml', 'profile: warren-default', 'profile: warren-nope');
  edit(d, 'services.yaml', 'hosts: [registry.npmjs.org]', 'hosts: [registry.npmjs.org, pypi.org]\n    cidrs: [0.0.0.0/0]');
  const msgs = issuesOf(() => loadPolicy(d)).map((i) => `${i.file}:${i.line}: ${i.message}`).join('\n');
  t.regex(msgs, /profiles\.yaml:\d+: \/tmp is both read-only and writable/);
  t.regex(msgs, /profiles\.yaml:\d+: \/proc: \/proc and \/sys may not be writable/);
  t.regex(msgs, /profiles\.yaml:\d+: \/etc is both protected and writable/);
  t.regex(msgs, /profiles\.yaml:\d+: "\/\*" needs \/sys in landlock\.protected/);
  t.regex(msgs, /profiles\.yaml:\d+: .*no filter "nonexistent"/);
  t.regex(msgs, /accounts\.yaml:\d+: .*no profile "warren-nope"/);
  t.regex(msgs, /services\.yaml:\d+: host pypi\.org is in both/);
  t.regex(msgs, /services\.yaml:\d+: 0\.0\.0\.0\/0 is too broad/);
});

test('policy: names of Object.prototype members (constructor, toString, __proto__) never resolve to a profile, filter or service', (t) => {
  for (const name of ['constructor', 'toString', 'valueOf', '__proto__', 'hasOwnProperty']) {
    const d = copy();
    edit(d, 'accounts.yaml', 'profile: warren-default', `profile: ${name}`);
    edit(d, 'profiles.yaml', 'seccomp: default                # a', `seccomp: ${name}                # a`);
    const msgs = issuesOf(() => loadPolicy(d)).map((i) => i.message).join('\n');
    t.true(msgs.includes(`no profile "${name}"`), `${name}: ${msgs}`);
    t.true(msgs.includes(`no filter "${name}"`), `${name}: ${msgs}`);
  }
  // service names are lower-case words: `constructor` is one
  const d = copy();
  edit(d, 'accounts.yaml', '    default: {}\n', '    default: {}\n    allow: [constructor]\n');
  t.regex(issuesOf(() => loadPolicy(d)).map((i) => i.message).join('\n'), /no service "constructor"/);
});

test('policy: duplicate keys and unknown files are rejected', (t) => {
  const d = copy();
  const sp = join(d, 'seccomp.yaml');
  writeFileSync(sp, readFileSync(sp, 'utf8').replace(/\.\.\.\n$/, '  default:\n    allow: {}\n...\n'));
  writeFileSync(join(d, 'extra.yaml'), 'version: 1\n...\n');
  const msgs = issuesOf(() => loadPolicy(d)).map((i) => `${i.file}: ${i.message}`).join('\n');
  t.regex(msgs, /seccomp\.yaml: Map keys must be unique/);
  t.regex(msgs, /extra\.yaml: unknown policy file/);
});

test('policy apply: atomic hot reload, last good policy kept on error, every attempt audited', (t) => {
  const d = copy();
  const audit = join(d, '..', 'audit.log');
  const store = new PolicyStore(d, audit);
  const first = store.current;
  t.false(first.seccomp.default!.allow.ptrace);

  // a good change is applied and its diff is reported
  edit(d, 'seccomp.yaml', '      ptrace: false        # ptrace', '      ptrace: true        # ptrace');
  const r = store.apply();
  t.true(store.current.seccomp.default!.allow.ptrace);
  t.deepEqual(r.changes, ['seccomp.default.allow.ptrace: false -> true']);

  // a bad change is rejected as a whole: nothing of it is applied
  const good = store.current;
  edit(d, 'seccomp.yaml', '      ioUring: false       # io_uring', '      ioUring: true       # io_uring');
  edit(d, 'profiles.yaml', 'allowUnconfined: false', 'allowUnconfined: maybe');
  t.throws(() => store.apply(), { code: 'POLICY_INVALID', message: /profiles\.yaml:\d+: enforcement\.allowUnconfined must be true or false/ } as never);
  t.is(store.current, good);
  t.false(store.current.seccomp.default!.allow.ioUring);

  const log = readFileSync(audit, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as { event: string; changes?: string[]; issues?: unknown[] });
  t.deepEqual(log.map((e) => e.event), ['load', 'applied', 'rejected']);
  t.deepEqual(log[1]!.changes, ['seccomp.default.allow.ptrace: false -> true']);
  t.true(Array.isArray(log[2]!.issues));
});

test('confinement: nsexec arguments carry the same confinement as the addon spec', (t) => {
  const args = nsexecConfineArgs({ seccomp: { allow: 1 }, landlockAbi: 7, readOnly: ['/'], writable: ['/tmp'], scope: 3, fsizeBytes: 1024, nofile: 64 });
  t.deepEqual(args, ['--seccomp', '1', '--landlock', '7', '--ro', '/', '--rw', '/tmp', '--scope', '3', '--fsize', '1024', '--nofile', '64']);
});

test('services catalog and account network policies: valid forms are read, contradictions rejected', (t) => {
  const d = copy();
  writeFileSync(
    join(d, 'services.yaml'),
    'version: 1\nservices:\n  pypi:\n    hosts: [pypi.org, "*.pythonhosted.org"]\n  internal-db:\n    cidrs: [10.20.0.0/16]\n    ports: [5432]\n  metrics:\n    cidrs: [10.30.0.0/24]\n    ports: [8125]\n    protocol: udp\n...\n',
  );
  writeFileSync(
    join(d, 'accounts.yaml'),
    'version: 1\ndefaults:\n  profile: warren-default\n  network:\n    default: {pypi: true}\naccounts:\n  acct-locked:\n    profile: warren-default\n    network:\n      allow: [internal-db]\n      default: {internal-db: true}\n      rules:\n        - cidr: 192.168.7.0/24\n          ports: [443]\n...\n',
  );
  const p = loadPolicy(d);
  t.deepEqual(p.services.pypi, { name: 'pypi', hosts: ['pypi.org', '*.pythonhosted.org'], ports: [443], cidrs: [], protocol: 'tcp' });
  t.deepEqual(p.services['internal-db']!.hosts, [], 'a service may be CIDRs only');
  t.is(p.services.metrics!.protocol, 'udp');
  t.deepEqual(p.accounts.defaultNetwork, { default: { pypi: true }, allow: null, rules: [] });
  t.deepEqual(p.accounts.accounts['acct-locked']!.network, { default: { 'internal-db': true }, allow: ['internal-db'], rules: [{ cidr: '192.168.7.0/24', ports: [443], protocol: 'tcp' }] });

  edit(d, 'accounts.yaml', 'default: {internal-db: true}', 'default: {pypi: true, nosuch: false}');
  edit(d, 'accounts.yaml', 'cidr: 192.168.7.0/24', 'cidr: 0.0.0.0/0');
  edit(d, 'services.yaml', 'ports: [8125]', 'ports: [53]');
  edit(d, 'services.yaml', '  internal-db:\n    cidrs: [10.20.0.0/16]', '  internal-db:\n    protocol: sctp\n    cidrs: [10.20.0.0/16]');
  const msgs = issuesOf(() => loadPolicy(d)).map((i) => `${i.file}:${i.line}: ${i.message}`).join('\n');
  t.regex(msgs, /accounts\.yaml:\d+: "pypi" is enabled by default but not in allow/);
  t.regex(msgs, /accounts\.yaml:\d+: no service "nosuch"/);
  t.regex(msgs, /accounts\.yaml:\d+: "0\.0\.0\.0\/0" is not an IPv4 CIDR of \/8 or longer/);
  t.regex(msgs, /services\.yaml:\d+: DNS goes through the node resolver only/);
  t.regex(msgs, /services\.yaml:\d+: protocol must be tcp or udp/);
  writeFileSync(join(d, 'services.yaml'), 'version: 1\nservices:\n  empty: {}\n...\n');
  t.regex(issuesOf(() => loadPolicy(d)).map((i) => i.message).join('\n'), /service "empty" needs hosts or cidrs/);
});
