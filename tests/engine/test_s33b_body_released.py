"""Once a request's body is parsed, the engine keeps only the fields it serves it with:
neither the body's bytes nor its decoded JSON stay alive while the request runs (many
long requests at once would hold each body twice, outside the held-bytes budget, which
counts a body only until it is parsed). Checked on the completions, chat and Responses
routes, streamed and not, while the request's step is held on the device: no object
refers to the body's bytes, and no dict holding its fields is left."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from starlette.requests import Request
from starlette.responses import Response

from engine.generation import AnswerStream
from engine.responses_route import ResponsesRoute
from engine.server import EngineServer
from tests.support.engine_cores import HeldExecutor
from tests.support.held_engines import held_engine

MODEL = "tiny-sim"
MARK = "s33b-unused-field-of-the-body"  # sent in ``user``, which the engine never serves


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    """A sim engine whose steps wait until its executor's ``release`` is set."""
    async with held_engine(MODEL) as srv:
        yield srv


def _sent_once(raw: bytes, path: str) -> Request:
    """A POST of ``raw`` whose receive hands it over and keeps no reference to it; its
    client never leaves."""
    left = [raw]

    async def receive() -> dict[str, object]:
        if not left:
            await asyncio.Event().wait()
        return {"type": "http.request", "body": left.pop(), "more_body": False}

    return Request({"type": "http", "method": "POST", "path": path, "query_string": b"",
                    "headers": [(b"content-length", str(len(raw)).encode()),
                                (b"content-type", b"application/json")]}, receive)


def _holders(raw: bytes, kept: list[bytes]) -> list[str]:
    """What refers to ``raw`` but ``kept``, and the dicts holding the body's fields."""
    gc.collect()
    referrers = [type(r).__name__ for r in gc.get_referrers(raw) if r is not kept]
    decoded = [repr(o)[:80] for o in gc.get_objects()
               if type(o) is dict and o.get("user") == MARK]
    return referrers + decoded


async def _held_while_running(server: EngineServer,
                              route: Callable[[Request], Awaitable[Response]],
                              path: str, body: dict[str, Any]) -> list[str]:
    """What holds the body of a request to ``route`` while its first step is held."""
    held = server.core.executor
    assert isinstance(held, HeldExecutor)
    raw = json.dumps({"model": MODEL, "user": MARK, **body}).encode()
    kept = [raw]
    # the request lives on until the check, as the server's does while its answer runs
    # (a stream's route has returned by then, and keeps no reference to it)
    request = _sent_once(raw, path)
    task = asyncio.create_task(route(request))
    del raw
    try:
        assert await asyncio.to_thread(held.entered.wait, 10)
        if body.get("stream"):
            await asyncio.wait_for(asyncio.shield(task), 10)  # the stream, returned
        holders = _holders(kept[0], kept)
    finally:
        held.release.set()
    response = await task
    if isinstance(response, AnswerStream):
        async for _ in response.events:
            pass
    assert response.status_code == 200
    return holders


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_chat_keeps_no_body_while_it_runs(server: EngineServer, stream: bool) -> None:
    assert await _held_while_running(server, server.chat_completions, "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3,
        "stream": stream}) == []


async def test_a_completion_keeps_no_body_while_it_runs(server: EngineServer) -> None:
    assert await _held_while_running(server, server.completions, "/v1/completions", {
        "prompt": ["hello there"], "max_tokens": 3}) == []


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_response_keeps_no_body_while_it_runs(server: EngineServer,
                                                      stream: bool) -> None:
    route = ResponsesRoute(server, max_body_bytes=1 << 20)
    assert await _held_while_running(server, route.handle, "/v1/responses", {
        "input": [{"role": "user", "content": "hello there"}], "max_output_tokens": 3,
        "metadata": {"topic": "greeting"}, "stream": stream}) == []
