"""A streamed answer holds only the outputs it has not sent yet: each choice's output ids
and log probabilities are dropped once the chunk naming them is made, so a long stream's
memory is bounded by a step, not by the answer (as vLLM's delta outputs). A whole answer
still names every token's at its end. The app's stream is played in-process on a running
sim engine, the generations it holds looked at as each chunk goes out."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.types import Message

from engine.generation import AnswerStream
from engine.server import EngineServer, build_app
from tests.support.engine_servers import running_engine

MODEL = "tiny-sim"
TOKENS = 120


@pytest.fixture
async def server() -> AsyncIterator[EngineServer]:
    async with running_engine(MODEL) as srv:
        yield srv


async def _stream_held(srv: EngineServer, chat: bool, body: dict[str, Any]
                       ) -> tuple[list[int], list[dict[str, Any]]]:
    """Stream ``body``; the most output ids and log probabilities any of its generations
    held as each body went out, and the chunks sent."""
    raw = json.dumps({"model": MODEL, **body, "stream": True}).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if requested:  # the client stays: the stream is read to its end
            await asyncio.Event().wait()
        requested = True
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": path, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]}
    route = srv.chat_completions if chat else srv.completions
    response = await route(Request(scope, receive))
    assert isinstance(response, AnswerStream)
    held: list[int] = []
    bodies: list[bytes] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            bodies.append(message.get("body", b""))
            held.append(max(max(len(g.token_ids), len(g.logprobs)) for g in response.gens))

    await response(scope, receive, send)
    datas = [line[6:] for line in b"".join(bodies).decode().splitlines()
             if line.startswith("data: ")]
    assert datas[-1] == "[DONE]"
    return held, [json.loads(d) for d in datas[:-1]]


@pytest.mark.parametrize("chat", [False, True])
async def test_a_stream_holds_a_step_of_logprobs_not_the_answer(
        server: EngineServer, chat: bool) -> None:
    asked: dict[str, Any] = {"messages": [{"role": "user", "content": "a long story"}],
                             "logprobs": True, "top_logprobs": 5} if chat else \
        {"prompt": "a long story", "logprobs": 5}
    held, chunks = await _stream_held(server, chat, {
        **asked, "n": 2, "max_tokens": TOKENS, "ignore_eos": True, "return_token_ids": True})
    assert len(held) > TOKENS  # a chunk per token and choice
    # a choice holds the outputs of the step it is on, never what went out before
    assert max(held) <= 2, held[-5:]
    # and every token still went out with its log probabilities and id, once
    for index in (0, 1):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        ids = [t for c in mine for t in c.get("token_ids") or ()]
        if chat:
            named = [e for c in mine if c["logprobs"] for e in c["logprobs"]["content"]]
            assert all(len(e["top_logprobs"]) == 5 for e in named)
        else:
            named = [t for c in mine if c["logprobs"] for t in c["logprobs"]["tokens"]]
        assert len(ids) == len(named) == TOKENS
        assert mine[-1]["finish_reason"] == "length"


async def test_a_whole_answer_still_names_every_tokens_logprobs(server: EngineServer
                                                               ) -> None:
    transport = httpx.ASGITransport(app=build_app(server))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        r = await client.post("/v1/completions", json={
            "model": MODEL, "prompt": "a long story", "logprobs": 3, "n": 2,
            "max_tokens": TOKENS, "ignore_eos": True})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert len(choice["logprobs"]["tokens"]) == TOKENS
        assert all(len(top) >= 3 for top in choice["logprobs"]["top_logprobs"])
