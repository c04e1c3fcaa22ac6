/**
 * What one invocation leaves must not reach the next one in the same pool
 * container, network included: each invocation has a network namespace of its
 * own (loopback only), so sockets, TIME_WAIT entries and bound ports die with
 * it. (With WARREN_FNCALL_NETNS=0, i.e. the container's shared namespace, the
 * first test fails: the TIME_WAIT entry and the port are still there.)
 *
 * Also here: the scratch filesystem (absolute paths such as /mnt/x and /tmp/y
 * are writable, can be put and fetched, and are empty again for the next
 * invocation), and /etc/hosts with a resolvable localhost.
 */
import test from 'ava';
import { type FnFixture, integrationSkipReason, openFnFixture } from './fncall-fixture';
import { testUnless } from '../helpers/skip';

const skip = integrationSkipReason();
let f: FnFixture;
const maybe = testUnless(skip).serial;

test.before(async () => {
  if (skip) return;
  f = await openFnFixture();
  // one container: every invocation lands in the same one
  await f.pool({ name: 'one', min: 1, max: 1 });
});

test.after.always(async () => {
  if (f) await f.close();
});

const py = (code: string, extra: Record<string, unknown> = {}) => f.admin.functions.invoke('one', { code, language: 'python3', ...extra });

const SOCKETS = `
import socket
def sockets():
    n = 0
    for p in ('/proc/net/tcp', '/proc/net/tcp6', '/proc/net/udp', '/proc/net/udp6'):
        try:
            n += len(open(p).read().splitlines()[1:])
        except FileNotFoundError:
            pass
    return n
`;

maybe('network reset: no socket, TIME_WAIT entry or bound port of an invocation reaches the next one in the same container', async (t) => {
  const [c] = f.shim.functions.pool('one').containerList();
  // The server closes first, so its side of the connection sits in TIME_WAIT; a UDP socket stays bound.
  const first = await py(`${SOCKETS}
srv = socket.socket(); srv.bind(('127.0.0.1', 5555)); srv.listen()
cli = socket.create_connection(('localhost', 5555))
conn, _ = srv.accept(); conn.close(); cli.close(); srv.close()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', 5556))
tw = [l for l in open('/proc/net/tcp').read().splitlines()[1:] if l.split()[3] == '06']
print(len(tw), sockets())
`);
  t.is(first.status, 'ok', first.stderr);
  const [tw, open1] = first.stdout.trim().split(' ').map(Number);
  t.true(tw! >= 1, `the first invocation itself sees its TIME_WAIT entry (${first.stdout})`);
  t.true(open1! >= 2);
  const second = await py(`${SOCKETS}
print(sockets())
s = socket.socket(); s.bind(('127.0.0.1', 5555)); s.listen()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', 5556))
print('bound')
`);
  t.is(second.status, 'ok', second.stderr);
  t.is(second.stdout, '0\nbound\n');
  t.is(f.shim.functions.pool('one').containerList()[0]!.id, c!.id, 'both ran in the same container');
});

maybe("the judge base has Python's scientific and testing packages (Debian's)", async (t) => {
  // every package is installed; numpy and pandas (the heavy imports are slow on a loaded machine) are imported
  const r = await py(
    'import importlib.util, numpy, pandas\nmissing = [m for m in ("scipy", "sympy", "networkx", "sortedcontainers", "requests", "pytest", "yaml", "dateutil", "regex") if importlib.util.find_spec(m) is None]\nprint(missing, numpy.__version__.split(".")[0], pandas.DataFrame({"a": [1, 2]}).a.sum())',
    { timeoutMs: 60_000 },
  );
  t.is(r.status, 'ok', r.stderr);
  t.is(r.stdout, '[] 1 3\n');
});

maybe('localhost resolves (/etc/hosts) and loopback works inside an invocation', async (t) => {
  const r = await py(`
import socket, threading
print(socket.gethostbyname('localhost'))
srv = socket.socket(); srv.bind(('localhost', 0)); srv.listen()
port = srv.getsockname()[1]
threading.Thread(target=lambda: srv.accept()[0].sendall(b'pong'), daemon=True).start()
print(socket.create_connection(('localhost', port)).recv(4).decode())
`);
  t.is(r.status, 'ok', r.stderr);
  t.is(r.stdout, '127.0.0.1\npong\n');
});

maybe('scratch filesystem: absolute paths are writable, put and fetched, and empty for the next invocation; the rest stays read-only', async (t) => {
  const r = await py(
    `
import os
print(open('/mnt/in/data.txt').read())
for p in ('/mnt/out.txt', '/tmp/t.txt', '/home/h.txt', '/data/d/x.txt', '/root/r.txt', '/var/tmp/v.txt'):
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, 'w').write(p)
for p in ('/etc/x', '/usr/x', '/x'):
    try:
        open(p, 'w')
        print('wrote', p)
    except OSError as e:
        print('refused', p, e.errno)
`,
    { files: { '/mnt/in/data.txt': 'given' }, fetchFiles: ['/mnt/out.txt', '/tmp/t.txt', '/data/d/x.txt', '/work/main.py', 'main.py'] },
  );
  t.is(r.status, 'ok', r.stderr);
  t.is(r.stdout, 'given\nrefused /etc/x 30\nrefused /usr/x 30\nrefused /x 30\n');
  const got = Object.fromEntries(Object.entries(r.files ?? {}).map(([k, v]) => [k, Buffer.from(v, 'base64').toString()]));
  t.is(got['/mnt/out.txt'], '/mnt/out.txt');
  t.is(got['/tmp/t.txt'], '/tmp/t.txt');
  t.is(got['/data/d/x.txt'], '/data/d/x.txt');
  t.regex(got['main.py'] ?? '', /import os/);
  const next = await py(`
import os
print(sorted(os.listdir('/mnt')), sorted(os.listdir('/tmp')), sorted(os.listdir('/data')), sorted(os.listdir('/home')), sorted(os.listdir('/root')))
`);
  t.is(next.stdout, '[] [] [] [] []\n', next.stderr);
  const esc = await t.throwsAsync(py('1', { files: { '/etc/passwd': 'x' } }));
  t.regex(esc!.message, /outside the writable directories/);
  const dots = await t.throwsAsync(py('1', { fetchFiles: ['/tmp/../etc/shadow'] }));
  t.regex(dots!.message, /"\.\." component/);
});
