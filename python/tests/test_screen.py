"""Computer use (vm backend): the client side of screenshot() and input().

A desktop vm boot costs tens of seconds under TCG, so this file checks the
calls against a container sandbox (no screen: NOT_SUPPORTED from the server,
sync and asyncio); test/integration/vm-desktop.test.ts drives a real desktop.
"""

from __future__ import annotations

import asyncio

import pytest

import warren
from conftest import WarrenServer


def test_screen_calls_sync(client: warren.Client) -> None:
    with client.create_sandbox(image="default") as sb:
        with pytest.raises(warren.WarrenError) as e:
            sb.screenshot()
        assert e.value.code == "NOT_SUPPORTED"
        with pytest.raises(warren.WarrenError) as e:
            sb.input([{"type": "move", "x": 1, "y": 1}])
        assert e.value.code == "NOT_SUPPORTED"
        with pytest.raises(warren.WarrenError) as e:
            sb.screenshot(width=5)
        assert e.value.code == "INVALID_ARGUMENT"


def test_screen_calls_async(server: WarrenServer) -> None:
    async def go() -> None:
        async with server.aclient() as c:
            sb = await c.create_sandbox(image="default")
            try:
                with pytest.raises(warren.WarrenError) as e:
                    await sb.screenshot(width=64)
                assert e.value.code == "NOT_SUPPORTED"
                with pytest.raises(warren.WarrenError) as e:
                    await sb.input([{"type": "key", "keys": "ctrl+c"}])
                assert e.value.code == "NOT_SUPPORTED"
            finally:
                await sb.delete()

    asyncio.run(go())
