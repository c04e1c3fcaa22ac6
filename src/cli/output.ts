/** Terminal output helpers for the CLI: aligned tables and image-build progress. */
import type { ImportProgress } from '../shim/types';

/** Left-aligned columns separated by two spaces; a header row first. */
export function formatTable(rows: Record<string, string>[], columns: string[]): string {
  const widths = columns.map((c) => Math.max(c.length, ...rows.map((r) => (r[c] ?? '').length)));
  const line = (cells: string[]) =>
    cells
      .map((cell, i) => (i === cells.length - 1 ? cell : cell.padEnd(widths[i]!)))
      .join('  ')
      .trimEnd() + '\n';
  return line(columns) + rows.map((r) => line(columns.map((c) => r[c] ?? ''))).join('');
}

/** One progress line: `[#######.............]  35% phase: message` (no bar when the fraction is unknown). */
export function progressLine(p: ImportProgress, width = 20): string {
  if (typeof p.fraction === 'number' && Number.isFinite(p.fraction)) {
    const f = Math.min(1, Math.max(0, p.fraction));
    const filled = Math.round(f * width);
    return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}] ${String(Math.round(f * 100)).padStart(3)}% ${p.phase}: ${p.message}`;
  }
  return `${p.phase}: ${p.message}`;
}

/**
 * Progress on stderr: a bar redrawn in place on a terminal, plain lines
 * otherwise (logs, pipes). Repeated identical lines are skipped.
 */
export class ProgressPrinter {
  private last = '';
  private drawn = false;

  constructor(private readonly stream: NodeJS.WriteStream) {}

  update(p: ImportProgress): void {
    const text = progressLine(p);
    if (text === this.last) return;
    this.last = text;
    if (this.stream.isTTY) {
      const cols = this.stream.columns || 80;
      this.stream.write(`\r\x1b[2K${text.length > cols - 1 ? `${text.slice(0, cols - 2)}…` : text}`);
      this.drawn = true;
    } else {
      this.stream.write(`${text}\n`);
    }
  }

  finish(): void {
    if (this.drawn) {
      this.stream.write('\n');
      this.drawn = false;
    }
  }
}
