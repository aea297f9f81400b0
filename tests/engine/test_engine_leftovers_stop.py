"""Stopping the async engine answers everyone still waiting on it: each request in flight
and each call not yet run gets an EngineDeadError naming the stop, and later ones are
refused at once, where they used to wait forever for a loop that was gone."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_engine import AsyncEngine, EngineDeadError
from engine.request import SamplingParams
from tests.support.engine_cores import HeldExecutor, make_core


def test_stop_answers_requests_in_flight_and_calls_not_run() -> None:
    async def run() -> None:
        core = make_core()
        held = HeldExecutor(core.executor)
        core.executor = held
        engine = AsyncEngine(core, sleep_modeled_time=False)
        await engine.start()
        params = SamplingParams(max_tokens=8, ignore_eos=True)
        running = engine.add(core.make_request("running", [1, 2, 3], params))
        assert await asyncio.to_thread(held.entered.wait, 5)
        # queued while the step runs: the loop would take both up after it
        waiting = engine.add(core.make_request("waiting", [4, 5, 6], params))
        call = asyncio.create_task(engine.call(lambda c: c.num_running))
        await asyncio.sleep(0)
        # the step ends only once stop() has cancelled the loop (which runs first)
        asyncio.get_running_loop().call_soon(held.release.set)
        await engine.stop()
        for queue in (running, waiting):
            item = queue.get_nowait()
            assert isinstance(item, EngineDeadError) and "engine stopped" in str(item)
        with pytest.raises(EngineDeadError, match="engine stopped"):
            await call
        assert engine.in_flight() == []
        with pytest.raises(EngineDeadError, match="engine stopped"):
            engine.add(core.make_request("late", [7, 8], params))
        with pytest.raises(EngineDeadError, match="engine stopped"):
            await engine.call(lambda c: c.num_running)
        with pytest.raises(EngineDeadError, match="engine stopped"):
            engine.abort("running")

    asyncio.run(asyncio.wait_for(run(), 20))
