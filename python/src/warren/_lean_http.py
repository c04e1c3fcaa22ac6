"""A small HTTP/1.1 client on asyncio streams, for the AsyncClient.

Why not httpx here: an RL trainer drives hundreds of FnCall invocations per second from one
asyncio loop, and httpx 0.23 (the version Debian 12 ships) spends about 2 ms of CPU per request
on a 2-core machine (its own request model, httpcore, h11), four times the TypeScript SDK; on a
machine whose cores the judge containers also need, that CPU is throughput. Warren's API needs
little of HTTP: JSON or raw bodies with a Content-Length, answers with Content-Length or chunked
(archives, image progress), keep-alive. This client does exactly that at about 0.3 ms per request
(bench/python-sdk.ts). The sync Client keeps httpx.

Connections are pooled per client (LIFO, at most ``max_connections``, each used by one request at a
time); a connection idle for longer than ``keepalive_expiry`` or found closed is not reused.
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import sys
import time
from typing import AsyncIterator, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

MAX_HEADER_BYTES = 64 * 1024


class HTTPTransportError(Exception):
    """The connection failed or the answer was not HTTP; ``sent`` tells whether the request may
    have reached the server (False: refused or broken before any byte was written)."""

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


class HTTPTimeout(HTTPTransportError):
    pass


if sys.version_info >= (3, 11):

    def _deadline(loop_deadline: float) -> "asyncio.Timeout":
        return asyncio.timeout_at(loop_deadline)

else:  # pragma: no cover - Debian 12 has 3.11
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def _deadline(loop_deadline: float) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            task.cancel()

        h = loop.call_at(loop_deadline, fire)
        try:
            yield
        except asyncio.CancelledError:
            if fired:
                raise asyncio.TimeoutError() from None
            raise
        finally:
            h.cancel()


class _Conn:
    __slots__ = ("reader", "writer", "idle_since")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float, expiry: float) -> bool:
        return now - self.idle_since < expiry and not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        try:
            self.writer.close()
        except Exception:
            pass


class Response:
    """Status and headers are read; the body is read with :meth:`aread` or streamed."""

    def __init__(self, pool: "ConnectionPool", conn: _Conn, status: int, headers: Dict[str, str], deadline: float, head_only: bool) -> None:
        self._pool = pool
        self._conn: Optional[_Conn] = conn
        self.status_code = status
        self.headers = headers
        self._deadline = deadline
        self._content: Optional[bytes] = None
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._length: Optional[int] = int(cl) if cl is not None and not self._chunked else None
        if head_only or status in (204, 304) or 100 <= status < 200:
            self._length = 0
            self._chunked = False
        self._keep = headers.get("connection", "").lower() != "close" and (self._length is not None or self._chunked)

    @property
    def content(self) -> bytes:
        if self._content is None:
            raise RuntimeError("body not read")
        return self._content

    async def aread(self) -> bytes:
        if self._content is None:
            parts = [c async for c in self.aiter_bytes()]
            self._content = b"".join(parts)
        return self._content

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            if self._content is not None:
                yield self._content
            return
        r = conn.reader
        done = False
        try:
            async with _deadline(self._deadline):
                if self._length is not None:
                    left = self._length
                    while left > 0:
                        chunk = await r.read(min(left, 1 << 16))
                        if not chunk:
                            raise HTTPTransportError(f"connection closed with {left} body bytes missing")
                        left -= len(chunk)
                        yield chunk
                elif self._chunked:
                    while True:
                        line = await r.readuntil(b"\r\n")
                        size = int(line.split(b";", 1)[0].strip(), 16)
                        if size == 0:
                            while (await r.readuntil(b"\r\n")) != b"\r\n":  # trailers
                                pass
                            break
                        left = size
                        while left > 0:
                            chunk = await r.read(min(left, 1 << 16))
                            if not chunk:
                                raise HTTPTransportError("connection closed inside a chunk")
                            left -= len(chunk)
                            yield chunk
                        if await r.readexactly(2) != b"\r\n":
                            raise HTTPTransportError("malformed chunked body")
                else:
                    while True:
                        chunk = await r.read(1 << 16)
                        if not chunk:
                            break
                        yield chunk
            done = True
        except asyncio.TimeoutError:
            raise HTTPTimeout("timed out reading the answer") from None
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            raise HTTPTransportError(f"answer broken: {type(e).__name__} {e}") from None
        finally:
            self._release(done and self._keep)

    async def aiter_lines(self) -> AsyncIterator[str]:
        buf = b""
        async for chunk in self.aiter_bytes():
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield line.decode("utf-8").rstrip("\r")
        if buf:
            yield buf.decode("utf-8")

    def _release(self, reuse: bool) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            self._pool._give_back(conn, reuse)

    async def aclose(self) -> None:
        # An unread body means the connection cannot carry another request.
        self._release(False)


class ConnectionPool:
    def __init__(self, url: str, base_headers: Dict[str, str], max_connections: int, keepalive_expiry: float = 5.0, connect_timeout: float = 10.0) -> None:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"unsupported URL {url!r} (http:// or https://)")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: Optional[_ssl.SSLContext] = _ssl.create_default_context() if u.scheme == "https" else None
        self.base_path = u.path.rstrip("/")
        host_header = u.netloc.rsplit("@", 1)[-1]
        self._head = "".join(f"{k}: {v}\r\n" for k, v in {"host": host_header, **base_headers}.items())
        self._idle: List[_Conn] = []
        self._slots = asyncio.Semaphore(max_connections)
        self._expiry = keepalive_expiry
        self._connect_timeout = connect_timeout
        self._closed = False

    def _give_back(self, conn: _Conn, reuse: bool) -> None:
        if reuse and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)
        else:
            conn.close()
        self._slots.release()

    async def _connect(self, deadline: float) -> _Conn:
        loop = asyncio.get_running_loop()
        try:
            async with _deadline(min(deadline, loop.time() + self._connect_timeout)):
                reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 20)
        except asyncio.TimeoutError:
            raise HTTPTimeout(f"connecting to {self.host}:{self.port} timed out", sent=False) from None
        except OSError as e:
            raise HTTPTransportError(f"cannot connect to {self.host}:{self.port}: {e}", sent=False) from None
        return _Conn(reader, writer)

    async def request(self, method: str, target: str, headers: Dict[str, str], body: Optional[bytes], timeout: float) -> Response:
        """Send one request; answer once the status line and headers are in. ``target`` is the
        path (with query) below the client's base path."""
        if self._closed:
            raise HTTPTransportError("client is closed", sent=False)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            async with _deadline(deadline):
                await self._slots.acquire()
        except asyncio.TimeoutError:
            raise HTTPTimeout("no free connection in time", sent=False) from None
        conn: Optional[_Conn] = None
        sent = False
        try:
            now = time.monotonic()
            while self._idle:
                c = self._idle.pop()
                if c.usable(now, self._expiry):
                    conn = c
                    break
                c.close()
            if conn is None:
                conn = await self._connect(deadline)
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
            if body is not None:
                extra += f"content-length: {len(body)}\r\n"
            head = f"{method} {self.base_path}{target} HTTP/1.1\r\n{self._head}{extra}\r\n".encode("latin-1")
            try:
                async with _deadline(deadline):
                    conn.writer.write(head + body if body is not None and len(body) < 65536 else head)
                    if body is not None and len(body) >= 65536:
                        conn.writer.write(body)
                    sent = True
                    await conn.writer.drain()
                    status, hdrs = await _read_head(conn.reader)
                    while status == 100:
                        status, hdrs = await _read_head(conn.reader)
            except asyncio.TimeoutError:
                raise HTTPTimeout(f"no answer in {timeout:.1f}s") from None
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
                # A reused connection the server had already closed fails here before any answer.
                raise HTTPTransportError(f"connection failed: {type(e).__name__} {e}", sent=sent) from None
            res = Response(self, conn, status, hdrs, deadline, method == "HEAD")
            conn = None
            return res
        except BaseException:
            if conn is not None:
                conn.close()
            self._slots.release()
            raise

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()


async def _read_head(r: asyncio.StreamReader) -> Tuple[int, Dict[str, str]]:
    raw = await r.readuntil(b"\r\n\r\n")
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError("response headers too large")
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError(f"not an HTTP/1.x status line: {lines[0][:100]!r}")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep:
            raise ValueError(f"malformed header line {line[:100]!r}")
        k = k.strip().lower()
        v = v.strip()
        headers[k] = f"{headers[k]}, {v}" if k in headers else v
    return int(parts[1]), headers
