/**
 * A real `warren up` in a child process, for tests that kill -9 the gateway
 * and start it again on the same data dir.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';

const CLI = resolve(__dirname, '../../src/cli/main.js');

export interface WarrenProcess {
  child: ChildProcess;
  url: string;
}

/** Sandbox networking stays off unless the test gives its own bridge (one node per bridge and DNS address). */
/** `wrap`: a command the gateway runs under (e.g. ['prlimit', '--nofile=400:400', '--']); `env`: added to the environment. */
export function startWarrenProcess(dataDir: string, nodeId: string, extraArgs: string[] = [], log?: string[], opts: { wrap?: string[]; env?: Record<string, string> } = {}): Promise<WarrenProcess> {
  const network = extraArgs.includes('--bridge') ? [] : ['--no-network'];
  const argv = [process.execPath, CLI, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-default-image', '--node-id', nodeId, ...network, ...extraArgs];
  const cmd = [...(opts.wrap ?? []), ...argv];
  const child = spawn(cmd[0]!, cmd.slice(1), {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...opts.env },
  });
  return new Promise((resolveUrl, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`warren up did not start: ${out}`)), 30_000);
    const onData = (c: Buffer) => {
      out += c.toString();
      log?.push(c.toString());
      const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        clearTimeout(timer);
        resolveUrl({ child, url: m[1]! });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.on('exit', (code) => reject(new Error(`warren up exited ${code}: ${out}`)));
  });
}

/** SIGTERM and wait for the exit (a clean shutdown). */
export function stopGracefully(child: ChildProcess): Promise<void> {
  return new Promise((r) => {
    if (child.exitCode !== null || child.signalCode !== null) return r();
    child.once('exit', () => r());
    child.kill('SIGTERM');
  });
}

export function kill9(child: ChildProcess): Promise<void> {
  return new Promise((r) => {
    if (child.exitCode !== null || child.signalCode !== null) return r();
    child.once('exit', () => r());
    child.kill('SIGKILL');
  });
}

/**
 * The last stop of a test's node. A clean shutdown gives back the node's prepared sandboxes
 * (made ahead, in no record); a kill -9 leaves their cgroups for the next start of the same
 * node id to sweep, and a test's node id never starts again. SIGKILL if it is not down in `ms`.
 */
export async function stopNode(child: ChildProcess, ms = 30_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGTERM');
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<boolean>((r) => (timer = setTimeout(() => r(true), ms)));
  if (await Promise.race([exited.then(() => false), late])) {
    child.kill('SIGKILL');
    await exited;
  }
  clearTimeout(timer);
}
