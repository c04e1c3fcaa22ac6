"""HTTP transports (httpx, one keep-alive pool per client) with the retry policy.

Retries, only where the API says a second attempt is safe:

- a connection refused before any byte of the request was written, on any call;
- a transport failure (connection refused or reset, a broken keep-alive connection) on an
  idempotent call (GETs): the first attempt may or may not have reached the server, and sending
  a GET twice changes nothing;
- ``429`` or ``503`` *with* ``Retry-After``, on any call: the gateway sends Retry-After only on
  refusals made before any work was done (FnCall admission, a full queue), so the request can be
  sent again after that many seconds;
- ``502``/``503``/``504`` without Retry-After on idempotent calls.

Everything else is raised at once. Waits use exponential backoff with jitter (never shorter than
Retry-After), and no retry is made that would end past the call's deadline.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from contextlib import asynccontextmanager, contextmanager
from typing import Any, AsyncIterator, Dict, Iterator, Optional
from urllib.parse import urlencode

import httpx

from ._version import __version__ as _version
from ._errors import UnavailableError, WarrenError, WarrenTimeoutError, error_from_response, parse_retry_after
from ._lean_http import ConnectionPool, HTTPTimeout, HTTPTransportError
from ._lean_http import Response as LeanResponse
from ._wire import Call

CONNECT_TIMEOUT = 10.0
WRITE_TIMEOUT = 120.0
# The gateway's HTTP server closes a connection after 10 s idle; a pooled connection kept longer
# can take a request the server never reads (a reset), so idle connections are dropped first.
KEEPALIVE_EXPIRY = 5.0
BACKOFF_BASE = 0.1
BACKOFF_CAP = 5.0


def _headers(token: Optional[str]) -> Dict[str, str]:
    h = {"user-agent": f"warren-python/{_version}", "accept": "application/json"}
    if token:
        h["authorization"] = f"Bearer {token}"
    return h


def _timeout(seconds: float) -> httpx.Timeout:
    # pool: waiting for a free connection counts against the call's own deadline, so a burst of
    # calls larger than the pool queues (bounded by the pool size in flight) instead of failing.
    return httpx.Timeout(connect=min(CONNECT_TIMEOUT, seconds), read=seconds, write=min(WRITE_TIMEOUT, max(seconds, 1.0)), pool=seconds)


def _request_args(call: Call, seconds: float) -> Dict[str, Any]:
    args: Dict[str, Any] = {"params": call.query, "timeout": _timeout(seconds)}
    headers: Dict[str, str] = dict(call.headers)
    if call.json is not None:
        args["content"] = json.dumps(call.json, separators=(",", ":")).encode("utf-8")
        headers["content-type"] = "application/json"
    elif call.content is not None:
        args["content"] = call.content
        headers["content-type"] = "application/octet-stream"
    elif call.method in ("POST", "PUT", "PATCH"):
        args["content"] = b""
    if headers:
        args["headers"] = headers
    return args


def backoff(attempt: int) -> float:
    return random.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * (2**attempt)))


def retry_delay(call: Call, attempt: int, retries: int, deadline: float, *, status: Optional[int] = None, retry_after: Optional[float] = None, transport: bool = False) -> Optional[float]:
    if attempt >= retries:
        return None
    if transport:
        delay: Optional[float] = backoff(attempt) if call.idempotent else None
    elif status in (429, 503) and retry_after is not None:
        delay = max(retry_after, backoff(attempt))
    elif status in (502, 503, 504) and call.idempotent:
        delay = backoff(attempt)
    else:
        delay = None
    if delay is None or time.monotonic() + delay >= deadline:
        return None
    return delay


def transport_error(call: Call, url: str, exc: Exception) -> WarrenError:
    if isinstance(exc, httpx.TimeoutException):
        return WarrenTimeoutError("TIMEOUT", f"no answer from Warren at {url} in time ({call.method} {call.path}): {type(exc).__name__} {exc}")
    return UnavailableError("UNAVAILABLE", f"cannot reach Warren at {url} ({call.method} {call.path}): {type(exc).__name__} {exc}")


def _is_error(call: Call, status: int) -> bool:
    return status >= 400 or status not in call.expect and status >= 300


class SyncTransport:
    def __init__(self, url: str, token: Optional[str], connections: int, retries: int, timeout: float) -> None:
        self.url = url
        self.timeout = timeout
        self.token = token
        self.retries = retries
        self.http = httpx.Client(
            base_url=url,
            headers=_headers(token),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=KEEPALIVE_EXPIRY),
            trust_env=False,
        )

    def send(self, call: Call) -> httpx.Response:
        with self.stream(call) as res:
            res.read()
            return res

    @contextmanager
    def stream(self, call: Call) -> Iterator[httpx.Response]:
        seconds = call.timeout if call.timeout is not None else self.timeout
        deadline = time.monotonic() + seconds
        attempt = 0
        while True:
            try:
                req = self.http.build_request(call.method, call.path, **_request_args(call, seconds))
                res = self.http.send(req, stream=True)
            except httpx.TransportError as exc:
                # ConnectError: refused before anything was written, so safe to send again.
                safe = isinstance(exc, httpx.ConnectError)
                delay = retry_delay(_IDEMPOTENT if safe else call, attempt, self.retries, deadline, transport=not isinstance(exc, httpx.TimeoutException))
                if delay is None:
                    raise transport_error(call, self.url, exc) from None
                attempt += 1
                time.sleep(delay)
                continue
            if _is_error(call, res.status_code):
                try:
                    body = res.read()
                except httpx.TransportError:
                    body = b""
                finally:
                    res.close()
                ra = parse_retry_after(res.headers.get("retry-after"))
                delay = retry_delay(call, attempt, self.retries, deadline, status=res.status_code, retry_after=ra)
                if delay is None:
                    raise error_from_response(res.status_code, body, res.headers.get("retry-after"))
                attempt += 1
                time.sleep(delay)
                continue
            try:
                yield res
            except httpx.TransportError as exc:
                raise transport_error(call, self.url, exc) from None
            finally:
                res.close()
            return

    def close(self) -> None:
        self.http.close()


class AsyncTransport:
    """The same policy over :mod:`warren._lean_http` (see there for why not httpx)."""

    def __init__(self, url: str, token: Optional[str], connections: int, retries: int, timeout: float) -> None:
        self.url = url
        self.token = token
        self.retries = retries
        self.timeout = timeout
        self.pool = ConnectionPool(url, _headers(token), connections, connect_timeout=CONNECT_TIMEOUT)

    async def send(self, call: Call) -> LeanResponse:
        async with self.stream(call) as res:
            await res.aread()
            return res

    @asynccontextmanager
    async def stream(self, call: Call) -> AsyncIterator[LeanResponse]:
        seconds = call.timeout if call.timeout is not None else self.timeout
        deadline = time.monotonic() + seconds
        target = call.path + ("?" + urlencode(call.query) if call.query else "")
        headers: Dict[str, str] = dict(call.headers)
        body: Optional[bytes] = None
        if call.json is not None:
            body = json.dumps(call.json, separators=(",", ":")).encode("utf-8")
            headers["content-type"] = "application/json"
        elif call.content is not None:
            body = call.content
            headers["content-type"] = "application/octet-stream"
        elif call.method in ("POST", "PUT", "PATCH"):
            body = b""
        attempt = 0
        while True:
            try:
                res = await self.pool.request(call.method, target, headers, body, max(deadline - time.monotonic(), 0.001))
            except HTTPTransportError as exc:
                timed_out = isinstance(exc, HTTPTimeout)
                # Nothing written yet (connect refused, no free connection): safe for any call.
                safe = not exc.sent and not timed_out
                delay = retry_delay(call if not safe else _IDEMPOTENT, attempt, self.retries, deadline, transport=not timed_out)
                if delay is None:
                    raise _lean_error(call, self.url, exc) from None
                attempt += 1
                await asyncio.sleep(delay)
                continue
            if _is_error(call, res.status_code):
                try:
                    body_bytes = await res.aread()
                except HTTPTransportError:
                    body_bytes = b""
                ra = parse_retry_after(res.headers.get("retry-after"))
                delay = retry_delay(call, attempt, self.retries, deadline, status=res.status_code, retry_after=ra)
                if delay is None:
                    raise error_from_response(res.status_code, body_bytes, res.headers.get("retry-after"))
                attempt += 1
                await asyncio.sleep(delay)
                continue
            try:
                yield res
            except HTTPTransportError as exc:
                raise _lean_error(call, self.url, exc) from None
            finally:
                await res.aclose()
            return

    async def close(self) -> None:
        await self.pool.close()


_IDEMPOTENT = Call("GET", "", idempotent=True)


def _lean_error(call: Call, url: str, exc: HTTPTransportError) -> WarrenError:
    if isinstance(exc, HTTPTimeout):
        return WarrenTimeoutError("TIMEOUT", f"no answer from Warren at {url} in time ({call.method} {call.path}): {exc}")
    return UnavailableError("UNAVAILABLE", f"cannot reach Warren at {url} ({call.method} {call.path}): {exc}")


def decode_json(res: "httpx.Response | LeanResponse") -> Any:
    if res.status_code == 204 or not res.content:
        return None
    try:
        return json.loads(res.content)
    except ValueError as e:
        raise WarrenError("INTERNAL", f"malformed JSON answer ({res.status_code}): {e}") from None
