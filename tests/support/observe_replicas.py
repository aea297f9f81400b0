"""Replicas for the observability tests: one that lists no models (so the gateway forwards
any model name a client sends)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route


def unlisted_replica() -> Starlette:
    """Answers a completion (3 prompt tokens) and ``/health``; no ``/v1/models``."""

    async def complete(request: Request) -> Response:
        return JSONResponse({"id": "x", "object": "text_completion", "created": 0,
                             "model": "m", "choices": [{"index": 0, "text": "ok",
                                                        "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 1,
                                       "total_tokens": 4}})

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/health", health)])
