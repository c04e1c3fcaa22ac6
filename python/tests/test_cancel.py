"""Cancellation: an asyncio task cancelled mid-exec, mid-command or mid-create leaves nothing
behind (no sandbox, no process, no session, no task of the SDK's own)."""

from __future__ import annotations

import asyncio
import uuid

import warren
from conftest import WarrenServer, processes_with, wait_for


def _marker() -> str:
    # a sleep duration nothing else on the machine uses: its process can be found in /proc
    return f"{1000 + uuid.uuid4().int % 100000}.{uuid.uuid4().int % 97 + 1}"


def test_cancel_mid_exec_deletes_the_sandbox(server: WarrenServer) -> None:
    marker = _marker()
    seen: dict[str, str] = {}

    async def work(c: warren.AsyncClient, started: asyncio.Event) -> None:
        async with await c.create_sandbox(image="default", labels={"t": "cancel-exec"}) as sb:
            seen["id"] = sb.id
            started.set()
            await sb.exec(["sleep", marker])

    async def main() -> None:
        async with server.aclient() as c:
            started = asyncio.Event()
            task = asyncio.create_task(work(c, started))
            await started.wait()
            assert await asyncio.to_thread(wait_for, lambda: processes_with(f"sleep\0{marker}") != [], 15)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            assert task.cancelled()
            assert await c.list_sandboxes(labels={"t": "cancel-exec"}) == []
            assert asyncio.all_tasks() == {asyncio.current_task()}, "no SDK task outlives the cancelled one"

    asyncio.run(main())
    assert wait_for(lambda: processes_with(f"sleep\0{marker}") == [], 15), "the exec'd process is gone with its sandbox"


def test_cancel_mid_command_kills_it_and_keeps_the_session(server: WarrenServer) -> None:
    marker = _marker()

    async def main() -> None:
        async with server.aclient() as c:
            async with await c.create_sandbox(image="default") as sb:
                async with await sb.shell() as sh:
                    await sh.run("cd /tmp; export KEEP=yes")
                    task = asyncio.create_task(sh.run(f"sleep {marker}"))
                    assert await asyncio.to_thread(wait_for, lambda: processes_with(f"sleep\0{marker}") != [], 15)
                    task.cancel()
                    try:
                        await task
                    except asyncio.CancelledError:
                        pass
                    assert task.cancelled()
                    assert await asyncio.to_thread(wait_for, lambda: processes_with(f"sleep\0{marker}") == [], 15), "the command was killed"
                    r = await sh.run("pwd; echo $KEEP")
                    assert r.stdout == "/tmp\nyes\n", "the session is still usable, state intact"
                    sid = sh.session
                assert all(s["id"] != sid or not s["alive"] for s in await sb.sessions())

    asyncio.run(main())


def test_cancel_mid_create_deletes_what_was_created(server: WarrenServer) -> None:
    label = f"cc-{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with server.aclient() as c:
            # A disk quota no other test asks for: a shape the node has no prepared sandbox of, so
            # this create spawns (5 ms and more in the node) and is cancelled while in flight.
            disk_mb = 1000 + int(label[3:], 16) % 1000
            task = asyncio.create_task(c.create_sandbox(image="default", labels={"t": label}, disk_mb=disk_mb))
            await asyncio.sleep(0.002)
            assert not task.done(), "the create was still in flight when cancelled"
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            assert task.cancelled()
            assert await c.list_sandboxes(labels={"t": label}) == []

    asyncio.run(main())


def test_cancel_mid_exec_stream(server: WarrenServer) -> None:
    marker = _marker()

    async def main() -> None:
        async with server.aclient() as c:
            async with await c.create_sandbox(image="default") as sb:
                got: list[bytes] = []
                task = asyncio.create_task(sb.exec_stream(f"echo started; sleep {marker}", lambda o: got.append(o.data)))
                assert await asyncio.to_thread(wait_for, lambda: processes_with(f"sleep\0{marker}") != [] and got != [], 15)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                assert got == [b"started\n"]
                assert await asyncio.to_thread(wait_for, lambda: processes_with(f"sleep\0{marker}") == [], 15)
                assert [s for s in await sb.sessions() if s["alive"]] == [], "the streaming session was closed"

    asyncio.run(main())
