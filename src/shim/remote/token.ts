/**
 * The shim protocol's shared token in a file (mode 0600): read when it
 * exists, else created. The node and its gateways name the same file, or
 * copies of it.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, openSync, readFileSync, writeSync } from 'node:fs';
import { WarrenError } from '../../errors';

export function readOrCreateShimToken(file: string): string {
  try {
    const fd = openSync(file, 'wx', 0o600);
    const token = randomBytes(32).toString('hex');
    try {
      writeSync(fd, `${token}\n`);
    } finally {
      closeSync(fd);
    }
    return token;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw new WarrenError('INVALID_ARGUMENT', `cannot create the shim token file ${file}: ${(err as Error).message}`);
  }
  return readShimToken(file);
}

export function readShimToken(file: string): string {
  let text: string;
  try {
    text = readFileSync(file, 'utf8').trim();
  } catch (err) {
    throw new WarrenError('INVALID_ARGUMENT', `cannot read the shim token file ${file}: ${(err as Error).message}`);
  }
  if (text.length < 16 || /\s/.test(text)) throw new WarrenError('INVALID_ARGUMENT', `the shim token file ${file} must hold one token of at least 16 characters`);
  return text;
}
