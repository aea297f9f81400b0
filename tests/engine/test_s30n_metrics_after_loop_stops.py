"""A step that raises something other than ``StepFailed`` (a fault of the core itself)
stops the engine's loop; /metrics then reads the core as it is, not as it was before
that step for good."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from engine.async_engine import AsyncEngine
from engine.executor import Batch, Executor, StepResult
from engine.metrics import EngineMetrics
from engine.request import SamplingParams
from kvwire import metric_names as m
from tests.support.engine_cores import make_core
from tests.support.metrics import Samples, samples

KEY = (("engine", "0"), ("model_name", "tiny"))


class TokenLess:
    """The core's own executor, but its results name no sampled token: the core's update
    of the step raises KeyError (not ``StepFailed``: the executor itself returned)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.eos_token_id = inner.eos_token_id

    def execute(self, batch: Batch) -> StepResult:
        return StepResult({}, self.inner.execute(batch).seconds)


def test_a_step_that_stops_the_loop_leaves_metrics_reading_the_core_live() -> None:
    async def run() -> None:
        core = make_core(num_blocks=64)
        core.executor = TokenLess(core.executor)
        metrics = EngineMetrics(core, "tiny")
        engine = AsyncEngine(core, sleep_modeled_time=False)
        queue = engine.add(core.make_request(
            "r0", [100] * 10, SamplingParams(max_tokens=2, ignore_eos=True)))
        await engine.start()
        try:
            item = await asyncio.wait_for(queue.get(), 5)
            assert isinstance(item, BaseException), item
            assert isinstance(engine.error, KeyError), engine.error
        finally:
            await engine.stop()
        # the step admitted the request and computed its prompt before it raised
        assert core.num_running == 1 and core.num_waiting == 0 and core.kv.usage() > 0
        assert core.read_gauges() == core.gauges()
        got: Samples = samples(generate_latest(metrics.registry).decode())
        assert got[(m.NUM_REQUESTS_RUNNING, KEY)] == 1
        assert got[(m.NUM_REQUESTS_WAITING, KEY)] == 0
        assert got[(m.PROMPT_TOKENS_WAITING, KEY)] == 0
        assert got[(m.KV_CACHE_USAGE, KEY)] == core.kv.usage() > 0

    asyncio.run(run())
