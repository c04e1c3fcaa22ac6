"""Idempotency keys from the Python SDK against a real ``warren up``: a keyed exec runs once and
its retries get the stored result; a keyed exec sent while the gateway is down is retried until
it is back, and still runs once; keyed shell runs are answered from the first run."""

from __future__ import annotations

import threading
from typing import Iterator, List

import pytest

import warren
from conftest import WarrenServer, start_server


@pytest.fixture(scope="module")
def node() -> Iterator[WarrenServer]:
    n = start_server("idem")
    try:
        yield n
    finally:
        leftovers = n.cleanup()
        assert leftovers == [], leftovers


def count(sb: warren.Sandbox, path: str) -> int:
    return int(sb.exec(f"cat {path} 2>/dev/null | wc -l").stdout.strip())


def test_keyed_exec_runs_once_and_replays(node: WarrenServer) -> None:
    with node.client() as c:
        sb = c.create_sandbox(image="default")
        try:
            a = sb.exec("echo run >> /tmp/once; echo hello", idempotency_key="py-1")
            b = sb.exec("echo run >> /tmp/once; echo hello", idempotency_key="py-1")
            assert (a.exit_code, a.stdout) == (0, "hello\n")
            assert (b.exit_code, b.stdout) == (0, "hello\n")
            assert count(sb, "/tmp/once") == 1
            with pytest.raises(warren.ConflictError) as e:
                sb.exec("echo something else", idempotency_key="py-1")
            assert e.value.code == "IDEMPOTENCY_KEY_REUSED"
            assert e.value.status == 422
            with pytest.raises(warren.BadInputError):
                sb.exec("true", idempotency_key="not a key")
        finally:
            sb.delete()


def test_keyed_exec_is_retried_until_the_gateway_is_back(node: WarrenServer) -> None:
    with node.client() as c:
        sb = c.create_sandbox(image="default")
        sandbox_id = sb.id
    node.kill9()
    results: List[object] = []

    def call() -> None:
        with node.client() as c2:
            sandbox = c2.sandbox(sandbox_id)  # a handle without a request: the gateway is down
            try:
                results.append(sandbox.exec("echo run >> /tmp/auto; echo back", idempotency_key="py-auto", retry_for=120))
            except warren.WarrenError as err:
                results.append(err)

    t = threading.Thread(target=call)
    t.start()
    node.start()
    t.join(150)
    assert len(results) == 1
    r = results[0]
    assert isinstance(r, warren.ExecResult), r
    assert (r.exit_code, r.stdout) == (0, "back\n")
    with node.client() as c:
        sb = c.get_sandbox(sandbox_id)
        again = sb.exec("echo run >> /tmp/auto; echo back", idempotency_key="py-auto")
        assert again.stdout == "back\n"
        assert count(sb, "/tmp/auto") == 1
        sb.delete()


def test_keyed_shell_run_replays(node: WarrenServer) -> None:
    with node.client() as c:
        sb = c.create_sandbox(image="default")
        try:
            with sb.shell() as sh:
                first = sh.run("echo run >> /tmp/sh; echo out; (exit 3)", idempotency_key="py-sh")
                second = sh.run("echo run >> /tmp/sh; echo out; (exit 3)", idempotency_key="py-sh")
                assert (first.exit_code, first.stdout, first.replayed) == (3, "out\n", False)
                assert (second.exit_code, second.stdout, second.replayed) == (3, "out\n", True)
                assert sh.run("wc -l < /tmp/sh").stdout.strip() == "1"
        finally:
            sb.delete()


def test_async_keyed_exec_runs_once(node: WarrenServer) -> None:
    import asyncio

    async def go() -> None:
        async with node.aclient() as c:
            sb = await c.create_sandbox(image="default")
            try:
                runs = await asyncio.gather(*(sb.exec("echo run >> /tmp/a; echo async", idempotency_key="py-async") for _ in range(3)))
                assert [r.stdout for r in runs] == ["async\n"] * 3
                assert (await sb.exec("wc -l < /tmp/a")).stdout.strip() == "1"
            finally:
                await sb.delete()

    asyncio.run(go())
