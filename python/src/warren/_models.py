"""Results.

Descriptions the server returns (a sandbox, an image, a pool's stats, ...) are the API's JSON as
``TypedDict``s, keys spelled as in docs/api.md. Results a caller computes on (exec, shell
commands, FnCall invocations and judgements) are dataclasses with Python names; each keeps the
full answer in ``raw``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Mapping, Optional, TypedDict, Union

from ._errors import WarrenError, error_from_code

SandboxState = Literal["running", "paused", "hibernated", "stopped", "failed"]


class SandboxLimits(TypedDict):
    cpu: float
    memoryMb: int
    pids: int
    diskMb: Optional[int]


class SandboxLifecycle(TypedDict, total=False):
    expiresAt: Optional[str]
    lastActivityAt: str
    idleAt: Optional[str]
    idleSeconds: Optional[int]
    onIdle: str
    pausedAt: str
    stopReason: str


class SandboxNetworkSummary(TypedDict):
    services: Dict[str, bool]
    address: str


class _SandboxInfoBase(TypedDict):
    id: str
    backend: str
    image: str
    layers: List[str]
    state: SandboxState
    node: str
    createdAt: str
    owner: str
    limits: SandboxLimits
    priority: str
    labels: Dict[str, str]


class SandboxInfo(_SandboxInfoBase, total=False):
    pid: int
    lifecycle: SandboxLifecycle
    network: SandboxNetworkSummary


class FileEntry(TypedDict):
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int
    mode: int
    mtime: str


class SessionInfo(TypedDict):
    id: str
    sandboxId: str
    mode: Literal["command", "pty"]
    createdAt: str
    outputOffset: int
    alive: bool


class _PauseResultBase(TypedDict):
    id: str
    state: SandboxState
    changed: bool
    memoryBeforeBytes: int
    memoryAfterBytes: int
    releasedBytes: int
    swapBytes: Optional[int]
    reclaim: str
    durationMs: float


class PauseResult(_PauseResultBase, total=False):
    note: str


class ResumeResult(TypedDict):
    id: str
    state: SandboxState
    changed: bool
    durationMs: float


class ImageInfo(TypedDict):
    name: str
    digest: str
    kind: Literal["base", "workspace", "toolkit"]
    layers: List[str]
    sizeBytes: int
    createdAt: str
    source: str


class EnvironmentInfo(TypedDict):
    name: str
    digest: str
    owner: str
    published: bool
    parent: str
    sourceSandbox: str
    diffLayers: List[str]
    baseLayers: List[str]
    createdAt: str


class PackResult(TypedDict):
    image: ImageInfo
    environment: EnvironmentInfo
    layer: str
    diffBytes: int
    diffEntries: int
    scrubbed: List[str]
    squashed: bool
    frozenMs: float
    durationMs: float


class NetworkBinding(TypedDict):
    service: str
    name: str
    address: str
    expiresInS: float


class NetworkDenial(TypedDict):
    at: str
    service: str
    destination: str
    proto: str
    hook: str


class NetworkInfo(TypedDict, total=False):
    services: Dict[str, bool]
    address: str
    resolver: str
    rules: Any
    bindings: List[NetworkBinding]
    denials: List[NetworkDenial]


class FeatureStatus(TypedDict, total=False):
    supported: bool
    reason: str
    action: str


class BackendStatus(TypedDict, total=False):
    available: bool
    reason: str


class FeatureReport(TypedDict, total=False):
    node: str
    kernel: str
    cgroup: Dict[str, Any]
    features: Dict[str, FeatureStatus]
    backends: Dict[str, BackendStatus]
    enforcer: str


class Health(TypedDict):
    status: str
    node: str
    version: str
    uptimeS: float


class AccountInfo(TypedDict):
    id: str
    name: str
    role: Literal["admin", "builder", "runtime"]
    createdAt: str


class NewAccount(AccountInfo):
    token: str


class Quota(TypedDict):
    maxSandboxes: Optional[int]
    maxCpu: Optional[float]
    maxMemoryMb: Optional[int]


class QuotaUsage(TypedDict):
    sandboxes: int
    cpu: float
    memoryMb: int


class QuotaInfo(TypedDict, total=False):
    account: str
    quota: Quota
    usage: QuotaUsage


class PoolLimits(TypedDict, total=False):
    cpu: float
    memoryMb: int
    pids: int
    fileSizeBytes: int
    tmpfsBytes: int
    workBytes: int
    timeoutMs: int
    maxTimeoutMs: int
    maxOutputBytes: int


class PoolStats(TypedDict, total=False):
    name: str
    image: str
    state: Literal["preparing", "ready", "failed", "closing"]
    message: str
    min: int
    max: int
    maxQueue: int
    warm: int
    busy: int
    starting: int
    queued: int
    invocations: int
    replaced: int
    rejected: int
    p50Ms: Optional[float]
    p99Ms: Optional[float]
    limits: PoolLimits
    layers: List[str]
    idleSeconds: int


class ImportProgress(TypedDict, total=False):
    phase: str
    message: str
    fraction: float


RunCodeResponse = Dict[str, Any]


# ---------------------------------------------------------------------------
# computed-on results


@dataclass
class ExecResult:
    """``POST /v1/sandboxes/:id/exec``. A non-zero exit code is a result, not an exception."""

    exit_code: Optional[int]
    signal: Optional[int]
    stdout: str
    stderr: str
    status: str
    duration_ms: float
    truncated: bool
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.exit_code == 0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ExecResult":
        return cls(
            exit_code=d.get("exitCode"),
            signal=d.get("signal"),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            status=str(d.get("status", "")),
            duration_ms=float(d.get("durationMs", 0)),
            truncated=bool(d.get("truncated", False)),
            raw=dict(d),
        )


@dataclass
class CommandResult:
    """One command of a command-mode shell session."""

    exit_code: Optional[int]
    stdout: str
    stderr: str
    timed_out: bool
    # Re-attach from here to replay nothing before the end of this command.
    offset: int
    # A run with an idempotency key that had run before: this is the first run's result.
    replayed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class ShellOutput:
    """A chunk of session output at absolute ``offset`` of the session's output stream."""

    stream: Literal["stdout", "stderr", "pty"]
    offset: int
    data: bytes


