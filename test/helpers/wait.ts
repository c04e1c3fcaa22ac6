/**
 * Waiting in tests: on a condition, polled until a deadline, never a bare sleep standing in for
 * "it has probably happened by now". A test that must let time pass on purpose (a timeout that
 * has to fire, a window in which nothing may happen) says so with `elapse`, which names why.
 */

/** Polls `cond` every `intervalMs` until it is true; throws naming `what` after `timeoutMs`. */
export async function waitFor(cond: () => boolean | Promise<boolean>, timeoutMs: number, what: string, intervalMs = 10): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** Polls `get` until `pred` holds for its value and returns that value; throws after `timeoutMs`. */
export async function waitForValue<T>(get: () => T | Promise<T>, pred: (v: T) => boolean, timeoutMs: number, what: string, intervalMs = 10): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await get();
    if (pred(v)) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${JSON.stringify(v)?.slice(0, 200)})`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}

/** Lets `ms` of wall time pass because the behaviour under test is about time itself (`why` says how). */
export function elapse(ms: number, why: string): Promise<void> {
  void why;
  return new Promise((r) => setTimeout(r, ms));
}

/** `p`, or a rejection naming `what` once `timeoutMs` have passed (a step that can hang fails where it hangs). */
export function within<T>(p: Promise<T>, timeoutMs: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${timeoutMs} ms`)), timeoutMs);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
