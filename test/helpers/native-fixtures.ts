/**
 * Fixtures for the native helper's integration tests (test/integration/native-*.test.ts):
 * a busybox root filesystem used directly as an overlay lowerdir, sandboxes made
 * straight through the addon, and exec helpers that read the raw fds it returns.
 * Everything created is destroyed in `finally`; a failing test prints its sandbox id.
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as tty from 'node:tty';
import type { ExecutionContext } from 'ava';

import { native, helperBinary } from '../../src/native';
import type { CgroupLimits, ExecProcess, ExecSpec, ExitStatus, SandboxProcess } from '../../src/native/types';
import { WarrenError } from '../../src/errors';

export { native, helperBinary };

export const isRoot = process.getuid?.() === 0;

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** `p`, or undefined after `ms` (the timer does not keep the process alive afterwards). */
export async function within<T>(p: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([p, new Promise<undefined>((r) => (timer = setTimeout(r, ms, undefined)))]);
  } finally {
    clearTimeout(timer);
  }
}

// ---------------------------------------------------------------- rootfs

let rootfsDir: string | undefined;

/** A busybox root filesystem (built once per test process, removed at exit). */
export function busyboxRootfs(): string {
  if (rootfsDir) return rootfsDir;
  const busybox = ['/bin/busybox', '/usr/bin/busybox'].find((p) => fs.existsSync(p));
  if (!busybox) throw new Error('busybox not found (apt-get install busybox-static)');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'warren-native-rootfs-'));
  for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'root', 'proc', 'sys', 'dev', 'home/user'])
    fs.mkdirSync(path.join(dir, d), { recursive: true });
  fs.mkdirSync(path.join(dir, 'tmp'), { mode: 0o1777 });
  fs.chmodSync(path.join(dir, 'tmp'), 0o1777);
  fs.copyFileSync(busybox, path.join(dir, 'bin/busybox'));
  fs.chmodSync(path.join(dir, 'bin/busybox'), 0o755);
  const applets = execFileSync(busybox, ['--list-full'], { encoding: 'utf8' }).split('\n').filter(Boolean);
  for (const applet of applets) {
    const p = path.join(dir, applet);
    if (applet === 'bin/busybox' || fs.existsSync(p)) continue;
    fs.mkdirSync(path.dirname(p), { recursive: true });
    fs.symlinkSync(path.relative(path.dirname(p), path.join(dir, 'bin/busybox')), p);
  }
  fs.writeFileSync(
    path.join(dir, 'etc/passwd'),
    'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n',
  );
  fs.writeFileSync(path.join(dir, 'etc/group'), 'root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n');
  fs.writeFileSync(path.join(dir, 'etc/hostname-in-image'), 'image\n');
  fs.chownSync(path.join(dir, 'home/user'), 1000, 1000);
  rootfsDir = dir;
  process.once('exit', () => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

// ---------------------------------------------------------------- sandboxes

let counter = 0;
export function uniqueId(prefix = 'nt'): string {
  counter++;
  return `${prefix}-${process.pid.toString(36)}-${counter.toString(36)}-${Math.random().toString(36).slice(2, 6)}`;
}

export interface SandboxOptions {
  limits?: CgroupLimits;
  schedIdle?: boolean;
  coreSched?: boolean;
  hostname?: string;
}

export interface TestSandbox extends SandboxProcess {
  id: string;
  dir: string;
  rootfsDir: string;
  hostname: string;
  /** Resolves when pid 1 has exited (reaped through watchExit). */
  exited: Promise<ExitStatus>;
  destroy(): Promise<void>;
}

/** Remove a cgroup, retrying while killed processes are still on their way out. */
export async function destroyCgroup(id: string): Promise<void> {
  if (!native.cgroupExists(id)) return;
  const deadline = Date.now() + 10_000;
  for (;;) {
    try {
      native.cgroupKill(id);
    } catch {
      /* already gone */
    }
    try {
      native.cgroupDestroy(id);
      return;
    } catch (err) {
      if (!(err instanceof WarrenError) || err.errno !== 16 || Date.now() > deadline) throw err;
    }
    await sleep(5);
  }
}

export async function createSandbox(opts: SandboxOptions = {}): Promise<TestSandbox> {
  const id = uniqueId();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), `warren-native-${id}-`));
  const upperDir = path.join(dir, 'upper');
  const workDir = path.join(dir, 'work');
  const rootfs = path.join(dir, 'rootfs');
  for (const d of [upperDir, workDir, rootfs]) fs.mkdirSync(d);
  const hostname = opts.hostname ?? id;
  let cgroup = false;
  try {
    native.cgroupCreate(id, opts.limits ?? {});
    cgroup = true;
    const proc = native.spawnSandbox({
      id,
      hostname,
      lowerDirs: [busyboxRootfs()],
      upperDir,
      workDir,
      rootfsDir: rootfs,
      initPath: helperBinary('warren-init'),
      network: 'loopback',
      schedIdle: opts.schedIdle ?? false,
      coreSched: opts.coreSched ?? false,
    });
    const exited = new Promise<ExitStatus>((resolve) => native.watchExit(proc.pidfd, resolve));
    let destroyed: Promise<void> | undefined;
    return {
      ...proc,
      id,
      dir,
      rootfsDir: rootfs,
      hostname,
      exited,
      destroy() {
        destroyed ??= (async () => {
          try {
            native.cgroupKill(id);
          } catch {
            /* group may already be gone */
          }
          await within(exited, 5000);
          await destroyCgroup(id);
          try {
            native.close(proc.pidfd);
          } catch {
            /* closed already */
          }
          fs.rmSync(dir, { recursive: true, force: true });
        })();
        return destroyed;
      },
    };
  } catch (err) {
    if (cgroup) await destroyCgroup(id).catch(() => undefined);
    fs.rmSync(dir, { recursive: true, force: true });
    throw err;
  }
}

