"""Warren's Python SDK: sandboxes, shell sessions, files and FnCall judging (docs/python.md).

    import warren

    with warren.Client() as client:               # url/token as the CLI finds them
        with client.create_sandbox(image="default", memory_mb=512) as sb:
            r = sb.exec(["echo", "hi"])            # r.exit_code, r.stdout, r.stderr
            with sb.shell() as sh:
                sh.run("cd /tmp && export X=1")    # cwd, env and jobs persist between runs
                print(sh.run("pwd; echo $X").stdout)

    async with warren.AsyncClient() as client:    # the same names, awaited
        r = await client.functions.invoke("py", "print(1)", language="python3")
"""

from ._version import __version__
from ._errors import (
    ERROR_CODES,
    AuthError,
    BackpressureError,
    BadInputError,
    ConflictError,
    InternalError,
    NotFoundError,
    NotSupportedError,
    QuotaExceededError,
    ResourceExhaustedError,
    UnavailableError,
    WarrenError,
    WarrenTimeoutError,
)
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
    JudgeTestResult,
    NetworkInfo,
    PackResult,
    PauseResult,
    PoolStats,
    QuotaInfo,
    ResumeResult,
    RunCodeResponse,
    SandboxInfo,
    SessionInfo,
    ShellExit,
    ShellOutput,
    StepResult,
)
from ._wire import JudgeTestInput
from ._shell import AsyncShellSession
from ._async import AsyncClient, AsyncFunctions, AsyncImages, AsyncSandbox
from ._sync import Client, Functions, Images, Sandbox, ShellSession

__all__ = [
    "__version__",
    "Client",
    "Sandbox",
    "ShellSession",
    "Functions",
    "Images",
    "AsyncClient",
    "AsyncSandbox",
    "AsyncShellSession",
    "AsyncFunctions",
    "AsyncImages",
    "ERROR_CODES",
    "WarrenError",
    "BadInputError",
    "AuthError",
    "NotFoundError",
    "ConflictError",
    "ResourceExhaustedError",
    "BackpressureError",
    "QuotaExceededError",
    "NotSupportedError",
    "UnavailableError",
    "WarrenTimeoutError",
    "InternalError",
    "AccountInfo",
    "BatchItem",
    "CommandResult",
    "EnvironmentInfo",
    "ExecResult",
    "FeatureReport",
    "FileEntry",
    "Health",
    "ImageInfo",
    "ImportProgress",
    "InvokeResult",
    "JudgeResult",
    "JudgeTestResult",
    "JudgeTestInput",
    "NetworkInfo",
    "PackResult",
    "PauseResult",
    "PoolStats",
    "QuotaInfo",
    "ResumeResult",
    "RunCodeResponse",
    "SandboxInfo",
    "SessionInfo",
    "ShellExit",
    "ShellOutput",
    "StepResult",
]
