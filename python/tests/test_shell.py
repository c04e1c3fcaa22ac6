"""Shell sessions over the WebSocket: command mode (state, exit codes, timeouts, streaming),
pty mode, re-attach by id with replay, refusals with their codes. Sync and asyncio."""

from __future__ import annotations

import asyncio

import pytest

import warren
from conftest import WarrenServer, processes_with, wait_for


def test_command_mode_sync(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        with sb.shell() as sh:
            assert sh.mode == "command" and sh.session
            r = sh.run("cd /tmp && export X=41 && f() { echo fn$1; }")
            assert r.exit_code == 0
            r = sh.run("pwd; echo $((X+1)); f 7")
            assert r.stdout == "/tmp\n42\nfn7\n" and r.ok
            r = sh.run(["sh", "-c", "echo to-err >&2; exit 5"])
            assert (r.exit_code, r.stdout, r.stderr) == (5, "", "to-err\n")
            # background jobs persist between runs
            sh.run("sleep 300 &")
            assert "sleep 300" in sh.run("jobs").stdout
            sh.run("kill %1")
            r = sh.run("sleep 20", timeout=0.3)
            assert r.timed_out and r.exit_code is None and not r.ok
            assert sh.run("echo still-alive").stdout == "still-alive\n"
            seen: list[bytes] = []
            r = sh.run("for i in 1 2 3; do echo $i; sleep 0.05; done", on_output=lambda o: seen.append(o.data))
            assert r.stdout == "1\n2\n3\n" and b"".join(seen) == b"1\n2\n3\n" and len(seen) >= 2
            assert sh.ping() < 5
            sessions = {s["id"]: s for s in sb.sessions()}
            assert sessions[sh.session]["alive"] and sessions[sh.session]["mode"] == "command"
        assert sh.closed
        assert all(s["id"] != sh.session or not s["alive"] for s in sb.sessions())


def test_shell_exit_ends_the_session(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        sh = sb.shell()
        # the command's done carries the status; then the shell is gone and the socket closes
        assert sh.run("exit 3").exit_code == 3
        sh.wait_closed()
        assert sh.exit is not None and sh.exit.exit_code == 3 and sh.close_code == 1000
        with pytest.raises(warren.UnavailableError):
            sh.run("true")
        sh.close()


def test_reattach_by_id(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        sh = sb.shell()
        sh.run("cd /srv 2>/dev/null || cd /opt; export Y=3; echo first-output")
        sid, off = sh.session, sh.offset
        sh.detach()
        assert sh.closed
        with sb.shell(session=sid, offset=off) as again:
            assert again.session == sid and again.offset == off
            r = again.run("pwd; echo $Y")
            assert r.stdout.split() == [r.stdout.split()[0], "3"] and r.stdout.startswith("/")
        # the session above was closed by the with-block: attaching again is refused with its code
        with pytest.raises(warren.NotFoundError) as e:
            sb.shell(session=sid)
        assert e.value.code == "SESSION_NOT_FOUND"


def test_replay_from_offset_is_not_taken_for_new_output(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        sh = sb.shell()
        sh.run("echo before-detach")
        sid = sh.session
        sh.detach()
        replayed: list[warren.ShellOutput] = []
        with sb.shell(session=sid, offset=0, on_output=replayed.append) as again:
            r = again.run("echo after")
            assert r.stdout == "after\n", "replayed output belongs to earlier commands"
        assert b"before-detach" in b"".join(o.data for o in replayed)


def test_refusals(client: warren.Client) -> None:
    with pytest.raises(warren.NotFoundError) as e:
        client.sandbox("no-such-sandbox").shell()
    assert e.value.code == "SANDBOX_NOT_FOUND"
    with client.create_sandbox(image="default") as sb:
        # passes the client's id syntax, refused by the server's stricter session-id format
        with pytest.raises(warren.BadInputError) as e2:
            sb.shell(session="s-does-not-exist")
        assert e2.value.code == "INVALID_ID"
        with pytest.raises(warren.BadInputError) as e3:
            sb.shell(cols=5000)
        assert e3.value.code == "LIMIT_OUT_OF_RANGE"
        with sb.shell() as sh:
            with pytest.raises(warren.BadInputError):
                sh.signal("NOPE")
            with pytest.raises(warren.BadInputError):
                sh.run("true", timeout=0)


def test_pty_sync(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        with sb.shell("pty", cols=100, rows=30) as sh:
            assert sh.mode == "pty"
            sh.write("stty size; echo mark$((40+2))\n")
            out = sh.read_until(b"mark42")
            assert b"30 100" in out
            sh.resize(120, 40)
            sh.write("stty size; echo mark$((50+1))\n")
            assert b"40 120" in sh.read_until(b"mark51")
            # INT must reach the sleep, not the shell before it has started it
            sh.write("sleep 137.25\n")
            assert wait_for(lambda: processes_with("sleep\x00137.25") != [], 15)
            sh.signal("INT")
            sh.write("echo after-int$((1+1))\n")
            sh.read_until(b"after-int2")
            sid, off = sh.session, sh.offset
            sh.detach()
        with sb.shell("pty", session=sid, offset=off) as again:
            again.write("echo re$((3+4))\n")
            assert b"re7" in again.read_until(b"re7")


def test_async_shell(server: WarrenServer) -> None:
    async def main() -> None:
        async with server.aclient() as c:
            async with await c.create_sandbox(image="default") as sb:
                async with await sb.shell() as sh:
                    await sh.run("export Z=9")
                    # concurrent runs on one session are queued, each gets its own output
                    a, b, z = await asyncio.gather(sh.run("echo a; sleep 0.1"), sh.run("echo b"), sh.run("echo $Z"))
                    assert (a.stdout, b.stdout, z.stdout) == ("a\n", "b\n", "9\n")
                    r = await sh.run("false")
                    assert r.exit_code == 1
                    sid, off = sh.session, sh.offset
                    await sh.detach()
                again = await sb.shell(session=sid, offset=off)
                assert (await again.run("echo $Z")).stdout == "9\n"
                await again.close()
                async with await sb.shell("pty") as pty:
                    await pty.write(b"echo p$((2*3))\n")
                    assert b"p6" in await pty.read_until("p6")
                chunks: list[warren.ShellOutput] = []
                r = await sb.exec_stream(["echo", "streamed"], chunks.append)
                assert r.stdout == "streamed\n" and chunks and chunks[0].data == b"streamed\n"

    asyncio.run(main())


def test_pty_input_exactly_once_across_broken_connections(server: WarrenServer) -> None:
    """Input in flight when the connection breaks is sent again and applied once; input typed
    while the session is attached again waits for the new connection."""

    async def main() -> None:
        async with server.aclient() as c:
            async with await c.create_sandbox(image="default") as sb:
                async with await sb.shell("pty") as pty:
                    seen = bytearray()
                    for i in range(4):
                        line = f"echo n-$(({i}*1000+7))\n"
                        assert pty._ws is not None
                        if i % 2 == 0:
                            # the line went to the socket just before it broke
                            await pty.write(line)
                            pty._ws.transport.abort()
                        else:
                            # typed after the break, before the client has noticed it
                            pty._ws.transport.abort()
                            await pty.write(line)
                        seen += await pty.read_until(f"n-{i * 1000 + 7}\r\n")
                    await pty.write("echo end-$((2+2))\n")
                    seen += await pty.read_until("end-4")
                    for i in range(4):
                        assert bytes(seen).count(f"n-{i * 1000 + 7}\r\n".encode()) == 1, (i, bytes(seen))
                    assert pty.reconnects == 4

    asyncio.run(main())


def test_run_across_broken_connections_is_sent_once(server: WarrenServer) -> None:
    """A run issued while the connection is broken, before or after the client notices, reaches
    the shell once (keyed or not): on the new connection, never also from the re-attach."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with server.aclient() as c:
            async with await c.create_sandbox(image="default") as sb:
                async with await sb.shell() as sh:
                    for i, key in enumerate([None, "py-broken-1", None, "py-broken-2"]):
                        assert sh._ws is not None
                        sh._ws.transport.abort()
                        if i >= 2:
                            # the client has noticed: this run waits for the re-attach in progress
                            deadline = loop.time() + 10
                            while sh._live.is_set():
                                assert loop.time() < deadline, "the client never noticed the break"
                                await asyncio.sleep(0.001)
                        r = await sh.run(f"echo run-{i} >> /tmp/runs; echo ok-{i}", idempotency_key=key)
                        assert (r.exit_code, r.stdout) == (0, f"ok-{i}\n"), (i, r)
                    runs = await sh.run("cat /tmp/runs")
                    assert runs.stdout.split() == [f"run-{i}" for i in range(4)]
                    assert sh.reconnects == 4

    asyncio.run(main())
