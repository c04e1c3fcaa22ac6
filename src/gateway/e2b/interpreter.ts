/**
 * The code interpreter plane (`E2b-Sandbox-Port: 49999`): `/execute` and
 * `/contexts`, as @e2b/code-interpreter calls them. Each context is one
 * python3 kernel process inside the sandbox (kernel.ts), run as `user` in its
 * cwd; executions on a context run one at a time and stream NDJSON lines back.
 * A client that goes away mid-execution interrupts the cell (SIGINT).
 */
import { randomBytes } from 'node:crypto';
import type { Req as Request, Res as Response, Router as Server } from './http';
import type { ExecStream } from '../../shim/types';
import { publicError } from '../http';
import { validateEnv } from '../validation';
import { DEFAULT_USER, type Plane, ensureUser, homeOf, planeSandbox, resolvePath } from './envd';
import { KERNEL_SOURCE } from './kernel';
import { E2bError, bodyPending, readBodyAnyEncoding, sendJsonBody, toE2bError } from './wire';

const MAX_CONTEXTS = 16;
const CODE_LIMIT = 4 * 1024 * 1024;

interface Execution {
  onLine(line: string): void;
  onDeath(): void;
}

class Kernel {
  private buf = '';
  current: Execution | null = null;
  queue: Promise<unknown> = Promise.resolve();
  dead = false;

  constructor(readonly proc: ExecStream) {
    proc.stdout.on('data', (d: Buffer) => {
      this.buf += d.toString('utf8');
      let i: number;
      while ((i = this.buf.indexOf('\n')) !== -1) {
        const line = this.buf.slice(0, i);
        this.buf = this.buf.slice(i + 1);
        if (line !== '') this.current?.onLine(line);
      }
    });
    proc.stderr.resume();
    proc.stdin.on('error', () => undefined);
    void proc.exited.then(() => {
      this.dead = true;
      this.current?.onDeath();
    });
  }
}

interface CodeContext {
  id: string;
  language: 'python';
  cwd: string;
  kernel: Kernel;
}

async function startKernel(plane: Plane, sandboxId: string, cwd: string): Promise<Kernel> {
  const proc = await plane.ctx.shim.execStream(sandboxId, { cmd: ['python3', '-u', '-c', KERNEL_SOURCE], cwd, user: DEFAULT_USER, env: { PYTHONUNBUFFERED: '1', PYTHONIOENCODING: 'utf-8' } });
  return new Kernel(proc);
}

function language(v: unknown): 'python' {
  if (v === undefined || v === null || v === '' || v === 'python' || v === 'python3') return 'python';
  throw new E2bError(400, `language ${JSON.stringify(v)} is not supported here (python only: the kernel is python3's standard library)`, 'invalid_argument');
}

