"""The response that relays an upstream answer to the client as it arrives."""

from __future__ import annotations

from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.proxy import UpstreamStream


class RelayResponse(StreamingResponse):
    """Relays an upstream stream; settles it even if the relay never started (a client
    that leaves before the first chunk is sent cancels the response, not the relay). A
    non-streamed body the replica cut is left unfinished: the server then drops the
    connection, so the client cannot take it for a whole answer."""

    def __init__(self, stream: UpstreamStream, headers: dict[str, str]) -> None:
        super().__init__(stream.relay(), status_code=stream.status, headers=headers)
        self.stream = stream

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        async for chunk in self.body_iterator:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.stream.cut is None or self.stream.stream:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.stream.close(ok=False)  # no-op when the relay finished and closed it


def answer(stream: UpstreamStream, route: str, request_id: str,
           worker: int | None = None) -> Response:
    """The client's response to ``stream``, with the gateway's own headers (and the
    worker process's index, with workers)."""
    headers = {**stream.headers, "x-kvgate-replica": stream.replica,
               "x-kvgate-route": route, "x-request-id": request_id}
    if worker is not None:
        headers["x-kvgate-worker"] = str(worker)
    if stream.complete:  # nothing left to relay: skip the streaming machinery
        return Response(stream.whole_body(), status_code=stream.status, headers=headers)
    return RelayResponse(stream, headers)
