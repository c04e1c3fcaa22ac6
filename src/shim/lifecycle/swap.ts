/**
 * A zram swap device for paused sandboxes, set up when the operator enables it
 * (`warren up --zram-swap-mb N`, ShimOptions.lifecycle.zramSwapMb).
 *
 * The device is a new one from /sys/class/zram-control/hot_add (never an
 * existing /dev/zramN someone else uses), compressed with zstd or lz4, with
 * high swap priority. Its number is recorded in <dataDir>/lifecycle/zram.json
 * so that a restarted gateway adopts it instead of adding another, and
 * `teardown()` (swapoff, reset, hot_remove) leaves nothing behind. Swapped
 * pages of paused sandboxes live in it: a gateway that stops while sandboxes
 * are paused keeps the device.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, unlinkSync, writeFileSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { WarrenError } from '../../errors';

const run = promisify(execFile);
const CONTROL = '/sys/class/zram-control';

export interface ZramState {
  device: number;
  sizeBytes: number;
  algorithm: string;
}

export interface ZramOptions {
  sizeBytes: number;
  /** Preferred compressors, first available wins (default zstd, lz4, lzo-rle). */
  algorithms?: string[];
  /** swapon priority (default 100: used before any disk swap). */
  priority?: number;
}

function activeSwaps(): string[] {
  try {
    return readFileSync('/proc/swaps', 'utf8')
      .split('\n')
      .slice(1)
      .map((l) => l.split(/\s+/)[0] ?? '')
      .filter(Boolean);
  } catch {
    return [];
  }
}

async function tool(cmd: string, args: string[]): Promise<void> {
  try {
    await run(cmd, args, { timeout: 120_000 });
  } catch (err) {
    const e = err as { stderr?: string; message: string };
    throw new WarrenError('INTERNAL', `${cmd} ${args.join(' ')}: ${(e.stderr ?? e.message).toString().trim()}`);
  }
}

export class ZramSwap {
  private readonly stateFile: string;
  state: ZramState | null = null;

  constructor(stateDir: string) {
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    this.stateFile = join(stateDir, 'zram.json');
  }

  static supported(): { ok: boolean; reason?: string } {
    if (!existsSync(CONTROL)) return { ok: false, reason: 'zram module not loaded (modprobe zram)' };
    return { ok: true };
  }

  get devicePath(): string | null {
    return this.state === null ? null : `/dev/zram${this.state.device}`;
  }

  /** Adopt the device recorded by an earlier gateway, or create one. */
  async setup(opts: ZramOptions): Promise<ZramState> {
    const sup = ZramSwap.supported();
    if (!sup.ok) throw new WarrenError('NOT_SUPPORTED', `zram swap: ${sup.reason}`);
    if (!Number.isSafeInteger(opts.sizeBytes) || opts.sizeBytes < 16 * 1024 * 1024) {
      throw new WarrenError('INVALID_ARGUMENT', 'zram swap size must be at least 16 MiB');
    }
    const recorded = this.readState();
    if (recorded !== null && activeSwaps().includes(`/dev/zram${recorded.device}`)) {
      this.state = recorded;
      return recorded;
    }
    if (recorded !== null) await this.removeDevice(recorded.device).catch(() => undefined);
    const device = Number((await readFile(join(CONTROL, 'hot_add'), 'utf8')).trim());
    if (!Number.isInteger(device) || device < 0) throw new WarrenError('INTERNAL', 'zram hot_add returned no device number');
    const state: ZramState = { device, sizeBytes: opts.sizeBytes, algorithm: '' };
    this.writeState(state);
    try {
      const block = `/sys/block/zram${device}`;
      const available = (await readFile(join(block, 'comp_algorithm'), 'utf8')).replace(/[[\]]/g, '').trim().split(/\s+/);
      const algorithm = (opts.algorithms ?? ['zstd', 'lz4', 'lzo-rle']).find((a) => available.includes(a)) ?? available[0] ?? 'lzo';
      await writeFile(join(block, 'comp_algorithm'), algorithm);
      await writeFile(join(block, 'disksize'), String(opts.sizeBytes));
      state.algorithm = algorithm;
      this.writeState(state);
      await tool('mkswap', ['-q', `/dev/zram${device}`]);
      await tool('swapon', ['-p', String(opts.priority ?? 100), `/dev/zram${device}`]);
    } catch (err) {
      await this.removeDevice(device).catch(() => undefined);
      this.clearState();
      throw err;
    }
    this.state = state;
    return state;
  }

  /** swapoff (pages come back to memory), reset and remove the device. */
  async teardown(): Promise<void> {
    const st = this.state ?? this.readState();
    if (st === null) return;
    await this.removeDevice(st.device);
    this.clearState();
    this.state = null;
  }

  /** Bytes stored and memory used by the device (from mm_stat), when set up. */
  async usage(): Promise<{ origDataBytes: number; comprDataBytes: number; memUsedBytes: number } | null> {
    if (this.state === null) return null;
    const f = (await readFile(`/sys/block/zram${this.state.device}/mm_stat`, 'utf8')).trim().split(/\s+/).map(Number);
    return { origDataBytes: f[0] ?? 0, comprDataBytes: f[1] ?? 0, memUsedBytes: f[2] ?? 0 };
  }

  private async removeDevice(device: number): Promise<void> {
    const dev = `/dev/zram${device}`;
    if (activeSwaps().includes(dev)) {
      try {
        await tool('swapoff', [dev]);
      } catch (err) {
        // Raced with another swapoff: fine as long as it is no longer a swap device.
        if (activeSwaps().includes(dev)) throw err;
      }
    }
    const block = `/sys/block/zram${device}`;
    if (!existsSync(block)) return;
    await writeFile(join(block, 'reset'), '1').catch(() => undefined);
    await writeFile(join(CONTROL, 'hot_remove'), String(device));
  }

  private readState(): ZramState | null {
    try {
      const s = JSON.parse(readFileSync(this.stateFile, 'utf8')) as ZramState;
      return Number.isInteger(s.device) ? s : null;
    } catch {
      return null;
    }
  }

  private writeState(s: ZramState): void {
    const tmp = `${this.stateFile}.${process.pid}`;
    writeFileSync(tmp, JSON.stringify(s), { mode: 0o600 });
    renameSync(tmp, this.stateFile);
  }

  private clearState(): void {
    try {
      unlinkSync(this.stateFile);
    } catch {
      /* gone */
    }
  }
}

const ZSWAP_ENABLED = '/sys/module/zswap/parameters/enabled';

/**
 * zswap: a compressed cache in front of a (disk) swap device, for hosts that
 * have swap but no zram. `setZswap(true)` turns it on and returns what it was,
 * so the caller can put it back; NOT_SUPPORTED when the kernel lacks it.
 */
export async function setZswap(enabled: boolean): Promise<boolean> {
  let before: string;
  try {
    before = (await readFile(ZSWAP_ENABLED, 'utf8')).trim();
  } catch {
    throw new WarrenError('NOT_SUPPORTED', 'zswap is not built into this kernel');
  }
  await writeFile(ZSWAP_ENABLED, enabled ? 'Y' : 'N');
  return before === 'Y' || before === '1';
}

