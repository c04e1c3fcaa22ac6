import { StringDecoder } from 'node:string_decoder';

/**
 * Splits an NDJSON byte stream into parsed values. Chunks may end anywhere
 * (inside a line or a multi-byte character); blank lines are skipped; a line
 * that is not JSON throws.
 */
export class NdjsonDecoder {
  private readonly decoder = new StringDecoder('utf8');
  private buffered = '';
  /** Largest line accepted, to keep a misbehaving server from growing this without bound. */
  constructor(private readonly maxLineBytes = 16 * 1024 * 1024) {}

  push(chunk: Buffer | string): unknown[] {
    this.buffered += typeof chunk === 'string' ? chunk : this.decoder.write(chunk);
    const out: unknown[] = [];
    let nl: number;
    while ((nl = this.buffered.indexOf('\n')) !== -1) {
      const line = this.buffered.slice(0, nl);
      this.buffered = this.buffered.slice(nl + 1);
      const v = parseLine(line);
      if (v !== undefined) out.push(v);
    }
    if (this.buffered.length > this.maxLineBytes) throw new Error(`NDJSON line longer than ${this.maxLineBytes} bytes`);
    return out;
  }

  /** Flush a final line without a trailing newline. */
  end(): unknown[] {
    this.buffered += this.decoder.end();
    const rest = this.buffered;
    this.buffered = '';
    const v = parseLine(rest);
    return v === undefined ? [] : [v];
  }
}

function parseLine(line: string): unknown {
  const trimmed = line.trim();
  if (trimmed === '') return undefined;
  return JSON.parse(trimmed);
}
