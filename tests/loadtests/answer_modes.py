"""A chat backend that answers each request in one of a list of ways, in turn: whole or
cut short, streamed or not, or held (for the load tools' clients: what they count as
answered, failed and unfinished). Each answer names its way in ``x-kvgate-served-by``,
which the clients record as the sample's replica (unless told a replica's name)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

USAGE = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    return _event({"id": "x", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})


# mode -> the streamed body after the role chunk; None: answered whole (JSON)
STREAMS: dict[str, Sequence[bytes]] = {
    "whole": [_chunk({"content": "hi"}), _chunk({}, "length"),
              _event({"id": "x", "choices": [], "usage": USAGE}), b"data: [DONE]\n\n"],
    # the body ends cleanly after a token: no finish reason, no usage, no [DONE]
    "truncated": [_chunk({"content": "hi"})],
    # every token and a finish reason, then the body ends: no [DONE]
    "no_done": [_chunk({"content": "hi"}), _chunk({}, "length")],
    # the engine gave up on the request
    "abort": [_chunk({"content": "hi"}), _chunk({}, "abort"), b"data: [DONE]\n\n"],
    # [DONE] without a finish reason
    "no_finish": [_chunk({"content": "hi"}), b"data: [DONE]\n\n"],
}
WHOLE: dict[str, dict[str, Any]] = {
    "json_whole": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                                "finish_reason": "stop"}], "usage": USAGE},
    "json_abort": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "h"},
                                "finish_reason": "abort"}]},
    "json_no_choices": {"choices": []},
    "json_no_finish": {"choices": [{"index": 0, "message": {"role": "assistant",
                                                            "content": "hi"}}]},
}
# held: headers, then nothing for a minute (``hold_first``), or a first token and then
# nothing (``hold_after_first``)
HELD = ("hold_first", "hold_after_first")
ANSWERED = ("whole", "json_whole")


def answer_modes(modes: Sequence[str], served_by: str | None = None) -> Starlette:
    """The backend; with ``served_by``, answers name that replica instead of their way."""
    turn = itertools.cycle(modes)

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(request: Request) -> Response:
        await request.body()
        mode = next(turn)
        headers = {"x-kvgate-served-by": served_by or mode}
        if mode in WHOLE:
            return JSONResponse({"id": "x", "object": "chat.completion", "model": "m",
                                 **WHOLE[mode]}, headers=headers)

        async def body() -> AsyncIterator[bytes]:
            if mode == "hold_first":
                await asyncio.sleep(60)
            yield _chunk({"role": "assistant", "content": ""})
            if mode == "hold_after_first":
                yield _chunk({"content": "hi"})
                await asyncio.sleep(60)
            for part in STREAMS.get(mode, ()):
                await asyncio.sleep(0.01)
                yield part

        return StreamingResponse(body(), media_type="text/event-stream", headers=headers)

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])])
