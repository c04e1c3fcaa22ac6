"""Shell sessions outlive the gateway: kill -9 ``warren up``, start it again on the same data dir
and port, re-attach to the session by id and find its state and unread output."""

from __future__ import annotations

import asyncio
import threading
from typing import Iterator

import pytest

import warren
from conftest import WarrenServer, start_server, wait_for


@pytest.fixture(scope="module")
def node() -> Iterator[WarrenServer]:
    """One node for this module's tests, killed and restarted by them."""
    n = start_server("r")
    try:
        yield n
    finally:
        leftovers = n.cleanup()
        assert leftovers == [], leftovers


def test_reattach_after_gateway_kill9_and_restart(node: WarrenServer) -> None:
    with node.client() as c:
        sb = c.create_sandbox(image="default")
        # reconnect=False: this test re-attaches by hand, as a client of its own would
        sh = sb.shell(reconnect=False)
        sh.run("mkdir -p /work/r; cd /work/r; export ROUND=1; sleep 600 &")
        assert sh.run("jobs").stdout.strip() != ""
        sid, off = sh.session, sh.offset

        node.kill9()
        # the dropped socket surfaces as an error on the next use, not as a hang
        with pytest.raises(warren.UnavailableError):
            sh.run("true", timeout=5)
        node.start()

        again = sb.shell(session=sid, offset=off)
        assert again.session == sid
        r = again.run("pwd; echo $ROUND; jobs | grep -c 'sleep 600'")
        assert r.stdout == "/work/r\n1\n1\n", "cwd, env and background jobs survived"
        # output produced while no client was attached is replayed on the next attachment
        again.run("(sleep 0.2; echo while-detached) &")
        mid = again.offset
        again.detach()
        assert wait_for(lambda: any(x["id"] == sid and x["outputOffset"] > mid for x in sb.sessions())), "output produced while detached"
        replay: list[bytes] = []
        third = sb.shell(session=sid, offset=mid, on_output=lambda o: replay.append(o.data))
        assert third.run("echo back").stdout == "back\n"
        assert b"while-detached" in b"".join(replay)
        third.close()
        sb.delete()


def test_command_in_flight_survives_a_gateway_kill9_and_restart(node: WarrenServer) -> None:
    """The SDK attaches again by itself once the gateway is back on its address, and the command
    that was running when the gateway died completes, once, with all its output."""
    with node.client() as c:
        sb = c.create_sandbox(image="default")
        sh = sb.shell(reconnect_window=300)
        sh.run("cd /tmp; echo 0 > runs")
        result: dict[str, object] = {}

        def run() -> None:
            try:
                result["r"] = sh.run("n=$(cat runs); echo $((n+1)) > runs; echo started; sleep 2; echo done-$PWD")
            except Exception as e:  # reported below
                result["e"] = e

        t = threading.Thread(target=run)
        t.start()
        assert wait_for(lambda: sb.exec("cat /tmp/runs").stdout == "1\n", timeout=30), "the command to start"
        node.kill9()
        node.start()
        t.join(timeout=300)
        assert not t.is_alive(), "the run to end"
        assert "e" not in result, result.get("e")
        r = result["r"]
        assert isinstance(r, warren.CommandResult)
        assert (r.exit_code, r.stdout) == (0, "started\ndone-/tmp\n")
        assert sh.reconnects >= 1
        assert sh.run("cat runs").stdout == "1\n", "the command ran once"
        sh.close()
        sb.delete()


def test_async_reattach_after_restart(node: WarrenServer) -> None:
    async def before() -> tuple[str, str, int]:
        async with node.aclient() as c:
            sb = await c.create_sandbox(image="default")
            sh = await sb.shell()
            await sh.run("export A=async; cd /opt")
            await sh.detach()
            return sb.id, sh.session, sh.offset

    sandbox_id, sid, off = asyncio.run(before())
    node.kill9()
    node.start()

    async def after() -> None:
        async with node.aclient() as c:
            sb = await c.get_sandbox(sandbox_id)
            assert sb.state == "running"
            assert any(s["id"] == sid and s["alive"] for s in await sb.sessions())
            async with await sb.shell(session=sid, offset=off) as sh:
                assert (await sh.run("echo $A $PWD")).stdout == "async /opt\n"
            await sb.delete(missing_ok=False)

    asyncio.run(after())
