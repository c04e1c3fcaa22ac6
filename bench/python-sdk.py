"""The Python half of `npm run bench:python` (bench/python-sdk.ts starts the node and runs the
TypeScript half in the same run): shell-session exec round trip and FnCall invocations/s at a
given concurrency, through warren.AsyncClient and warren.Client. Prints one JSON object.

    /usr/bin/python3 bench/python-sdk.py URL TOKEN SANDBOX POOL SHELL_N FN_N CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "src"))

import warren  # noqa: E402


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-len(s) * p // 100) - 1))] if s else float("nan")


def summary(lat_s: List[float], wall: float) -> Dict[str, float]:
    ms = [x * 1000 for x in lat_s]
    return {"n": len(ms), "p50": pct(ms, 50), "p99": pct(ms, 99), "mean": statistics.fmean(ms), "throughput": len(ms) / wall}


async def shell_async(c: warren.AsyncClient, sandbox: str, n: int) -> Dict[str, float]:
    sb = c.sandbox(sandbox)
    async with await sb.shell() as sh:
        for _ in range(20):
            await sh.run("true")
        lat = []
        t0 = time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            r = await sh.run("true")
            lat.append(time.perf_counter() - s)
            assert r.exit_code == 0
        return summary(lat, time.perf_counter() - t0)


def shell_sync(c: warren.Client, sandbox: str, n: int) -> Dict[str, float]:
    with c.sandbox(sandbox).shell() as sh:
        for _ in range(20):
            sh.run("true")
        lat = []
        t0 = time.perf_counter()
        for _ in range(n):
            s = time.perf_counter()
            r = sh.run("true")
            lat.append(time.perf_counter() - s)
            assert r.exit_code == 0
        return summary(lat, time.perf_counter() - t0)


async def fncall_async(c: warren.AsyncClient, pool: str, n: int, conc: int) -> Dict[str, float]:
    for _ in range(conc):
        await c.functions.invoke(pool, cmd=["true"])
    lat: List[float] = []
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            s = time.perf_counter()
            r = await c.functions.invoke(pool, cmd=["true"])
            lat.append(time.perf_counter() - s)
            assert r.ok, r

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return summary(lat, time.perf_counter() - t0)


def fncall_threads(c: warren.Client, pool: str, n: int, conc: int) -> Dict[str, float]:
    def one(_: int) -> float:
        s = time.perf_counter()
        r = c.functions.invoke(pool, cmd=["true"])
        assert r.ok, r
        return time.perf_counter() - s

    with ThreadPoolExecutor(conc) as ex:
        list(ex.map(one, range(conc)))
        t0 = time.perf_counter()
        lat = list(ex.map(one, range(n)))
        return summary(lat, time.perf_counter() - t0)


def main() -> None:
    url, token, sandbox, pool = sys.argv[1:5]
    shell_n, fn_n, conc = (int(x) for x in sys.argv[5:8])
    out: Dict[str, Any] = {"python": sys.version.split()[0], "httpx": __import__("httpx").__version__, "websockets": __import__("websockets").__version__}

    async def run_async() -> None:
        async with warren.AsyncClient(url, token, connections=conc) as c:
            out["shell_async"] = await shell_async(c, sandbox, shell_n)
            out["fncall_async"] = await fncall_async(c, pool, fn_n, conc)

    asyncio.run(run_async())
    with warren.Client(url, token, connections=conc) as c:
        out["shell_sync"] = shell_sync(c, sandbox, shell_n)
        out["fncall_threads"] = fncall_threads(c, pool, fn_n, conc)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
