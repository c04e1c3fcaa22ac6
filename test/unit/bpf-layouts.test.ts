/**
 * The BPF layouts have one source (bpf/layouts.json): the generated C header and
 * TypeScript codecs must be current, and the C compiler must agree with every
 * offset the generator computed (the header's _Static_asserts).
 */
import test from 'ava';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import * as L from '../../src/native/bpf-layouts';
import { ipToBytes, parseCidr } from '../../src/shim/network/addr';
import { bytesToIp } from '../../src/shim/network/egress';

const root = join(__dirname, '../../..');

test('generated header and TypeScript are current', (t) => {
  t.notThrows(() => execFileSync('node', [join(root, 'scripts/gen-bpf-layouts.js'), '--check'], { stdio: 'pipe' }));
});

test('the C compiler agrees with every size and offset', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'warren-layouts-'));
  try {
    const src = join(dir, 'check.c');
    writeFileSync(src, '#include <linux/types.h>\n#include "sandbox_egress_layouts.h"\nint main(void) { return 0; }\n');
    t.notThrows(() => execFileSync('cc', ['-fsyntax-only', '-I', join(root, 'bpf'), src], { stdio: 'pipe' }));
    // and a wrong assertion is caught, so the check above is not vacuous
    writeFileSync(src, '#include <linux/types.h>\n#include <stddef.h>\n#include "sandbox_egress_layouts.h"\n_Static_assert(offsetof(struct egress_key, port) == 23, "x");\n');
    t.throws(() => execFileSync('cc', ['-fsyntax-only', '-I', join(root, 'bpf'), src], { stdio: 'pipe' }));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('codecs round-trip and zero the padding', (t) => {
  const key = { cgroupId: 0x1122334455667788n, addr: ipToBytes('10.1.2.3'), port: 443, proto: 6, generation: 7 };
  const buf = Buffer.alloc(L.EGRESS_KEY_SIZE, 0xee);
  L.encodeEgressKey(key, buf);
  t.deepEqual(L.decodeEgressKey(buf), key);
  t.deepEqual([...buf.subarray(L.EGRESS_KEY_OFFSETS.pad, L.EGRESS_KEY_SIZE)], [0, 0, 0, 0]);
  const ev = { cgroupId: 9n, timestampNs: 123n, addr: ipToBytes('2001:db8::1'), port: 53, proto: 17, kind: L.EGRESS_EVENT_SENDMSG6, pid: 4242, reason: L.EGRESS_REASON_METADATA };
  t.deepEqual(L.decodeEgressEvent(L.encodeEgressEvent(ev)), ev);
  t.throws(() => L.decodeEgressEvent(Buffer.alloc(L.EGRESS_EVENT_SIZE - 1)), { instanceOf: RangeError });
  t.throws(() => L.encodeEgressKey({ ...key, addr: Buffer.alloc(4) }), { instanceOf: RangeError });
});

test('addresses: IPv4 is IPv4-mapped IPv6; CIDRs clear host bits', (t) => {
  t.is(ipToBytes('1.2.3.4').toString('hex'), '00000000000000000000ffff01020304');
  t.deepEqual(ipToBytes('::ffff:1.2.3.4'), ipToBytes('1.2.3.4'), 'mapped literal = IPv4');
  t.is(ipToBytes('2001:db8::1').toString('hex'), '20010db8000000000000000000000001');
  t.is(bytesToIp(ipToBytes('10.0.0.1')), '10.0.0.1');
  t.is(bytesToIp(ipToBytes('2001:db8::1')), '2001:db8::1');
  const c = parseCidr('10.1.2.3/8');
  t.is(c.prefix, 104);
  t.is(bytesToIp(c.bytes), '10.0.0.0');
  t.is(parseCidr('2001:db8::/32').prefix, 32);
  for (const bad of ['10.0.0.0/33', '10.0.0.0/', 'x/8', '10.0.0.0/8/8', '::/129', '1.2.3/8']) t.throws(() => parseCidr(bad), { code: 'INVALID_ARGUMENT' } as never, bad);
});
