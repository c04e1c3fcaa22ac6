/**
 * A real `warren up` (child process, default image from the node cache, no
 * sandbox networking) for the E2B SDK tests, and the options that point the
 * unmodified SDKs at it. Every sandbox left at the end is deleted through the
 * native API before the gateway stops.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { tempDir } from '../helpers/tmp';

const CLI = resolve(__dirname, '../../src/cli/main.js');

export interface E2bWarren {
  child: ChildProcess;
  url: string;
  /** The E2B surface's base URL. */
  e2bUrl: string;
  token: string;
  dataDir: string;
  /** Connection options for `Sandbox.create(...)` of e2b and @e2b/code-interpreter. */
  opts: { apiKey: string; apiUrl: string; sandboxUrl: string; domain: string; requestTimeoutMs: number };
  /** A native REST call with the admin token. */
  api(method: string, path: string, body?: unknown, token?: string): Promise<{ status: number; body: any }>;
  stop(): Promise<void>;
}

export async function startE2bWarren(nodeId: string): Promise<E2bWarren> {
  const dataDir = tempDir('warren-e2b-');
  const child = spawn(process.execPath, [CLI, 'up', '--listen', '127.0.0.1:0', '--data-dir', dataDir, '--node-id', nodeId, '--no-network', '--e2b-port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const { url, e2bUrl } = await new Promise<{ url: string; e2bUrl: string }>((resolveUrl, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`warren up did not start: ${out}`)), 300_000);
    const onData = (c: Buffer) => {
      out += c.toString();
      const m = /listening on (http:\/\/[\d.:]+)/.exec(out);
      const e = /E2B API on (http:\/\/[\d.:]+)/.exec(out);
      if (m && e) {
        clearTimeout(timer);
        resolveUrl({ url: m[1]!, e2bUrl: e[1]! });
      }
    };
    child.stdout!.on('data', onData);
    child.stderr!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`warren up exited ${code}: ${out}`)));
  });
  const token = readFileSync(join(dataDir, 'admin.token'), 'utf8').trim();
  const api = async (method: string, path: string, body?: unknown, tok = token) => {
    const res = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${tok}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
      ...(body !== undefined ? { body: JSON.stringify(body) } : {}),
    });
    const text = await res.text();
    let parsed: unknown = text;
    try {
      parsed = text === '' ? undefined : JSON.parse(text);
    } catch {
      /* not JSON */
    }
    return { status: res.status, body: parsed };
  };
  return {
    child,
    url,
    e2bUrl,
    token,
    dataDir,
    opts: { apiKey: token, apiUrl: `${e2bUrl}/e2b`, sandboxUrl: e2bUrl, domain: 'warren.test', requestTimeoutMs: 60_000 },
    api,
    async stop() {
      const list = await api('GET', '/v1/sandboxes').catch(() => ({ status: 0, body: { sandboxes: [] } }));
      for (const s of ((list.body as { sandboxes?: unknown })?.sandboxes ?? []) as { id: string }[]) await api('DELETE', `/v1/sandboxes/${s.id}`).catch(() => undefined);
      await new Promise<void>((r) => {
        if (child.exitCode !== null || child.signalCode !== null) return r();
        child.once('exit', () => r());
        child.kill('SIGTERM');
      });
    },
  };
}
