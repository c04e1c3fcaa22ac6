"""One exception hierarchy for everything the SDK raises.

Every error carries the server's stable string ``code`` (docs/api.md, src/errors.ts); callers
switch on the class (the family) or on ``code``, never on the message. Errors made on the client
side (bad input caught before a request, an unreachable gateway, a timeout) use the same codes.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Type

# The stable codes and their HTTP status, as in src/errors.ts. Unknown codes from a newer server
# keep their text; only the family falls back to the HTTP status.
ERROR_CODES: Dict[str, int] = {
    "INVALID_ARGUMENT": 400,
    "UNKNOWN_FIELD": 400,
    "INVALID_ID": 400,
    "PATH_ESCAPE": 400,
    "ARCHIVE_ESCAPE": 400,
    "INVALID_ARCHIVE": 400,
    "LIMIT_OUT_OF_RANGE": 400,
    "POLICY_INVALID": 400,
    "OFF_SCREEN": 400,
    "UNKNOWN_KEY": 400,
    "UNAUTHENTICATED": 401,
    "FORBIDDEN": 403,
    "ORIGIN_REFUSED": 403,
    "NOT_FOUND": 404,
    "SANDBOX_NOT_FOUND": 404,
    "SESSION_NOT_FOUND": 404,
    "IMAGE_NOT_FOUND": 404,
    "LAYER_NOT_FOUND": 404,
    "FILE_NOT_FOUND": 404,
    "JOB_NOT_FOUND": 404,
    "SANDBOX_NOT_RUNNING": 409,
    "ALREADY_EXISTS": 409,
    "IMAGE_IN_USE": 409,
    "SESSION_BUSY": 409,
    "IDEMPOTENCY_IN_PROGRESS": 409,
    "IDEMPOTENCY_INTERRUPTED": 409,
    "SANDBOX_LOST": 410,
    "IDEMPOTENCY_KEY_REUSED": 422,
    "PAYLOAD_TOO_LARGE": 413,
    "RESOURCE_EXHAUSTED": 429,
    "QUOTA_EXCEEDED": 429,
    "NOT_SUPPORTED": 501,
    "CONFINEMENT_UNAVAILABLE": 501,
    "INTERNAL": 500,
    "NATIVE_ERROR": 500,
    "CGROUP_ERROR": 500,
    "MOUNT_ERROR": 500,
    "SPAWN_ERROR": 500,
    "IMAGE_BUILD_FAILED": 500,
    "TIMEOUT": 504,
    "UNAVAILABLE": 503,
    "NODE_AT_CAPACITY": 503,
    "CLUSTER_UNAVAILABLE": 503,
    "NODE_FENCED": 503,
}

_STATUS_CODE: Dict[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    422: "IDEMPOTENCY_KEY_REUSED",
    413: "PAYLOAD_TOO_LARGE",
    429: "RESOURCE_EXHAUSTED",
    501: "NOT_SUPPORTED",
    503: "UNAVAILABLE",
    504: "TIMEOUT",
}


class WarrenError(Exception):
    """Base class: ``code`` (stable), ``status`` (HTTP), ``message``, ``details``."""

    code: str
    status: int
    message: str
    details: Dict[str, Any]

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: Optional[int] = None,
        details: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status if status is not None else ERROR_CODES.get(code, 500)
        self.details = dict(details) if details else {}

    def __reduce__(self) -> Any:
        return (_rebuild, (self.code, self.message, self.status, self.details))


def _rebuild(code: str, message: str, status: int, details: Dict[str, Any]) -> WarrenError:
    return error_from_code(code, message, status=status, details=details)


class BadInputError(WarrenError):
    """400 and 413: the request is wrong (also raised before a request for input the SDK checks)."""


class AuthError(WarrenError):
    """401 / 403: who you are or what you may do."""


class NotFoundError(WarrenError):
    """404: no such sandbox, session, image, file, pool or route."""


class ConflictError(WarrenError):
    """409: the state does not allow it (not running, already exists, busy, in use); 422: an
    idempotency key sent again with a different request (IDEMPOTENCY_KEY_REUSED)."""


class ResourceExhaustedError(WarrenError):
    """429: back-pressure or a quota. ``retry_after`` is the server's Retry-After in seconds, if any."""

    retry_after: Optional[float]

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: Optional[int] = None,
        details: Optional[Mapping[str, Any]] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(code, message, status=status, details=details)
        if retry_after is None:
            hint = self.details.get("retryAfterS")
            if isinstance(hint, (int, float)) and hint > 0:
                retry_after = float(hint)
        self.retry_after = retry_after


