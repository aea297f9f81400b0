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


async def test_a_stop_that_is_itself_cancelled_ends_cancelled() -> None:
    # a loop slow to stop, stopped under a deadline (a forced shutdown's): the deadline's
    # cancellation reaches whoever set it, not swallowed as the loop's own
    stopping = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopping.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await stop_tasks([task])
    assert stopping.is_set() and task.cancelled()
