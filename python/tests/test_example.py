"""The worked RL reward example runs against the test node and gives the expected rewards."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys

import pytest

from conftest import WarrenServer

HERE = os.path.dirname(os.path.abspath(__file__))


def _load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rl_reward", os.path.join(HERE, "..", "examples", "rl_reward.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["rl_reward"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_rl_reward_example(server: WarrenServer, judge_pool: str) -> None:
    ex = _load()

    async def main() -> None:
        async with server.aclient() as c:
            got = await ex.demo(c, pool=judge_pool)
            assert got["code"] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0, 1.0])
            assert got["repo"] == pytest.approx([1.0, 0.375, 0.0])
            assert await c.list_sandboxes(labels={"purpose": "rl-reward"}) == [], "every reward sandbox was deleted"

    asyncio.run(main())
