"""A streamed chat or completion of ``n`` > 1 choices (a task per choice feeding the
stream) whose client left mid-stream cancels every choice's task as the response ends,
not when its events' iterator is collected. The app is served in-process, its ASGI
receive and send played by the test, on a running sim engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import make_core

MODEL = "tiny-sim"
FEED = "OpenAIAnswer._interleaved.<locals>.feed"


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    core = make_core(num_blocks=256, block_size=4, vocab=(259, 4096), max_model_len=512)
    srv = EngineServer(core, load_tokenizer(None), model_name=MODEL, sleep_modeled_time=False)
    await srv.engine.start()
    try:
        yield srv
    finally:
        await srv.engine.stop()


def _feeders() -> list[asyncio.Task[Any]]:
    """The choice tasks of the streams on this loop still running."""
    return [t for t in asyncio.all_tasks()
            if not t.done() and getattr(t.get_coro(), "__qualname__", "") == FEED]


async def _left_after_first_chunk(srv: EngineServer, path: str, body: dict[str, Any]
                                  ) -> tuple[int, list[dict[str, Any]]]:
    """POST ``body`` to ``path`` on ``srv``'s app; the client takes no body (the first one
    fills its socket) and is gone then. The choice tasks running as the first body was
    sent, and the messages sent, once the app returned."""
    raw = json.dumps(body).encode()
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    running = 0
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal running
        sent.append(message)
        if message["type"] == "http.response.body":
            running = len(_feeders())
            gone.set()
            await asyncio.Event().wait()  # the socket's buffer is full

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    await build_app(srv)(scope, receive, send)
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