@dataclass
class ShellExit:
    exit_code: Optional[int]
    signal: Optional[int]


def _b64(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else base64.b64decode(s)


@dataclass
class StepResult:
    status: str
    exit_code: Optional[int]
    signal: Optional[int]
    stdout: str
    stderr: str
    truncated: bool
    wall_ms: float
    cpu_ms: float
    mem_peak_bytes: int
    limit: Optional[str] = None
    message: Optional[str] = None
    # The exact bytes when the output was not valid UTF-8 (``stdout`` then has U+FFFD).
    stdout_bytes: Optional[bytes] = None
    stderr_bytes: Optional[bytes] = None

    @classmethod
    def _fields(cls, d: Mapping[str, Any]) -> Dict[str, Any]:
        return dict(
            status=str(d.get("status", "")),
            exit_code=d.get("exitCode"),
            signal=d.get("signal"),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            truncated=bool(d.get("truncated", False)),
            wall_ms=float(d.get("wallMs", 0)),
            cpu_ms=float(d.get("cpuMs", 0)),
            mem_peak_bytes=int(d.get("memPeakBytes", 0)),
            limit=d.get("limit"),
            message=d.get("message"),
            stdout_bytes=_b64(d.get("stdoutBase64")),
            stderr_bytes=_b64(d.get("stderrBase64")),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "StepResult":
        return cls(**cls._fields(d))


@dataclass
class InvokeResult(StepResult):
    """``POST /v1/functions/:pool/invoke`` (docs/fncall.md)."""

    phase: str = "run"
    pool: str = ""
    queue_ms: float = 0.0
    compile: Optional[StepResult] = None
    files: Dict[str, bytes] = field(default_factory=dict)
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "InvokeResult":
        comp = d.get("compile")
        files = d.get("files") or {}
        return cls(
            **StepResult._fields(d),
            phase=str(d.get("phase", "run")),
            pool=str(d.get("pool", "")),
            queue_ms=float(d.get("queueMs", 0)),
            compile=StepResult.from_json(comp) if isinstance(comp, Mapping) else None,
            files={k: base64.b64decode(v) for k, v in files.items()},
            raw=dict(d),
        )


Verdict = Literal["AC", "WA", "TLE", "MLE", "RE", "CE", "OLE", "IE"]


@dataclass
class JudgeTestResult:
    index: int
    verdict: str
    status: str
    exit_code: Optional[int]
    signal: Optional[int]
    wall_ms: float
    cpu_ms: float
    mem_peak_bytes: int
    stdout: str
    stderr: str

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JudgeTestResult":
        return cls(
            index=int(d.get("index", 0)),
            verdict=str(d.get("verdict", "")),
            status=str(d.get("status", "")),
            exit_code=d.get("exitCode"),
            signal=d.get("signal"),
            wall_ms=float(d.get("wallMs", 0)),
            cpu_ms=float(d.get("cpuMs", 0)),
            mem_peak_bytes=int(d.get("memPeakBytes", 0)),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
        )


@dataclass
class JudgeResult:
    """``POST /v1/functions/:pool/judge``: the first non-AC verdict, else AC."""

    verdict: str
    passed: int
    total: int
    ran: int
    tests: List[JudgeTestResult]
    compile: Optional[StepResult]
    max_wall_ms: float
    max_cpu_ms: float
    max_mem_peak_bytes: int
    pool: str
    raw: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def accepted(self) -> bool:
        return self.verdict == "AC"

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JudgeResult":
        comp = d.get("compile")
        return cls(
            verdict=str(d.get("verdict", "")),
            passed=int(d.get("passed", 0)),
            total=int(d.get("total", 0)),
            ran=int(d.get("ran", 0)),
            tests=[JudgeTestResult.from_json(t) for t in d.get("tests", [])],
            compile=StepResult.from_json(comp) if isinstance(comp, Mapping) else None,
            max_wall_ms=float(d.get("maxWallMs", 0)),
            max_cpu_ms=float(d.get("maxCpuMs", 0)),
            max_mem_peak_bytes=int(d.get("maxMemPeakBytes", 0)),
            pool=str(d.get("pool", "")),
            raw=dict(d),
        )


BatchItem = Union[InvokeResult, WarrenError]


def batch_items(d: Mapping[str, Any]) -> List[BatchItem]:
    """Batch results in request order; a refused item is a WarrenError instance (not raised)."""
    out: List[BatchItem] = []
    for item in d.get("results", []):
        err = item.get("error") if isinstance(item, Mapping) else None
        if isinstance(err, Mapping):
            out.append(error_from_code(str(err.get("code", "INTERNAL")), str(err.get("message", ""))))
        else:
            out.append(InvokeResult.from_json(item))
    return out
