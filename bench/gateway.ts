/** A real `warren up` in a child process, for benchmarks that measure through the gateway as a user would. */
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';

export interface GatewayOptions {
  /** Flags after the common ones (listen on a free loopback port, this data dir, no sandbox network). */
  args?: string[];
  env?: Record<string, string>;
  /** Copy the gateway's start-up output to this process's stderr (image builds print progress). */
  echo?: boolean;
}

/** Resolves with the gateway's URL once it says it is listening; rejects with its output if it exits first. */
export function startGateway(dataDir: string, opts: GatewayOptions = {}): Promise<{ url: string; child: ChildProcess }> {
  const cli = join(__dirname, '..', 'src', 'cli', 'main.js');
  const argv = [cli, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--no-network', ...(opts.args ?? [])];
  const child = spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...opts.env } });
  return new Promise((resolve, reject) => {
    let out = '';
    const onData = (c: Buffer) => {
      out += c.toString();
      if (opts.echo) process.stderr.write(c);
      const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
      if (m) {
        child.stdout!.off('data', onData);
        child.stderr!.off('data', onData);
        child.stdout!.resume();
        child.stderr!.resume();
        resolve({ url: m[1]!, child });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`warren up exited with ${code}: ${out.slice(-2000)}`)));
  });
}
