"""Stopping the async engine while a step runs: the step is waited for off the event
loop, so the loop serves on (a lifespan's other shutdown work, other apps) meanwhile."""

from __future__ import annotations

import asyncio
import threading

from engine.async_engine import AsyncEngine
from engine.executor import Batch, Executor, StepResult
from engine.request import SamplingParams
from tests.support.engine_cores import make_core


class HeldExecutor:
    """Runs ``inner`` once ``release`` is set (``entered`` tells a step waits for it);
    ``released`` records whether it was, or the wait gave up."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.eos_token_id = inner.eos_token_id
        self.entered, self.release = threading.Event(), threading.Event()
        self.released: list[bool] = []

    def execute(self, batch: Batch) -> StepResult:
        self.entered.set()
        self.released.append(self.release.wait(2))
        return self.inner.execute(batch)


def test_stop_waits_for_a_running_step_without_blocking_the_loop() -> None:
    async def run() -> None:
        core = make_core()
        held = HeldExecutor(core.executor)
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