/** Run `fn` with a fresh sandbox; always destroy it, and print its id when the test fails. */
export async function withSandbox(
  t: ExecutionContext,
  opts: SandboxOptions,
  fn: (sb: TestSandbox) => Promise<void>,
): Promise<void> {
  const sb = await createSandbox(opts);
  t.teardown(() => {
    if (!t.passed) console.error(`[native test] "${t.title}" failed; sandbox id ${sb.id}, init pid ${sb.pid}`);
  });
  try {
    await fn(sb);
  } catch (err) {
    t.log(`sandbox id ${sb.id} (init pid ${sb.pid})`);
    throw err;
  } finally {
    await sb.destroy();
  }
}

// ---------------------------------------------------------------- exec

export const PATH_ENV = 'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface RunOptions extends Partial<Omit<ExecSpec, 'initPid' | 'cgroup' | 'argv'>> {
  stdin?: string;
  timeoutMs?: number;
}

export interface RunResult extends ExitStatus {
  stdout: string;
  stderr: string;
  status?: string;
  pid: number;
}

export function execSpec(sb: { pid: number; id: string }, argv: string[], opts: RunOptions = {}): ExecSpec {
  const { stdin: _stdin, timeoutMs: _t, ...rest } = opts;
  return {
    initPid: sb.pid,
    cgroup: sb.id,
    argv,
    env: [PATH_ENV, 'HOME=/root', 'TERM=xterm'],
    cwd: '/',
    uid: 0,
    gid: 0,
    schedIdle: false,
    ...rest,
  };
}

/** Read a pipe fd to EOF (takes ownership of the fd). */
export function readFd(fd: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = new net.Socket({ fd, readable: true, writable: false });
    const chunks: Buffer[] = [];
    s.on('data', (c: Buffer) => chunks.push(c));
    s.on('error', reject);
    s.on('close', () => resolve(Buffer.concat(chunks).toString('utf8')));
  });
}

export function exitOf(pidfd: number): Promise<ExitStatus> {
  return new Promise((resolve) => native.watchExit(pidfd, resolve));
}

