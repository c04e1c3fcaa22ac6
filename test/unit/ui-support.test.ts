/** The dashboard's server-side helpers: the same-origin rule for shells, the recent-values ring, the CSP. */
import test from 'ava';
import { contentSecurityPolicy } from '../../src/gateway/routes/ui';
import { sameOrigin } from '../../src/gateway/ws-shell';
import { RecentRing, keepRecent, recentSeries } from '../../src/telemetry/recent';

test('sameOrigin: the Origin must name the host the request is addressed to', (t) => {
  t.true(sameOrigin('http://127.0.0.1:7070', '127.0.0.1:7070'));
  t.true(sameOrigin('https://warren.example', 'warren.example'));
  t.true(sameOrigin('http://Warren.Example:8080', 'warren.example:8080'), 'host names compare case-insensitively');
  t.false(sameOrigin('http://127.0.0.1:7071', '127.0.0.1:7070'), 'another port is another origin');
  t.false(sameOrigin('https://evil.example', '127.0.0.1:7070'));
  t.false(sameOrigin('http://127.0.0.1:7070', undefined), 'no Host, no match');
  t.false(sameOrigin('http://127.0.0.1:7070', ''));
  t.false(sameOrigin('null', '127.0.0.1:7070'), 'opaque origins (sandboxed iframes, file:) never match');
  t.false(sameOrigin('file:///etc', '127.0.0.1:7070'));
  t.false(sameOrigin('not a url', 'not a url'));
});

test('RecentRing keeps the newest values in order, bounded', (t) => {
  const r = new RecentRing(3);
  for (let i = 1; i <= 5; i++) r.push(i, { k: i % 2 === 0 ? 'even' : 'odd' }, 1000 + i);
  t.deepEqual(
    r.since().map((s) => s.v),
    [3, 4, 5],
  );
  t.deepEqual(
    r.since(1003).map((s) => s.v),
    [4, 5],
  );
  t.is(r.since()[1]!.attrs.k, 'even');
});

test('keepRecent records into the ring and passes the value on', (t) => {
  const seen: number[] = [];
  const h = keepRecent('test.ui.histogram', { record: (v: number) => void seen.push(v) });
  h.record(7, { backend: 'container' });
  h.record(9);
  t.deepEqual(seen, [7, 9]);
  const ring = recentSeries('test.ui.histogram').since();
  t.deepEqual(
    ring.map((s) => [s.v, s.attrs.backend]),
    [
      [7, 'container'],
      [9, undefined],
    ],
  );
});

test('the dashboard CSP allows no inline or remote code', (t) => {
  const csp = contentSecurityPolicy('abc');
  t.regex(csp, /default-src 'none'/);
  t.regex(csp, /script-src 'self';/);
  t.regex(csp, /style-src 'self' 'nonce-abc';/);
  t.regex(csp, /frame-ancestors 'none'/);
  t.notRegex(csp, /unsafe|\*|https?:/);
});
