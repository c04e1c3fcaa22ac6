"""A reward function for RL on code, the way a trainer calls it: a batch of model completions in,
one float per completion out, judged concurrently.

Two kinds of task, two Warren paths:

* **Competitive programming** (stdin/stdout tests): each completion is a program; FnCall judges
  it in a warm pool container (compile once, run every test, check tokens). Reward = fraction of
  tests passed. Hundreds per second on a small node; no sandbox is created.
* **Repository tasks** (SWE-style): each completion is a patched source file; it gets its own
  sandbox with the repository uploaded, and a shell session runs the project's test script there,
  then inspects the result in the same shell (state persists between commands). Reward = 1 if the
  tests pass, with partial credit for the fraction of test cases passing. Sandboxes are deleted
  when the block ends, also when the trainer cancels the step.

Run it against a node (``warren up``)::

    /usr/bin/python3 python/examples/rl_reward.py --url http://127.0.0.1:7070 --data-dir /var/lib/warren

A trainer (verl, OpenRLHF, SkyRL, ...) would call :func:`code_rewards` / :func:`repo_rewards`
from its reward hook; both take an :class:`warren.AsyncClient` so one connection pool serves
every step.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import warren  # noqa: E402

POOL = "rl-judge"


@dataclass
class Problem:
    statement: str
    tests: List[Dict[str, str]]  # [{"stdin": ..., "expected": ...}]
    language: str = "python3"


async def code_rewards(client: warren.AsyncClient, problems: Sequence[Problem], completions: Sequence[str], *, pool: str = POOL, concurrency: int = 64) -> List[float]:
    """One reward per completion: the fraction of the problem's tests it passes (0 on a
    compile error, a crash or a time limit). Judged concurrently, at most ``concurrency`` at
    once (more would only queue in the pool)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(problem: Problem, code: str) -> float:
        async with gate:
            try:
                j = await client.functions.judge(pool, code, problem.language, problem.tests, checker="tokens", timeout=2.0)
            except warren.BadInputError:
                return 0.0  # e.g. an unknown language in the completion's metadata: no reward
            return j.fraction

    return list(await asyncio.gather(*(one(p, c) for p, c in zip(problems, completions))))


@dataclass
class RepoTask:
    files: Dict[str, str]  # path (relative to the repo) -> content
    target: str  # the file the model rewrites
    test_command: str  # run in the repo dir; prints "passed N failed M" on its last line


async def repo_rewards(client: warren.AsyncClient, task: RepoTask, completions: Sequence[str], *, image: str = "default", concurrency: int = 8, timeout: float = 60.0) -> List[float]:
    """One sandbox per completion (at most ``concurrency`` alive), deleted when judged."""
    gate = asyncio.Semaphore(concurrency)

    async def one(patched: str) -> float:
        async with gate:
            async with await client.create_sandbox(image=image, cpu=1, memory_mb=512, ttl_seconds=600, labels={"purpose": "rl-reward"}) as sb:
                for path, content in {**task.files, task.target: patched}.items():
                    await sb.write_file(f"/work/repo/{path}", content)
                async with await sb.shell() as sh:
                    await sh.run("cd /work/repo && export PYTHONDONTWRITEBYTECODE=1")
                    r = await sh.run(task.test_command, timeout=timeout)
                    if r.timed_out:
                        return 0.0
                    summary = (await sh.run("tail -n 1 .last-run 2>/dev/null || true")).stdout.split()
                    counts = _counts(summary) or _counts(r.stdout.split())
                    if r.exit_code == 0:
                        return 1.0
                    if counts is not None and sum(counts) > 0:
                        return 0.5 * counts[0] / sum(counts)
                    return 0.0

    return list(await asyncio.gather(*(one(c) for c in completions)))


def _counts(words: List[str]) -> Optional[tuple[int, int]]:
    try:
        i, j = words.index("passed"), words.index("failed")
        return int(words[i + 1]), int(words[j + 1])
    except (ValueError, IndexError):
        return None


# ---------------------------------------------------------------------------
# a demo batch

SUM = Problem("print a+b", [{"stdin": "1 2\n", "expected": "3"}, {"stdin": "-5 5\n", "expected": "0"}, {"stdin": "100 23\n", "expected": "123"}])
CODE_COMPLETIONS = [
    "a, b = map(int, input().split())\nprint(a + b)\n",  # correct
    "a, b = map(int, input().split())\nprint(abs(a) + b)\n",  # wrong on negatives
    "print(3)\n",  # passes one test
    "while True: pass\n",  # time limit
    "#include <cstdio>\nint main(){long a,b;scanf(\"%ld %ld\",&a,&b);printf(\"%ld\\n\",a+b);}\n",  # correct, C++
]
CODE_LANGS = ["python3", "python3", "python3", "python3", "cpp"]

REPO = RepoTask(
    files={
        "test_calc.py": (
            "import calc\n"
            "cases = [((2, 3), 5), ((0, 0), 0), ((-1, 1), 0), ((10, -3), 7)]\n"
            "ok = sum(1 for args, want in cases if calc.add(*args) == want)\n"
            "line = f'passed {ok} failed {len(cases) - ok}'\n"
            "open('.last-run', 'w').write(line + '\\n')\n"
            "print(line)\n"
            "raise SystemExit(0 if ok == len(cases) else 1)\n"
        ),
    },
    target="calc.py",
    test_command="python3 test_calc.py",
)
REPO_COMPLETIONS = [
    "def add(a, b):\n    return a + b\n",
    "def add(a, b):\n    return abs(a) + b\n",
    "def add(a, b):\n    raise NotImplementedError\n",
]


async def demo(client: warren.AsyncClient, pool: str = POOL) -> Mapping[str, List[float]]:
    if pool not in {p["name"] for p in await client.functions.list()}:
        await client.functions.create(pool, image="judge", min=2, max=4, wait=True)
    problems = [Problem(SUM.statement, SUM.tests, lang) for lang in CODE_LANGS]
    t0 = time.perf_counter()
    code = await code_rewards(client, problems, CODE_COMPLETIONS, pool=pool)
    t1 = time.perf_counter()
    repo = await repo_rewards(client, REPO, REPO_COMPLETIONS)
    t2 = time.perf_counter()
    print(f"FnCall rewards  {code}  ({(t1 - t0) * 1000:.0f} ms for {len(code)})")
    print(f"sandbox rewards {repo}  ({(t2 - t1) * 1000:.0f} ms for {len(repo)})")
    return {"code": code, "repo": repo}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url")
    ap.add_argument("--token")
    ap.add_argument("--data-dir")
    a = ap.parse_args()

    async def run() -> None:
        async with warren.AsyncClient(a.url, a.token, data_dir=a.data_dir) as client:
            await demo(client)

    asyncio.run(run())


if __name__ == "__main__":
    main()
