"""A streamed chat or completion of ``n`` > 1 choices (a task per choice feeding the
stream) whose client left mid-stream cancels every choice's task as the response ends,
not when its events' iterator is collected. The app is served in-process, its ASGI
receive and send played by the test, on a running sim engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.types import Message

from engine.server import EngineServer, build_app
from tests.support.engine_servers import running_engine
from tests.support.stalled_client import post_then_stall

MODEL = "tiny-sim"
FEED = "OpenAIAnswer._interleaved.<locals>.feed"


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    async with running_engine(MODEL) as srv:
        yield srv


def _feeders() -> list[asyncio.Task[Any]]:
    """The choice tasks of the streams on this loop still running."""
    return [t for t in asyncio.all_tasks()
            if not t.done() and getattr(t.get_coro(), "__qualname__", "") == FEED]


async def _left_after_first_chunk(srv: EngineServer, path: str, body: dict[str, Any]
                                  ) -> tuple[int, list[Message]]:
    """POST ``body`` to ``path`` on ``srv``'s app; the client takes no body (the first one
    fills its socket) and is gone then. The choice tasks running as the first body was
    sent, and the messages sent, once the app returned."""
    running = 0

    def count() -> None:
        nonlocal running
        running = len(_feeders())

    sent = await post_then_stall(build_app(srv), path, body, on_first_body=count)
    return running, sent


@pytest.mark.parametrize(("path", "asked"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a long story"}]}),
    ("/v1/completions", {"prompt": "a long story"}),
])
async def test_a_stream_of_n_choices_cancels_each_choices_task_as_it_ends(
        server: EngineServer, path: str, asked: dict[str, Any]) -> None:
    running, sent = await _left_after_first_chunk(server, path, {
        "model": MODEL, **asked, "n": 3, "max_tokens": 300, "stream": True})
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert running == 3  # a task per choice fed the stream as its first chunk went out
    # the response is over: its requests left the engine, and no choice's task waits on
    # for outputs that will never come
    assert server.engine.in_flight() == []
    assert _feeders() == []
