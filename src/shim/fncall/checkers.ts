/**
 * Judge checkers: exact, tokens, float(eps). Pure functions.
 *
 * - exact: byte-for-byte, except that a missing or extra final newline and
 *   CRLF line ends are tolerated (judges' usual reading of "exact").
 * - tokens: the whitespace-separated tokens are equal.
 * - float(eps): tokens are equal, and tokens that both parse as numbers may
 *   differ by eps absolutely or relatively (|a-b| <= eps * max(1, |b|)).
 */
import { WarrenError } from '../../errors';
import type { Checker, InvokeStatus, Verdict } from './types';

export function parseChecker(value: unknown): Checker {
  if (value === undefined || value === 'exact') return { kind: 'exact' };
  if (value === 'tokens') return { kind: 'tokens' };
  if (typeof value === 'string') {
    const m = /^float(?:\(([^)]*)\))?$/.exec(value);
    if (m) return floatChecker(m[1] === undefined || m[1] === '' ? 1e-6 : Number(m[1]));
  }
  if (typeof value === 'object' && value !== null && !Array.isArray(value)) {
    const o = value as Record<string, unknown>;
    if (o.kind === 'float' || o.type === 'float') return floatChecker(typeof o.eps === 'number' ? o.eps : 1e-6);
    if (o.kind === 'exact' || o.kind === 'tokens') return { kind: o.kind };
  }
  throw new WarrenError('INVALID_ARGUMENT', `checker must be "exact", "tokens", "float(EPS)" or {"kind":"float","eps":EPS} (got ${JSON.stringify(value)?.slice(0, 64)})`, { field: 'checker' });
}

function floatChecker(eps: number): Checker {
  if (!Number.isFinite(eps) || eps < 0 || eps > 1e6) {
    throw new WarrenError('LIMIT_OUT_OF_RANGE', `checker eps must be a number in 0..1e6 (got ${eps})`, { field: 'checker', min: 0, max: 1e6 });
  }
  return { kind: 'float', eps };
}

function normalizeLines(s: string): string {
  return s.replace(/\r\n/g, '\n').replace(/\n$/, '');
}

const NUMBER_RE = /^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?$|^[+-]?(?:inf|infinity|nan)$/i;

export function check(checker: Checker, output: string, expected: string): boolean {
  switch (checker.kind) {
    case 'exact':
      return normalizeLines(output) === normalizeLines(expected);
    case 'tokens': {
      const a = output.split(/\s+/).filter(Boolean);
      const b = expected.split(/\s+/).filter(Boolean);
      return a.length === b.length && a.every((x, i) => x === b[i]);
    }
    case 'float': {
      const a = output.split(/\s+/).filter(Boolean);
      const b = expected.split(/\s+/).filter(Boolean);
      if (a.length !== b.length) return false;
      return a.every((x, i) => {
        const y = b[i]!;
        if (x === y) return true;
        if (!NUMBER_RE.test(x) || !NUMBER_RE.test(y)) return false;
        const fx = Number(x.replace(/^([+-]?)inf(inity)?$/i, '$1Infinity'));
        const fy = Number(y.replace(/^([+-]?)inf(inity)?$/i, '$1Infinity'));
        if (Number.isNaN(fx) || Number.isNaN(fy)) return Number.isNaN(fx) && Number.isNaN(fy);
        if (!Number.isFinite(fx) || !Number.isFinite(fy)) return fx === fy;
        return Math.abs(fx - fy) <= checker.eps * Math.max(1, Math.abs(fy));
      });
    }
  }
}

/** The verdict of a run that did not pass the checker or did not finish. */
export function verdictOf(status: InvokeStatus): Verdict {
  switch (status) {
    case 'ok':
      return 'AC';
    case 'timeout':
      return 'TLE';
    case 'memory_limit':
      return 'MLE';
    case 'output_limit':
      return 'OLE';
    case 'runtime_error':
    case 'signal':
      return 'RE';
    case 'internal_error':
      return 'IE';
  }
}
