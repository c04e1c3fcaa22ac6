"""Where the gateway is and which token to use, found the way the CLI finds them (src/cli/main.ts):
an explicit argument, then ``WARREN_URL`` / ``WARREN_TOKEN``, then the admin token the first
``warren up`` wrote to ``<data dir>/admin.token`` (data dir: argument, ``WARREN_DATA_DIR``, or
``/var/lib/warren``).
"""

from __future__ import annotations

import os
from typing import Mapping, Optional, Tuple

from ._errors import AuthError

DEFAULT_URL = "http://127.0.0.1:7070"
DEFAULT_DATA_DIR = "/var/lib/warren"


def resolve(
    url: Optional[str] = None,
    token: Optional[str] = None,
    data_dir: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Tuple[str, Optional[str]]:
    env = os.environ if environ is None else environ
    u = url or env.get("WARREN_URL") or DEFAULT_URL
    t = token if token else env.get("WARREN_TOKEN") or None
    if t is None:
        d = data_dir or env.get("WARREN_DATA_DIR") or DEFAULT_DATA_DIR
        path = os.path.join(d, "admin.token")
        if os.path.exists(path):
            try:
                with open(path, "r", encoding="utf-8") as f:
                    t = f.read().strip() or None
            except OSError as e:
                # An explicitly named data dir must work; the default one is only a convenience.
                if data_dir is not None:
                    raise AuthError("UNAUTHENTICATED", f"cannot read {path}: {e}") from e
        elif data_dir is not None:
            raise AuthError("UNAUTHENTICATED", f"no admin token at {path}")
    return u.rstrip("/"), t
