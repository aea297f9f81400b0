"""Once the engine loop has died (steps failing in a row), nothing is queued for it any
more: an abort, a request or a call fails at once naming why, and every route the server
answers through the engine is a 503 naming the stopped loop, not an internal error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from engine.async_engine import FAILED_STEPS_IN_A_ROW, AsyncEngine, EngineDeadError
from engine.request import SamplingParams
from tests.support.engine_cores import POISON, FaultyExecutor, make_core
from tests.support.engine_servers import LiveEngine, serve_engine


def test_a_dead_loop_refuses_aborts_requests_and_calls_at_once() -> None:
    async def run() -> None:
        core = make_core(num_blocks=32, vocab=(100, 4096))
        core.executor = FaultyExecutor(core.executor)
        engine = AsyncEngine(core, sleep_modeled_time=False)
        await engine.start()
        try:
            params = SamplingParams(max_tokens=2)
            for i in range(FAILED_STEPS_IN_A_ROW):
                queue = engine.add(core.make_request(f"bad{i}", [101, POISON], params))
                await asyncio.wait_for(queue.get(), 5)
            assert not engine.alive and engine.error is not None
            with pytest.raises(EngineDeadError, match="device fault"):
                engine.abort("bad0")
            with pytest.raises(EngineDeadError, match="device fault"):
                engine.add(core.make_request("after", [101, 102], params))
            with pytest.raises(EngineDeadError, match="device fault"):
                await asyncio.wait_for(engine.call(lambda c: c.num_running), 5)
        finally:
            await engine.stop()

    asyncio.run(run())


@pytest.fixture
def live() -> Iterator[LiveEngine]:
    yield from serve_engine(LiveEngine, "faulty", executor=FaultyExecutor)


def test_the_server_answers_503_naming_the_stopped_loop(live: LiveEngine) -> None:
    bad = {"model": "faulty", "prompt": [300, POISON], "max_tokens": 4}
    for _ in range(FAILED_STEPS_IN_A_ROW):
        live.http.post("/v1/completions", json=bad)
    assert live.http.get("/health").status_code == 503
    for method, path in (("POST", "/reset_prefix_cache"), ("GET", "/v1/loads"),
                         ("GET", "/get_load"), ("POST", "/flush_cache"),
                         ("POST", "/v1/completions")):
        body = {"model": "faulty", "prompt": [300, 301], "max_tokens": 2} \
            if path == "/v1/completions" else None
        r = live.http.request(method, path, json=body)
        assert r.status_code == 503, (path, r.text)
        message = r.json()["error"]["message"]
        assert "engine loop stopped" in message and "device fault" in message, (path, message)
