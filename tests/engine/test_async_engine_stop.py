"""Stopping the async engine while a step runs: the step is waited for off the event
loop, so the loop serves on (a lifespan's other shutdown work, other apps) meanwhile."""

from __future__ import annotations

import asyncio

from engine.async_engine import AsyncEngine
from engine.request import SamplingParams
from tests.support.engine_cores import HeldExecutor, make_core


def test_stop_waits_for_a_running_step_without_blocking_the_loop() -> None:
    async def run() -> None:
        core = make_core()
        held = HeldExecutor(core.executor, wait_s=2)
        core.executor = held
        engine = AsyncEngine(core, sleep_modeled_time=False)
        await engine.start()
        engine.add(core.make_request("a", [1, 2, 3], SamplingParams(max_tokens=1)))
        assert await asyncio.to_thread(held.entered.wait, 5)
        # released by the loop while stop() waits for the step: only if the loop runs
        asyncio.get_running_loop().call_later(0.05, held.release.set)
        await engine.stop()
        assert held.released == [True]

    asyncio.run(run())
