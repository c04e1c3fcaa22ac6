/**
 * Computer-use commands (vm backend, docs/vm.md):
 *
 *   warren screenshot ID OUT.png [--width W]      the current screen as PNG
 *   warren input ID ACTIONS_JSON                  send input actions ('[{"type":"type","text":"ls\n"}]')
 *   warren vnc ID [--listen HOST:PORT]            the live view for any VNC viewer: a local TCP port
 *                                                 bridged to the gateway's VNC-over-WebSocket
 */
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import WebSocket from 'ws';
import { WarrenClient } from '../sdk';
import { UsageError, connection } from './main';

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  env: NodeJS.ProcessEnv;
}

const COMMON = { url: { type: 'string' }, token: { type: 'string' }, 'data-dir': { type: 'string' }, help: { type: 'boolean', short: 'h' } } as const satisfies ParseArgsConfig['options'];

export const SCREEN_USAGE = `computer use (vm backend):
  warren screenshot ID OUT.png [--width W]     the screen as PNG (scaled down to W pixels wide)
  warren input ID JSON                         input actions, e.g. '[{"type":"click","x":10,"y":20},{"type":"type","text":"ls\\n"}]'
  warren vnc ID [--listen HOST:PORT]           the live view on a local port for any VNC viewer (default 127.0.0.1:5900)
`;

function parse<O extends NonNullable<ParseArgsConfig['options']>>(args: string[], options: O) {
  try {
    return parseArgs({ args, options: { ...COMMON, ...options }, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
}

function client(values: Record<string, unknown>, io: Io): { client: WarrenClient; token: string | undefined } {
  const c = connection(values as Record<string, string | boolean | string[] | undefined>, io.env);
  return { client: new WarrenClient({ url: c.url, token: c.token, connections: 2 }), token: c.token };
}

export async function cmdScreenshot(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { width: { type: 'string' } });
  if (values.help || positionals.length !== 2) throw new UsageError('usage: warren screenshot ID OUT.png [--width W]');
  const width = values.width === undefined ? undefined : Number(values.width);
  if (width !== undefined && !Number.isInteger(width)) throw new UsageError('--width expects an integer');
  const { client: c } = client(values, io);
  try {
    const png = await c.sandbox(positionals[0]!).screenshot(width === undefined ? {} : { width });
    writeFileSync(positionals[1]!, png);
    io.out(`${positionals[1]} (${png.length} bytes, ${png.readUInt32BE(16)}x${png.readUInt32BE(20)})\n`);
    return 0;
  } finally {
    await c.close();
  }
}

export async function cmdInput(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, {});
  if (values.help || positionals.length !== 2) throw new UsageError('usage: warren input ID JSON');
  let actions: unknown;
  try {
    actions = JSON.parse(positionals[1]!);
  } catch (err) {
    throw new UsageError(`input actions are JSON: ${(err as Error).message}`);
  }
  const { client: c } = client(values, io);
  try {
    const r = await c.sandbox(positionals[0]!).input(actions as never);
    io.out(`${r.actions} actions, ${r.events} events\n`);
    return 0;
  } finally {
    await c.close();
  }
}

/** Bridge one local TCP connection to the gateway's VNC WebSocket. */
function bridge(sock: net.Socket, url: string, token: string | undefined, io: Io): void {
  const ws = new WebSocket(url, ['binary'], { headers: token ? { authorization: `Bearer ${token}` } : {} });
  ws.binaryType = 'nodebuffer';
  const pending: Buffer[] = [];
  ws.on('open', () => {
    for (const b of pending.splice(0)) ws.send(b);
  });
  ws.on('message', (d: Buffer) => {
    if (!sock.write(d)) ws.pause();
  });
  sock.on('drain', () => ws.resume());
  sock.on('data', (d) => (ws.readyState === WebSocket.OPEN ? ws.send(d) : pending.push(d)));
  ws.on('unexpected-response', (_req, res) => {
    let body = '';
    res.on('data', (c: Buffer) => (body += c.toString()));
    res.on('end', () => {
      io.err(`warren vnc: ${res.statusCode} ${body.slice(0, 300)}\n`);
      sock.destroy();
    });
  });
  ws.on('close', () => sock.destroy());
  ws.on('error', (err) => {
    io.err(`warren vnc: ${err.message}\n`);
    sock.destroy();
  });
  sock.on('close', () => ws.close());
  sock.on('error', () => ws.close());
}

export async function cmdVnc(args: string[], io: Io): Promise<number> {
  const { values, positionals } = parse(args, { listen: { type: 'string' } });
  if (values.help || positionals.length !== 1) throw new UsageError('usage: warren vnc ID [--listen HOST:PORT]');
  const listen = values.listen ?? '127.0.0.1:5900';
  const m = /^(.*):(\d{1,5})$/.exec(listen);
  if (m === null) throw new UsageError('--listen expects HOST:PORT');
  const { client: c, token } = client(values, io);
  const sandbox = c.sandbox(positionals[0]!);
  await sandbox.refresh(); // unknown ids fail here, not at the first viewer
  const url = sandbox.vncUrl();
  await c.close();
  const server = net.createServer((sock) => bridge(sock, url, token, io));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(Number(m[2]), m[1]!.replace(/^\[|\]$/g, ''), () => resolve());
  });
  const addr = server.address() as net.AddressInfo;
  io.out(`live view of ${positionals[0]} on vnc://${addr.address}:${addr.port} (${url}); Ctrl-C ends\n`);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  server.close();
  return 0;
}
