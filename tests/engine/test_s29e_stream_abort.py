"""A ``/v1/responses`` stream whose send is stuck on its opening events (the client's
socket full, then the client gone) aborts its engine request, as the other routes' streams
do. The app is served in-process, its ASGI receive and send played by the test, on a
running sim engine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engine.server import EngineServer, build_app
from kvwire.tokenizer import load_tokenizer
from tests.support.engine_cores import HeldExecutor, make_core
from tests.support.waiting import wait_until_async

MODEL = "tiny-sim"


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    """A sim engine whose steps wait until its executor's ``release`` is set."""
    core = make_core(num_blocks=256, block_size=4, vocab=(259, 4096), max_model_len=512)
    core.executor = HeldExecutor(core.executor)
    srv = EngineServer(core, load_tokenizer(None), model_name=MODEL, sleep_modeled_time=False)
    await srv.engine.start()
    try:
        yield srv
    finally:
        core.executor.release.set()
        await srv.engine.stop()


async def _post(srv: EngineServer, path: str, body: dict[str, Any], *,
                gone: asyncio.Event) -> list[dict[str, Any]]:
    """POST ``body`` to ``path`` on ``srv``'s app; the first body the client is sent is
    never taken (it fills the client's socket, its send waits for good), and the client
    is gone then (``gone`` set). The messages the app sent, once it returned."""
    raw = json.dumps(body).encode()
    sent: list[dict[str, Any]] = []
    requested = False

    async def receive() -> dict[str, Any]:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            gone.set()
            await asyncio.Event().wait()  # the socket's buffer is full

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    await build_app(srv)(scope, receive, send)
    return sent




async def test_a_responses_stream_stuck_on_its_opening_events_aborts(
        server: EngineServer) -> None:
    sent = await _post(server, "/v1/responses", {
        "model": MODEL, "input": "a long story", "max_output_tokens": 300, "stream": True},
        gone=asyncio.Event())
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
    assert core.stats.generation_tokens < 300
