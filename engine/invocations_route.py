"""The engine's ``POST /invocations``: SageMaker's one inference path, served as vLLM
serves it, by the body's shape.

vLLM tries its request types in order (chat completion, completion, embedding, then the
pooling kinds) and serves the first the body validates as; one of none is a 400 naming
the types. Here the keys decide, as the gateway's ``/invocations`` reads them
(``gateway.request_parse.generates``): ``messages`` is a chat, ``prompt`` or
``prompt_embeds`` a completion, and ``input`` an embedding on an engine that embeds (the
sim executor's); a chat or a completion that is malformed gets that route's own error,
where vLLM's would say no type fits. The body is decoded here to choose, then handed to
the route as it came (read again, within the same limits and byte budget).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.types import Message

from kvwire.openai_schema import BadRequest
from kvwire.request_edge import decoded_body, parses_on_loop

if TYPE_CHECKING:
    from engine.server import EngineServer

Handler = Callable[[HTTPRequest], Awaitable[Response]]

CHAT_KEYS = ("messages",)
COMPLETION_KEYS = ("prompt", "prompt_embeds")
EMBEDDING_KEYS = ("input",)
_KEYS_TOLD = 8  # of a body that is none of them, the keys its error names


class InvocationsRoute:
    """``handle`` serves ``POST /invocations`` for one :class:`EngineServer`, with its
    ``embed`` handler (``/v1/embeddings``'s) for embedding bodies."""

    def __init__(self, server: EngineServer, embed: Handler) -> None:
        self.server = server
        self.embed = embed

    async def handle(self, request: HTTPRequest) -> Response:
        srv = self.server
        async with srv.held_body(request) as raw:
            body = decoded_body(raw) if parses_on_loop(raw) \
                else await asyncio.to_thread(decoded_body, raw)
            route = self.route_for(body)
            del body  # decoded again by the route, which keeps only what it serves
        again = _replayed(request, raw)
        del raw  # held by ``again`` until the route has read it
        return await route(again)

    def route_for(self, body: Any) -> Handler:
        """The handler of ``body``: chat, completion or (where this engine embeds)
        embedding, by its keys; BadRequest naming what it has when it is none."""
        if isinstance(body, dict):
            if any(key in body for key in CHAT_KEYS):
                return self.server.chat_completions
            if any(key in body for key in COMPLETION_KEYS):
                return self.server.completions
            if self.server.embedder is not None and any(key in body for key in EMBEDDING_KEYS):
                return self.embed
        embeds = self.server.embedder is not None
        kinds = "a chat (`messages`) or a completion (`prompt` or `prompt_embeds`)"
        kinds += ", or an embedding (`input`)" if embeds \
            else " (this engine's executor serves no embeddings)"
        if isinstance(body, dict):
            keys = sorted(str(key) for key in body)
            shown = ", ".join(repr(key[:64]) for key in keys[:_KEYS_TOLD])
            more = f" and {len(keys) - _KEYS_TOLD} more" if len(keys) > _KEYS_TOLD else ""
            has = f"its keys are {shown}{more}" if keys else "it is an empty object"
        else:
            has = f"it is a JSON {type(body).__name__}, not an object"
        raise BadRequest(f"an /invocations body is {kinds}; {has}")


def _replayed(request: HTTPRequest, raw: bytes) -> HTTPRequest:
    """``request`` again, its body ``raw`` sent once more; after it, the client's own
    messages (its disconnect)."""
    pending: list[bytes] = [raw]

    async def receive() -> Message:
        if pending:
            return {"type": "http.request", "body": pending.pop(), "more_body": False}
        return await request.receive()

    return HTTPRequest(request.scope, receive)
