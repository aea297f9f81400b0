"""A /metrics scrape while a step runs in the engine's worker thread reads the core as it
was before that step (every gauge and counter of one moment), not half-way through it."""

from __future__ import annotations

import asyncio

from prometheus_client import generate_latest

from engine.async_engine import AsyncEngine
from engine.metrics import EngineMetrics
from engine.request import SamplingParams
from kvwire import metric_names as m
from tests.support.engine_cores import HeldExecutor, make_core, read_to_end
from tests.support.metrics import Samples, samples

KEY = (("engine", "0"), ("model_name", "tiny"))


def _read(metrics: EngineMetrics) -> dict[str, float]:
    got: Samples = samples(generate_latest(metrics.registry).decode())
    return {name: got[(name, KEY)] for name in (
        m.NUM_REQUESTS_RUNNING, m.NUM_REQUESTS_WAITING, m.KV_CACHE_USAGE,
        m.PROMPT_TOKENS_WAITING, m.PREFIX_CACHE_QUERIES + "_total",
        m.GENERATION_TOKENS + "_total")}


def test_a_scrape_during_a_step_reads_the_core_as_before_it() -> None:
    async def run() -> None:
        core = make_core(num_blocks=64)
        held = HeldExecutor(core.executor)
        core.executor = held
        metrics = EngineMetrics(core, "tiny")
        engine = AsyncEngine(core, sleep_modeled_time=False)
        params = SamplingParams(max_tokens=2, ignore_eos=True)
        queues = [engine.add(core.make_request(f"r{i}", [100 + i] * 10, params))
                  for i in range(3)]
        await engine.start()
        try:
            assert await asyncio.to_thread(held.entered.wait, 5)
            # the step has admitted all three and allocated their blocks; nothing of it
            # is done yet
            assert core.num_running == 3 and core.kv.usage() > 0
            assert _read(metrics) == {
                m.NUM_REQUESTS_RUNNING: 0, m.NUM_REQUESTS_WAITING: 3, m.KV_CACHE_USAGE: 0,
                m.PROMPT_TOKENS_WAITING: 30, m.PREFIX_CACHE_QUERIES + "_total": 0,
                m.GENERATION_TOKENS + "_total": 0}
            held.release.set()
            for queue in queues:
                await read_to_end(queue)
            assert not core.has_unfinished()
            # between steps: the core as it is
            assert _read(metrics) == {
                m.NUM_REQUESTS_RUNNING: 0, m.NUM_REQUESTS_WAITING: 0, m.KV_CACHE_USAGE: 0,
                m.PROMPT_TOKENS_WAITING: 0, m.PREFIX_CACHE_QUERIES + "_total": 30,
                m.GENERATION_TOKENS + "_total": 6}
        finally:
            held.release.set()
            await engine.stop()

    asyncio.run(run())
