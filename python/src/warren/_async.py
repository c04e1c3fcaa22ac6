"""The asyncio client: :class:`AsyncClient`, :class:`AsyncSandbox` and the API namespaces.

Mirrors :mod:`warren._sync` name for name (every method is awaited here). Both build their
requests with :mod:`warren._wire`, so the two cannot drift in what they send.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union, cast
from urllib.parse import quote

from . import _wire as w
from ._errors import NotFoundError, UnavailableError, WarrenError, bad_input, error_from_code
from ._http import AsyncTransport, decode_json
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
    ShellOutput,
    batch_items,
)
from ._config import resolve
from ._shell import AsyncShellSession, OutputCallback

ProgressCallback = Callable[[ImportProgress], None]


async def _settle(task: "asyncio.Future[Any]") -> bool:
    """Wait for ``task`` to end even if the caller is cancelled meanwhile (cleanup that must
    happen). Returns whether the caller was cancelled while waiting (the caller re-raises)."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:
            break
    return cancelled


class AsyncClient:
    """``AsyncClient(url=..., token=...)``; url and token default as the CLI finds them
    (``WARREN_URL``, ``WARREN_TOKEN``, ``<data_dir>/admin.token``).

    ``connections`` bounds the keep-alive pool and so the requests in flight (more wait for a
    connection, within their own deadline); ``retries`` bounds the retries of the safe cases
    (see :mod:`warren._http`); ``timeout`` (seconds) is the deadline of calls that have no
    longer one of their own (exec waits its command's timeout plus a minute, judge an hour)."""

    url: str
    functions: "AsyncFunctions"
    images: "AsyncImages"

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *, data_dir: Optional[str] = None, connections: int = 64, retries: int = 3, timeout: float = w.DEFAULT_TIMEOUT) -> None:
        self.url, self._token = resolve(url, token, data_dir)
        self._t = AsyncTransport(self.url, self._token, connections, retries, w.check_number(timeout, "timeout", 0.001))
        self.functions = AsyncFunctions(self)
        self.images = AsyncImages(self)

    @property
    def token(self) -> Optional[str]:
        return self._token

    async def _json(self, call: w.Call) -> Any:
        return decode_json(await self._t.send(call))

    # ---- system and accounts

    async def health(self) -> Health:
        return cast(Health, await self._json(w.Call("GET", "/v1/health", idempotent=True)))

    async def features(self) -> FeatureReport:
        return cast(FeatureReport, await self._json(w.Call("GET", "/v1/features", idempotent=True)))

    async def whoami(self) -> AccountInfo:
        return cast(AccountInfo, await self._json(w.Call("GET", "/v1/accounts/me", idempotent=True)))

    async def create_account(self, name: str, role: str = "runtime") -> NewAccount:
        body = {"name": name, "role": w.check_choice(role, "role", ("admin", "builder", "runtime"))}
        return cast(NewAccount, await self._json(w.Call("POST", "/v1/accounts", json=body)))

    async def list_accounts(self) -> List[AccountInfo]:
        return cast(List[AccountInfo], (await self._json(w.Call("GET", "/v1/accounts", idempotent=True)))["accounts"])

    async def quota(self, account: str = "me") -> QuotaInfo:
        return cast(QuotaInfo, await self._json(w.Call("GET", f"/v1/accounts/{quote(account, safe='')}/quota", idempotent=True)))

    async def set_quota(self, account: str, **quota: Optional[float]) -> QuotaInfo:
        """Admin: ``set_quota(id, max_sandboxes=10, max_cpu=None, max_memory_mb=4096)`` (None = unlimited)."""
        names = {"max_sandboxes": "maxSandboxes", "max_cpu": "maxCpu", "max_memory_mb": "maxMemoryMb"}
        body = {names[k] if k in names else k: v for k, v in quota.items()}
        return cast(QuotaInfo, await self._json(w.Call("PUT", f"/v1/accounts/{quote(account, safe='')}/quota", json=body)))

    # ---- sandboxes

    async def create_sandbox(
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
    ) -> "AsyncSandbox":
        """Create a sandbox (every field of ``POST /v1/sandboxes``). Use it as
        ``async with await client.create_sandbox(...) as sb:`` to delete it on exit.

        If the calling task is cancelled while the request is in flight, the answer is still
        awaited and the sandbox deleted, so a cancelled create leaves nothing behind."""
        body = w.create_sandbox_body(
            image=image, backend=backend, workspaces=workspaces, toolkits=toolkits, cpu=cpu, memory_mb=memory_mb,
            pids=pids, disk_mb=disk_mb, ttl_seconds=ttl_seconds, idle_seconds=idle_seconds, on_idle=on_idle,
            network=network, priority=priority, user=user, env=env, labels=labels,
        )
        task = asyncio.ensure_future(self._json(w.Call("POST", "/v1/sandboxes", json=body)))
        try:
            info = await asyncio.shield(task)
        except asyncio.CancelledError:
            await _settle(task)
            if not task.cancelled() and task.exception() is None:
                cleanup = asyncio.ensure_future(self.delete_sandbox(task.result()["id"], missing_ok=True))
                await _settle(cleanup)
                if not cleanup.cancelled():
                    cleanup.exception()
            raise
        return AsyncSandbox(self, cast(SandboxInfo, info))

    async def get_sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        info = await self._json(w.Call("GET", w.sandbox_path(sandbox_id), idempotent=True))
        return AsyncSandbox(self, cast(SandboxInfo, info))

    def sandbox(self, sandbox_id: str) -> "AsyncSandbox":
        """A handle for an existing sandbox id, without a request."""
        return AsyncSandbox(self, None, w.check_sandbox_id(sandbox_id))

    async def list_sandboxes(self, labels: Optional[Mapping[str, str]] = None, owner: Optional[str] = None) -> List[SandboxInfo]:
        q = w.labels_query(labels) + ([("owner", owner)] if owner is not None else [])
        return cast(List[SandboxInfo], (await self._json(w.Call("GET", "/v1/sandboxes", query=q, idempotent=True)))["sandboxes"])

    async def delete_sandbox(self, sandbox_id: str, *, missing_ok: bool = False) -> None:
        try:
            await self._json(w.Call("DELETE", w.sandbox_path(sandbox_id)))
        except NotFoundError:
            if not missing_ok:
                raise

    async def pause_sandboxes(self, labels: Mapping[str, str], owner: Optional[str] = None) -> List[PauseResult]:
        """Pause every sandbox whose labels all match (a job, for preemption)."""
        q = w.labels_query(labels) + ([("owner", owner)] if owner is not None else [])
        if not labels:
            raise bad_input("INVALID_ARGUMENT", "a label selector is required", "labels")
        return cast(List[PauseResult], (await self._json(w.Call("POST", "/v1/sandboxes/pause", query=q)))["sandboxes"])

    async def resume_sandboxes(self, labels: Mapping[str, str], owner: Optional[str] = None) -> List[ResumeResult]:
        q = w.labels_query(labels) + ([("owner", owner)] if owner is not None else [])
        if not labels:
            raise bad_input("INVALID_ARGUMENT", "a label selector is required", "labels")
        return cast(List[ResumeResult], (await self._json(w.Call("POST", "/v1/sandboxes/resume", query=q)))["sandboxes"])

    # ---- environments (pack_diff results, docs/lifecycle.md)

    async def list_environments(self) -> List[EnvironmentInfo]:
        return cast(List[EnvironmentInfo], (await self._json(w.Call("GET", "/v1/environments", idempotent=True)))["environments"])

    async def publish_environment(self, name: str, published: bool = True) -> EnvironmentInfo:
        path = f"/v1/environments/{quote(w.check_ref(name, 'name'), safe='')}/{'publish' if published else 'unpublish'}"
        return cast(EnvironmentInfo, await self._json(w.Call("POST", path)))

    # ---- lifetime

    async def close(self) -> None:
        await self._t.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSandbox:
    """A sandbox. ``async with sb:`` deletes it on exit, also on exceptions and cancellation."""

    id: str
    info: Optional[SandboxInfo]

    def __init__(self, client: AsyncClient, info: Optional[SandboxInfo], sandbox_id: Optional[str] = None) -> None:
        self._c = client
        self.info = info
        self.id = info["id"] if info is not None else cast(str, sandbox_id)

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, state={self.state!r})"

    @property
    def state(self) -> Optional[SandboxState]:
        return self.info["state"] if self.info is not None else None

    def _path(self, suffix: str = "") -> str:
        return w.sandbox_path(self.id, suffix)

    async def refresh(self) -> SandboxInfo:
        self.info = cast(SandboxInfo, await self._c._json(w.Call("GET", self._path(), idempotent=True)))
        return self.info

    async def exec(
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
            return ExecResult.from_json(await self._c._json(call))
        deadline = time.monotonic() + w.check_number(retry_for, "retry_for", 0)
        delay = 0.1
        while True:
            try:
                return ExecResult.from_json(await self._c._json(call))
            except UnavailableError:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def exec_stream(
        self,
        cmd: w.Cmd,
        on_output: OutputCallback,
        *,
        timeout: Optional[float] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> CommandResult:
        """Run a command with its output streamed to ``on_output`` as it is produced (through a
        short-lived command-mode shell session, closed afterwards; cancelling kills it)."""
        text = _prefixed(cmd, cwd, env)
        async with await self.shell() as sh:
            return await sh.run(text, timeout=timeout, on_output=on_output)

    # ---- computer use (vm backend)

    async def screenshot(self, width: Optional[int] = None) -> bytes:
        """The current screen as PNG, scaled down to ``width`` pixels wide when given."""
        q = [] if width is None else [("width", str(int(width)))]
        res = await self._c._t.send(w.Call("GET", self._path("/screen"), query=q, idempotent=True))
        return res.content

    async def input(self, actions: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Keyboard and pointer actions at the hypervisor level, e.g.
        ``[{"type": "click", "x": 10, "y": 20}, {"type": "type", "text": "ls\\n"}]`` (docs/vm.md)."""
        return cast(Dict[str, Any], await self._c._json(w.Call("POST", self._path("/input"), json={"actions": list(actions)})))

    # ---- files

    async def read_file(self, path: str) -> bytes:
        res = await self._c._t.send(w.Call("GET", self._path("/files"), query=[("path", w.check_path(path))], idempotent=True))
        return res.content

    async def write_file(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> None:
        content = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        q = [("path", w.check_path(path))] + w.file_mode_query(mode)
        await self._c._json(w.Call("PUT", self._path("/files"), query=q, content=content))

    async def list_dir(self, path: str = "/") -> List[FileEntry]:
        r = await self._c._json(w.Call("GET", self._path("/files/list"), query=[("path", w.check_path(path))], idempotent=True))
        return cast(List[FileEntry], r["entries"])

    async def upload_tar(self, directory: str, tar: bytes) -> Dict[str, Any]:
        """Extract a tar archive into ``directory`` (entries escaping it are refused)."""
        call = w.Call("PUT", self._path("/files/archive"), query=[("path", w.check_path(directory, "directory"))], content=bytes(tar))
        return cast(Dict[str, Any], await self._c._json(call))

    async def upload_dir(self, local_dir: str, directory: str) -> Dict[str, Any]:
        """Upload a local directory's contents into ``directory`` (tarred in memory)."""
        return await self.upload_tar(directory, _tar_dir(local_dir))

    async def download_tar(self, path: str) -> bytes:
        """A tar archive of ``path`` (file or directory) inside the sandbox."""
        res = await self._c._t.send(w.Call("GET", self._path("/files/archive"), query=[("path", w.check_path(path))], idempotent=True))
        return res.content

    async def download_tar_to(self, path: str, out: "io.RawIOBase | io.BufferedIOBase | Any") -> int:
        """Stream the archive of ``path`` into a writable binary file; returns the bytes written.
        A broken stream raises (the server aborts the connection rather than end it early)."""
        n = 0
        async with self._c._t.stream(w.Call("GET", self._path("/files/archive"), query=[("path", w.check_path(path))], idempotent=True)) as res:
            async for chunk in res.aiter_bytes():
                out.write(chunk)
                n += len(chunk)
        return n

    # ---- shell sessions

    async def sessions(self) -> List[SessionInfo]:
        return cast(List[SessionInfo], (await self._c._json(w.Call("GET", self._path("/sessions"), idempotent=True)))["sessions"])

    async def shell(
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
    ) -> AsyncShellSession:
        """Open a shell session (``mode``: ``"command"`` default, or ``"pty"``), or with ``session``
        re-attach to one, replaying its output from ``offset`` (default: all still buffered).
        ``reconnect``: attach again by itself after a lost connection (trying for
        ``reconnect_window`` seconds) and resume the command in flight (docs/shell-protocol.md,
        "Lost connections")."""
        q = w.shell_query(mode, session, offset, cols, rows)
        return await AsyncShellSession.connect(self._c.url, self.id, self._c.token, q, connect_timeout=connect_timeout, on_output=on_output, reconnect=reconnect, reconnect_window=reconnect_window)

    # ---- lifecycle

    async def delete(self, *, missing_ok: bool = True) -> None:
        await self._c.delete_sandbox(self.id, missing_ok=missing_ok)

    async def pause(self) -> PauseResult:
        return cast(PauseResult, await self._c._json(w.Call("POST", self._path("/pause"))))

    async def resume(self) -> ResumeResult:
        return cast(ResumeResult, await self._c._json(w.Call("POST", self._path("/resume"))))

    async def hibernate(self) -> PauseResult:
        return cast(PauseResult, await self._c._json(w.Call("POST", self._path("/hibernate"))))

    async def extend(self, *, seconds: Optional[int] = None, ttl_seconds: Optional[int] = None) -> SandboxInfo:
        self.info = cast(SandboxInfo, await self._c._json(w.Call("POST", self._path("/extend"), json=_extend_body(seconds, ttl_seconds))))
        return self.info

    async def pack(self, name: str, *, scrub: Optional[Sequence[str]] = None, publish: Optional[bool] = None, squash: Optional[bool] = None, compression: Optional[str] = None) -> PackResult:
        """pack_diff: this sandbox's changes (scrubbed) become environment ``name``."""
        body = w.pack_body(name, scrub, publish, squash, compression)
        return cast(PackResult, await self._c._json(w.Call("POST", self._path("/pack"), json=body, timeout=w.PACK_TIMEOUT)))

    async def network(self) -> NetworkInfo:
        return cast(NetworkInfo, await self._c._json(w.Call("GET", self._path("/network"), idempotent=True)))

    async def set_network(self, change: Mapping[str, bool]) -> NetworkInfo:
        """Enable (True) / disable (False) services while the sandbox runs; atomic in the kernel."""
        return cast(NetworkInfo, await self._c._json(w.Call("PATCH", self._path("/network"), json=w.check_network(change))))

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Deleted even when the body raised or the task was cancelled (also while deleting).
        task = asyncio.ensure_future(self.delete())
        cancelled_again = await _settle(task)
        err = None if task.cancelled() else task.exception()
        if cancelled_again:
            raise asyncio.CancelledError()
        if err is not None and exc_type is None:
            raise err


class AsyncFunctions:
    """FnCall: ``client.functions`` (docs/fncall.md)."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[PoolStats]:
        return cast(List[PoolStats], (await self._c._json(w.Call("GET", "/v1/functions", idempotent=True)))["pools"])

    async def get(self, pool: str) -> PoolStats:
        return cast(PoolStats, await self._c._json(w.Call("GET", w.function_path(pool), idempotent=True)))

    async def create(
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
        return cast(PoolStats, await self._c._json(call))

    async def delete(self, pool: str, *, missing_ok: bool = False) -> None:
        try:
            await self._c._json(w.Call("DELETE", w.function_path(pool)))
        except NotFoundError:
            if not missing_ok:
                raise

    async def invoke(
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
        return InvokeResult.from_json(await self._c._json(w.Call("POST", w.function_path(pool, "/invoke"), json=body, timeout=w.INVOKE_TIMEOUT)))

    async def judge(
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
        return JudgeResult.from_json(await self._c._json(w.Call("POST", w.function_path(pool, "/judge"), json=body, timeout=w.JUDGE_TIMEOUT)))

    async def batch(self, pool: str, invocations: Sequence[Mapping[str, Any]], *, concurrency: Optional[int] = None) -> List[BatchItem]:
        """Many invocations in one request (each a mapping of :meth:`invoke`'s keyword arguments);
        results in request order, a refused one as a WarrenError instance (not raised)."""
        body: Dict[str, Any] = {"invocations": [_invoke_from(i) for i in invocations]}
        if concurrency is not None:
            body["concurrency"] = w.check_int(concurrency, "concurrency", 1)
        return batch_items(await self._c._json(w.Call("POST", w.function_path(pool, "/batch"), json=body, timeout=w.JUDGE_TIMEOUT)))

    async def run_code(self, request: Mapping[str, Any]) -> RunCodeResponse:
        """SandboxFusion-compatible ``POST /run_code`` (its own request and response shapes)."""
        return cast(RunCodeResponse, await self._c._json(w.Call("POST", "/run_code", json=dict(request), timeout=w.INVOKE_TIMEOUT)))


class AsyncImages:
    """Images: ``client.images``."""

    def __init__(self, client: AsyncClient) -> None:
        self._c = client

    async def list(self) -> List[ImageInfo]:
        return cast(List[ImageInfo], (await self._c._json(w.Call("GET", "/v1/images", idempotent=True)))["images"])

    async def import_image(self, name: str, path: str, *, kind: Optional[str] = None, type: Optional[str] = None, on_progress: Optional[ProgressCallback] = None) -> ImageInfo:
        """Import a rootfs directory or OCI archive that lies on the gateway's host (admin)."""
        body = _import_body(name, path, kind, type)
        return await self._post(body, on_progress)

    async def build(self, name: str, *, suite: Optional[str] = None, include: Optional[Sequence[str]] = None, on_progress: Optional[ProgressCallback] = None) -> ImageInfo:
        """Build a Debian image with debootstrap."""
        return await self._post(_build_body(name, suite, include), on_progress)

    async def delete(self, name: str) -> Dict[str, Any]:
        """Remove an image and the layers no other image uses (ConflictError IMAGE_IN_USE while a
        sandbox uses it). Returns ``{"name", "removedLayers"}``."""
        return cast(Dict[str, Any], await self._c._json(w.Call("DELETE", _image_path(name))))

    async def _post(self, body: Dict[str, Any], on_progress: Optional[ProgressCallback]) -> ImageInfo:
        state = _ProgressState(on_progress)
        async with self._c._t.stream(w.Call("POST", "/v1/images", json=body, timeout=w.IMAGE_TIMEOUT)) as res:
            async for line in res.aiter_lines():
                state.line(line)
        return state.result()


# ---------------------------------------------------------------------------
# helpers shared with the sync client


def _image_path(name: str) -> str:
    from urllib.parse import quote

    if not isinstance(name, str) or name == "":
        raise bad_input("INVALID_ARGUMENT", "image name must be a non-empty string", "name")
    return "/v1/images/" + quote(name, safe="")


def _prefixed(cmd: w.Cmd, cwd: Optional[str], env: Optional[Mapping[str, str]]) -> str:
    import shlex

    text = w.shell_command(cmd)
    pre = ""
    if env:
        pre += "".join(f"export {k}={shlex.quote(v)}; " for k, v in w.check_str_map(env, "env", w.ENV_NAME).items())
    if cwd is not None:
        pre += f"cd {shlex.quote(w.check_path(cwd, 'cwd'))} && "
    return pre + text


def _extend_body(seconds: Optional[int], ttl_seconds: Optional[int]) -> Dict[str, int]:
    if (seconds is None) == (ttl_seconds is None):
        raise bad_input("INVALID_ARGUMENT", "give exactly one of seconds or ttl_seconds", "seconds")
    if seconds is not None:
        return {"seconds": w.check_int(seconds, "seconds", *w.LIFETIME_RANGE)}
    return {"ttlSeconds": w.check_int(ttl_seconds, "ttl_seconds", *w.LIFETIME_RANGE)}


_INVOKE_KEYS = ("code", "language", "cmd", "files", "stdin", "env", "timeout", "cpu_time", "memory_mb", "max_output_bytes", "compile_timeout", "fetch_files")


def _invoke_from(item: Mapping[str, Any]) -> Dict[str, Any]:
    unknown = set(item) - set(_INVOKE_KEYS)
    if unknown:
        raise bad_input("UNKNOWN_FIELD", f"unknown invocation field(s) {sorted(unknown)} (use invoke()'s keyword names)", sorted(unknown)[0])
    return w.invoke_body(**{k: item.get(k) for k in _INVOKE_KEYS})


def _tar_dir(local_dir: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in sorted(os.listdir(local_dir)):
            tf.add(os.path.join(local_dir, name), arcname=name)
    return buf.getvalue()


def _import_body(name: str, path: str, kind: Optional[str], type_: Optional[str]) -> Dict[str, Any]:
    t = type_ or ("oci-archive" if path.endswith((".tar", ".tar.gz", ".tgz", ".oci")) else "directory")
    body: Dict[str, Any] = {"name": w.check_ref(name, "name"), "source": {"type": w.check_choice(t, "type", ("directory", "oci-archive")), "path": path}}
    if kind is not None:
        body["kind"] = w.check_choice(kind, "kind", ("base", "workspace", "toolkit"))
    return body


def _build_body(name: str, suite: Optional[str], include: Optional[Sequence[str]]) -> Dict[str, Any]:
    source: Dict[str, Any] = {"type": "debootstrap"}
    if suite is not None:
        source["suite"] = suite
    if include is not None:
        source["include"] = list(include)
    return {"name": w.check_ref(name, "name"), "source": source}


class _ProgressState:
    """Reads the NDJSON stream of ``POST /v1/images``: progress lines, then one done or error."""

    def __init__(self, on_progress: Optional[ProgressCallback]) -> None:
        self.on_progress = on_progress
        self.image: Optional[ImageInfo] = None
        self.error: Optional[WarrenError] = None

    def line(self, line: str) -> None:
        if not line.strip():
            return
        try:
            ev = json.loads(line)
        except ValueError:
            raise WarrenError("INTERNAL", f"malformed image progress line: {line[:200]!r}") from None
        if not isinstance(ev, dict):
            return
        if ev.get("type") == "progress" and self.on_progress is not None:
            p: ImportProgress = {"phase": str(ev.get("phase")), "message": str(ev.get("message"))}
            if isinstance(ev.get("fraction"), (int, float)):
                p["fraction"] = float(ev["fraction"])
            self.on_progress(p)
        elif ev.get("type") == "done":
            self.image = cast(ImageInfo, ev.get("image"))
        elif ev.get("type") == "error":
            e = ev.get("error") or {}
            self.error = error_from_code(str(e.get("code", "INTERNAL")), str(e.get("message", "image import failed")))

    def result(self) -> ImageInfo:
        if self.error is not None:
            raise self.error
        if self.image is None:
            raise WarrenError("UNAVAILABLE", "image progress stream ended without a result")
        return self.image


__all__ = ["AsyncClient", "AsyncSandbox", "AsyncFunctions", "AsyncImages", "AsyncShellSession", "ShellOutput"]
