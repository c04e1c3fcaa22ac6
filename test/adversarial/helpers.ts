/**
 * Shared pieces of the adversarial suite: the attack binary (attack.c, compiled
 * static on the host once per test process and copied into each sandbox), a fixture that
 * gives a test one or more confined sandboxes on a real node, and result helpers.
 *
 * Every test asserts the SAFE outcome of a real attack; none of them mocks the kernel.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import test, { type ExecutionContext } from 'ava';
import { activeEnforcer } from '../../src/features';
import type { ExecResult, SandboxSpec } from '../../src/shim/types';
import type { ShimNode } from '../../src/shim/node';
import { type ShimFixture, closeTestShim, openTestShim, rootSkipReason, spec, withShim } from '../helpers/warren';
import { tempDir } from '../helpers/tmp';

/** The checkout this suite runs from (dist/test/adversarial -> the repository): a directory only the host has. */
export const REPO_ROOT = join(__dirname, '../../..');

let attackBin: string | null = null;

/** Path of the static attack binary on the host (compiled once). */
export function attackBinary(): string {
  if (attackBin !== null) return attackBin;
  const src = join(__dirname, '..', '..', '..', 'test', 'adversarial', 'attack.c');
  const out = join(tempDir('warren-attack-'), 'attack');
  execFileSync('gcc', ['-static', '-O1', '-o', out, src], { stdio: 'pipe' });
  attackBin = out;
  return out;
}

let skip: string | null | undefined;
/** Why the suite cannot run here (not root, no gcc, no container backend, no enforcer), or null. */
export function adversarialSkipReason(): string | null {
  if (skip !== undefined) return skip;
  skip = rootSkipReason();
  if (skip === null) {
    try {
      execFileSync('gcc', ['--version'], { stdio: 'pipe' });
    } catch {
      skip = 'gcc is not installed (the attack program is compiled on the host)';
    }
  }
  if (skip === null && activeEnforcer().lsm === 'none') skip = 'no LSM enforcer on this node (AppArmor or Landlock)';
  return skip;
}

export interface Box {
  id: string;
  pid: number;
  /** Run a shell command in the sandbox. */
  sh(cmd: string, opts?: { timeoutMs?: number; user?: string }): Promise<ExecResult>;
  /** Run one attack of attack.c; returns its output line (or the signal that killed it). */
  attack(name: string, arg?: string): Promise<{ out: string; result: ExecResult }>;
}

export async function box(shim: ShimNode, overrides: Partial<SandboxSpec> = {}): Promise<Box> {
  const info = await shim.createSandbox(spec(overrides));
  const pid = info.pid!;
  const dest = `/proc/${pid}/root/usr/local/bin/attack`;
  if (!existsSync(`/proc/${pid}/root/usr/local/bin`)) execFileSync('mkdir', ['-p', `/proc/${pid}/root/usr/local/bin`]);
  copyFileSync(attackBinary(), dest);
  chmodSync(dest, 0o755);
  const b: Box = {
    id: info.id,
    pid,
    sh: (cmd, opts = {}) => shim.exec(info.id, { cmd, timeoutMs: opts.timeoutMs ?? 30_000, ...(opts.user ? { user: opts.user } : {}) }),
    async attack(name, arg) {
      const result = await shim.exec(info.id, { cmd: ['/usr/local/bin/attack', name, ...(arg !== undefined ? [arg] : [])], timeoutMs: 30_000 });
      return { out: result.stdout.trim(), result };
    },
  };
  return b;
}

/**
 * Register one adversarial test: a fresh node with `boxes` confined sandboxes (busybox image).
 * Skipped, with the reason in the title, where the suite cannot run.
 */
export function attackTest(
  title: string,
  fn: (t: ExecutionContext, ctx: { shim: ShimNode; boxes: Box[] }) => Promise<void>,
  opts: { boxes?: number; spec?: Partial<SandboxSpec> } = {},
): void {
  const why = adversarialSkipReason();
  if (why !== null) {
    test.skip(`${title} (skipped: ${why})`, () => undefined);
    return;
  }
  test(title, async (t) => {
    await withShim(t, async ({ shim }) => {
      const boxes: Box[] = [];
      try {
        for (let i = 0; i < (opts.boxes ?? 1); i++) boxes.push(await box(shim, opts.spec));
        await fn(t, { shim, boxes });
      } catch (err) {
        t.log(`sandboxes: ${boxes.map((b) => b.id).join(', ')}`);
        throw err;
      }
    });
  });
}

/** The attack was refused by the kernel (any errno) or killed the attacker. */
export function refused(t: ExecutionContext, r: { out: string; result: ExecResult }, errno?: string): void {
  if (r.result.signal !== null) {
    t.not(r.result.signal, null, `killed by signal ${r.result.signal}`);
    return;
  }
  t.regex(r.out, /^DENIED [A-Z0-9]+$/, `attack output: ${r.out} ${r.result.stderr}`);
  if (errno !== undefined) t.is(r.out, `DENIED ${errno}`);
}

/**
 * One node and `n` sandboxes shared by every test of a file (created in test.before,
 * destroyed in test.after.always). `it` is ava's `test`, or `test.skip` with the reason
 * where the suite cannot run here.
 */
export function sharedNode(n: number, overrides: Partial<SandboxSpec> = {}) {
  const why = adversarialSkipReason();
  const state: { fixture: ShimFixture | null; boxes: Box[] } = { fixture: null, boxes: [] };
  type Body = (t: ExecutionContext) => Promise<void>;
  const skipped = (title: string) => test.skip(`${title} (skipped: ${why})`, () => undefined);
  const it = Object.assign((title: string, fn: Body) => (why === null ? test(title, fn) : skipped(title)), {
    serial: (title: string, fn: Body) => (why === null ? test.serial(title, fn) : skipped(title)),
  });
  if (why === null) {
    test.before(async () => {
      state.fixture = await openTestShim();
      for (let i = 0; i < n; i++) state.boxes.push(await box(state.fixture.shim, overrides));
    });
    test.after.always(async (t) => {
      const f = state.fixture;
      if (f !== null) await closeTestShim(f, (l) => t.log(l));
    });
  }
  return {
    it,
    get shim(): ShimNode {
      return state.fixture!.shim;
    },
    get boxes(): Box[] {
      return state.boxes;
    },
  };
}
