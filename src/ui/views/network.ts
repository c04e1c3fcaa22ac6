/** The live feed of egress denials, and (admins) the policy in force, its audit log, validate and apply. */
import { type Denial, ApiError, get, post } from '../api';
import { type View, errorBox, link } from '../app';
import { button, h, kv, replace, table } from '../dom';

interface PolicyInfo {
  dir: string;
  since: string;
  digests: Record<string, string>;
  profiles: string[];
  defaultProfile: string;
  allowUnconfined: boolean;
  enforcer: string;
}

interface Issue {
  file: string;
  line: number;
  message: string;
}

function issuesTable(issues: Issue[]): HTMLElement {
  return table(['file', 'line', 'problem'], issues.map((i) => [i.file, String(i.line), i.message]));
}

function auditSummary(e: Record<string, unknown>): string {
  if (Array.isArray(e.changes)) return e.changes.length === 0 ? 'no changes' : (e.changes as string[]).join('; ');
  if (Array.isArray(e.issues)) return (e.issues as Issue[]).map((i) => `${i.file}:${i.line}: ${i.message}`).join('; ');
  return '';
}

export async function renderNetwork(root: HTMLElement, view: View): Promise<void> {
  const feed = h('div', { id: 'denials' });
  const feedNote = h('p', { class: 'hint' });
  const policy = h('section', { class: 'card wide', id: 'policy' });
  const outcome = h('div', { id: 'policy-outcome' });
  replace(root, h('h2', null, 'Network & security'), h('h3', null, 'Egress denials (live)'), feedNote, feed, policy);

  view.every(2000, async () => {
    const r = await get<{ networkedSandboxes: number; denials: Denial[] }>('/v1/ui/denials');
    feedNote.textContent = `${r.networkedSandboxes} sandbox(es) with network ${view.account.role === 'admin' ? 'on this node' : 'of yours'}; newest first`;
    replace(
      feed,
      table(
        ['at', 'sandbox', 'destination', 'service', 'proto', 'hook'],
        r.denials.map((d) => [d.at, link(`/sandboxes/${d.sandbox}`, d.sandbox ?? ''), d.destination, d.service, d.proto, d.hook]),
        { empty: 'no denials', class: 'grid denials' },
      ),
    );
  });

  const loadPolicy = async () => {
    let p: PolicyInfo;
    try {
      p = await get<PolicyInfo>('/v1/policy');
    } catch (err) {
      if (err instanceof ApiError && err.code === 'FORBIDDEN') {
        replace(policy, h('h3', null, 'Policy'), h('p', null, 'The policy in force and its audit log are shown to admins. The API said: '), errorBox(err));
        return;
      }
      throw err;
    }
    const audit = await get<{ auditLog: string | null; audit: Record<string, unknown>[] }>('/v1/ui/policy');
    replace(
      policy,
      h('h3', null, 'Policy in force'),
      kv([
        ['directory', p.dir],
        ['in force since', p.since],
        ['enforcer', p.enforcer],
        ['profiles', p.profiles.join(', ')],
        ['default profile', p.defaultProfile],
        ['unconfined allowed', p.allowUnconfined ? 'yes' : 'no'],
      ]),
      h('h4', null, 'Files'),
      table(['file', 'sha256'], Object.entries(p.digests).map(([f, d]) => [f, h('code', null, d.slice(0, 16))])),
      h(
        'div',
        { class: 'toolbar' },
        button(
          'Validate the directory',
          async () => {
            const v = await post<{ valid: boolean; changes?: string[]; issues?: Issue[] }>('/v1/ui/policy/validate');
            replace(
              outcome,
              v.valid
                ? h('div', { class: 'notice' }, `valid; applying would change: ${v.changes && v.changes.length ? v.changes.join('; ') : 'nothing'}`)
                : h('div', null, h('div', { class: 'error' }, 'invalid: the policy in force would stay'), issuesTable(v.issues ?? [])),
            );
          },
          { report: (e) => replace(outcome, errorBox(e)), id: 'policy-validate' },
        ),
        button(
          'Apply',
          async () => {
            try {
              const a = await post<{ changes: string[] }>('/v1/policy/apply');
              replace(outcome, h('div', { class: 'notice' }, `applied: ${a.changes.length ? a.changes.join('; ') : 'no changes'}`));
            } catch (err) {
              const issues = err instanceof ApiError ? (err.details?.issues as Issue[] | undefined) : undefined;
              replace(outcome, errorBox(err), issues ? issuesTable(issues) : null);
            }
            await loadPolicy();
          },
          { class: 'danger', id: 'policy-apply' },
        ),
      ),
      outcome,
      h('h4', null, 'Audit log'),
      audit.auditLog ? h('p', { class: 'hint' }, audit.auditLog) : null,
      table(
        ['at', 'event', 'details'],
        audit.audit.map((e) => [String(e.at ?? ''), String(e.event ?? ''), auditSummary(e)]),
        { empty: audit.auditLog === null ? 'this node keeps no audit log' : 'empty' },
      ),
    );
  };
  await loadPolicy();
}
