"""A step whose executor raises fails that step's requests (a 500 naming the failure, or
an error event in a stream) and the engine goes on serving; steps failing one after
another (a lost device) stop it, and /health says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from engine.async_engine import FAILED_STEPS_IN_A_ROW, AsyncEngine, RequestFailed
from engine.core import StepFailed
from engine.request import SamplingParams
from kvwire.kv_event_format import BlockRemoved, BlockStored
from tests.support.engine_cores import (
    POISON,
    FaultyExecutor,
    add,
    faulty_engine,
    make_core,
    read_to_end,
    run_all,
)
from tests.support.engine_servers import LiveEngine, serve_engine


def test_core_aborts_the_failed_batch_and_goes_on() -> None:
    core = make_core(num_blocks=32, vocab=(100, 200))
    core.executor = FaultyExecutor(core.executor)
    add(core, "good", list(range(100, 110)), max_tokens=3)
    add(core, "bad", [101, 102, POISON, 103], max_tokens=3)
    with pytest.raises(StepFailed) as failed:
        core.step(0.0)
    assert failed.value.request_ids == ("good", "bad")
    assert isinstance(failed.value.cause, RuntimeError)
    core.check_integrity()
    assert not core.has_unfinished() and core.kv.usage() == 0
    assert core.stats.num_requests_aborted == 2
    add(core, "after", list(range(100, 110)), max_tokens=3)
    outs = run_all(core)
    assert outs["after"][-1].finish_reason == "length"


@pytest.fixture
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, "faulty", executor=FaultyExecutor)


def test_a_failed_step_fails_its_request_and_the_engine_serves_on(live: LiveEngine) -> None:
    bad = {"model": "faulty", "prompt": [300, POISON, 301], "max_tokens": 4}
    r = live.http.post("/v1/completions", json=bad)
    assert r.status_code == 500, r.text
    error = r.json()["error"]
    assert error["code"] == "engine_step_failed" and "RuntimeError" in error["message"]
    r = live.http.post("/v1/completions", json={**bad, "stream": True})
    assert r.status_code == 200
    datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert json.loads(datas[0])["error"]["code"] == "engine_step_failed"
    good = live.client.completions.create(model="faulty", prompt=[300, 301, 302], max_tokens=4)
    assert good.choices[0].finish_reason == "length"
    assert live.http.get("/health").status_code == 200
    metrics = live.http.get("/metrics").text
    aborted = 'vllm:request_success_total{engine="0",finished_reason="abort",model_name="faulty"}'
    assert f"{aborted} 2.0" in metrics, [m for m in metrics.splitlines() if aborted in m]


def test_steps_failing_in_a_row_stop_the_engine(live: LiveEngine) -> None:
    bad = {"model": "faulty", "prompt": [300, POISON], "max_tokens": 4}
    for _ in range(FAILED_STEPS_IN_A_ROW - 1):
        assert live.http.post("/v1/completions", json=bad).status_code == 500
    assert live.http.get("/health").status_code == 200
    assert live.http.post("/v1/completions", json=bad).status_code == 503
    assert live.http.get("/health").status_code == 503


def test_an_id_given_again_after_a_failed_step_is_not_aborted_by_the_first_reader() -> None:
    """SGLang's clients name their request ids: one may come again while the reader of
    the failed request it had is still to end, whose abort must leave the new one be."""

    async def run() -> None:
        core = make_core(num_blocks=32, vocab=(100, 200))
        core.executor = FaultyExecutor(core.executor)
        engine = AsyncEngine(core, sleep_modeled_time=False)
        await engine.start()
        try:
            params = SamplingParams(max_tokens=3, ignore_eos=True)
            first = engine.add(core.make_request("rid", [101, POISON], params))
            failed = await asyncio.wait_for(first.get(), 5)
            assert isinstance(failed, RequestFailed)
            again = engine.add(core.make_request("rid", [101, 102, 103], params))
            engine.abort("rid", first)  # the first reader ends: its request, not this one
            outputs = await read_to_end(again)
            assert outputs[-1].finish_reason == "length"
        finally:
            await engine.stop()

    asyncio.run(run())


def test_the_blocks_a_failed_step_evicted_are_reported_at_once() -> None:
    """The step evicted cached blocks to make room before its executor raised: those
    evictions reach ``on_step`` (where the server publishes KV events) with the failure,
    not whenever a later step succeeds (an idle engine takes none)."""

    async def run() -> None:
        async with faulty_engine() as (core, engine, drained):
            params = SamplingParams(max_tokens=1)
            cached = engine.add(core.make_request("cached", list(range(100, 109)), params))
            assert (await asyncio.wait_for(cached.get(), 5)).finished
            assert any(isinstance(e, BlockStored) for e in drained)
            bad = engine.add(core.make_request("bad", [*range(110, 122), POISON], params))
            assert isinstance(await asyncio.wait_for(bad.get(), 5), RequestFailed)
            removed = [e for e in drained if isinstance(e, BlockRemoved)]
            assert removed and not core.kv.pool.events
            assert not core.kv.pool.cached

    asyncio.run(run())
