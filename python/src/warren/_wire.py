"""What goes on the wire, shared by the sync and the asyncio client.

Each API call is built here as a :class:`Call` (method, path, query, body, timeout, whether it
may be retried) from Python arguments, with the client-side checks that catch bad input before a
request; the two clients only differ in how they send a ``Call``. Names follow Python
(``memory_mb``); bodies follow the REST contract (``memoryMb``, docs/api.md).
"""

from __future__ import annotations

import base64
import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from ._errors import bad_input

# Ranges the gateway enforces that do not depend on the host (src/gateway/validation.ts LIMITS).
# Host-dependent maxima (cpu, memory) are left to the server, which answers LIMIT_OUT_OF_RANGE.
CPU_MIN = 0.01
MEMORY_MB_MIN = 16
PIDS_RANGE = (8, 32768)
DISK_MB_RANGE = (16, 1_048_576)
TIMEOUT_MS_RANGE = (1, 3_600_000)
MAX_OUTPUT_RANGE = (1, 64 * 1024 * 1024)
LIFETIME_RANGE = (1, 31_536_000)
TERMINAL_RANGE = (1, 1000)
FILE_MODE_MAX = 0o7777
MAX_LAYERS = 16

SANDBOX_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$")
POOL_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,62}$")

BACKENDS = ("container", "fncall", "microvm", "vm")
ON_IDLE = ("pause", "hibernate", "stop", "delete")
PRIORITIES = ("normal", "idle")

# Client-side deadlines (seconds) on top of the server's own limits; generous where the
# server's work can legitimately be long (a judge with many tests, a pack of a large diff).
DEFAULT_TIMEOUT = 300.0
EXEC_GRACE = 60.0
INVOKE_TIMEOUT = 900.0
JUDGE_TIMEOUT = 3600.0
PACK_TIMEOUT = 1800.0
POOL_CREATE_TIMEOUT = 900.0
IMAGE_TIMEOUT = 3600.0

Query = List[Tuple[str, str]]


@dataclass
class Call:
    method: str
    path: str
    query: Query = field(default_factory=list)
    json: Any = None
    content: Optional[bytes] = None
    # Seconds for the whole call (None: the client's default, 300 s unless set). Calls whose work
    # is legitimately long (exec with a timeout, judge, pack) carry their own.
    timeout: Optional[float] = None
    # Safe to send again after a transport failure (the request may or may not have reached the
    # server): GETs only. Any call may be retried on 429/503 *with* Retry-After, because those
    # are refusals before any work was done (admission control, a starting node).
    idempotent: bool = False
    # Statuses that are not errors for this call (204 for deletes, for instance).
    expect: Tuple[int, ...] = (200, 201, 204)
    # Extra request headers (Idempotency-Key).
    headers: Dict[str, str] = field(default_factory=dict)


# ---------------------------------------------------------------------------
# checks


def check_sandbox_id(sid: str) -> str:
    if not isinstance(sid, str) or not SANDBOX_ID.match(sid):
        raise bad_input("INVALID_ID", f"invalid sandbox id {sid!r}", "id")
    return sid


def check_session_id(sid: str) -> str:
    if not isinstance(sid, str) or not SESSION_ID.match(sid):
        raise bad_input("INVALID_ID", f"invalid session id {sid!r}", "session")
    return sid


def check_pool(name: str) -> str:
    if not isinstance(name, str) or not POOL_NAME.match(name):
        raise bad_input("INVALID_ID", f"invalid pool name {name!r}", "pool")
    return name


def check_ref(ref: str, fieldname: str) -> str:
    if not isinstance(ref, str) or ref == "" or ".." in ref or "/" in ref or "\0" in ref:
        raise bad_input("INVALID_ID", f"invalid image reference {ref!r}", fieldname)
    return ref


def check_path(path: str, fieldname: str = "path") -> str:
    if not isinstance(path, str):
        raise bad_input("INVALID_ARGUMENT", f"{fieldname} must be a string", fieldname)
    if not path.startswith("/") or "\0" in path or ".." in path.split("/"):
        raise bad_input("PATH_ESCAPE", f"{fieldname} must be an absolute path without '..' (got {path!r})", fieldname)
    if len(path.encode("utf-8")) > 4096 or any(len(c.encode("utf-8")) > 255 for c in path.split("/")):
        raise bad_input("PATH_ESCAPE", f"{fieldname} is too long", fieldname)
    return path


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_int(v: Any, fieldname: str, lo: int, hi: Optional[int] = None) -> int:
    if not _is_int(v):
        raise bad_input("INVALID_ARGUMENT", f"{fieldname} must be an integer (got {v!r})", fieldname)
    if v < lo or (hi is not None and v > hi):
        raise bad_input("LIMIT_OUT_OF_RANGE", f"{fieldname} must be in {lo}..{hi if hi is not None else ''} (got {v})", fieldname, min=lo, max=hi)
    return int(v)


