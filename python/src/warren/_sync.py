"""The sync client: :class:`Client`, :class:`Sandbox` and the API namespaces.

Mirrors :mod:`warren._async` name for name (there every method is awaited). Both build their
requests with :mod:`warren._wire`, so the two cannot drift in what they send. HTTP goes through
httpx's sync client; shell sessions (a WebSocket that must be read while the caller does other
things) run the asyncio implementation on a private event loop thread, started on the first
``shell()`` and stopped by ``close()``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
import io
import json
import os
import tarfile
import time
from typing import Any, Callable, Coroutine, Dict, List, Mapping, Optional, Sequence, TypeVar, Union, cast
from urllib.parse import quote

from . import _wire as w
from ._errors import NotFoundError, UnavailableError, WarrenError, bad_input, error_from_code
from ._http import SyncTransport, decode_json
from ._models import (
    AccountInfo,
    BatchItem,
    CommandResult,
    EnvironmentInfo,
    ExecResult,
    FeatureReport,
    FileEntry,
    Health,
    ImageInfo,
    ImportProgress,
    InvokeResult,
    JudgeResult,
    NetworkInfo,
    NewAccount,
    PackResult,
    PauseResult,
    PoolStats,
    QuotaInfo,
    ResumeResult,
    RunCodeResponse,
    SandboxInfo,
    SandboxState,
    SessionInfo,
    ShellExit,
    ShellOutput,
    batch_items,
)
from ._config import resolve
from ._shell import AsyncShellSession, OutputCallback
from ._async import _build_body, _extend_body, _image_path, _import_body, _invoke_from, _prefixed, _ProgressState, _tar_dir

ProgressCallback = Callable[[ImportProgress], None]


T = TypeVar("T")


class _Portal:
    """A private event loop in a daemon thread, for the sync shell sessions of one Client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self.sessions: "weakref.WeakSet[AsyncShellSession]" = weakref.WeakSet()

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                t = threading.Thread(target=loop.run_forever, name="warren-shell-loop", daemon=True)
                t.start()
                self._loop, self._thread = loop, t
            return self._loop

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait. If the caller is interrupted (KeyboardInterrupt),
        the coroutine is cancelled and its cleanup awaited before the interrupt propagates."""
        loop = self._get_loop()
        finished = threading.Event()

        async def wrapped() -> T:
            try:
                return await coro
            finally:
                finished.set()

        fut = asyncio.run_coroutine_threadsafe(wrapped(), loop)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise asyncio.CancelledError() from None
        except BaseException:
            if not fut.done():
                fut.cancel()
                finished.wait(30.0)
            raise

    def close(self) -> None:
        with self._lock:
            loop, t = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or t is None:
            return
        sessions = list(self.sessions)

        async def drain() -> None:
            # Detach what is still attached (the sessions keep running and can be re-attached),
            # then let every remaining task end before the loop goes away.
            await asyncio.gather(*(s.detach() for s in sessions), return_exceptions=True)
            me = asyncio.current_task()
            rest = [x for x in asyncio.all_tasks() if x is not me]
            for x in rest:
                x.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(drain(), loop).result(15.0)
        except Exception:
            pass
        loop.call_soon_threadsafe(loop.stop)
        t.join(10.0)
        if not t.is_alive():
            loop.close()


class Client:
    """``Client(url=..., token=...)``; url and token default as the CLI finds them
    (``WARREN_URL``, ``WARREN_TOKEN``, ``<data_dir>/admin.token``).

    ``connections`` bounds the keep-alive pool and so the requests in flight (more wait for a
    connection, within their own deadline); ``retries`` bounds the retries of the safe cases
    (see :mod:`warren._http`); ``timeout`` (seconds) is the deadline of calls that have no
    longer one of their own (exec waits its command's timeout plus a minute, judge an hour)."""

    url: str
    functions: "Functions"
    images: "Images"

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *, data_dir: Optional[str] = None, connections: int = 64, retries: int = 3, timeout: float = w.DEFAULT_TIMEOUT) -> None:
        self.url, self._token = resolve(url, token, data_dir)
        self._t = SyncTransport(self.url, self._token, connections, retries, w.check_number(timeout, "timeout", 0.001))
        self._portal = _Portal()
        self.functions = Functions(self)
        self.images = Images(self)

    @property
    def token(self) -> Optional[str]:
        return self._token

    def _json(self, call: w.Call) -> Any:
        return decode_json(self._t.send(call))

    # ---- system and accounts

    def health(self) -> Health:
        return cast(Health, self._json(w.Call("GET", "/v1/health", idempotent=True)))

    def features(self) -> FeatureReport:
        return cast(FeatureReport, self._json(w.Call("GET", "/v1/features", idempotent=True)))

    def whoami(self) -> AccountInfo:
        return cast(AccountInfo, self._json(w.Call("GET", "/v1/accounts/me", idempotent=True)))

    def create_account(self, name: str, role: str = "runtime") -> NewAccount:
        body = {"name": name, "role": w.check_choice(role, "role", ("admin", "builder", "runtime"))}
        return cast(NewAccount, self._json(w.Call("POST", "/v1/accounts", json=body)))

    def list_accounts(self) -> List[AccountInfo]:
        return cast(List[AccountInfo], (self._json(w.Call("GET", "/v1/accounts", idempotent=True)))["accounts"])

    def quota(self, account: str = "me") -> QuotaInfo:
        return cast(QuotaInfo, self._json(w.Call("GET", f"/v1/accounts/{quote(account, safe='')}/quota", idempotent=True)))

    def set_quota(self, account: str, **quota: Optional[float]) -> QuotaInfo:
        """Admin: ``set_quota(id, max_sandboxes=10, max_cpu=None, max_memory_mb=4096)`` (None = unlimited)."""
        names = {"max_sandboxes": "maxSandboxes", "max_cpu": "maxCpu", "max_memory_mb": "maxMemoryMb"}
        body = {names[k] if k in names else k: v for k, v in quota.items()}
        return cast(QuotaInfo, self._json(w.Call("PUT", f"/v1/accounts/{quote(account, safe='')}/quota", json=body)))

    # ---- sandboxes

    def create_sandbox(
        self,
        image: Optional[str] = None,
        *,
        backend: Optional[str] = None,
        workspaces: Optional[Sequence[str]] = None,
        toolkits: Optional[Sequence[str]] = None,
        cpu: Optional[float] = None,
        memory_mb: Optional[int] = None,
        pids: Optional[int] = None,
        disk_mb: Optional[int] = None,
        ttl_seconds: Optional[int] = None,
        idle_seconds: Optional[int] = None,
        on_idle: Optional[str] = None,
        network: Optional[Mapping[str, bool]] = None,
        priority: Optional[str] = None,
        user: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        labels: Optional[Mapping[str, str]] = None,
    ) -> "Sandbox":
        """Create a sandbox (every field of ``POST /v1/sandboxes``). Use it as
        ``with client.create_sandbox(...) as sb:`` to delete it on exit."""
        body = w.create_sandbox_body(
            image=image, backend=backend, workspaces=workspaces, toolkits=toolkits, cpu=cpu, memory_mb=memory_mb,
            pids=pids, disk_mb=disk_mb, ttl_seconds=ttl_seconds, idle_seconds=idle_seconds, on_idle=on_idle,
            network=network, priority=priority, user=user, env=env, labels=labels,
        )
        info = self._json(w.Call("POST", "/v1/sandboxes", json=body))
        return Sandbox(self, cast(SandboxInfo, info))

    def get_sandbox(self, sandbox_id: str) -> "Sandbox":
        info = self._json(w.Call("GET", w.sandbox_path(sandbox_id), idempotent=True))
        return Sandbox(self, cast(SandboxInfo, info))

    def sandbox(self, sandbox_id: str) -> "Sandbox":
        """A handle for an existing sandbox id, without a request."""
        return Sandbox(self, None, w.check_sandbox_id(sandbox_id))

    def list_sandboxes(self, labels: Optional[Mapping[str, str]] = None, owner: Optional[str] = None) -> List[SandboxInfo]:
        q = w.labels_query(labels) + ([("owner", owner)] if owner is not None else [])
        return cast(List[SandboxInfo], (self._json(w.Call("GET", "/v1/sandboxes", query=q, idempotent=True)))["sandboxes"])

    def delete_sandbox(self, sandbox_id: str, *, missing_ok: bool = False) -> None:
        try:
            self._json(w.Call("DELETE", w.sandbox_path(sandbox_id)))
        except NotFoundError:
            if not missing_ok:
                raise

    def pause_sandboxes(self, labels: Mapping[str, str], owner: Optional[str] = None) -> List[PauseResult]:
        """Pause every sandbox whose labels all match (a job, for preemption)."""
        q = w.labels_query(labels) + ([("owner", owner)] if owner is not None else [])
        if not labels:
            raise bad_input("INVALID_ARGUMENT", "a label selector is required", "labels")
        return cast(List[PauseResult], (self._json(w.Call("POST", "/v1/sandboxes/pause", query=q)))["sandboxes"])

    def resume_sandboxes(self, labels: Mapping[str, str], owner: Optional[str] = None) -> List[ResumeResult]:
        q = w.labels_query(labels) + ([("owner", owner)] if owner is not None else [])
        if not labels:
            raise bad_input("INVALID_ARGUMENT", "a label selector is required", "labels")
        return cast(List[ResumeResult], (self._json(w.Call("POST", "/v1/sandboxes/resume", query=q)))["sandboxes"])

    # ---- environments (pack_diff results, docs/lifecycle.md)

    def list_environments(self) -> List[EnvironmentInfo]:
        return cast(List[EnvironmentInfo], (self._json(w.Call("GET", "/v1/environments", idempotent=True)))["environments"])

    def publish_environment(self, name: str, published: bool = True) -> EnvironmentInfo:
        path = f"/v1/environments/{quote(w.check_ref(name, 'name'), safe='')}/{'publish' if published else 'unpublish'}"
        return cast(EnvironmentInfo, self._json(w.Call("POST", path)))

    # ---- lifetime

    def close(self) -> None:
        self._t.close()
        self._portal.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox:
    """A sandbox. ``with sb:`` deletes it on exit, also on exceptions (KeyboardInterrupt included)."""

    id: str
    info: Optional[SandboxInfo]

    def __init__(self, client: Client, info: Optional[SandboxInfo], sandbox_id: Optional[str] = None) -> None:
        self._c = client
        self.info = info
        self.id = info["id"] if info is not None else cast(str, sandbox_id)

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, state={self.state!r})"

    @property
    def state(self) -> Optional[SandboxState]:
        return self.info["state"] if self.info is not None else None

    def _path(self, suffix: str = "") -> str:
        return w.sandbox_path(self.id, suffix)

    def refresh(self) -> SandboxInfo:
        self.info = cast(SandboxInfo, self._c._json(w.Call("GET", self._path(), idempotent=True)))
        return self.info

    def exec(
        self,
        cmd: w.Cmd,
        *,
        stdin: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        timeout: Optional[float] = None,
        user: Optional[str] = None,
        max_output_bytes: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        retry_for: float = 120.0,
    ) -> ExecResult:
        """Run a command to completion (a string runs through ``/bin/sh -c``; a list is argv).

        ``idempotency_key``: a client request id (docs/idempotency.md). The gateway runs the
        command at most once per key and sandbox within its window; sending it again returns the
        first run's result (waiting for it while it runs). With a key, a lost connection or an
        unreachable gateway is retried for up to ``retry_for`` seconds."""
        call = w.exec_call(
            self.id, cmd, stdin=stdin, env=env, cwd=cwd, timeout=timeout, user=user, max_output_bytes=max_output_bytes, idempotency_key=idempotency_key
        )
        if idempotency_key is None:
            return ExecResult.from_json(self._c._json(call))
        deadline = time.monotonic() + w.check_number(retry_for, "retry_for", 0)
        delay = 0.1
        while True:
            try:
                return ExecResult.from_json(self._c._json(call))
            except UnavailableError:
                if time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def exec_stream(
        self,
        cmd: w.Cmd,
        on_output: OutputCallback,
        *,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> CommandResult:
        """Run a command with its output streamed to ``on_output`` as it is produced (through a
        short-lived command-mode shell session, closed afterwards). ``on_output`` is called
        on the client's shell thread."""
        text = _prefixed(cmd, cwd, env)
        with self.shell() as sh:
            return sh.run(text, timeout=timeout, on_output=on_output)

    # ---- computer use (vm backend)

    def screenshot(self, width: Optional[int] = None) -> bytes:
        """The current screen as PNG, scaled down to ``width`` pixels wide when given."""
        q = [] if width is None else [("width", str(int(width)))]
        res = self._c._t.send(w.Call("GET", self._path("/screen"), query=q, idempotent=True))
        return res.content

    def input(self, actions: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Keyboard and pointer actions at the hypervisor level, e.g.
        ``[{"type": "click", "x": 10, "y": 20}, {"type": "type", "text": "ls\\n"}]`` (docs/vm.md)."""
        return cast(Dict[str, Any], self._c._json(w.Call("POST", self._path("/input"), json={"actions": list(actions)})))

    # ---- files

    def read_file(self, path: str) -> bytes:
        res = self._c._t.send(w.Call("GET", self._path("/files"), query=[("path", w.check_path(path))], idempotent=True))
        return res.content

    def write_file(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> None:
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        q = [("path", w.check_path(path))] + w.file_mode_query(mode)
        self._c._json(w.Call("PUT", self._path("/files"), query=q, content=content))

    def list_dir(self, path: str = "/") -> List[FileEntry]:
        r = self._c._json(w.Call("GET", self._path("/files/list"), query=[("path", w.check_path(path))], idempotent=True))
        return cast(List[FileEntry], r["entries"])

    def upload_tar(self, directory: str, tar: bytes) -> Dict[str, Any]:
        """Extract a tar archive into ``directory`` (entries escaping it are refused)."""
        call = w.Call("PUT", self._path("/files/archive"), query=[("path", w.check_path(directory, "directory"))], content=bytes(tar))
        return cast(Dict[str, Any], self._c._json(call))

    def upload_dir(self, local_dir: str, directory: str) -> Dict[str, Any]:
        """Upload a local directory's contents into ``directory`` (tarred in memory)."""
        return self.upload_tar(directory, _tar_dir(local_dir))

    def download_tar(self, path: str) -> bytes:
        """A tar archive of ``path`` (file or directory) inside the sandbox."""
        res = self._c._t.send(w.Call("GET", self._path("/files/archive"), query=[("path", w.check_path(path))], idempotent=True))
        return res.content

    def download_tar_to(self, path: str, out: "io.RawIOBase | io.BufferedIOBase | Any") -> int:
        """Stream the archive of ``path`` into a writable binary file; returns the bytes written.
        A broken stream raises (the server aborts the connection rather than end it early)."""
        n = 0
        with self._c._t.stream(w.Call("GET", self._path("/files/archive"), query=[("path", w.check_path(path))], idempotent=True)) as res:
            for chunk in res.iter_bytes():
                out.write(chunk)
                n += len(chunk)
        return n

    # ---- shell sessions

    def sessions(self) -> List[SessionInfo]:
        return cast(List[SessionInfo], (self._c._json(w.Call("GET", self._path("/sessions"), idempotent=True)))["sessions"])

    def shell(
        self,
        mode: Optional[str] = None,
        *,
        session: Optional[str] = None,
        offset: Optional[int] = None,
        cols: Optional[int] = None,
        rows: Optional[int] = None,
        connect_timeout: float = 30.0,
        on_output: Optional[OutputCallback] = None,
        reconnect: bool = True,
        reconnect_window: float = 15.0,
    ) -> "ShellSession":
        """Open a shell session (``mode``: ``"command"`` default, or ``"pty"``), or with ``session``
        re-attach to one, replaying its output from ``offset`` (default: all still buffered).
        ``reconnect``: attach again by itself after a lost connection (trying for
        ``reconnect_window`` seconds) and resume the command in flight (docs/shell-protocol.md,
        "Lost connections")."""
        q = w.shell_query(mode, session, offset, cols, rows)
        portal = self._c._portal
        inner = portal.call(AsyncShellSession.connect(self._c.url, self.id, self._c.token, q, connect_timeout=connect_timeout, on_output=on_output, reconnect=reconnect, reconnect_window=reconnect_window))
        portal.sessions.add(inner)
        return ShellSession(inner, portal)

    # ---- lifecycle

    def delete(self, *, missing_ok: bool = True) -> None:
        self._c.delete_sandbox(self.id, missing_ok=missing_ok)

    def pause(self) -> PauseResult:
        return cast(PauseResult, self._c._json(w.Call("POST", self._path("/pause"))))

    def resume(self) -> ResumeResult:
        return cast(ResumeResult, self._c._json(w.Call("POST", self._path("/resume"))))

    def hibernate(self) -> PauseResult:
        return cast(PauseResult, self._c._json(w.Call("POST", self._path("/hibernate"))))

    def extend(self, *, seconds: Optional[int] = None, ttl_seconds: Optional[int] = None) -> SandboxInfo:
        self.info = cast(SandboxInfo, self._c._json(w.Call("POST", self._path("/extend"), json=_extend_body(seconds, ttl_seconds))))
        return self.info

    def pack(self, name: str, *, scrub: Optional[Sequence[str]] = None, publish: Optional[bool] = None, squash: Optional[bool] = None, compression: Optional[str] = None) -> PackResult:
        """pack_diff: this sandbox's changes (scrubbed) become environment ``name``."""
        body = w.pack_body(name, scrub, publish, squash, compression)
        return cast(PackResult, self._c._json(w.Call("POST", self._path("/pack"), json=body, timeout=w.PACK_TIMEOUT)))

    def network(self) -> NetworkInfo:
        return cast(NetworkInfo, self._c._json(w.Call("GET", self._path("/network"), idempotent=True)))

    def set_network(self, change: Mapping[str, bool]) -> NetworkInfo:
        """Enable (True) / disable (False) services while the sandbox runs; atomic in the kernel."""
        return cast(NetworkInfo, self._c._json(w.Call("PATCH", self._path("/network"), json=w.check_network(change))))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Deleted even when the body raised (KeyboardInterrupt included).
        try:
            self.delete()
        except WarrenError:
            if exc_type is None:
                raise


class Functions:
    """FnCall: ``client.functions`` (docs/fncall.md)."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> List[PoolStats]:
        return cast(List[PoolStats], (self._c._json(w.Call("GET", "/v1/functions", idempotent=True)))["pools"])

    def get(self, pool: str) -> PoolStats:
        return cast(PoolStats, self._c._json(w.Call("GET", w.function_path(pool), idempotent=True)))

    def create(
        self,
        name: str,
        *,
        image: Optional[str] = None,
        layers: Optional[Sequence[str]] = None,
        min: Optional[int] = None,
        max: Optional[int] = None,
        max_queue: Optional[int] = None,
        idle_seconds: Optional[int] = None,
        limits: Optional[Mapping[str, Any]] = None,
        wait: bool = False,
    ) -> PoolStats:
        """Create a pool; with ``wait``, answer once ``min`` containers are warm."""
        body = w.pool_body(name=name, image=image, layers=layers, min=min, max=max, max_queue=max_queue, idle_seconds=idle_seconds, limits=limits)
        call = w.Call("POST", "/v1/functions", json=body, query=[("wait", "1")] if wait else [], timeout=w.POOL_CREATE_TIMEOUT)
        return cast(PoolStats, self._c._json(call))

    def delete(self, pool: str, *, missing_ok: bool = False) -> None:
        try:
            self._c._json(w.Call("DELETE", w.function_path(pool)))
        except NotFoundError:
            if not missing_ok:
                raise

    def invoke(
        self,
        pool: str,
        code: Optional[str] = None,
        *,
        language: Optional[str] = None,
        cmd: Optional[w.Cmd] = None,
        files: Optional[Mapping[str, w.FileInput]] = None,
        stdin: Optional[Union[str, bytes]] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        cpu_time: Optional[float] = None,
        memory_mb: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        compile_timeout: Optional[float] = None,
        fetch_files: Optional[Sequence[str]] = None,
    ) -> InvokeResult:
        """Run code (with ``language``) or ``cmd`` in a warm container of ``pool``. Timeouts are
        seconds. A 429 (queue full, account at its concurrency) is retried after Retry-After."""
        body = w.invoke_body(
            code=code, language=language, cmd=cmd, files=files, stdin=stdin, env=env, timeout=timeout, cpu_time=cpu_time,
            memory_mb=memory_mb, max_output_bytes=max_output_bytes, compile_timeout=compile_timeout, fetch_files=fetch_files,
        )
        return InvokeResult.from_json(self._c._json(w.Call("POST", w.function_path(pool, "/invoke"), json=body, timeout=w.INVOKE_TIMEOUT)))

    def judge(
        self,
        pool: str,
        code: str,
        language: str,
        tests: Sequence[w.TestInput],
        *,
        checker: Optional[Union[str, Mapping[str, Any]]] = None,
        stop_on_first_failure: Optional[bool] = None,
        timeout: Optional[float] = None,
        cpu_time: Optional[float] = None,
        memory_mb: Optional[int] = None,
        max_output_bytes: Optional[int] = None,
        compile_timeout: Optional[float] = None,
    ) -> JudgeResult:
        """Compile once, run ``tests`` (``{"stdin", "expected"}``), check with ``checker``
        (``"exact"``, ``"tokens"``, ``"float(1e-6)"``)."""
        body = w.judge_body(
            code=code, language=language, tests=tests, checker=checker, stop_on_first_failure=stop_on_first_failure, timeout=timeout,
            cpu_time=cpu_time, memory_mb=memory_mb, max_output_bytes=max_output_bytes, compile_timeout=compile_timeout,
        )
        return JudgeResult.from_json(self._c._json(w.Call("POST", w.function_path(pool, "/judge"), json=body, timeout=w.JUDGE_TIMEOUT)))

    def batch(self, pool: str, invocations: Sequence[Mapping[str, Any]], *, concurrency: Optional[int] = None) -> List[BatchItem]:
        """Many invocations in one request (each a mapping of :meth:`invoke`'s keyword arguments);
        results in request order, a refused one as a WarrenError instance (not raised)."""
        body: Dict[str, Any] = {"invocations": [_invoke_from(i) for i in invocations]}
        if concurrency is not None:
            body["concurrency"] = w.check_int(concurrency, "concurrency", 1)
        return batch_items(self._c._json(w.Call("POST", w.function_path(pool, "/batch"), json=body, timeout=w.JUDGE_TIMEOUT)))

    def run_code(self, request: Mapping[str, Any]) -> RunCodeResponse:
        """SandboxFusion-compatible ``POST /run_code`` (its own request and response shapes)."""
        return cast(RunCodeResponse, self._c._json(w.Call("POST", "/run_code", json=dict(request), timeout=w.INVOKE_TIMEOUT)))


class Images:
    """Images: ``client.images``."""

    def __init__(self, client: Client) -> None:
        self._c = client

    def list(self) -> List[ImageInfo]:
        return cast(List[ImageInfo], (self._c._json(w.Call("GET", "/v1/images", idempotent=True)))["images"])

    def import_image(self, name: str, path: str, *, kind: Optional[str] = None, type: Optional[str] = None, on_progress: Optional[ProgressCallback] = None) -> ImageInfo:
        """Import a rootfs directory or OCI archive that lies on the gateway's host (admin)."""
        body = _import_body(name, path, kind, type)
        return self._post(body, on_progress)

    def build(self, name: str, *, suite: Optional[str] = None, include: Optional[Sequence[str]] = None, on_progress: Optional[ProgressCallback] = None) -> ImageInfo:
        """Build a Debian image with debootstrap."""
        return self._post(_build_body(name, suite, include), on_progress)

    def delete(self, name: str) -> Dict[str, Any]:
        """Remove an image and the layers no other image uses (ConflictError IMAGE_IN_USE while a
        sandbox uses it). Returns ``{"name", "removedLayers"}``."""
        return cast(Dict[str, Any], self._c._json(w.Call("DELETE", _image_path(name))))

    def _post(self, body: Dict[str, Any], on_progress: Optional[ProgressCallback]) -> ImageInfo:
        state = _ProgressState(on_progress)
        with self._c._t.stream(w.Call("POST", "/v1/images", json=body, timeout=w.IMAGE_TIMEOUT)) as res:
            for line in res.iter_lines():
                state.line(line)
        return state.result()



class ShellSession:
    """Sync face of :class:`warren.AsyncShellSession` (same methods, not awaited). Output
    callbacks run on the client's shell thread."""

    def __init__(self, inner: AsyncShellSession, portal: _Portal) -> None:
        self._s = inner
        self._p = portal

    def __repr__(self) -> str:
        return f"ShellSession({self.session!r}, mode={self.mode!r}, offset={self.offset})"

    @property
    def session(self) -> str:
        return self._s.session

    @property
    def mode(self) -> str:
        return self._s.mode

    @property
    def sandbox_id(self) -> str:
        return self._s.sandbox_id

    @property
    def offset(self) -> int:
        return self._s.offset

    @property
    def exit(self) -> Optional[ShellExit]:
        return self._s.exit

    @property
    def closed(self) -> bool:
        return self._s.closed

    @property
    def close_code(self) -> Optional[int]:
        return self._s.close_code

    @property
    def dropped_bytes(self) -> int:
        return self._s.dropped_bytes

    @property
    def reconnects(self) -> int:
        """Times the session was attached again by itself after a lost connection."""
        return self._s.reconnects

    @property
    def lost_bytes(self) -> int:
        return self._s.lost_bytes

    def run(self, cmd: w.Cmd, *, timeout: Optional[float] = None, on_output: Optional[OutputCallback] = None, idempotency_key: Optional[str] = None) -> CommandResult:
        return self._p.call(self._s.run(cmd, timeout=timeout, on_output=on_output, idempotency_key=idempotency_key))

    def write(self, data: Union[str, bytes]) -> None:
        self._p.call(self._s.write(data))

    def read(self, timeout: Optional[float] = None) -> Optional[ShellOutput]:
        return self._p.call(self._s.read(timeout))

    def read_until(self, marker: Union[str, bytes], timeout: float = 30.0) -> bytes:
        return self._p.call(self._s.read_until(marker, timeout))

    def resize(self, cols: int, rows: int) -> None:
        self._p.call(self._s.resize(cols, rows))

    def signal(self, sig: Union[str, int] = "INT") -> None:
        self._p.call(self._s.signal(sig))

    def ping(self, timeout: float = 10.0) -> float:
        return self._p.call(self._s.ping(timeout))

    def close(self, timeout: float = 10.0) -> Optional[ShellExit]:
        return self._p.call(self._s.close(timeout))

    def detach(self) -> None:
        self._p.call(self._s.detach())

    def wait_closed(self) -> None:
        self._p.call(self._s.wait_closed())

    def __enter__(self) -> "ShellSession":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
