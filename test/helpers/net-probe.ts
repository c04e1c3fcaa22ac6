/**
 * Network probes run by a real process (python3) inside a sandbox or a test cgroup:
 * each probe tries one way out and reports "ok", the errno name, or "timeout",
 * with how long the attempt took. Used to assert that denials are real and prompt.
 */
export type ProbeKind = 'tcp' | 'tcp6' | 'udp' | 'udp6' | 'udpconnect' | 'raw' | 'http' | 'resolve' | 'resolve6';

export interface Probe {
  kind: ProbeKind;
  /** IP literal, or a name for 'http' and 'resolve'. */
  host: string;
  port?: number;
  /** For 'udp': also wait for an echo. */
  expectReply?: boolean;
  /** For 'http': path. */
  path?: string;
}

export interface ProbeResult {
  kind: ProbeKind;
  host: string;
  port?: number;
  outcome: string;
  ms: number;
  body?: string;
}

export const PROBE_SCRIPT = String.raw`
import errno, json, socket, sys, time, urllib.request
def classify(e):
    r = getattr(e, "reason", None)
    if isinstance(r, BaseException):
        return classify(r)
    if isinstance(e, socket.timeout):
        return "timeout"
    if isinstance(e, socket.gaierror):
        return "gaierror:" + str(e)[:60]
    if isinstance(e, OSError) and isinstance(e.errno, int):
        return errno.errorcode.get(e.errno, str(e)[:80])
    return type(e).__name__ + ":" + str(e)[:80]
def run(p):
    k, host, port = p["kind"], p["host"], p.get("port", 0)
    t = time.monotonic()
    out = {"kind": k, "host": host, "port": port}
    try:
        if k in ("tcp", "tcp6"):
            s = socket.socket(socket.AF_INET6 if k == "tcp6" else socket.AF_INET, socket.SOCK_STREAM)
            s.settimeout(3)
            s.connect((host, port)); s.close()
        elif k in ("udp", "udp6"):
            s = socket.socket(socket.AF_INET6 if k == "udp6" else socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(2)
            s.sendto(b"ping", (host, port))
            if p.get("expectReply"): s.recvfrom(100)
            s.close()
        elif k == "udpconnect":
            # connect() only: the hooks decide, nothing is sent (IPv6 socket for a ':' host)
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
            s.connect((host, port)); s.close()
        elif k == "raw":
            s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
            s.settimeout(2)
            s.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", (host, 0))
            s.recvfrom(100)
        elif k == "http":
            with urllib.request.urlopen("http://%s:%d%s" % (host, port, p.get("path", "/")), timeout=5) as r:
                out["body"] = r.read().decode()
        elif k == "resolve":
            out["body"] = ",".join(sorted({a[4][0] for a in socket.getaddrinfo(host, 80, socket.AF_INET, socket.SOCK_STREAM)}))
        elif k == "resolve6":
            out["body"] = ",".join(sorted({a[4][0] for a in socket.getaddrinfo(host, 80, socket.AF_INET6, socket.SOCK_STREAM)}))
        out["outcome"] = "ok"
    except Exception as e:
        out["outcome"] = classify(e)
    out["ms"] = round((time.monotonic() - t) * 1000, 2)
    return out
print(json.dumps([run(p) for p in json.loads(sys.argv[1])]))
`;

/** argv that runs the probes with python3. */
export function probeArgv(probes: Probe[], python = 'python3'): string[] {
  return [python, '-c', PROBE_SCRIPT, JSON.stringify(probes)];
}

export function parseProbeOutput(stdout: string): ProbeResult[] {
  const line = stdout.trim().split('\n').pop() ?? '';
  try {
    return JSON.parse(line) as ProbeResult[];
  } catch {
    throw new Error(`probe output is not JSON: ${stdout.slice(0, 400)}`);
  }
}