class BackpressureError(ResourceExhaustedError):
    """RESOURCE_EXHAUSTED: a saturated queue, a per-account concurrency limit, a slow shell reader."""


class QuotaExceededError(ResourceExhaustedError):
    """QUOTA_EXCEEDED: an account quota (sandboxes, cpu, memory) would be exceeded."""


class NotSupportedError(WarrenError):
    """501: this node or kernel cannot (the reason is in the message and /v1/features)."""


class UnavailableError(WarrenError):
    """503 or no answer: the gateway cannot be reached, a connection broke, a shell was dropped."""


class WarrenTimeoutError(UnavailableError, TimeoutError):
    """504 / TIMEOUT: no answer in time (the client's deadline or the server's)."""


class InternalError(WarrenError):
    """5xx: a failure inside Warren (the message carries the log reference)."""


_BY_CODE: Dict[str, Type[WarrenError]] = {
    "RESOURCE_EXHAUSTED": BackpressureError,
    "QUOTA_EXCEEDED": QuotaExceededError,
    "TIMEOUT": WarrenTimeoutError,
    "UNAVAILABLE": UnavailableError,
    "CONFINEMENT_UNAVAILABLE": NotSupportedError,
}

_BY_STATUS: Dict[int, Type[WarrenError]] = {
    400: BadInputError,
    413: BadInputError,
    401: AuthError,
    403: AuthError,
    404: NotFoundError,
    409: ConflictError,
    422: ConflictError,
    429: BackpressureError,
    501: NotSupportedError,
    503: UnavailableError,
    504: WarrenTimeoutError,
}


def error_class(code: str, status: Optional[int] = None) -> Type[WarrenError]:
    cls = _BY_CODE.get(code)
    if cls is not None:
        return cls
    st = ERROR_CODES.get(code, status if status is not None else 500)
    return _BY_STATUS.get(st, InternalError)


def error_from_code(
    code: str,
    message: str,
    *,
    status: Optional[int] = None,
    details: Optional[Mapping[str, Any]] = None,
    retry_after: Optional[float] = None,
) -> WarrenError:
    cls = error_class(code, status)
    if issubclass(cls, ResourceExhaustedError):
        return cls(code, message, status=status, details=details, retry_after=retry_after)
    return cls(code, message, status=status, details=details)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Retry-After in seconds (the gateway sends delta-seconds; HTTP dates are not used by Warren)."""
    if value is None:
        return None
    try:
        s = float(value.strip())
    except ValueError:
        return None
    return s if s >= 0 else None


def error_from_response(status: int, body: bytes, retry_after: Optional[str] = None) -> WarrenError:
    """Rebuild the server's ``{"error": {code, message, details?}}``, or make one from the status."""
    ra = parse_retry_after(retry_after)
    try:
        parsed = json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        e = parsed["error"]
        code = e.get("code")
        if isinstance(code, str) and code:
            details = e.get("details") if isinstance(e.get("details"), dict) else None
            return error_from_code(code, str(e.get("message", "")), status=status, details=details, retry_after=ra)
    code = _STATUS_CODE.get(status, "INTERNAL")
    text = body[:200].decode("utf-8", "replace")
    return error_from_code(code, f"HTTP {status}" + (f": {text}" if text else ""), status=status, details={"status": status}, retry_after=ra)


def bad_input(code: str, message: str, field: Optional[str] = None, **details: Any) -> BadInputError:
    d: Dict[str, Any] = dict(details)
    if field is not None:
        d["field"] = field
    return BadInputError(code, message, details=d)
