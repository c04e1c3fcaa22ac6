"""Client side of the shell WebSocket protocol (docs/shell-protocol.md), asyncio.

One :class:`AsyncShellSession` is one *attachment* to a session that lives in a holder process
next to the sandbox: ``detach()`` (or a dropped connection, or a gateway restart) leaves the
session running, and ``Sandbox.shell(session=..., offset=...)`` attaches again. ``close()`` ends
the session. The sync :class:`warren.ShellSession` drives this class on a private event loop.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from contextlib import asynccontextmanager
from collections import deque
from typing import Any, AsyncIterator, Callable, Deque, Dict, List, Mapping, Optional, Tuple, Union

import websockets
import websockets.exceptions
from websockets.legacy.client import WebSocketClientProtocol

from ._errors import (
    BackpressureError,
    UnavailableError,
    WarrenError,
    WarrenTimeoutError,
    error_from_code,
    error_from_response,
)
from ._lean_http import _deadline as _lean_deadline
from ._models import CommandResult, ShellExit, ShellOutput
from ._wire import check_signal, shell_command, Cmd

OutputCallback = Callable[[ShellOutput], None]

if sys.version_info >= (3, 11):
    _timeout = asyncio.timeout
else:  # pragma: no cover - Debian 12 has 3.11

    @asynccontextmanager
    async def _timeout(seconds: float) -> AsyncIterator[None]:
        async with _lean_deadline(asyncio.get_running_loop().time() + seconds):
            yield

# Default client-side wait for a command that has no timeout of its own (the server's maximum
# timeoutMs is an hour); a command given a timeout waits that long plus this grace.
RUN_WAIT_DEFAULT = 3600.0
RUN_GRACE = 30.0
# After a cancelled or abandoned run the command is killed; wait this long for its "done".
ABORT_WAIT = 10.0
# Output kept for read() when nobody consumes it, beyond which the oldest is dropped (counted).
READ_BUFFER_BYTES = 16 * 1024 * 1024
# Input kept for the gateway until it acknowledges it (also while the connection is made again).
UNACKED_MAX_BYTES = 1024 * 1024
# Close codes after which the session is still there to attach to again (docs/shell-protocol.md,
# "Lost connections"): no close frame, the gateway going away or failing, the node unreachable.
RESUMABLE_CLOSE = frozenset({1001, 1006, 1011, 1012, 1013, 4500})


class _ErrorBodyProtocol(WebSocketClientProtocol):
    """Refusals happen before the upgrade as ordinary JSON error responses; keep their code."""

    async def read_http_response(self) -> Tuple[int, Any]:
        status, headers = await super().read_http_response()
        if status != 101:
            body = b""
            try:
                n = int(headers.get("content-length", "0"))
                if 0 < n <= 1 << 20:
                    body = await asyncio.wait_for(self.reader.readexactly(n), 5.0)
            except (ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError):
                pass
            raise error_from_response(status, body, headers.get("retry-after"))
        return status, headers


class _Run:
    __slots__ = ("id", "future", "stdout", "stderr", "on_output", "msg", "sent")

    def __init__(self, rid: str, future: "asyncio.Future[CommandResult]", on_output: Optional[OutputCallback], msg: Dict[str, Any]) -> None:
        self.id = rid
        self.future = future
        self.stdout: List[bytes] = []
        self.stderr: List[bytes] = []
        self.on_output = on_output
        # sent again after a re-attach: as a resume, or with its idempotency key
        self.msg = msg
        # whether msg went to a connection: a run still waiting for the re-attach is sent once,
        # by run() on the new connection, not also by the re-attach
        self.sent = False


def _ws_url(http_url: str) -> str:
    if http_url.startswith("https://"):
        return "wss://" + http_url[len("https://") :]
    if http_url.startswith("http://"):
        return "ws://" + http_url[len("http://") :]
    return http_url


class AsyncShellSession:
    """A shell session (``mode="command"``: :meth:`run`; ``mode="pty"``: :meth:`write`/:meth:`read`)."""

    session: str
    mode: str
    sandbox_id: str
    # Next output offset: everything before it has been received (re-attach from here).
    offset: int
    exit: Optional[ShellExit]
    close_code: Optional[int]
    close_reason: str
    # Bytes dropped from the read() buffer because nobody read them, and bytes the server
    # reported lost from the session's own ring (pty "lost" frames).
    dropped_bytes: int
    lost_bytes: int

    def __init__(self) -> None:
        self.session = ""
        self.mode = "command"
        self.sandbox_id = ""
        self.offset = 0
        self.exit = None
        self.close_code = None
        self.close_reason = ""
        self.dropped_bytes = 0
        self.lost_bytes = 0
        self._ws: Optional[WebSocketClientProtocol] = None
        self._reader: Optional["asyncio.Task[None]"] = None
        self._active: Optional[_Run] = None
        self._lock = asyncio.Lock()
        self._next_id = 1
        self._id_prefix = "c" + os.urandom(4).hex() + "-"
        self._replay_end = 0
        self._on_output: Optional[OutputCallback] = None
        self._buffer: Deque[ShellOutput] = deque()
        self._buffer_bytes = 0
        self._buffering = False
        self._data_event = asyncio.Event()
        self._closed = asyncio.Event()
        self._pongs: Dict[str, "asyncio.Future[None]"] = {}
        self._url = ""
        self._headers: Dict[str, str] = {}
        self._connect_timeout = 30.0
        self._reconnect = True
        self._reconnect_window = 15.0
        # detach() or close() was called: the socket's end is ours
        self._ending = False
        # set while a socket is open; cleared while the session is being attached again
        self._live = asyncio.Event()
        # times the session was attached again after a lost connection
        self.reconnects = 0
        # numbered input (docs/shell-protocol.md, "Lost connections"): this client's writer name,
        # and what the gateway has not acknowledged, sent again on a new connection
        self._writer = base64.urlsafe_b64encode(os.urandom(12)).decode("ascii")
        self._seq = 0
        self._unacked: Deque[Tuple[int, str]] = deque()
        self._unacked_bytes = 0
        # the socket is up and what was not acknowledged has been sent again on it
        self._input_up = False

    # ---- connecting

    @classmethod
    async def connect(
        cls,
        http_url: str,
        sandbox_id: str,
        token: Optional[str],
        query: List[Tuple[str, str]],
        *,
        connect_timeout: float = 30.0,
        on_output: Optional[OutputCallback] = None,
        reconnect: bool = True,
        reconnect_window: float = 15.0,
    ) -> "AsyncShellSession":
        """``reconnect``: attach again by itself when the connection breaks (no close frame, the
        gateway going away, the gateway losing the session's node), from the last offset
        received, and resume the command in flight: it runs exactly once (docs/shell-protocol.md,
        "Lost connections"). Tried for ``reconnect_window`` seconds."""
        from urllib.parse import quote

        self = cls()
        self.sandbox_id = sandbox_id
        self._on_output = on_output
        self._url = f"{_ws_url(http_url)}/v1/sandboxes/{quote(sandbox_id, safe='')}/shell"
        self._headers = {"authorization": f"Bearer {token}"} if token else {}
        self._connect_timeout = connect_timeout
        self._reconnect = reconnect
        self._reconnect_window = reconnect_window
        if reconnect:
            query = [*query, ("writer", self._writer)]
        hello = await self._open(query)
        self._input_up = True
        self.session = str(hello.get("session", ""))
        self.mode = "pty" if hello.get("mode") == "pty" else "command"
        self.offset = int(hello.get("offset") or 0)
        self._replay_end = int(hello.get("liveOffset") or self.offset)
        self._buffering = self.mode == "pty"
        self._reader = asyncio.get_running_loop().create_task(self._read_loop())
        return self

    async def _open(self, query: List[Tuple[str, str]]) -> Dict[str, Any]:
        """One socket, up to its hello (which is returned); it becomes this session's socket."""
        from urllib.parse import urlencode

        url = self._url + ("?" + urlencode(query) if query else "")
        connect_timeout = self._connect_timeout
        try:
            ws = await websockets.connect(  # type: ignore[attr-defined]
                url,
                create_protocol=_ErrorBodyProtocol,
                extra_headers=self._headers,
                open_timeout=connect_timeout,
                compression=None,
                max_size=64 * 1024 * 1024,
                # The gateway pings idle connections itself; the library answers them.
                ping_interval=None,
                close_timeout=5.0,
            )
        except WarrenError:
            raise
        except asyncio.TimeoutError:
            raise WarrenTimeoutError("TIMEOUT", f"shell handshake with {self._url} did not finish in {connect_timeout}s") from None
        except (OSError, websockets.exceptions.WebSocketException) as e:
            raise UnavailableError("UNAVAILABLE", f"shell connection to {self._url} failed: {type(e).__name__} {e}") from None
        try:
            first = await asyncio.wait_for(ws.recv(), connect_timeout)
            hello = json.loads(first) if isinstance(first, str) else None
        except asyncio.TimeoutError:
            await ws.close()
            raise WarrenTimeoutError("TIMEOUT", "shell: no hello from the server in time") from None
        except (websockets.exceptions.ConnectionClosed, ValueError) as e:
            await ws.close()
            raise UnavailableError("UNAVAILABLE", f"shell closed during the handshake: {e}") from None
        except BaseException:
            ws.transport.abort()
            raise
        if not isinstance(hello, dict) or hello.get("type") != "hello":
            await ws.close()
            if isinstance(hello, dict) and hello.get("type") == "error":
                raise error_from_code(str(hello.get("code", "INTERNAL")), str(hello.get("message", "")))
            raise WarrenError("INTERNAL", f"shell: expected hello, got {first!r:.200}")
        self._ws = ws
        self._live.set()
        return hello

    def _resumable(self, code: Optional[int]) -> bool:
        return self._reconnect and not self._ending and self.exit is None and self.session != "" and code in RESUMABLE_CLOSE

    async def _reattach(self) -> bool:
        """Attach to the same session again from the last offset received, and send the command
        in flight again. False when the session cannot be reached within the window."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._reconnect_window
        delay = 0.05
        while not self._ending:
            start = self.offset
            try:
                await self._open([("mode", self.mode), ("session", self.session), ("offset", str(start)), ("writer", self._writer)])
            except (UnavailableError, OSError):
                # unreachable for now (a gateway restarting, a network blip): try again
                if loop.time() + delay > deadline:
                    return False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                continue
            except WarrenError:
                # the session or the sandbox is gone, or this token may no longer attach
                return False
            if self._ending:
                await self._shutdown_socket()
                return False
            # output from where this client had got to is the command in flight's own
            self._replay_end = start
            self.reconnects += 1
            run = self._active
            if run is not None and not run.future.done() and run.sent:
                msg = dict(run.msg)
                if "idempotencyKey" not in msg:
                    msg["resume"] = True
                try:
                    assert self._ws is not None
                    await self._ws.send(json.dumps(msg, separators=(",", ":")))
                except websockets.exceptions.ConnectionClosed:
                    pass  # the reader sees this socket end too, and tries again
            # input the gateway has not acknowledged, in order, also what is written meanwhile
            # (acknowledgements are read by this task, so nothing leaves the queue here); the
            # gateway skips what it applied before the break
            i = 0
            while i < len(self._unacked):
                try:
                    assert self._ws is not None
                    await self._ws.send(self._unacked[i][1])
                except websockets.exceptions.ConnectionClosed:
                    break
                i += 1
            self._input_up = True
            return True
        return False

    # ---- reading

    async def _read_loop(self) -> None:
        ws = self._ws
        assert ws is not None
        try:
            while True:
                try:
                    async for msg in ws:
                        if isinstance(msg, bytes):
                            self._emit(ShellOutput("pty", self.offset, msg))
                            self.offset += len(msg)
                        else:
                            self._on_frame(msg)
                except websockets.exceptions.ConnectionClosed:
                    pass
                self._live.clear()
                self._input_up = False
                if not self._resumable(ws.close_code) or not await self._reattach():
                    break
                assert self._ws is not None
                ws = self._ws
        except Exception as e:  # pragma: no cover - a bug here must not hang runs
            self._fail_active(WarrenError("INTERNAL", f"shell reader failed: {e!r}"))
        finally:
            self.close_code = ws.close_code
            self.close_reason = ws.close_reason or ""
            self._fail_active(self._closed_error())
            for f in self._pongs.values():
                if not f.done():
                    f.set_exception(self._closed_error())
            self._closed.set()
            self._data_event.set()

    def _closed_error(self) -> WarrenError:
        code, reason = self.close_code, self.close_reason
        if code == 4429:
            return BackpressureError("RESOURCE_EXHAUSTED", f"shell dropped for back-pressure: {reason}; re-attach with session and offset")
        if code == 1000 and self.exit is not None:
            return UnavailableError("UNAVAILABLE", f"the shell session ended (exit code {self.exit.exit_code}, signal {self.exit.signal})")
        return UnavailableError("UNAVAILABLE", f"shell connection closed ({code}{' ' + reason if reason else ''}); the session may still run: re-attach by id")

    def _fail_active(self, err: WarrenError) -> None:
        run = self._active
        if run is not None and not run.future.done():
            run.future.set_exception(err)

    def _emit(self, out: ShellOutput) -> None:
        if self._on_output is not None:
            self._on_output(out)
        if self._buffering:
            self._buffer.append(out)
            self._buffer_bytes += len(out.data)
            while self._buffer_bytes > READ_BUFFER_BYTES and self._buffer:
                old = self._buffer.popleft()
                self._buffer_bytes -= len(old.data)
                self.dropped_bytes += len(old.data)
            self._data_event.set()

    def _on_frame(self, text: str) -> None:
        try:
            m = json.loads(text)
        except ValueError:
            return
        if not isinstance(m, dict):
            return
        t = m.get("type")
        if t == "output":
            raw = str(m.get("data", ""))
            data = base64.b64decode(raw) if m.get("encoding") == "base64" else raw.encode("utf-8")
            stream = "stderr" if m.get("stream") == "stderr" else "stdout"
            off = int(m.get("offset", self.offset))
            self.offset = max(self.offset, off + len(data))
            out = ShellOutput(stream, off, data)  # type: ignore[arg-type]
            run = self._active
            # Replayed output belongs to commands from before this attachment, not to a new run.
            if run is not None and off >= self._replay_end and not run.future.done():
                (run.stderr if stream == "stderr" else run.stdout).append(data)
                if run.on_output is not None:
                    run.on_output(out)
            self._emit(out)
        elif t == "done":
            done_off = m.get("offset")
            if isinstance(done_off, int) and done_off > self.offset:
                self.offset = done_off
            run = self._active
            if run is not None and run.id == str(m.get("id")) and not run.future.done():
                if m.get("replayed") is True:
                    # The first run's result, stored by the gateway (docs/idempotency.md).
                    b64 = m.get("encoding") == "base64"
                    texts = [str(m.get(k, "")) for k in ("stdout", "stderr")]
                    stdout, stderr = (base64.b64decode(x).decode("utf-8", "replace") if b64 else x for x in texts)
                else:
                    stdout = b"".join(run.stdout).decode("utf-8", "replace")
                    stderr = b"".join(run.stderr).decode("utf-8", "replace")
                run.future.set_result(
                    CommandResult(
                        exit_code=m.get("exitCode"),
                        stdout=stdout,
                        stderr=stderr,
                        timed_out=bool(m.get("timedOut")),
                        offset=self.offset,
                        replayed=m.get("replayed") is True,
                    )
                )
        elif t == "exit":
            self.exit = ShellExit(m.get("exitCode"), m.get("signal"))
        elif t == "error":
            err = error_from_code(str(m.get("code", "INTERNAL")), str(m.get("message", "")))
            run = self._active
            if m.get("id") is not None and run is not None and run.id == str(m.get("id")) and not run.future.done():
                run.future.set_exception(err)
        elif t == "lost":
            lost_off = m.get("offset")
            if isinstance(lost_off, int) and lost_off > self.offset:
                self.offset = lost_off
            self.lost_bytes += int(m.get("bytes") or 0)
        elif t == "pong":
            f = self._pongs.pop(str(m.get("id")), None)
            if f is not None and not f.done():
                f.set_result(None)
        elif t == "ack":
            up_to = m.get("seq")
            if isinstance(up_to, int):
                while self._unacked and self._unacked[0][0] <= up_to:
                    self._unacked_bytes -= len(self._unacked.popleft()[1])

    # ---- sending

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def _send(self, obj: Union[Mapping[str, Any], bytes], run: Optional[_Run] = None) -> None:
        """Send on the live connection, waiting for a re-attach in progress. With ``run``, a
        connection that breaks under the send is not an error: the re-attach sends the run again,
        or fails it when the session cannot be reached."""
        if not self._live.is_set() and not self._closed.is_set():
            # being attached again: what is sent goes on the new connection
            closed = asyncio.ensure_future(self._closed.wait())
            live = asyncio.ensure_future(self._live.wait())
            try:
                await asyncio.wait({closed, live}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                closed.cancel()
                live.cancel()
        ws = self._ws
        if ws is None or self._closed.is_set():
            raise UnavailableError("UNAVAILABLE", "shell connection is closed")
        if run is not None:
            run.sent = True
        try:
            await ws.send(obj if isinstance(obj, bytes) else json.dumps(obj, separators=(",", ":")))
        except websockets.exceptions.ConnectionClosed:
            if run is not None and self._reconnect:
                return
            raise self._closed_error() from None

    async def run(
        self, cmd: Cmd, *, timeout: Optional[float] = None, on_output: Optional[OutputCallback] = None, idempotency_key: Optional[str] = None
    ) -> CommandResult:
        """Run one command in the session's shell (cwd, variables, functions persist between
        runs). ``timeout`` (seconds) is enforced by the server, which kills the command and
        answers ``timed_out=True``. Runs are queued one at a time. Cancelling the calling task
        kills the command (the session stays usable).

        ``idempotency_key`` (docs/idempotency.md): the command runs once per key in this session;
        after a lost connection, re-attach (``session=``, ``offset=``) and run it again with the
        same key to get the first run's result (``replayed=True``), also across a gateway restart."""
        text = shell_command(cmd)
        msg: Dict[str, Any] = {"type": "run", "cmd": text}
        if idempotency_key is not None:
            from ._wire import check_idempotency_key

            msg["idempotencyKey"] = check_idempotency_key(idempotency_key)
        if timeout is not None:
            from ._wire import seconds_to_ms

            msg["timeoutMs"] = seconds_to_ms(timeout, "timeout")
        wait = (timeout if timeout is not None else RUN_WAIT_DEFAULT) + RUN_GRACE
        async with self._lock:
            # Ids are unique per attachment: a replayed "done" of an earlier attachment's command
            # (ids restart there too) must never complete this one.
            rid = f"{self._id_prefix}{self._next_id}"
            self._next_id += 1
            msg["id"] = rid
            run = _Run(rid, asyncio.get_running_loop().create_future(), on_output, msg)
            self._active = run
            try:
                await self._send(msg, run)
                # shield: a timeout or a cancellation must not cancel the future the reader
                # completes; _abort waits on it for the killed command's end.
                async with _timeout(wait):
                    return await asyncio.shield(run.future)
            except asyncio.TimeoutError:
                await self._abort(run)
                raise WarrenTimeoutError("TIMEOUT", f"no answer for command {rid} within {wait:.0f}s; it was killed") from None
            except asyncio.CancelledError:
                await self._abort(run)
                raise
            finally:
                if self._active is run:
                    self._active = None
                if run.future.done() and not run.future.cancelled():
                    run.future.exception()  # mark retrieved

    async def _abort(self, run: _Run) -> None:
        """Kill an abandoned command and wait (bounded) for its done, so the next run finds the
        shell idle instead of SESSION_BUSY."""
        # The caller has gone: its callback gets nothing more (the kill's own messages included).
        run.on_output = None
        if run.future.done() or self._closed.is_set():
            return
        try:
            await self._send({"type": "signal", "signal": "KILL"})
            await asyncio.wait({run.future}, timeout=ABORT_WAIT)
        except (WarrenError, asyncio.CancelledError):
            pass

    async def _send_input(self, obj: Dict[str, Any]) -> None:
        """Numbered input: kept until the gateway acknowledges it, sent now if the connection is up,
        else when it is made again (exactly once either way). Without reconnect, sent as it is."""
        if not self._reconnect:
            await self._send(obj)
            return
        if self._closed.is_set():
            raise UnavailableError("UNAVAILABLE", "shell connection is closed")
        text = json.dumps({**obj, "seq": self._seq + 1}, separators=(",", ":"))
        if self._unacked_bytes + len(text) > UNACKED_MAX_BYTES:
            raise UnavailableError("UNAVAILABLE", f"shell connection: {self._unacked_bytes} bytes of input wait for the gateway to take them")
        self._seq += 1
        self._unacked.append((self._seq, text))
        self._unacked_bytes += len(text)
        ws = self._ws
        if self._input_up and ws is not None:
            try:
                await ws.send(text)
            except websockets.exceptions.ConnectionClosed:
                pass  # kept: sent again once the session is attached again

    async def write(self, data: Union[str, bytes]) -> None:
        """pty mode: raw bytes to the terminal (keystrokes, pastes)."""
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if not self._reconnect:
            await self._send(raw)
            return
        await self._send_input({"type": "input", "data": base64.b64encode(raw).decode("ascii"), "encoding": "base64"})

    async def read(self, timeout: Optional[float] = None) -> Optional[ShellOutput]:
        """Next chunk of output (pty mode, or any mode once called), None once closed and drained.
        Raises WarrenTimeoutError after ``timeout`` seconds without output."""
        self._buffering = True
        while not self._buffer:
            if self._closed.is_set():
                return None
            self._data_event.clear()
            try:
                await asyncio.wait_for(self._data_event.wait(), timeout)
            except asyncio.TimeoutError:
                raise WarrenTimeoutError("TIMEOUT", f"no shell output within {timeout}s") from None
        out = self._buffer.popleft()
        self._buffer_bytes -= len(out.data)
        return out

    async def read_until(self, marker: Union[str, bytes], timeout: float = 30.0) -> bytes:
        """Read output until ``marker`` appears; returns everything read (marker included)."""
        want = marker.encode("utf-8") if isinstance(marker, str) else marker
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        got = bytearray()
        while want not in got:
            left = end - loop.time()
            if left <= 0:
                raise WarrenTimeoutError("TIMEOUT", f"{want!r} not seen within {timeout}s (got {bytes(got[-200:])!r})")
            out = await self.read(timeout=left)
            if out is None:
                raise UnavailableError("UNAVAILABLE", f"shell closed before {want!r} was seen (got {bytes(got[-200:])!r})")
            got += out.data
        return bytes(got)

    async def resize(self, cols: int, rows: int) -> None:
        from ._wire import TERMINAL_RANGE, check_int

        await self._send_input({"type": "resize", "cols": check_int(cols, "cols", *TERMINAL_RANGE), "rows": check_int(rows, "rows", *TERMINAL_RANGE)})

    async def signal(self, sig: Union[str, int] = "INT") -> None:
        """pty: the terminal's foreground process group; command mode: the running command."""
        await self._send_input({"type": "signal", "signal": check_signal(sig)})

    async def ping(self, timeout: float = 10.0) -> float:
        """Round trip of a protocol ping, in seconds."""
        loop = asyncio.get_running_loop()
        pid = f"p{self._next_id}"
        self._next_id += 1
        fut: "asyncio.Future[None]" = loop.create_future()
        self._pongs[pid] = fut
        t0 = loop.time()
        try:
            await self._send({"type": "ping", "id": pid})
            await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise WarrenTimeoutError("TIMEOUT", f"no pong within {timeout}s") from None
        finally:
            self._pongs.pop(pid, None)
        return loop.time() - t0

    async def close(self, timeout: float = 10.0) -> Optional[ShellExit]:
        """End the session (its shell is killed) and wait for the socket to close."""
        self._ending = True
        if not self._closed.is_set():
            try:
                await self._send({"type": "close"})
                await asyncio.wait_for(asyncio.shield(self._closed.wait()), timeout)
            except (WarrenError, asyncio.TimeoutError):
                pass
        await self._shutdown()
        return self.exit

    async def detach(self) -> None:
        """Drop this connection only; the session keeps running (re-attach with session, offset)."""
        self._ending = True
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._ending = True
        await self._shutdown_socket()
        if self._reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._reader), 5.0)
            except (asyncio.TimeoutError, Exception):
                self._reader.cancel()

    async def _shutdown_socket(self) -> None:
        ws = self._ws
        if ws is not None:
            try:
                await asyncio.shield(ws.close(1000, "detach"))
            except asyncio.CancelledError:
                ws.transport.abort()
                raise
            except Exception:
                ws.transport.abort()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def __aenter__(self) -> "AsyncShellSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
