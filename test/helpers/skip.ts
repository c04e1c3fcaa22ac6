/**
 * Tests that need something the machine may lack (root, a kernel feature, a built image) are
 * registered through `testUnless`: with no reason it is ava's own `test`; with a reason every test
 * and hook it registers is skipped, and each skipped test's title carries the reason, so the
 * report always says why a test did not run.
 */
import anyTest, { type TestFn } from 'ava';

export function testUnless<C = unknown>(reason: string | null, base: TestFn<C> = anyTest as TestFn<C>): TestFn<C> {
  if (reason === null) return base;
  const skipped = (title: string, ..._impl: unknown[]) => base.skip(`${title} (skipped: ${reason})`, () => undefined);
  const noHook = Object.assign(() => undefined, { always: Object.assign(() => undefined, { skip: () => undefined }), skip: () => undefined });
  return Object.assign(skipped, {
    serial: Object.assign((title: string, ...impl: unknown[]) => skipped(title, ...impl), { skip: skipped, only: skipped, failing: skipped, todo: base.todo }),
    only: skipped,
    failing: skipped,
    skip: skipped,
    todo: base.todo,
    macro: base.macro,
    meta: base.meta,
    before: noHook,
    after: noHook,
    beforeEach: noHook,
    afterEach: noHook,
  }) as unknown as TestFn<C>;
}

/** Why a test that needs root cannot run here, or null. */
export const rootReason: string | null = process.getuid?.() === 0 ? null : 'needs root';
