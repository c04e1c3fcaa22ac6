/**
 * Fixtures for the lifecycle tests: a static "memhog" program that holds N MiB
 * of anonymous memory filled with a known pattern and checks it on SIGUSR1,
 * and a real zram swap device that is always removed afterwards.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, statSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ZramSwap } from '../../src/shim/lifecycle/swap';
import { waitFor } from '../helpers/wait';
import type { ShimFixture } from '../helpers/warren';

const MEMHOG_C = String.raw`
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* memhog MiB statusfile [random%]: every 4 KiB page gets random% of pseudo-random bytes
   (xorshift, seeded by the page number) and a constant fill after that, so the
   compressibility is known; SIGUSR1 re-reads every page and reports ok/bad. */
static volatile sig_atomic_t check = 0;
static void on_usr1(int s) { (void)s; check = 1; }
static void fill(unsigned char *pg, size_t page, size_t nrand) {
  uint64_t x = page * 0x9E3779B97F4A7C15ull + 1;
  for (size_t j = 0; j < nrand; j++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; pg[j] = (unsigned char)x; }
  memset(pg + nrand, (int)(page * 7 % 251), 4096 - nrand);
}
int main(int argc, char **argv) {
  if (argc < 3) return 2;
  size_t mib = strtoul(argv[1], 0, 10), n = mib << 20, pct = argc > 3 ? strtoul(argv[3], 0, 10) : 0;
  size_t nrand = 4096 * (pct > 100 ? 100 : pct) / 100;
  unsigned char *p = malloc(n), ref[4096];
  if (!p) return 3;
  for (size_t i = 0; i < n / 4096; i++) fill(p + i * 4096, i, nrand);
  signal(SIGUSR1, on_usr1);
  FILE *f = fopen(argv[2], "w"); fprintf(f, "ready\n"); fclose(f);
  for (;;) {
    usleep(20000);
    if (!check) continue;
    check = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n / 4096; i++) { fill(ref, i, nrand); if (memcmp(ref, p + i * 4096, 4096)) bad++; }
    f = fopen(argv[2], "w"); fprintf(f, bad ? "bad %zu\n" : "ok\n", bad); fclose(f);
  }
}
`;

let memhogPath: string | null = null;

/** A static binary: `memhog MiB statusfile [random%]` (writes "ready", then "ok"/"bad N" after each SIGUSR1). */
export function memhogBinary(): Buffer {
  if (memhogPath === null) {
    const dir = mkdtempSync(join(tmpdir(), 'warren-memhog-'));
    writeFileSync(join(dir, 'memhog.c'), MEMHOG_C);
    execFileSync('gcc', ['-O1', '-static', '-o', join(dir, 'memhog'), join(dir, 'memhog.c')]);
    memhogPath = join(dir, 'memhog');
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  }
  return readFileSync(memhogPath);
}

export function memhogSkipReason(): string | null {
  try {
    memhogBinary();
    return null;
  } catch (err) {
    return `cannot build the memhog fixture with gcc -static: ${(err as Error).message.split('\n')[0]}`;
  }
}

type Shim = ShimFixture['shim'];

/** Start `memhog MiB` in the sandbox, wait until its memory is filled; its pid. */
export async function startMemhog(shim: Shim, id: string, mib: number): Promise<string> {
  await shim.writeFile(id, '/bin/memhog', memhogBinary(), 0o755);
  await shim.exec(id, { cmd: `(memhog ${mib} /tmp/hog 50 >/dev/null 2>&1 &)` });
  await waitFor(async () => (await shim.exec(id, { cmd: 'cat /tmp/hog 2>/dev/null' })).stdout === 'ready\n', 20_000, 'memhog to fill its memory', 50);
  return (await shim.exec(id, { cmd: 'pidof memhog' })).stdout.trim();
}

/** Have memhog re-read every page: "ok\n", or "bad N\n" with the pages that changed. */
export async function memhogCheck(shim: Shim, id: string): Promise<string> {
  return (await shim.exec(id, { cmd: 'kill -USR1 $(pidof memhog); while ! grep -qE "ok|bad" /tmp/hog; do usleep 10000; done; cat /tmp/hog', timeoutMs: 60_000 })).stdout;
}

const SWAP_LOCK = '/run/warren-test-swap.lock';

/**
 * Run `fn` while no other test process makes or removes a swap device. Swap spreads pages over
 * every device of one priority, so a device one test removes can hold pages of another test's
 * paused sandbox: they come back into memory, and the other test's released and swapped counts
 * are off. The lock is a directory (mkdir is atomic) naming its holder; a dead holder's is taken.
 */
export async function withSwapLock<T>(fn: () => Promise<T>): Promise<T> {
  const take = (): boolean => {
    try {
      mkdirSync(SWAP_LOCK);
      writeFileSync(join(SWAP_LOCK, 'pid'), String(process.pid));
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    }
    let holder = NaN;
    try {
      holder = Number(readFileSync(join(SWAP_LOCK, 'pid'), 'utf8'));
    } catch {
      /* being written or removed */
    }
    if (Number.isInteger(holder) && holder > 0 && !existsSync(`/proc/${holder}`)) rmSync(SWAP_LOCK, { recursive: true, force: true });
    return false;
  };
  await waitFor(take, 15 * 60_000, `${SWAP_LOCK} (held by another test process)`, 100);
  try {
    return await fn();
  } finally {
    rmSync(SWAP_LOCK, { recursive: true, force: true });
  }
}

/** Run `fn` with a real zram swap device of `mb` MiB; the device is swapped off and removed afterwards. */
export function withZramSwap<T>(mb: number, fn: (swap: ZramSwap) => Promise<T>): Promise<T> {
  return withSwapLock(() => withOwnZram(mb, fn));
}

async function withOwnZram<T>(mb: number, fn: (swap: ZramSwap) => Promise<T>): Promise<T> {
  const stateDir = mkdtempSync(join(tmpdir(), 'warren-zram-'));
  const swap = new ZramSwap(stateDir);
  await swap.setup({ sizeBytes: mb * 1024 * 1024 });
  // kernfs gives a re-created device a new inode: another test may get the same index at once
  const sysfsIdentity = (dev: string) => {
    try {
      return statSync(`/sys/block/${dev.slice(5)}`).ino;
    } catch {
      return null;
    }
  };
  const ours = sysfsIdentity(swap.devicePath!);
  try {
    return await fn(swap);
  } finally {
    const dev = swap.devicePath!;
    await swap.teardown();
    rmSync(stateDir, { recursive: true, force: true });
    if (sysfsIdentity(dev) === ours) throw new Error(`${dev} was not removed`);
  }
}

export function zramSkipReason(): string | null {
  const s = ZramSwap.supported();
  return s.ok ? null : s.reason!;
}

/**
 * A busybox root with a /work tree to modify and delete from (sandboxes may
 * write under /work, /root, /tmp, /home with the default confinement profile):
 * /work/app/{keep.txt, modify.txt, delete.txt, deldir/x, opaque/{a,b}}.
 */
export async function packBaseRootfs(): Promise<string> {
  const { busyboxRootfs } = await import('../helpers/warren');
  const dir = mkdtempSync(join(tmpdir(), 'warren-packbase-'));
  execFileSync('cp', ['-a', '--no-target-directory', await busyboxRootfs(), dir]);
  const app = join(dir, 'work', 'app');
  for (const d of ['deldir', 'opaque']) execFileSync('mkdir', ['-p', join(app, d)]);
  for (const [f, text] of Object.entries({ 'keep.txt': 'keep', 'modify.txt': 'original', 'delete.txt': 'doomed', 'deldir/x': 'x', 'opaque/a': 'a', 'opaque/b': 'b' })) {
    writeFileSync(join(app, f), `${text}\n`);
  }
  process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}
