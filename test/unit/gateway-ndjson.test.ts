import test from 'ava';
import { WarrenError } from '../../src/errors';
import { doneEvent, errorEvent, ndjsonLine, progressEvent } from '../../src/gateway/ndjson';
import type { ImageInfo } from '../../src/shim/types';
import { NdjsonDecoder } from '../../src/sdk/ndjson';

const image: ImageInfo = { name: 'bb', digest: 'sha256:' + 'a'.repeat(64), kind: 'base', layers: ['sha256:' + 'a'.repeat(64)], sizeBytes: 1, createdAt: 'now', source: 'dir' };

test('one JSON object per line, newline-terminated, no raw newlines inside', (t) => {
  const line = ndjsonLine(progressEvent({ phase: 'unpack', message: 'line one\nline two\r\u2028', fraction: 0.5 }));
  t.true(line.endsWith('\n'));
  t.is(line.indexOf('\n'), line.length - 1);
  t.deepEqual(JSON.parse(line), { type: 'progress', phase: 'unpack', message: 'line one\nline two\r\u2028', fraction: 0.5 });
});

test('fractions are clamped and dropped when not finite', (t) => {
  t.is((progressEvent({ phase: 'p', message: 'm', fraction: 1.5 }) as { fraction?: number }).fraction, 1);
  t.is((progressEvent({ phase: 'p', message: 'm', fraction: -1 }) as { fraction?: number }).fraction, 0);
  t.false('fraction' in progressEvent({ phase: 'p', message: 'm', fraction: NaN }));
  t.false('fraction' in progressEvent({ phase: 'p', message: 'm' }));
});

test('terminal lines: done with the image, error with code and message', (t) => {
  t.deepEqual(JSON.parse(ndjsonLine(doneEvent(image))), { type: 'done', image });
  t.deepEqual(JSON.parse(ndjsonLine(errorEvent(new WarrenError('IMAGE_BUILD_FAILED', 'debootstrap failed')))), {
    type: 'error',
    error: { code: 'IMAGE_BUILD_FAILED', message: 'debootstrap failed' },
  });
});

test('decoder: chunks split anywhere, including inside multi-byte characters', (t) => {
  const events = [progressEvent({ phase: 'a', message: 'héllo ✓ 𝄞' }), progressEvent({ phase: 'b', message: 'x', fraction: 0.25 }), doneEvent(image)];
  const bytes = Buffer.from(events.map(ndjsonLine).join(''));
  for (let size = 1; size <= 7; size++) {
    const d = new NdjsonDecoder();
    const out: unknown[] = [];
    for (let i = 0; i < bytes.length; i += size) out.push(...d.push(bytes.subarray(i, i + size)));
    out.push(...d.end());
    t.deepEqual(out, JSON.parse(JSON.stringify(events)));
  }
});

test('decoder: blank lines skipped, final line without newline flushed, garbage throws', (t) => {
  const d = new NdjsonDecoder();
  t.deepEqual(d.push('\n\n{"a":1}\n  \n{"b"'), [{ a: 1 }]);
  t.deepEqual(d.push(':2}'), []);
  t.deepEqual(d.end(), [{ b: 2 }]);
  t.throws(() => new NdjsonDecoder().push('not json\n'), { instanceOf: SyntaxError });
});

test('decoder: an endless line is bounded', (t) => {
  const d = new NdjsonDecoder(1024);
  t.throws(() => d.push('x'.repeat(2048)), { message: /longer than 1024/ });
});
