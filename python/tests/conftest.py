"""Fixtures: a real ``warren up`` (the repository's built CLI) on a temp data dir.

One node serves the whole test session; tests that kill or reconfigure a gateway start their
own with :func:`start_server`. Nothing is mocked: the SDK talks HTTP and WebSockets to the real
gateway, which runs real sandboxes. Every node's sandboxes and pools are deleted at the end and
counted: a test that leaves one behind fails the run.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python" / "src"))

import warren  # noqa: E402

CLI = ROOT / "dist" / "src" / "cli" / "main.js"
NODE = shutil.which("node") or "node"
JUDGE_POOL = "pyt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WarrenServer:
    """``warren up`` in a child process: start, kill -9, start again on the same data dir/port."""

    def __init__(self, tag: str, extra_args: Optional[List[str]] = None) -> None:
        self.data_dir = tempfile.mkdtemp(prefix=f"warren-py-{tag}-")
        self.node_id = f"py{tag}{os.getpid() % 46656:x}"[:20]
        self.port = free_port()
        self.extra_args = extra_args or []
        self.proc: Optional[subprocess.Popen[str]] = None
        self.log: List[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return Path(self.data_dir, "admin.token").read_text().strip()

    def start(self, timeout: float = 300.0) -> None:
        if not CLI.exists():
            pytest.fail(f"{CLI} is missing: run `npm run build` first")
        network = [] if "--bridge" in self.extra_args else ["--no-network"]
        args = [NODE, str(CLI), "up", "--listen", f"127.0.0.1:{self.port}", "--data-dir", self.data_dir, "--node-id", self.node_id, *network, *self.extra_args]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(ROOT))
        self.proc = proc
        ready = threading.Event()

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.log.append(line)
                if "Warren is listening on" in line:
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(timeout) or proc.poll() is not None:
            self.kill9()
            raise RuntimeError("warren up did not start:\n" + "".join(self.log[-40:]))

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.proc = None

    def client(self, **kw: object) -> "warren.Client":
        return warren.Client(self.url, self.token, **kw)  # type: ignore[arg-type]

    def aclient(self, **kw: object) -> "warren.AsyncClient":
        return warren.AsyncClient(self.url, self.token, **kw)  # type: ignore[arg-type]

    def cleanup(self) -> List[str]:
        """Delete what is left (sandboxes, pools) and say what was; then stop and remove the dir."""
        leftovers: List[str] = []
        if self.proc is not None and self.proc.poll() is not None:
            leftovers.append(f"warren up exited on its own ({self.proc.returncode}):\n" + "".join(self.log[-30:]))
        elif self.proc is not None:
            try:
                with self.client() as c:
                    for s in c.list_sandboxes():
                        leftovers.append(f"sandbox {s['id']} {s.get('labels')}")
                        c.delete_sandbox(s["id"], missing_ok=True)
                    for p in c.functions.list():
                        c.functions.delete(p["name"], missing_ok=True)
            except warren.WarrenError as e:
                leftovers.append(f"cleanup failed: {e}\n" + "".join(self.log[-30:]))
        self.stop()
        # A stopped node keeps its image layers mounted (sandboxes outlive the gateway); this
        # data dir is ours alone, so its mounts go with it.
        for m in mounts_under(self.data_dir):
            subprocess.run(["umount", m], check=False, stderr=subprocess.DEVNULL)
        left = mounts_under(self.data_dir)
        if left:
            leftovers.append(f"mounts {left}")
        else:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        return leftovers


def mounts_under(directory: str) -> List[str]:
    """Mount points below ``directory``, deepest first."""
    prefix = os.path.realpath(directory) + "/"
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def start_server(tag: str, extra_args: Optional[List[str]] = None) -> WarrenServer:
    s = WarrenServer(tag, extra_args)
    s.start()
    return s


@pytest.fixture(scope="session")
def server() -> Iterator[WarrenServer]:
    s = start_server("s")
    try:
        yield s
    finally:
        leftovers = s.cleanup()
        if leftovers:
            raise AssertionError(f"tests left things behind: {leftovers}")


@pytest.fixture
def client(server: WarrenServer) -> Iterator["warren.Client"]:
    with server.client() as c:
        yield c


@pytest.fixture(scope="session")
def judge_pool(server: WarrenServer) -> str:
    """A FnCall pool on the judge image (taken from the node cache /var/cache/warren after the
    first build on this machine)."""
    with server.client() as c:
        c.functions.create(JUDGE_POOL, image="judge", min=2, max=4, limits={"timeoutMs": 10000}, wait=True)
    return JUDGE_POOL


def processes_with(marker: str) -> List[int]:
    """Host pids whose command line contains ``marker`` (sandbox processes are host processes)."""
    pids = []
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == me:
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    pids.append(int(d))
        except OSError:
            continue
    return pids


def wait_for(pred: "object", timeout: float = 10.0, interval: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(pred())  # type: ignore[operator]