def check_number(v: Any, fieldname: str, lo: float) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad_input("INVALID_ARGUMENT", f"{fieldname} must be a number (got {v!r})", fieldname)
    if not math.isfinite(v) or v < lo:
        raise bad_input("LIMIT_OUT_OF_RANGE", f"{fieldname} must be at least {lo} (got {v})", fieldname, min=lo)
    return v


def check_str_map(m: Any, fieldname: str, key_re: Optional["re.Pattern[str]"] = None) -> Dict[str, str]:
    if not isinstance(m, Mapping):
        raise bad_input("INVALID_ARGUMENT", f"{fieldname} must be a mapping of strings", fieldname)
    out: Dict[str, str] = {}
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise bad_input("INVALID_ARGUMENT", f"{fieldname} keys and values must be strings ({k!r}: {v!r})", f"{fieldname}.{k}")
        if key_re is not None and not key_re.match(k):
            raise bad_input("INVALID_ARGUMENT", f"invalid {fieldname} name {k!r}", f"{fieldname}.{k}")
        if "\0" in k or "\0" in v:
            raise bad_input("INVALID_ARGUMENT", f"{fieldname} must not contain NUL", f"{fieldname}.{k}")
        out[k] = v
    return out


def check_network(m: Any, fieldname: str = "network") -> Dict[str, bool]:
    if not isinstance(m, Mapping):
        raise bad_input("INVALID_ARGUMENT", f"{fieldname} must be a mapping of service name to bool", fieldname)
    out: Dict[str, bool] = {}
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, bool):
            raise bad_input("INVALID_ARGUMENT", f"{fieldname}: {k!r} must map to true or false (got {v!r})", f"{fieldname}.{k}")
        out[k] = v
    if len(out) > 64:
        raise bad_input("LIMIT_OUT_OF_RANGE", f"{fieldname}: at most 64 services", fieldname, max=64)
    return out


def check_choice(v: Any, fieldname: str, choices: Sequence[str]) -> str:
    if v not in choices:
        raise bad_input("INVALID_ARGUMENT", f"{fieldname} must be one of {', '.join(choices)} (got {v!r})", fieldname)
    return str(v)


def seconds_to_ms(seconds: float, fieldname: str) -> int:
    """Timeouts are seconds in Python and milliseconds on the wire; sub-millisecond rounds up."""
    check_number(seconds, fieldname, 0)
    ms = int(math.ceil(seconds * 1000))
    return check_int(ms, fieldname, TIMEOUT_MS_RANGE[0], TIMEOUT_MS_RANGE[1])


def labels_query(labels: Optional[Mapping[str, str]]) -> Query:
    if labels is None:
        return []
    return [("label", f"{k}={v}") for k, v in check_str_map(labels, "labels").items()]


def sandbox_path(sid: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(check_sandbox_id(sid), safe='')}{suffix}"


# ---------------------------------------------------------------------------
# sandboxes


