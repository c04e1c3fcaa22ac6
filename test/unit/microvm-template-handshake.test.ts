/**
 * The line handshake a restored microVM's /init speaks before its agent starts
 * (template.ts): bounded, with a deadline, and ended at once by a dead VMM; and
 * the sealed memfds a node keeps of template RAM.
 */
import test from 'ava';
import { closeSync, mkdirSync, openSync, readFileSync, readlinkSync, writeFileSync, writeSync } from 'node:fs';
import net from 'node:net';
import { join } from 'node:path';
import { WarrenError } from '../../src/errors';
import { vmLeftovers } from '../../src/shim/backends/microvm/backend';
import { TemplateStore, configLine, portHandshake } from '../../src/shim/backends/microvm/template';
import { tempDir } from '../helpers/tmp';
import { waitFor } from '../helpers/wait';

/** A unix socket server standing in for QEMU's end of the agent port. */
async function guest(onConnect: (s: net.Socket) => void): Promise<{ path: string; received: () => string; close: () => void }> {
  const path = join(tempDir('warren-hs-'), 'agent.sock');
  let got = '';
  const socks: net.Socket[] = [];
  const server = net.createServer((s) => {
    socks.push(s);
    s.on('data', (d) => (got += d.toString()));
    s.on('error', () => undefined);
    onConnect(s);
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    path,
    received: () => got,
    close: () => {
      for (const s of socks) s.destroy();
      server.close();
    },
  };
}

test('the config line names the sandbox, its pids limit, 64 random bytes and the time; bad values are refused', (t) => {
  const line = configLine({ id: 'n1-0123456789abcdef', pids: 256 });
  t.regex(line, /^WARREN_CONFIG id=n1-0123456789abcdef pids=256 seed=[0-9a-f]{128} clock=\d{19}\n$/);
  t.not(configLine({ id: 'a' }).split('seed=')[1].slice(0, 128), configLine({ id: 'a' }).split('seed=')[1].slice(0, 128));
  t.notRegex(configLine({ id: 'a' }), /pids=/);
  for (const id of ['', 'A', 'a b', 'a\nWARREN_GO', '-x']) t.throws(() => configLine({ id }), { instanceOf: WarrenError }, JSON.stringify(id));
  for (const pids of [0, -1, 1.5, Number.NaN]) t.throws(() => configLine({ id: 'a', pids }), { instanceOf: WarrenError });
  const net = { cidr: '10.88.0.5/16', gateway: '10.88.0.1', mac: '02:ab:cd:00:11:22' };
  t.regex(configLine({ id: 'a', net }), /^WARREN_CONFIG id=a net=10\.88\.0\.5\/16,10\.88\.0\.1 mac=02:ab:cd:00:11:22 seed=/);
  // nothing that could split into more words or lines for /init's parser
  for (const bad of [{ cidr: '10.88.0.5' }, { cidr: '10.88.0.5/16 pids=1' }, { gateway: '10.88.0.1\nWARREN_GO' }, { gateway: '300.1.1.1' }, { mac: '02:ab:cd:00:11' }, { mac: '02:AB:cd:00:11:22 x' }]) {
    t.throws(() => configLine({ id: 'a', net: { ...net, ...bad } }), { instanceOf: WarrenError }, JSON.stringify(bad));
  }
});

test('the host writes its line and waits for the wanted one; an overlong line is dropped whole, noise is skipped', async (t) => {
  const g = await guest((s) => {
    s.once('data', () => s.write(`WARREN_HOLD\n${'x'.repeat(10_000)}WARREN_GO\nnoise\nWARREN_GO\n`));
  });
  try {
    await portHandshake(g.path, { send: 'WARREN_CONFIG id=a\n', want: 'WARREN_GO', timeoutMs: 5000, isAlive: () => true });
    t.is(g.received(), 'WARREN_CONFIG id=a\n');
  } finally {
    g.close();
  }
});

test('a guest that never answers fails at the deadline; a VMM that dies ends the wait at once', async (t) => {
  const silent = await guest(() => undefined);
  try {
    const started = Date.now();
    const err = await t.throwsAsync(portHandshake(silent.path, { want: 'WARREN_GO', timeoutMs: 300, isAlive: () => true }), { instanceOf: WarrenError });
    t.is(err!.code, 'TIMEOUT');
    t.true(Date.now() - started >= 300);
    let alive = true;
    const p = portHandshake(silent.path, { want: 'WARREN_GO', timeoutMs: 60_000, isAlive: () => alive });
    alive = false;
    const dead = await t.throwsAsync(p, { instanceOf: WarrenError });
    t.is(dead!.code, 'UNAVAILABLE');
  } finally {
    silent.close();
  }
  // no socket at all (QEMU not started yet): retried until the deadline
  const err = await t.throwsAsync(portHandshake(join(tempDir('warren-hs-'), 'none.sock'), { want: 'WARREN_GO', timeoutMs: 200, isAlive: () => true }), { instanceOf: WarrenError });
  t.is(err!.code, 'TIMEOUT');
});

test('endless data without a newline stays bounded and never matches', async (t) => {
  const g = await guest((s) => {
    const chunk = Buffer.alloc(64 * 1024, 'y');
    const pump = () => {
      while (!s.destroyed && s.write(chunk)) {
        /* until back-pressure */
      }
    };
    s.on('drain', pump);
    pump();
  });
  try {
    const before = process.memoryUsage().rss;
    const err = await t.throwsAsync(portHandshake(g.path, { want: 'WARREN_GO', timeoutMs: 1500, isAlive: () => true }), { instanceOf: WarrenError });
    t.is(err!.code, 'TIMEOUT');
    t.true(process.memoryUsage().rss - before < 64 * 1024 * 1024, 'what was read was not kept');
  } finally {
    g.close();
  }
});

test("a template's RAM memfd is sealed, outlives a drop while a restore holds it, and the budget drops the least recently used", async (t) => {
  const root = tempDir('warren-tpl-ram-');
  const store = new TemplateStore(join(root, 'templates'), async () => ({ cmdline: '' }), () => undefined, 3 * 4096);
  const tpl = (key: string) => {
    const ram = join(root, `${key}.ram`);
    writeFileSync(ram, Buffer.alloc(2 * 4096, key));
    return { key, dir: root, snapshot: '', ram, disk: '', initrd: '', cmdline: '', snapshotBytes: 0 };
  };
  const isMemfd = (fd: number) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`).startsWith('/memfd:warren-template-');
    } catch {
      return false;
    }
  };
  const a = await store.acquireRam(tpl('a'));
  t.true(isMemfd(a.fd));
  t.is(readFileSync(`/proc/self/fd/${a.fd}`).toString(), 'a'.repeat(2 * 4096), 'a full copy');
  const w = openSync(`/proc/self/fd/${a.fd}`, 'r+');
  try {
    t.throws(() => writeSync(w, Buffer.from('x')), { code: 'EPERM' });
  } finally {
    closeSync(w);
  }
  // a second template over the budget drops the first, which its restore still holds
  const b = await store.acquireRam(tpl('b'));
  t.true(isMemfd(a.fd), 'held: not closed under the restore');
  a.release();
  await waitFor(() => !isMemfd(a.fd), 2000, "the dropped memfd's close");
  t.true(isMemfd(b.fd));
  b.release();
  t.true(isMemfd(b.fd), 'kept for the next restore');
  store.close();
  await waitFor(() => !isMemfd(b.fd), 2000, 'close()');
});

test("a template build's run dir is never taken for a sandbox's leftovers, even on a node named like its prefix", (t) => {
  const dir = tempDir('warren-tpl-left-');
  for (const d of ['tpl-0123456789abcdef0123456789abcdef-a1b2c3', 'tpl-0123456789abcdef', 'tpl-0123456789abcdeg', 'tpl-00000000000000aa']) mkdirSync(join(dir, d));
  t.deepEqual(vmLeftovers([dir], new Set(['tpl-00000000000000aa']), 'tpl-'), ['tpl-0123456789abcdef']);
});
