"""The Python half of `npm run bench:python` (bench/python-sdk.ts starts the node, runs the
TypeScript half and drives this one in the same run). A long-lived process: the driver sends one
command per line on stdin and reads one JSON line back, so short Python and TypeScript blocks can
alternate (the machine's load then hits both alike) without Python's start-up in the figures.

    /usr/bin/python3 bench/python-sdk.py URL TOKEN SANDBOX POOL CONCURRENCY
    stdin:  shell N | shell_sync N | fncall N | fncall_threads N | quit
    stdout: {"lat": [ms, ...], "wall": ms, "cpu": ms of this process's CPU} per command (the first line: {"ready": versions})
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "src"))

import httpx  # noqa: E402
import websockets  # noqa: E402

import warren  # noqa: E402


def out(obj: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def main_async(url: str, token: str, sandbox: str, pool: str, conc: int) -> None:
    loop = asyncio.get_running_loop()
    async with warren.AsyncClient(url, token, connections=conc) as ac:
        with warren.Client(url, token, connections=conc) as sc:
            ash = await ac.sandbox(sandbox).shell()
            ssh = sc.sandbox(sandbox).shell()
            threads = ThreadPoolExecutor(conc)
            for _ in range(20):
                await ash.run("true")
                ssh.run("true")
            out({"ready": {"python": sys.version.split()[0], "httpx": httpx.__version__, "websockets": websockets.__version__}})
            while True:
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line or line.strip() == "quit":
                    break
                cmd, n_s = line.split()
                n = int(n_s)
                lat: List[float] = []
                c0 = time.process_time()
                t0 = time.perf_counter()
                if cmd == "shell":
                    for _ in range(n):
                        s = time.perf_counter()
                        r = await ash.run("true")
                        lat.append((time.perf_counter() - s) * 1000)
                        assert r.exit_code == 0
                elif cmd == "shell_sync":
                    def sync_block() -> None:
                        for _ in range(n):
                            s = time.perf_counter()
                            r = ssh.run("true")
                            lat.append((time.perf_counter() - s) * 1000)
                            assert r.exit_code == 0

                    t0 = time.perf_counter()
                    sync_block()
                elif cmd == "fncall":
                    left = n

                    async def worker() -> None:
                        nonlocal left
                        while left > 0:
                            left -= 1
                            s = time.perf_counter()
                            r = await ac.functions.invoke(pool, cmd=["true"])
                            lat.append((time.perf_counter() - s) * 1000)
                            assert r.ok, r

                    await asyncio.gather(*(worker() for _ in range(conc)))
                elif cmd == "fncall_threads":
                    def one(_: int) -> float:
                        s = time.perf_counter()
                        r = sc.functions.invoke(pool, cmd=["true"])
                        assert r.ok, r
                        return (time.perf_counter() - s) * 1000

                    lat = await loop.run_in_executor(None, lambda: list(threads.map(one, range(n))))
                else:
                    raise SystemExit(f"unknown command {cmd!r}")
                out({"lat": lat, "wall": (time.perf_counter() - t0) * 1000, "cpu": (time.process_time() - c0) * 1000})
            threads.shutdown()
            ssh.close()
            await ash.close()


def main() -> None:
    url, token, sandbox, pool, conc = sys.argv[1:6]
    asyncio.run(main_async(url, token, sandbox, pool, int(conc)))


if __name__ == "__main__":
    main()
