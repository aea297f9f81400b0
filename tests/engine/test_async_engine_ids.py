"""A request id given again right after its request was aborted (SGLang's ``rid``: an RL
client's ``/abort_request``, then a resubmit) names the new request alone: the outputs of
a step that was running for the old one reach neither its queue nor the metrics."""

from __future__ import annotations

import asyncio
import threading

from engine.async_engine import AsyncEngine
from engine.core import EngineCore
from engine.executor import Batch, Executor, StepResult
from engine.metrics import EngineMetrics
from engine.request import SamplingParams
from kvwire import metric_names as m
from tests.support.engine_cores import make_core


class GatedExecutor:
    """Runs ``inner``; while ``closed`` is set, each step waits for ``gate`` after
    setting ``entered``."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.eos_token_id = inner.eos_token_id
        self.closed, self.entered, self.gate = (threading.Event(), threading.Event(),
                                                threading.Event())

    def execute(self, batch: Batch) -> StepResult:
        if self.closed.is_set():
            self.entered.set()
            self.gate.wait(10)
        return self.inner.execute(batch)


async def test_a_reused_id_gets_only_its_own_outputs() -> None:
    sim = make_core(num_blocks=64, block_size=4)
    gated = GatedExecutor(sim.executor)
    core = EngineCore(gated, sim.config)
    metrics = EngineMetrics(core, "tiny")
    engine = AsyncEngine(core, sleep_modeled_time=False,
                         on_step=lambda out: metrics.observe_step(out, 0.0))

    def value(name: str, **labels: str) -> float:
        got = metrics.registry.get_sample_value(
            name, {m.MODEL_NAME_LABEL: "tiny", m.ENGINE_LABEL: "0", **labels})
        assert got is not None, name
        return got

    await engine.start()
    try:
        params = SamplingParams(max_tokens=50, ignore_eos=True, seed=1)
        old = engine.add(core.make_request("x", [101, 102, 103, 104, 105], params))
        metrics.started("x")
        assert (await old.get()).num_output_tokens == 1
        gated.closed.set()
        await asyncio.to_thread(gated.entered.wait, 10)  # a step holding the old x runs
        engine.abort("x")
        metrics.ended_early("x", "abort", None, engine.clock())
        # the old x's gaps so far: a step may have ended before the gate closed
        old_gaps = value(m.INTER_TOKEN_LATENCY + "_count")
        new = engine.add(core.make_request("x", [150, 151], SamplingParams(
            max_tokens=3, ignore_eos=True, seed=2)))
        metrics.started("x")
        gated.closed.clear()
        gated.gate.set()
        outs = [await asyncio.wait_for(new.get(), 5) for _ in range(3)]
    finally:
        await engine.stop()
    assert [(o.num_prompt_tokens, o.num_output_tokens) for o in outs] == [(2, 1), (2, 2),
                                                                          (2, 3)]
    assert outs[-1].finished and new.empty()

    # the new request's two gaps between tokens, none of the old one's
    assert value(m.INTER_TOKEN_LATENCY + "_count") - old_gaps == 2
    assert value(m.REQUEST_GENERATION_TOKENS + "_sum") == 3
    assert value(m.REQUEST_SUCCESS + "_total", finished_reason="length") == 1
