"""A client of an ASGI app, played in-process by the test, that sends its request and
then stalls: it takes no body (the first one fills its socket, and the app's send of it
waits for good) and is gone then."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message


async def post_then_stall(app: ASGIApp, path: str, body: dict[str, Any],
                          on_first_body: Callable[[], None] | None = None) -> list[Message]:
    """POST ``body`` (as JSON) to ``path`` on ``app`` as that client; ``on_first_body`` is
    called as the app sends its first body, before the client is gone. The messages the
    app sent, once it returned."""
    raw = json.dumps(body).encode()
    sent: list[Message] = []
    gone = asyncio.Event()
    requested = False

    async def receive() -> Message:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            if on_first_body is not None:
                on_first_body()
            gone.set()
            await asyncio.Event().wait()  # the socket's buffer is full

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
             "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(raw)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    await app(scope, receive, send)
    return sent
