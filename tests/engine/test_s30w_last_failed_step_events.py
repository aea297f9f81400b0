"""The failed step that stops the engine (the last of ``FAILED_STEPS_IN_A_ROW``) still
reports the blocks it evicted: KV-event subscribers (the gateway's exact index) must not
keep blocks the engine dropped."""

from __future__ import annotations

import asyncio

from engine.async_engine import FAILED_STEPS_IN_A_ROW, EngineDeadError, RequestFailed
from engine.request import SamplingParams
from kvwire.kv_event_format import BlockRemoved, BlockStored
from tests.support.engine_cores import POISON, faulty_engine


def test_the_step_that_stops_the_engine_reports_what_it_evicted() -> None:
    async def run() -> None:
        async with faulty_engine() as (core, engine, drained):
            params = SamplingParams(max_tokens=1)
            cached = engine.add(core.make_request("cached", list(range(100, 109)), params))
            assert (await asyncio.wait_for(cached.get(), 5)).finished
            stored = [e for e in drained if isinstance(e, BlockStored)]
            assert stored and core.kv.pool.cached
            for i in range(FAILED_STEPS_IN_A_ROW - 1):  # one block each: nothing evicted
                bad = engine.add(core.make_request(f"bad{i}", [POISON], params))
                assert isinstance(await asyncio.wait_for(bad.get(), 5), RequestFailed)
            assert not any(isinstance(e, BlockRemoved) for e in drained)
            assert core.kv.pool.cached
            # the whole cache: the cached blocks are evicted, then the step fails
            last = engine.add(core.make_request("last", [*range(110, 122), POISON], params))
            assert isinstance(await asyncio.wait_for(last.get(), 5), EngineDeadError)
            assert not engine.alive
            assert not core.kv.pool.cached
            assert not core.kv.pool.events
            removed = {h for e in drained if isinstance(e, BlockRemoved) for h in e.block_hashes}
            assert removed == {h for e in stored for h in e.block_hashes}

    asyncio.run(run())
