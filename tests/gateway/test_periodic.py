"""The gateway's background loops: a failing round is logged and the next one runs."""

from __future__ import annotations

import asyncio

import pytest

from gateway.periodic import every, stop_tasks


async def test_a_failing_round_is_logged_and_the_loop_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []
    awaited_rounds: list[int] = []

    def plain() -> None:
        rounds.append(len(rounds))
        if len(rounds) == 1:
            raise RuntimeError("a bug in round 0")

    async def awaited() -> None:
        awaited_rounds.append(len(awaited_rounds))

    tasks = [asyncio.create_task(every(0.01, plain, "the plain round")),
             asyncio.create_task(every(0.01, awaited, "the awaited round"))]
    for _ in range(200):
        if len(rounds) >= 3 and awaited_rounds:
            break
        await asyncio.sleep(0.01)
    await stop_tasks([*tasks, None])
    assert all(task.done() for task in tasks)
    assert rounds[:3] == [0, 1, 2]  # rounds after the failure ran
    assert awaited_rounds  # a coroutine function's rounds are awaited
    assert "the plain round failed" in caplog.text and "a bug in round 0" in caplog.text
