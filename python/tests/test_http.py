"""The retry policy and error mapping against a real local HTTP server that answers what each
case needs (429 with and without Retry-After, 503, a dropped connection, a slow answer)."""

from __future__ import annotations

import asyncio
import json
import pickle
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Dict, Iterator, List, Tuple

import pytest

import warren
from warren._errors import error_from_response

Script = List[Tuple[int, Dict[str, str], bytes]]


class Scripted:
    """Answers requests from a script of (status, headers, body); status 0 drops the connection,
    status -1 sleeps 2 s before answering 200."""

    def __init__(self) -> None:
        self.script: Script = []
        self.seen: List[Tuple[str, str, float]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: object) -> None:
                pass

            def handle_one(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                if n:
                    self.rfile.read(n)
                outer.seen.append((self.command, self.path, time.monotonic()))
                status, headers, body = outer.script.pop(0) if outer.script else (200, {}, b'{"ok":true}')
                if status == 0:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if status == -1:
                    time.sleep(2)
                    status = 200
                if status == -2:  # a chunked answer, as the gateway streams archives
                    self.send_response(200)
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for piece in (body[:3], body[3:]):
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = handle_one

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def srv() -> Iterator[Scripted]:
    s = Scripted()
    yield s
    s.close()


def err(code: str, status: int, retry: str = "") -> Tuple[int, Dict[str, str], bytes]:
    h = {"retry-after": retry} if retry else {}
    return status, h, json.dumps({"error": {"code": code, "message": f"{code} here", "details": {"k": 1}}}).encode()


HEALTH = b'{"status":"ok","node":"n","version":"0","uptimeS":1}'


def test_429_with_retry_after_is_retried_on_any_method(srv: Scripted) -> None:
    srv.script = [err("RESOURCE_EXHAUSTED", 429, "0.2"), err("RESOURCE_EXHAUSTED", 429, "0.2"), (200, {}, b'{"pools":[]}')]
    with warren.Client(srv.url, "t") as c:
        t0 = time.monotonic()
        assert c.functions.list() == []
        assert len(srv.seen) == 3 and time.monotonic() - t0 >= 0.4, "waited Retry-After each time"
    srv.seen.clear()
    srv.script = [err("RESOURCE_EXHAUSTED", 429, "0.1"), (200, {}, json.dumps({"status": "ok", "exitCode": 0, "stdout": "", "stderr": ""}).encode())]
    with warren.Client(srv.url, "t") as c:
        assert c.functions.invoke("p", cmd="true").ok
    assert [m for m, _, _ in srv.seen] == ["POST", "POST"]


def test_429_without_retry_after_is_raised(srv: Scripted) -> None:
    srv.script = [err("QUOTA_EXCEEDED", 429)]
    with warren.Client(srv.url, "t") as c:
        with pytest.raises(warren.QuotaExceededError) as e:
            c.create_sandbox()
    assert len(srv.seen) == 1 and e.value.retry_after is None and e.value.details == {"k": 1}


def test_retries_exhausted_raise_with_retry_after(srv: Scripted) -> None:
    srv.script = [err("RESOURCE_EXHAUSTED", 429, "1")] * 3
    with warren.Client(srv.url, "t", retries=0) as c:
        with pytest.raises(warren.BackpressureError) as e:
            c.functions.invoke("p", cmd="true")
    assert e.value.retry_after == 1.0 and e.value.status == 429 and len(srv.seen) == 1


def test_503_retried_only_for_gets(srv: Scripted) -> None:
    srv.script = [err("UNAVAILABLE", 503), (200, {}, HEALTH)]
    with warren.Client(srv.url, "t") as c:
        assert c.health()["status"] == "ok"
        assert len(srv.seen) == 2
        srv.seen.clear()
        srv.script = [err("UNAVAILABLE", 503)]
        with pytest.raises(warren.UnavailableError):
            c.sandbox("abc").pause()
        assert len(srv.seen) == 1, "a POST is not sent twice"


def test_dropped_connection(srv: Scripted) -> None:
    srv.script = [(0, {}, b""), (200, {}, HEALTH)]
    with warren.Client(srv.url, "t") as c:
        assert c.health()["status"] == "ok", "GET retried after a dropped connection"
        srv.seen.clear()
        srv.script = [(0, {}, b"")]
        with pytest.raises(warren.UnavailableError) as e:
            c.sandbox("abc").exec("true")
        assert e.value.code == "UNAVAILABLE" and len(srv.seen) == 1, "an exec is never sent twice"


def test_timeout(srv: Scripted) -> None:
    srv.script = [(-1, {}, HEALTH)]
    with warren.Client(srv.url, "t", timeout=0.5, retries=0) as c:
        t0 = time.monotonic()
        with pytest.raises(warren.WarrenTimeoutError) as e:
            c.health()
        assert time.monotonic() - t0 < 1.5 and e.value.code == "TIMEOUT"
        assert isinstance(e.value, TimeoutError) and isinstance(e.value, warren.UnavailableError)


def test_async_retry_and_errors(srv: Scripted) -> None:
    async def main() -> None:
        srv.script = [err("RESOURCE_EXHAUSTED", 429, "0.1"), (200, {}, b'{"pools":[]}'), err("SANDBOX_NOT_FOUND", 404)]
        async with warren.AsyncClient(srv.url, "t") as c:
            assert await c.functions.list() == []
            with pytest.raises(warren.NotFoundError) as e:
                await c.get_sandbox("abc")
            assert e.value.code == "SANDBOX_NOT_FOUND"

    asyncio.run(main())


def test_async_transport(srv: Scripted) -> None:
    async def main() -> None:
        async with warren.AsyncClient(srv.url, "t", timeout=0.5) as c:
            srv.script = [(0, {}, b""), (200, {}, HEALTH)]
            assert (await c.health())["status"] == "ok", "GET retried after a dropped connection"
            srv.seen.clear()
            srv.script = [(0, {}, b"")]
            with pytest.raises(warren.UnavailableError):
                await c.sandbox("abc").exec("true")
            assert len(srv.seen) == 1, "an exec is never sent twice"
            srv.script = [(-2, {}, b"tar-bytes-here"), (-2, {}, b"second")]
            assert await c.sandbox("abc").download_tar("/x") == b"tar-bytes-here"
            assert await c.sandbox("abc").download_tar("/x") == b"second", "the connection is reused after a chunked body"
            srv.script = [(-1, {}, HEALTH)]
            t0 = time.monotonic()
            with pytest.raises(warren.WarrenTimeoutError):
                await c.health()
            assert time.monotonic() - t0 < 1.5
            srv.seen.clear()
            for _ in range(20):
                await c.health()
            assert len(srv.seen) == 20
        async with warren.AsyncClient(f"http://127.0.0.1:{_free_port()}", "t", retries=1) as dead:
            t0 = time.monotonic()
            with pytest.raises(warren.UnavailableError) as e:
                await dead.create_sandbox()
            assert "connect" in e.value.message

    asyncio.run(main())


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_error_mapping() -> None:
    cases: List[Tuple[int, bytes, type, str]] = [
        (400, b'{"error":{"code":"UNKNOWN_FIELD","message":"m","details":{"field":"x"}}}', warren.BadInputError, "UNKNOWN_FIELD"),
        (413, b"", warren.BadInputError, "PAYLOAD_TOO_LARGE"),
        (401, b"nope", warren.AuthError, "UNAUTHENTICATED"),
        (403, b'{"error":{"code":"ORIGIN_REFUSED","message":"m"}}', warren.AuthError, "ORIGIN_REFUSED"),
        (409, b'{"error":{"code":"SESSION_BUSY","message":"m"}}', warren.ConflictError, "SESSION_BUSY"),
        (501, b'{"error":{"code":"CONFINEMENT_UNAVAILABLE","message":"m"}}', warren.NotSupportedError, "CONFINEMENT_UNAVAILABLE"),
        (500, b'{"error":{"code":"INTERNAL","message":"internal error (ref 1)"}}', warren.InternalError, "INTERNAL"),
        (504, b"", warren.WarrenTimeoutError, "TIMEOUT"),
        (418, b"teapot", warren.InternalError, "INTERNAL"),
        # a code from a newer server keeps its text; the family follows the status
        (409, b'{"error":{"code":"JOB_RUNNING","message":"m"}}', warren.ConflictError, "JOB_RUNNING"),
    ]
    for status, body, cls, code in cases:
        e = error_from_response(status, body)
        assert type(e) is cls and e.code == code and e.status == status, (status, body, e)
        again = pickle.loads(pickle.dumps(e))
        assert type(again) is cls and again.code == code
    e = error_from_response(429, b'{"error":{"code":"RESOURCE_EXHAUSTED","message":"m","details":{"retryAfterS":3}}}')
    assert isinstance(e, warren.BackpressureError) and e.retry_after == 3.0