/** exec + collect stdout/stderr/status + wait. */
export async function run(sb: { pid: number; id: string }, argv: string[], opts: RunOptions = {}): Promise<RunResult> {
  const p: ExecProcess = native.exec(execSpec(sb, argv, opts));
  const exit = exitOf(p.pidfd);
  const stdout = readFd(p.stdout!);
  const stderr = readFd(p.stderr!);
  const status = p.status !== undefined ? readFd(p.status) : Promise.resolve(undefined);
  const stdin = new net.Socket({ fd: p.stdin!, readable: false, writable: true });
  stdin.on('error', () => undefined); // EPIPE when the child does not read
  stdin.end(opts.stdin ?? '');
  const timeout = opts.timeoutMs ?? 30_000;
  const timer = setTimeout(() => {
    try {
      native.pidfdSendSignal(p.pidfd, 9);
    } catch {
      /* gone */
    }
  }, timeout);
  try {
    const [st, out, err, stat] = await Promise.all([exit, stdout, stderr, status]);
    return { ...st, stdout: out, stderr: err, status: stat, pid: p.pid };
  } finally {
    clearTimeout(timer);
    native.close(p.pidfd);
  }
}

/** Shell helper: run `sh -c script` and return stdout (asserting exit 0 is up to the caller). */
export function sh(sb: { pid: number; id: string }, script: string, opts: RunOptions = {}): Promise<RunResult> {
  return run(sb, ['sh', '-c', script], opts);
}

/** A pty exec: collects everything the master reads until the child exits. */
export interface PtyRun {
  proc: ExecProcess;
  output(): string;
  write(s: string): void;
  waitFor(re: RegExp, timeoutMs?: number): Promise<string>;
  done: Promise<ExitStatus & { output: string }>;
}

export function runPty(sb: { pid: number; id: string }, argv: string[], cols: number, rows: number): PtyRun {
  const proc = native.exec(execSpec(sb, argv, { pty: { cols, rows } }));
  const fd = proc.ptyFd!;
  let buf = '';
  const waiters: Array<() => void> = [];
  const rs = new tty.ReadStream(fd);
  rs.on('data', (c: Buffer) => {
    buf += c.toString('utf8');
    for (const w of waiters.splice(0)) w();
  });
  // the master reads EIO once every slave fd is closed and the buffered output is drained
  const drained = new Promise<void>((resolve) => {
    rs.on('error', () => resolve());
    rs.on('end', () => resolve());
    rs.on('close', () => resolve());
  });
  const exit = exitOf(proc.pidfd);
  const done = exit.then(async (st) => {
    await within(drained, 5000);
    rs.destroy();
    native.close(proc.pidfd);
    return { ...st, output: buf };
  });
  return {
    proc,
    output: () => buf,
    write(s: string) {
      fs.writeSync(fd, s);
    },
    waitFor(re: RegExp, timeoutMs = 10_000) {
      return new Promise((resolve, reject) => {
        const deadline = setTimeout(() => reject(new Error(`timeout waiting for ${re} in ${JSON.stringify(buf)}`)), timeoutMs);
        const check = () => {
          if (re.test(buf)) {
            clearTimeout(deadline);
            resolve(buf);
          } else waiters.push(check);
        };
        check();
      });
    },
    done,
  };
}

/** The WarrenError thrown by fn (fails the test when nothing or something else is thrown). */
export function warrenErrorOf(t: ExecutionContext, fn: () => unknown): WarrenError {
  try {
    fn();
  } catch (err) {
    t.true(err instanceof WarrenError, `expected a WarrenError, got ${String(err)}`);
    return err as WarrenError;
  }
  t.fail('expected a WarrenError to be thrown');
  throw new Error('unreachable');
}

export function hostMountLines(): string[] {
  return fs.readFileSync('/proc/self/mountinfo', 'utf8').split('\n').filter(Boolean);
}

export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code !== 'ESRCH';
  }
}