export function registerInterpreter(app: Server, plane: Plane): void {
  const contexts = new Map<string, Map<string, CodeContext>>();
  const ctxOf = (id: string) => {
    let m = contexts.get(id);
    if (!m) contexts.set(id, (m = new Map()));
    return m;
  };

  const create = async (sandboxId: string, cwd: string, id = `ctx-${randomBytes(8).toString('hex')}`): Promise<CodeContext> => {
    const m = ctxOf(sandboxId);
    if (m.size >= MAX_CONTEXTS && !m.has(id)) throw new E2bError(429, `at most ${MAX_CONTEXTS} code contexts per sandbox`, 'resource_exhausted');
    await ensureUser(plane, sandboxId);
    const c: CodeContext = { id, language: 'python', cwd, kernel: await startKernel(plane, sandboxId, cwd) };
    m.set(id, c);
    return c;
  };

  const parseBody = async (req: Request): Promise<Record<string, unknown>> => {
    const body = await readBodyAnyEncoding(req, CODE_LIMIT);
    if (body.length === 0) return {};
    try {
      const v = JSON.parse(body.toString('utf8')) as unknown;
      if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new Error('not an object');
      return v as Record<string, unknown>;
    } catch (err) {
      throw new E2bError(400, `request body must be a JSON object: ${(err as Error).message}`, 'invalid_argument');
    }
  };

  const wrap = (fn: (req: Request, res: Response) => Promise<void>) => async (req: Request, res: Response) => {
    try {
      await fn(req, res);
    } catch (err) {
      const e = toE2bError(err, (x) => publicError(x, plane.log));
      if (res.completed) return;
      // The SDK reads 404 and 502 bodies as text; plain messages read best.
      res.status(e.status).header('content-type', 'text/plain; charset=utf-8');
      if (bodyPending(req)) res.header('connection', 'close');
      res.send(e.message);
    }
  };

  app.post(
    '/execute',
    wrap(async (req, res) => {
      const info = planeSandbox(plane, req, { traffic: true });
      const b = await parseBody(req);
      if (typeof b.code !== 'string') throw new E2bError(400, 'code: must be a string', 'invalid_argument');
      let env: Record<string, string> = {};
      if (b.env_vars !== undefined && b.env_vars !== null) {
        try {
          env = validateEnv(b.env_vars, 'env_vars');
        } catch (err) {
          throw new E2bError(400, (err as Error).message, 'invalid_argument');
        }
      }
      let c: CodeContext | undefined;
      if (typeof b.context_id === 'string' && b.context_id !== '') {
        c = ctxOf(info.id).get(b.context_id);
        if (!c) throw new E2bError(404, `context ${b.context_id} not found`, 'not_found');
      } else {
        language(b.language);
        c = ctxOf(info.id).get('default-python') ?? (await create(info.id, homeOf(DEFAULT_USER), 'default-python'));
      }
      const ctx = c;
      const run = async () => {
        if (ctx.kernel.dead) ctx.kernel = await startKernel(plane, info.id, ctx.cwd);
        const kernel = ctx.kernel;
        res.status(200);
        res.header('content-type', 'application/x-ndjson');
        res.header('cache-control', 'no-store');
        res.flushHeaders();
        await new Promise<void>((resolve) => {
          let finished = false;
          const finish = () => {
            if (finished) return;
            finished = true;
            kernel.current = null;
            resolve();
          };
          kernel.current = {
            onLine: (line) => {
              if (!res.completed) res.write(`${line}\n`);
              if (line.includes('"end_of_execution"')) {
                if (!res.completed) res.end();
                finish();
              }
            },
            onDeath: () => {
              if (!res.completed) {
                res.write(`${JSON.stringify({ type: 'error', name: 'KernelDied', value: 'the python kernel exited (the context restarts on the next execution)', traceback: '' })}\n`);
                res.write(`${JSON.stringify({ type: 'end_of_execution' })}\n`);
                res.end();
              }
              finish();
            },
          };
          res.once('close', () => {
            if (!finished) kernel.proc.kill(2);
          });
          kernel.proc.stdin.write(`${JSON.stringify({ code: b.code, env })}\n`);
        });
      };
      const p = ctx.kernel.queue.then(run, run);
      ctx.kernel.queue = p.catch(() => undefined);
      await p;
    }),
  );

  app.post(
    '/contexts',
    wrap(async (req, res) => {
      const info = planeSandbox(plane, req, { traffic: true });
      const b = await parseBody(req);
      const lang = language(b.language);
      const cwd = typeof b.cwd === 'string' && b.cwd !== '' ? resolvePath(b.cwd, DEFAULT_USER, 'cwd') : homeOf(DEFAULT_USER);
      const c = await create(info.id, cwd);
      sendJsonBody(res, 200, JSON.stringify({ id: c.id, language: lang, cwd: c.cwd }));
    }),
  );

  app.get(
    '/contexts',
    wrap(async (req, res) => {
      const info = planeSandbox(plane, req, { traffic: true });
      sendJsonBody(res, 200, JSON.stringify([...ctxOf(info.id).values()].map((c) => ({ id: c.id, language: c.language, cwd: c.cwd }))));
    }),
  );

  app.delete(
    '/contexts/:id',
    wrap(async (req, res) => {
      const info = planeSandbox(plane, req, { traffic: true });
      const m = ctxOf(info.id);
      const c = m.get(req.path_parameters.id ?? '');
      if (!c) throw new E2bError(404, `context ${req.path_parameters.id} not found`, 'not_found');
      m.delete(c.id);
      c.kernel.proc.kill(9);
      res.status(204).send();
    }),
  );

  app.post(
    '/contexts/:id/restart',
    wrap(async (req, res) => {
      const info = planeSandbox(plane, req, { traffic: true });
      const c = ctxOf(info.id).get(req.path_parameters.id ?? '');
      if (!c) throw new E2bError(404, `context ${req.path_parameters.id} not found`, 'not_found');
      const old = c.kernel;
      old.proc.kill(9);
      await old.proc.exited;
      c.kernel = await startKernel(plane, info.id, c.cwd);
      res.status(204).send();
    }),
  );

  // Contexts of sandboxes that went away: their kernels died with them.
  plane.onSandboxGone.push((id) => contexts.delete(id));
}
