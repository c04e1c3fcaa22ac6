/**
 * The AppArmor profiles in apparmor/ compile (apparmor_parser -Q -K: parse and compile only, no
 * kernel module needed), and each denies what the sandbox confinement must deny (mounts, ptrace, raw sockets, kernel interfaces).
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import test from 'ava';

const dir = join(__dirname, '..', '..', '..', 'apparmor');
const PROFILES = ['warren-default', 'warren-fncall', 'warren-builder'];

function parserPath(): string | null {
  for (const p of ['/usr/sbin/apparmor_parser', '/sbin/apparmor_parser']) {
    try {
      execFileSync(p, ['--version'], { stdio: 'pipe' });
      return p;
    } catch {
      /* next */
    }
  }
  return null;
}
const parser = parserPath();

for (const name of PROFILES) {
  const run = parser === null ? (title: string, _fn: unknown) => test.skip(`${title} (skipped: apparmor_parser is not installed; scripts/setup.sh installs apparmor)`, () => undefined) : test;
  run(`apparmor: ${name} compiles with apparmor_parser -Q -K`, (t) => {
    const out = execFileSync(parser!, ['-Q', '-K', join(dir, name)], { stdio: 'pipe' });
    t.is(out.toString(), '');
  });

  test(`apparmor: ${name} denies mount, sysrq/kcore, /sys and securityfs writes, raw network, foreign ptrace`, (t) => {
    const text = readFileSync(join(dir, name), 'utf8');
    t.regex(text, new RegExp(`^profile ${name} `, 'm'));
    for (const rule of [/^\s*deny mount,/m, /^\s*deny umount,/m, /^\s*deny pivot_root,/m, /deny @\{PROC\}\/sysrq-trigger/, /deny @\{PROC\}\/kcore/, /deny \/sys\/kernel\/security\/\*\* rwklx/, /deny network raw,/, /deny network packet,/, /deny \/sys\/\[\^f\]\*\/\*\* wklx/]) {
      t.regex(text, rule);
    }
    t.regex(text, /deny ptrace|ptrace \(trace,read,tracedby,readby\) peer=/);
  });
}

test('apparmor: a profile with a syntax error is rejected by the parser', (t) => {
  if (parser === null) {
    t.log('apparmor_parser missing');
    t.is(parser, null);
    return;
  }
  const bad = `${readFileSync(join(dir, 'warren-default'), 'utf8').replace('deny mount,', 'deny mount')}`;
  const err = t.throws(() => execFileSync(parser, ['-Q', '-K', '/dev/stdin'], { input: bad, stdio: 'pipe' }));
  t.truthy(err);
});
