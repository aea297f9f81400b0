"""The response that relays an upstream answer to the client as it arrives."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.proxy import UpstreamStream
from kvwire.request_edge import ClientWatch


class RelayResponse(Response):
    """Relays an upstream stream; settles it even if the relay never started (a client
    that leaves before the first chunk is sent cancels the response, not the relay). A
    non-streamed body the replica cut is left unfinished: the server then drops the
    connection, so the client cannot take it for a whole answer.

    A client that leaves mid-answer cancels the relay, which drops the upstream
    connection (the replica sees the cancel). The request's ``ClientWatch`` does it (the
    one that watched while the request waited for its replica), not
    Starlette's ``StreamingResponse`` task group: its cost per chunk and per answer was a
    measurable share of a streamed request's CPU."""

    def __init__(self, stream: UpstreamStream, headers: dict[str, str],
                 watch: ClientWatch) -> None:
        self.stream = stream
        self.watch = watch
        stream.client = watch
        self.status_code = stream.status
        self.background = None
        self.init_headers(headers)

    async def _relay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        stream = self.stream
        ended = False
        async for chunk in stream.relay():
            # the upstream body's last bytes go out with the end of the client's body: one
            # socket write, not two (a write costs more than the rest of a chunk's relay)
            ended = stream.read_whole()
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended and (stream.cut is None or stream.stream):
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self.watch
        try:
            if watch.fired:  # it left while the request waited for a replica, and the
                watch.client_left()  # cancel was absorbed there (a retry after ejection)
                self.stream.left = True
                return
            await self._relay(send)
        except asyncio.CancelledError:
            if not watch.client_left():
                raise  # cancelled from outside; else the client left: nothing more to send
        finally:
            watch.close()
            self.stream.close(ok=False)  # no-op when the relay finished and closed it


async def relay(request: Request, opening: Awaitable[UpstreamStream], route: str,
                request_id: str, worker: int | None = None) -> Response:
    """The client's response to the upstream answer ``opening`` brings, watched for the
    client leaving from the wait for a replica through the relay (``ClientWatch``;
    ClientDisconnected when it leaves before the answer opened). The response carries
    the gateway's own headers, and the worker process's index with workers."""
    watch = ClientWatch(request.receive)
    try:
        stream = await watch.guard(opening)
        headers = {**stream.headers, "x-kvgate-replica": stream.replica,
                   "x-kvgate-route": route, "x-request-id": request_id}
        if worker is not None:
            headers["x-kvgate-worker"] = str(worker)
        if stream.complete:  # nothing left to relay: skip the streaming machinery
            watch.close()
            return Response(stream.whole_body(), status_code=stream.status, headers=headers)
        return RelayResponse(stream, headers, watch)
    except BaseException:
        watch.close()
        raise
