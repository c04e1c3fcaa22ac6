/**
 * The code interpreter plane (`E2b-Sandbox-Port: 49999`): `/execute` and
 * `/contexts`, as @e2b/code-interpreter calls them. Each context is one kernel
 * driver inside the sandbox (src/shim/kernels: ipykernel where the image has
 * it, the standard-library kernel elsewhere), run as `user` in its cwd;
 * executions on a context run one at a time and stream NDJSON lines back in
 * the SDK's message shapes. A client that goes away mid-execution (its
 * `timeoutMs`) interrupts the cell; the context keeps its state.
 */
import { randomBytes } from 'node:crypto';
import type { Req as Request, Res as Response, Router as Server } from './http';
import { type KernelEvent, KernelSession, SERVE_COMMAND } from '../../shim/kernels';
import { publicError } from '../http';
import { validateEnv } from '../../validation';
import { DEFAULT_USER, type Plane, ensureUser, homeOf, planeSandbox, resolvePath } from './envd';
import { E2bError, bodyPending, readBodyAnyEncoding, sendJsonBody, toE2bError } from './wire';
import { lookupTable } from '../../validation';

const MAX_CONTEXTS = 16;
const CODE_LIMIT = 4 * 1024 * 1024;

interface CodeContext {
  id: string;
  language: 'python';
  cwd: string;
  kernel: KernelSession;
}

async function startKernel(plane: Plane, sandboxId: string, cwd: string): Promise<KernelSession> {
  const started = Date.now();
  const k = await KernelSession.start(() => plane.ctx.shim.execStream(sandboxId, { cmd: SERVE_COMMAND, cwd, user: DEFAULT_USER, env: { PYTHONUNBUFFERED: '1', PYTHONIOENCODING: 'utf-8' } }));
  plane.log(`e2b: sandbox ${sandboxId}: ${k.backend} kernel in ${cwd} up in ${Date.now() - started} ms`);
  void k.proc.exited.then((e) => {
    if (!k.closed) plane.log(`e2b: sandbox ${sandboxId}: the kernel driver in ${cwd} exited (code ${e.exitCode}, signal ${e.signal}): ${k.stderrTail.slice(-600).trim()}`);
  });
  return k;
}

/** Jupyter MIME bundle keys as the SDK's Result fields (others are kept under their MIME name: `extra`). */
const MIME_FIELDS: Record<string, string> = lookupTable({
  'text/plain': 'text',
  'text/html': 'html',
  'text/markdown': 'markdown',
  'image/svg+xml': 'svg',
  'image/png': 'png',
  'image/jpeg': 'jpeg',
  'application/pdf': 'pdf',
  'text/latex': 'latex',
  'application/json': 'json',
  'application/javascript': 'javascript',
});

/** One kernel event as the SDK's NDJSON messages. */
export function e2bMessage(ev: KernelEvent): Record<string, unknown> {
  if (ev.type === 'stream') return { type: ev.name, text: ev.text };
  if (ev.type === 'error') return { type: 'error', name: ev.ename, value: ev.evalue, traceback: ev.traceback.join('\n') };
  const out: Record<string, unknown> = { type: 'result', is_main_result: ev.type === 'execute_result' };
  for (const [mime, v] of Object.entries(ev.data)) out[MIME_FIELDS[mime] ?? mime] = v;
  return out;
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
      const info = await planeSandbox(plane, req, { traffic: true });
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
      if (ctx.kernel.dead) ctx.kernel = await startKernel(plane, info.id, ctx.cwd);
      const kernel = ctx.kernel;
      const write = (m: Record<string, unknown>) => {
        if (!res.completed) res.write(`${JSON.stringify(m)}\n`);
      };
      // Headers at once: the SDK's timeoutMs is a body timeout, started when they arrive.
      res.status(200);
      res.header('content-type', 'application/x-ndjson');
      res.header('cache-control', 'no-store');
      res.flushHeaders();
      const gone = new AbortController();
      // Aborting after the end is a no-op (the kernel has moved on to another execution or none).
      res.once('close', () => gone.abort());
      try {
        const done = await kernel.execute(b.code, {
          env,
          signal: gone.signal,
          onEvent: (ev) => write(e2bMessage(ev)),
        });
        write({ type: 'number_of_executions', execution_count: done.execution_count });
      } catch {
        write({ type: 'error', name: 'KernelDied', value: 'the python kernel exited (the context restarts on the next execution)', traceback: '' });
      }
      write({ type: 'end_of_execution' });
      if (!res.completed) res.end();
    }),
  );

  app.post(
    '/contexts',
    wrap(async (req, res) => {
      const info = await planeSandbox(plane, req, { traffic: true });
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
      const info = await planeSandbox(plane, req, { traffic: true });
      sendJsonBody(res, 200, JSON.stringify([...ctxOf(info.id).values()].map((c) => ({ id: c.id, language: c.language, cwd: c.cwd }))));
    }),
  );

  app.delete(
    '/contexts/:id',
    wrap(async (req, res) => {
      const info = await planeSandbox(plane, req, { traffic: true });
      const m = ctxOf(info.id);
      const c = m.get(req.path_parameters.id ?? '');
      if (!c) throw new E2bError(404, `context ${req.path_parameters.id} not found`, 'not_found');
      m.delete(c.id);
      c.kernel.close();
      res.status(204).send();
    }),
  );

  app.post(
    '/contexts/:id/restart',
    wrap(async (req, res) => {
      const info = await planeSandbox(plane, req, { traffic: true });
      const c = ctxOf(info.id).get(req.path_parameters.id ?? '');
      if (!c) throw new E2bError(404, `context ${req.path_parameters.id} not found`, 'not_found');
      // An idle kernel restarts inside its driver; a busy one (a cell that may never end) goes with its driver.
      if (!c.kernel.dead && !c.kernel.busy) await c.kernel.restart();
      else {
        c.kernel.close();
        await c.kernel.proc.exited;
        c.kernel = await startKernel(plane, info.id, c.cwd);
      }
      res.status(204).send();
    }),
  );

  // Contexts of sandboxes that went away: their kernels died with them.
  plane.onSandboxGone.push((id) => contexts.delete(id));
}
