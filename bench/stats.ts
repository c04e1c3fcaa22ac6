import os from 'node:os';
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';

export function percentile(samples: number[], p: number): number {
  if (samples.length === 0) return NaN;
  const sorted = [...samples].sort((a, b) => a - b);
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[idx]!;
}

export function conditions(): Record<string, string> {
  const cpu = os.cpus()[0]?.model ?? 'unknown';
  const runc = (() => {
    try {
      return execFileSync('runc', ['--version'], { encoding: 'utf8' }).split('\n')[0]!;
    } catch {
      return 'not installed';
    }
  })();
  const cgroup = (() => {
    try {
      return readFileSync('/proc/self/mountinfo', 'utf8').includes(' /sys/fs/cgroup cgroup2 ') ? 'v2' : 'v1 (+ cgroup2 for BPF)';
    } catch {
      return 'unknown';
    }
  })();
  return {
    date: new Date().toISOString(),
    host: `${os.cpus().length} × ${cpu}, ${(os.totalmem() / 2 ** 30).toFixed(0)} GiB`,
    kernel: os.release(),
    node: process.version,
    cgroup,
    runc,
  };
}

export function printTable(rows: Array<Record<string, string>>): void {
  if (rows.length === 0) return;
  const cols = Object.keys(rows[0]!);
  const widths = cols.map((c) => Math.max(c.length, ...rows.map((r) => (r[c] ?? '').length)));
  const line = (cells: string[]) => '| ' + cells.map((c, i) => c.padEnd(widths[i]!)).join(' | ') + ' |';
  console.log(line(cols));
  console.log('|' + widths.map((w) => '-'.repeat(w + 2)).join('|') + '|');
  for (const r of rows) console.log(line(cols.map((c) => r[c] ?? '')));
}
