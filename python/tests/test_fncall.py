"""FnCall through the SDK: pools, invoke, judge, batch, run_code, errors, and 500 concurrent
invocations from one AsyncClient with bounded memory."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest

import warren
from conftest import WarrenServer


def test_pools(client: warren.Client, judge_pool: str) -> None:
    pools = {p["name"]: p for p in client.functions.list()}
    assert pools[judge_pool]["image"] == "judge" and pools[judge_pool]["max"] == 4
    st = client.functions.get(judge_pool)
    assert st["state"] == "ready" and st["warm"] + st["busy"] + st["starting"] >= 1
    with pytest.raises(warren.ConflictError) as e:
        client.functions.create(judge_pool)
    assert e.value.code == "ALREADY_EXISTS"
    with pytest.raises(warren.NotFoundError) as nf:
        client.functions.get("no-such-pool")
    assert nf.value.code == "NOT_FOUND"
    client.functions.create("pytmp", image="judge", min=0, max=1)
    client.functions.delete("pytmp")
    with pytest.raises(warren.NotFoundError):
        client.functions.delete("pytmp")
    client.functions.delete("pytmp", missing_ok=True)


def test_invoke(client: warren.Client, judge_pool: str) -> None:
    fn = client.functions
    r = fn.invoke(judge_pool, "import sys; print(input()[::-1]); sys.exit(0)", language="python3", stdin="abc")
    assert r.ok and r.stdout == "cba\n" and r.exit_code == 0 and r.pool == judge_pool and r.wall_ms > 0
    r = fn.invoke(judge_pool, cmd=["sh", "-c", "cat data/in.txt; echo $K; printf '\\377' > out.bin"], files={"data/in.txt": "file-text\n"}, env={"K": "V"}, fetch_files=["out.bin"])
    assert r.stdout == "file-text\nV\n" and r.files == {"out.bin": b"\xff"}
    r = fn.invoke(judge_pool, cmd="head -c 3 /work/b.bin | od -An -tx1", files={"b.bin": b"\x00\x01\x02"})
    assert r.stdout.split() == ["00", "01", "02"]
    r = fn.invoke(judge_pool, "while True: pass", language="python3", timeout=0.5, cpu_time=0.3)
    assert r.status == "timeout" and r.limit in ("cpuMs", "wallMs")
    r = fn.invoke(judge_pool, "raise SystemExit(3)", language="python3")
    assert r.status == "runtime_error" and r.exit_code == 3 and not r.ok
    r = fn.invoke(judge_pool, "int main(){ return 1 }", language="c")
    assert r.phase == "compile" and r.compile is not None and r.compile.status == "runtime_error"
    r = fn.invoke(judge_pool, cmd=["printf", "\\377\\376"])
    assert r.stdout_bytes == b"\xff\xfe", "exact bytes when the output is not UTF-8"
    with pytest.raises(warren.BadInputError) as e:
        fn.invoke(judge_pool, "x", language="cobol")
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(warren.BadInputError) as e2:
        fn.invoke(judge_pool, cmd="true", files={"../x": "no"})
    assert e2.value.code == "PATH_ESCAPE"
    with pytest.raises(warren.NotFoundError):
        fn.invoke("no-such-pool", cmd="true")


def test_judge(client: warren.Client, judge_pool: str) -> None:
    code = "a, b = map(int, input().split())\nprint(a + b)\n"
    tests = [{"stdin": "1 2\n", "expected": "3\n"}, warren.JudgeTestInput(stdin="5 5\n", expected="10")]
    j = client.functions.judge(judge_pool, code, "python3", tests, checker="tokens")
    assert j.verdict == "AC" and j.accepted and (j.passed, j.total) == (2, 2) and j.fraction == 1.0
    assert [t.verdict for t in j.tests] == ["AC", "AC"]
    wrong = client.functions.judge(judge_pool, "print(0)", "python3", tests, stop_on_first_failure=True)
    assert wrong.verdict == "WA" and wrong.ran == 1 and wrong.passed == 0
    cpp = client.functions.judge(judge_pool, "#include <cstdio>\nint main(){double x;scanf(\"%lf\",&x);printf(\"%.9f\\n\",x/3);}", "cpp", [{"stdin": "1", "expected": "0.333333"}], checker="float(1e-5)")
    assert cpp.verdict == "AC" and cpp.compile is not None
    ce = client.functions.judge(judge_pool, "int main(", "c", [{"expected": ""}])
    assert ce.verdict == "CE"


def test_batch_and_run_code(client: warren.Client, judge_pool: str) -> None:
    items = [{"code": f"print({i} * {i})", "language": "python3"} for i in range(6)] + [{"cmd": ["sh", "-c", "exit 2"]}]
    results = client.functions.batch(judge_pool, items, concurrency=3)
    assert len(results) == 7
    for i, r in enumerate(results[:6]):
        assert isinstance(r, warren.InvokeResult) and r.stdout == f"{i * i}\n"
    last = results[6]
    assert isinstance(last, warren.InvokeResult) and last.exit_code == 2
    sf = client.functions.run_code({"code": "print('sf')", "language": "python"})
    assert sf["status"] == "Success" and sf["run_result"]["stdout"] == "sf\n"
    bad = client.functions.run_code({"code": "import sys; sys.exit(4)", "language": "python"})
    assert bad["status"] == "Failed" and bad["run_result"]["return_code"] == 4


def test_async_mirror(server: WarrenServer, judge_pool: str) -> None:
    async def main() -> None:
        async with server.aclient() as c:
            assert judge_pool in {p["name"] for p in await c.functions.list()}
            r = await c.functions.invoke(judge_pool, "print('async')", language="python3")
            assert r.stdout == "async\n"
            j = await c.functions.judge(judge_pool, "print(input())", "python3", [{"stdin": "x", "expected": "x"}])
            assert j.accepted
            b = await c.functions.batch(judge_pool, [{"cmd": ["echo", "b"]}])
            assert isinstance(b[0], warren.InvokeResult) and b[0].stdout == "b\n"
            sf = await c.functions.run_code({"code": "print(2)", "language": "python3"})
            assert sf["status"] == "Success"

    asyncio.run(main())


def test_500_concurrent_invocations_bounded_memory(server: WarrenServer, judge_pool: str) -> None:
    """500 invocations started at once from one AsyncClient: every one completes (the client's
    pool keeps at most ``connections`` in flight, within the account's concurrency; a 429 is
    retried after Retry-After), and the client's memory stays bounded while they run."""
    n = 500

    async def main() -> tuple[int, int, int]:
        async with server.aclient(connections=48) as c:
            await c.functions.invoke(judge_pool, cmd=["true"])  # warm the connection pool
            gc.collect()
            tracemalloc.start()
            base, _ = tracemalloc.get_traced_memory()
            results = await asyncio.gather(*(c.functions.invoke(judge_pool, cmd=["echo", str(i)]) for i in range(n)))
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            ok = sum(1 for i, r in enumerate(results) if r.ok and r.stdout == f"{i}\n")
            return ok, base, peak

    ok, base, peak = asyncio.run(main())
    assert ok == n
    # ~2 KiB of request and result per invocation plus the pool's buffers; unbounded buffering
    # (every request's body and answer held at once many times over) would be far more.
    assert peak - base < 24 * 1024 * 1024, f"peak {peak - base} bytes above baseline for {n} invocations"
