"""A ``/v1/responses`` stream's events, closed mid-answer, close their reader of the
engine's outputs then and there (its request aborted on the engine), not when the reader
is collected. The route runs on a running sim engine; its events are read directly."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request

from engine.generation import AnswerStream
from engine.responses_route import ResponsesRoute
from engine.server import EngineServer
from tests.support.engine_servers import running_engine
from tests.support.posted import posted

MODEL = "tiny-sim"


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    async with running_engine(MODEL) as srv:
        yield srv


def _request(body: dict[str, Any]) -> Request:
    return posted(json.dumps(body).encode(), "/v1/responses",
                  [(b"content-type", b"application/json")])


async def test_closed_events_close_their_reader_of_engine_outputs(
        server: EngineServer) -> None:
    route = ResponsesRoute(server, max_body_bytes=1 << 20)
    stream = await route.handle(_request({
        "model": MODEL, "input": "a long story", "max_output_tokens": 300,
        "stream": True}))
    assert isinstance(stream, AnswerStream)
    events, answer = stream.events, stream.gens[0]
    async for event in events:
        if event.startswith("event: response.output_text.delta"):
            break
    assert not answer.ended and server.engine.in_flight() == [answer.rid]
    await events.aclose()
    # its reader ended with it: the request left the engine, its generation unfinished
    assert answer.ended
    assert server.engine.in_flight() == []
    assert answer.num_output < 300