def create_sandbox_body(
    *,
    image: Optional[str],
    backend: Optional[str],
    workspaces: Optional[Sequence[str]],
    toolkits: Optional[Sequence[str]],
    cpu: Optional[float],
    memory_mb: Optional[int],
    pids: Optional[int],
    disk_mb: Optional[int],
    ttl_seconds: Optional[int],
    idle_seconds: Optional[int],
    on_idle: Optional[str],
    network: Optional[Mapping[str, bool]],
    priority: Optional[str],
    user: Optional[str],
    env: Optional[Mapping[str, str]],
    labels: Optional[Mapping[str, str]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if backend is not None:
        body["backend"] = check_choice(backend, "backend", BACKENDS)
    if image is not None:
        body["image"] = check_ref(image, "image")
    for name, refs in (("workspaces", workspaces), ("toolkits", toolkits)):
        if refs is not None:
            if isinstance(refs, str) or not isinstance(refs, Sequence):
                raise bad_input("INVALID_ARGUMENT", f"{name} must be a list of image references", name)
            if len(refs) > MAX_LAYERS:
                raise bad_input("LIMIT_OUT_OF_RANGE", f"at most {MAX_LAYERS} {name}", name, max=MAX_LAYERS)
            body[name] = [check_ref(r, name) for r in refs]
    if cpu is not None:
        body["cpu"] = check_number(cpu, "cpu", CPU_MIN)
    if memory_mb is not None:
        body["memoryMb"] = check_int(memory_mb, "memory_mb", MEMORY_MB_MIN)
    if pids is not None:
        body["pids"] = check_int(pids, "pids", *PIDS_RANGE)
    if disk_mb is not None:
        body["diskMb"] = check_int(disk_mb, "disk_mb", *DISK_MB_RANGE)
    if ttl_seconds is not None:
        body["ttlSeconds"] = check_int(ttl_seconds, "ttl_seconds", *LIFETIME_RANGE)
    if idle_seconds is not None:
        body["idleSeconds"] = check_int(idle_seconds, "idle_seconds", *LIFETIME_RANGE)
    if on_idle is not None:
        if idle_seconds is None:
            raise bad_input("INVALID_ARGUMENT", "on_idle needs idle_seconds", "on_idle")
        body["onIdle"] = check_choice(on_idle, "on_idle", ON_IDLE)
    if network is not None:
        body["network"] = check_network(network)
    if priority is not None:
        body["priority"] = check_choice(priority, "priority", PRIORITIES)
    if user is not None:
        if not isinstance(user, str) or user == "":
            raise bad_input("INVALID_ARGUMENT", "user must be a non-empty string", "user")
        body["user"] = user
    if env is not None:
        e = check_str_map(env, "env", ENV_NAME)
        if len(e) > 256:
            raise bad_input("LIMIT_OUT_OF_RANGE", "at most 256 env entries", "env", max=256)
        body["env"] = e
    if labels is not None:
        lb = check_str_map(labels, "labels", LABEL_KEY)
        if len(lb) > 64:
            raise bad_input("LIMIT_OUT_OF_RANGE", "at most 64 labels", "labels", max=64)
        body["labels"] = lb
    return body


Cmd = Union[str, Sequence[str]]


def check_cmd(cmd: Cmd) -> Union[str, List[str]]:
    if isinstance(cmd, str):
        if cmd == "":
            raise bad_input("INVALID_ARGUMENT", "cmd must not be empty", "cmd")
        return cmd
    if not isinstance(cmd, Sequence) or len(cmd) == 0 or not all(isinstance(a, str) for a in cmd):
        raise bad_input("INVALID_ARGUMENT", "cmd must be a string or a non-empty list of strings", "cmd")
    return list(cmd)


def shell_command(cmd: Cmd) -> str:
    """A command for a shell session: strings run as they are, argv lists are quoted."""
    c = check_cmd(cmd)
    return c if isinstance(c, str) else shlex.join(c)


def exec_call(
    sid: str,
    cmd: Cmd,
    *,
    stdin: Optional[str],
    env: Optional[Mapping[str, str]],
    cwd: Optional[str],
    timeout: Optional[float],
    user: Optional[str],
    max_output_bytes: Optional[int],
    idempotency_key: Optional[str] = None,
) -> Call:
    body: Dict[str, Any] = {"cmd": check_cmd(cmd)}
    if stdin is not None:
        if not isinstance(stdin, str):
            raise bad_input("INVALID_ARGUMENT", "stdin must be a string", "stdin")
        body["stdin"] = stdin
    if env is not None:
        body["env"] = check_str_map(env, "env", ENV_NAME)
    if cwd is not None:
        body["cwd"] = check_path(cwd, "cwd")
    wait = DEFAULT_TIMEOUT + EXEC_GRACE
    if timeout is not None:
        body["timeoutMs"] = seconds_to_ms(timeout, "timeout")
        wait = timeout + EXEC_GRACE
    if user is not None:
        body["user"] = user
    if max_output_bytes is not None:
        body["maxOutputBytes"] = check_int(max_output_bytes, "max_output_bytes", *MAX_OUTPUT_RANGE)
    if idempotency_key is None:
        return Call("POST", sandbox_path(sid, "/exec"), json=body, timeout=wait)
    # With a key the gateway runs the command at most once (docs/idempotency.md): sending it
    # again after a transport failure is safe, so the call counts as idempotent.
    return Call("POST", sandbox_path(sid, "/exec"), json=body, timeout=wait, idempotent=True, headers={"idempotency-key": check_idempotency_key(idempotency_key)})


IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_.:/+=-]{1,200}$")


def check_idempotency_key(key: str) -> str:
    if not isinstance(key, str) or not IDEMPOTENCY_KEY.match(key):
        raise bad_input("INVALID_ARGUMENT", "idempotency_key must be 1..200 characters of [A-Za-z0-9_.:/+=-] (a UUID fits)", "idempotencyKey")
    return key


def file_mode_query(mode: Optional[int]) -> Query:
    if mode is None:
        return []
    return [("mode", format(check_int(mode, "mode", 0, FILE_MODE_MAX), "o"))]


def pack_body(name: str, scrub: Optional[Sequence[str]], publish: Optional[bool], squash: Optional[bool], compression: Optional[str]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": check_ref(name, "name")}
    if scrub is not None:
        if isinstance(scrub, str) or not all(isinstance(s, str) for s in scrub):
            raise bad_input("INVALID_ARGUMENT", "scrub must be a list of paths or patterns", "scrub")
        body["scrub"] = list(scrub)
    if publish is not None:
        body["publish"] = bool(publish)
    if squash is not None:
        body["squash"] = bool(squash)
    if compression is not None:
        body["compression"] = check_choice(compression, "compression", ("none", "lz4", "lz4hc"))
    return body


# ---------------------------------------------------------------------------
# shell


def shell_query(
    mode: Optional[str], session: Optional[str], offset: Optional[int], cols: Optional[int], rows: Optional[int]
) -> Query:
    q: Query = []
    if mode is not None:
        q.append(("mode", check_choice(mode, "mode", ("command", "pty"))))
    if session is not None:
        q.append(("session", check_session_id(session)))
    if offset is not None:
        if session is None:
            raise bad_input("INVALID_ARGUMENT", "offset is only meaningful with session", "offset")
        q.append(("offset", str(check_int(offset, "offset", 0))))
    if cols is not None:
        q.append(("cols", str(check_int(cols, "cols", *TERMINAL_RANGE))))
    if rows is not None:
        q.append(("rows", str(check_int(rows, "rows", *TERMINAL_RANGE))))
    return q


SIGNALS = ("HUP", "INT", "QUIT", "KILL", "USR1", "USR2", "TERM", "CONT", "STOP", "TSTP", "WINCH")


def check_signal(sig: Union[str, int]) -> Union[str, int]:
    if isinstance(sig, int) and not isinstance(sig, bool):
        return check_int(sig, "signal", 1, 64)
    if isinstance(sig, str):
        name = sig.upper()
        if name.startswith("SIG"):
            name = name[3:]
        if name in SIGNALS:
            return name
    raise bad_input("INVALID_ARGUMENT", f"unknown signal {sig!r} (one of {' '.join(SIGNALS)} or 1..64)", "signal")


# ---------------------------------------------------------------------------
# FnCall

FileInput = Union[str, bytes, Mapping[str, Any]]


def _files_body(files: Mapping[str, FileInput]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for path, v in files.items():
        if not isinstance(path, str) or path == "":
            raise bad_input("INVALID_ARGUMENT", f"file name {path!r} must be a non-empty string", "files")
        if isinstance(v, str):
            out[path] = v
        elif isinstance(v, (bytes, bytearray, memoryview)):
            out[path] = {"base64": base64.b64encode(bytes(v)).decode("ascii")}
        elif isinstance(v, Mapping):
            out[path] = dict(v)
        else:
            raise bad_input("INVALID_ARGUMENT", f"files[{path!r}] must be str, bytes or a mapping", f"files.{path}")
    return out


def invoke_body(
    *,
    code: Optional[str],
    language: Optional[str],
    cmd: Optional[Cmd],
    files: Optional[Mapping[str, FileInput]],
    stdin: Optional[Union[str, bytes]],
    env: Optional[Mapping[str, str]],
    timeout: Optional[float],
    cpu_time: Optional[float],
    memory_mb: Optional[int],
    max_output_bytes: Optional[int],
    compile_timeout: Optional[float],
    fetch_files: Optional[Sequence[str]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {}
    if cmd is not None:
        if code is not None:
            raise bad_input("INVALID_ARGUMENT", "give either cmd or code (with language), not both", "cmd")
        body["cmd"] = check_cmd(cmd)
    elif code is not None:
        if not isinstance(code, str):
            raise bad_input("INVALID_ARGUMENT", "code must be a string", "code")
        if language is None:
            raise bad_input("INVALID_ARGUMENT", "code needs a language (python3, bash, c, cpp)", "language")
        body["code"] = code
    else:
        raise bad_input("INVALID_ARGUMENT", "give cmd or code", "code")
    if language is not None:
        body["language"] = language
    if files is not None:
        body["files"] = _files_body(files)
    if stdin is not None:
        if isinstance(stdin, str):
            body["stdin"] = stdin
        else:
            body["stdinBase64"] = base64.b64encode(bytes(stdin)).decode("ascii")
    if env is not None:
        body["env"] = check_str_map(env, "env", ENV_NAME)
    if timeout is not None:
        body["timeoutMs"] = seconds_to_ms(timeout, "timeout")
    if cpu_time is not None:
        body["cpuMs"] = seconds_to_ms(cpu_time, "cpu_time")
    if memory_mb is not None:
        body["memoryMb"] = check_int(memory_mb, "memory_mb", 1)
    if max_output_bytes is not None:
        body["maxOutputBytes"] = check_int(max_output_bytes, "max_output_bytes", 1)
    if compile_timeout is not None:
        body["compileTimeoutMs"] = seconds_to_ms(compile_timeout, "compile_timeout")
    if fetch_files is not None:
        if isinstance(fetch_files, str) or not all(isinstance(f, str) for f in fetch_files):
            raise bad_input("INVALID_ARGUMENT", "fetch_files must be a list of paths", "fetch_files")
        body["fetchFiles"] = list(fetch_files)
    return body


@dataclass
class JudgeTestInput:
    expected: str
    stdin: Optional[str] = None


TestInput = Union[JudgeTestInput, Mapping[str, str]]


def judge_body(
    *,
    code: str,
    language: str,
    tests: Sequence[TestInput],
    checker: Optional[Union[str, Mapping[str, Any]]],
    stop_on_first_failure: Optional[bool],
    timeout: Optional[float],
    cpu_time: Optional[float],
    memory_mb: Optional[int],
    max_output_bytes: Optional[int],
    compile_timeout: Optional[float],
) -> Dict[str, Any]:
    if not isinstance(code, str) or not isinstance(language, str):
        raise bad_input("INVALID_ARGUMENT", "code and language must be strings", "code")
    ts: List[Dict[str, str]] = []
    for i, t in enumerate(tests):
        if isinstance(t, JudgeTestInput):
            d: Dict[str, str] = {"expected": t.expected}
            if t.stdin is not None:
                d["stdin"] = t.stdin
        elif isinstance(t, Mapping) and isinstance(t.get("expected"), str):
            d = {"expected": t["expected"]}
            if t.get("stdin") is not None:
                d["stdin"] = str(t["stdin"])
        else:
            raise bad_input("INVALID_ARGUMENT", f"tests[{i}] needs an expected string", f"tests[{i}]")
        ts.append(d)
    if not ts:
        raise bad_input("INVALID_ARGUMENT", "tests must not be empty", "tests")
    body: Dict[str, Any] = {"code": code, "language": language, "tests": ts}
    if checker is not None:
        body["checker"] = checker if isinstance(checker, str) else dict(checker)
    if stop_on_first_failure is not None:
        body["stopOnFirstFailure"] = bool(stop_on_first_failure)
    if timeout is not None:
        body["timeoutMs"] = seconds_to_ms(timeout, "timeout")
    if cpu_time is not None:
        body["cpuMs"] = seconds_to_ms(cpu_time, "cpu_time")
    if memory_mb is not None:
        body["memoryMb"] = check_int(memory_mb, "memory_mb", 1)
    if max_output_bytes is not None:
        body["maxOutputBytes"] = check_int(max_output_bytes, "max_output_bytes", 1)
    if compile_timeout is not None:
        body["compileTimeoutMs"] = seconds_to_ms(compile_timeout, "compile_timeout")
    return body


def pool_body(
    *,
    name: str,
    image: Optional[str],
    layers: Optional[Sequence[str]],
    min: Optional[int],
    max: Optional[int],
    max_queue: Optional[int],
    idle_seconds: Optional[int],
    limits: Optional[Mapping[str, Any]],
) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": check_pool(name)}
    if image is not None:
        body["image"] = check_ref(image, "image")
    if layers is not None:
        body["layers"] = [check_ref(r, "layers") for r in layers]
    if min is not None:
        body["min"] = check_int(min, "min", 0)
    if max is not None:
        body["max"] = check_int(max, "max", 1)
    if max_queue is not None:
        body["maxQueue"] = check_int(max_queue, "max_queue", 0)
    if idle_seconds is not None:
        body["idleSeconds"] = check_int(idle_seconds, "idle_seconds", 1)
    if limits is not None:
        body["limits"] = dict(limits)
    return body


def function_path(pool: str, suffix: str = "") -> str:
    return f"/v1/functions/{quote(check_pool(pool), safe='')}{suffix}"
