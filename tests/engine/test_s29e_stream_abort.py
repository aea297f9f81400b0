"""A ``/v1/responses`` stream whose send is stuck on its opening events (the client's
socket full, then the client gone) aborts its engine request, as the other routes' streams
do. The app is served in-process, its ASGI receive and send played by the test, on a
running sim engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.server import EngineServer, build_app
from tests.support.engine_cores import HeldExecutor
from tests.support.held_engines import held_engine
from tests.support.stalled_client import post_then_stall
from tests.support.waiting import wait_until_async

MODEL = "tiny-sim"


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    """A sim engine whose steps wait until its executor's ``release`` is set."""
    async with held_engine(MODEL) as srv:
        yield srv


async def test_a_responses_stream_stuck_on_its_opening_events_aborts(
        server: EngineServer) -> None:
    sent = await post_then_stall(build_app(server), "/v1/responses", {
        "model": MODEL, "input": "a long story", "max_output_tokens": 300, "stream": True})
    # it got as far as its first event, which the client never took
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert b"response.created" in sent[1]["body"]
    # its request left the engine as the answer ended, its first step not yet done
    assert server.engine.in_flight() == []
    core = server.core
    assert isinstance(core.executor, HeldExecutor)
    core.executor.release.set()
    await wait_until_async(lambda: not core.has_unfinished(), 10, "the engine to go idle")
    assert core.stats.num_requests_aborted == 1
    assert core.stats.generation_tokens <= 1  # (the step that was held, at most)
