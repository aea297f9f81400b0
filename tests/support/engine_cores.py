"""A tiny sim engine whose pieces are easy to reason about (block size 4, a handful of
blocks, a cheap cost model), and helpers that drive it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from engine.async_engine import AsyncEngine
from engine.core import EngineConfig, EngineCore
from engine.cost_model import CostModel, GPUSpec, ModelShape
from engine.executor import Batch, Executor, StepResult
from engine.request import RequestOutput, SamplingParams
from engine.sim_executor import SimExecutor

TINY_MODEL = ModelShape(name="tiny", params=1e6, num_layers=2, num_heads=2, num_kv_heads=1,
                        head_dim=8, dtype_bytes=2, max_model_len=256)
TINY_GPU = GPUSpec(name="toy", peak_tflops=1.0, hbm_tb_per_s=1.0, step_overhead_ms=1.0)


def make_core(num_blocks: int = 16, block_size: int = 4, eos: int | None = None,
              vocab: tuple[int, int] = (100, 200), **kw: object) -> EngineCore:
    ex = SimExecutor(CostModel(TINY_MODEL, TINY_GPU), block_size=block_size,
                     eos_token_id=eos, token_range=vocab)
    cfg = EngineConfig(model_id="tiny", num_blocks=num_blocks, block_size=block_size,
                       max_model_len=kw.pop("max_model_len", 256), **kw)  # type: ignore[arg-type]
    return EngineCore(ex, cfg)


def add(core: EngineCore, rid: str, prompt: list[int], max_tokens: int = 1, now: float = 0.0,
        **kw: object) -> None:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=bool(kw.pop("ignore_eos", False)))
    core.add_request(core.make_request(rid, prompt, params, **kw), now=now)  # type: ignore[arg-type]


def run_all(core: EngineCore, now: float = 0.0, max_steps: int = 10_000) -> dict[str, list]:
    """Step until idle, checking integrity after every step; outputs by request id."""
    outs: dict[str, list] = {}
    for _ in range(max_steps):
        if not core.has_unfinished():
            return outs
        step = core.step(now)
        now += step.seconds
        core.check_integrity()
        for o in step.outputs:
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("engine did not drain")


POISON = 4000  # a prompt holding this id makes ``FaultyExecutor``'s step computing it raise


class FaultyExecutor:
    """The core's own executor, raising on a batch that computes ``POISON``: a fault
    injected at the device's boundary."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.eos_token_id = inner.eos_token_id

    def execute(self, batch: Batch) -> StepResult:
        if any(POISON in s.token_ids for s in batch.seqs):
            raise RuntimeError("device fault")
        return self.inner.execute(batch)


class FailsAfter:
    """The core's own executor for ``steps`` steps, then raising on every step (a device
    lost mid-answer)."""

    def __init__(self, inner: Executor, steps: int, message: str = "device lost") -> None:
        self.inner, self.steps, self.message = inner, steps, message
        self.block_size, self.eos_token_id = inner.block_size, inner.eos_token_id

    def execute(self, batch: Batch) -> StepResult:
        self.steps -= 1
        if self.steps < 0:
            raise RuntimeError(self.message)
        return self.inner.execute(batch)


class HeldExecutor:
    """Runs ``inner`` once ``release`` is set, or ``wait_s`` has passed (``entered`` tells
    a step waits for it); ``released`` records, step by step, whether it was set."""

    def __init__(self, inner: Executor, wait_s: float = 10.0) -> None:
        self.inner = inner
        self.block_size = inner.block_size
        self.eos_token_id = inner.eos_token_id
        self.wait_s = wait_s
        self.entered, self.release = threading.Event(), threading.Event()
        self.released: list[bool] = []

    def execute(self, batch: Batch) -> StepResult:
        self.entered.set()
        self.released.append(self.release.wait(self.wait_s))
        return self.inner.execute(batch)


@asynccontextmanager
async def faulty_engine(num_blocks: int = 4
                        ) -> AsyncIterator[tuple[EngineCore, AsyncEngine, list[object]]]:
    """A started engine over ``make_core`` whose executor fails a step holding ``POISON``
    (``FaultyExecutor``), and the KV events it recorded, drained at each step (where the
    server publishes them) into the list it yields; stopped on leaving."""
    core = make_core(num_blocks=num_blocks, vocab=(100, 200))
    core.executor = FaultyExecutor(core.executor)
    events: list[Any] = []
    core.kv.pool.events = events
    drained: list[object] = []

    def on_step(_out: object) -> None:
        drained.extend(events)
        events.clear()

    engine = AsyncEngine(core, sleep_modeled_time=False, on_step=on_step)
    await engine.start()
    try:
        yield core, engine, drained
    finally:
        await engine.stop()


async def read_to_end(queue: asyncio.Queue[RequestOutput | BaseException],
                      timeout_s: float = 5.0) -> list[RequestOutput]:
    """A request's outputs on ``queue`` (``AsyncEngine.add``'s) up to its finished one, each
    awaited at most ``timeout_s``; an exception in their place fails (AssertionError
    naming it)."""
    outputs: list[RequestOutput] = []
    while not outputs or not outputs[-1].finished:
        item = await asyncio.wait_for(queue.get(), timeout_s)
        assert not isinstance(item, BaseException), item
        outputs.append(item)
    return outputs
