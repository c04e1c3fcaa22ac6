/**
 * `warren policy ...`: the security team's workflow.
 *
 *   warren policy validate [DIR]   check a policy directory locally (default: the bundled policies/);
 *                                  prints every problem as FILE:LINE: message, exit 1 when invalid
 *   warren policy apply            ask the server to re-read its policy directory and swap it in
 *                                  (atomic; the last good policy stays on error; audited)
 *   warren policy show [--json]    the policy in force on the server
 */
import { resolve } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { WarrenClient } from '../sdk';
import { WarrenError } from '../errors';
import { UsageError, connection } from './main';

interface Io {
  out: (s: string) => void;
  err: (s: string) => void;
  env: NodeJS.ProcessEnv;
}

const OPTIONS = { url: { type: 'string' }, token: { type: 'string' }, 'data-dir': { type: 'string' }, help: { type: 'boolean', short: 'h' }, json: { type: 'boolean' } } as const satisfies ParseArgsConfig['options'];

export const POLICY_USAGE = `usage: warren policy validate [DIR] | apply | show [--json]
  validate [DIR]  check every file of a policy directory (default: the bundled policies/)
  apply           make the server re-read and apply its policy directory (admin)
  show            the policy in force on the server (admin)
`;

function printIssues(err: unknown, io: Io): boolean {
  const issues = (err as WarrenError).details?.issues as Array<{ file: string; line: number; message: string }> | undefined;
  if (!(err instanceof WarrenError) || err.code !== 'POLICY_INVALID' || !Array.isArray(issues)) return false;
  for (const i of issues) io.err(`${i.file}:${i.line}: ${i.message}\n`);
  io.err(`warren: policy rejected (${issues.length} problem${issues.length === 1 ? '' : 's'}); the last good policy stays in force\n`);
  return true;
}

export async function cmdPolicy(args: string[], io: Io): Promise<number> {
  let parsed;
  try {
    parsed = parseArgs({ args, options: OPTIONS, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const { values, positionals } = parsed;
  const [sub, ...rest] = positionals;
  if (values.help || sub === undefined) {
    (sub === undefined && !values.help ? io.err : io.out)(POLICY_USAGE);
    return sub === undefined && !values.help ? 2 : 0;
  }
  if (sub === 'validate') {
    if (rest.length > 1) throw new UsageError('policy validate takes at most one directory');
    const { loadPolicy } = await import('../security/policy');
    const { BUNDLED_POLICY_DIR } = await import('../security/confinement');
    const dir = rest[0] !== undefined ? resolve(rest[0]) : BUNDLED_POLICY_DIR;
    try {
      const p = loadPolicy(dir);
      io.out(`${dir}: valid (profiles: ${Object.keys(p.profiles).join(', ')}; seccomp filters: ${Object.keys(p.seccomp).join(', ')}; services: ${Object.keys(p.services).length}; accounts: ${Object.keys(p.accounts.accounts).length})\n`);
      return 0;
    } catch (err) {
      if (printIssues(err, io)) return 1;
      throw err;
    }
  }
  if (rest.length > 0) throw new UsageError(`policy ${sub} takes no arguments`);
  const c = connection(values, io.env);
  const client = new WarrenClient({ url: c.url, token: c.token, connections: 1 });
  try {
    if (sub === 'apply') {
      try {
        const r = await client.requestJson<{ changes: string[] }>('POST', '/v1/policy/apply');
        if (values.json) io.out(`${JSON.stringify(r, null, 2)}\n`);
        else {
          io.out(r.changes.length === 0 ? 'policy applied: no changes\n' : `policy applied, ${r.changes.length} change(s):\n`);
          for (const ch of r.changes) io.out(`  ${ch}\n`);
        }
        return 0;
      } catch (err) {
        if (printIssues(err, io)) return 1;
        throw err;
      }
    }
    if (sub === 'show') {
      const r = await client.requestJson<Record<string, unknown>>('GET', '/v1/policy');
      io.out(`${JSON.stringify(r, null, 2)}\n`);
      return 0;
    }
    throw new UsageError(`unknown policy command ${JSON.stringify(sub)}`);
  } finally {
    await client.close();
  }
}
