"""A Starlette request posting given bytes, for calling a route's handler (or a server's
body reader) directly, with no server in between."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.requests import Request


def posted(body: bytes, path: str, headers: Sequence[tuple[bytes, bytes]] = ()) -> Request:
    """A POST to ``path`` of ``body`` (its ``Content-Length`` given, and ``headers``), all
    in one message; its client never leaves: a read past the body waits for good."""
    sent = False

    async def receive() -> dict[str, object]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # no disconnect while the request is served
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request({"type": "http", "method": "POST", "path": path, "query_string": b"",
                    "headers": [(b"content-length", str(len(body)).encode()), *headers]},
                   receive)
