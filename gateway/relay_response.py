"""The response that relays an upstream answer to the client as it arrives."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.errors import counted
from gateway.idle_watch import IdleWatch
from gateway.proxy import UpstreamStream
from kvwire.request_edge import ClientWatch

log = logging.getLogger("kvgate.proxy")


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
        stream = self.stream
        # every send waits (uvicorn's flow control) while the client reads nothing, for at
        # most idle_s: a chunk's, and the head's (a kept-alive connection's answer before
        # it unread) and the end's (the body's last bytes filled the connection, its end
        # came later), which would otherwise hold the request's place and its replica, or
        # its connection, for as long as the client stays. The relay's reads from the
        # replica share the watch (``UpstreamStream.relay``)
        idle = IdleWatch(stream.idle_s)
        ended = False
        chunks = stream.relay(idle)
        try:
            idle.waiting()
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})
            idle.got()
            async for chunk in chunks:
                # the upstream body's last bytes go out with the end of the client's body:
                # one socket write, not two (a write costs more than the rest of a chunk's
                # relay)
                ended = stream.read_whole()
                idle.waiting()
                await send({"type": "http.response.body", "body": chunk,
                            "more_body": not ended})
                idle.got()
            if not ended and (stream.cut is None or stream.stream):
                idle.waiting()
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not idle.fired or idle.since is None:
                raise  # the client left (the relay's end, below, records it) or outside
            # the client read nothing for idle_s: it is gone in all but name. The answer
            # is left unfinished (the server drops the connection; one whose head never
            # went out is answered nothing more) and the replica's connection closed,
            # freeing its place and the replica's work
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            stream.client_gone()
            log.warning("client stopped reading its answer from replica %s for %s s: "
                        "dropped", stream.replica, idle.idle_s)
        finally:
            idle.stop()
            await chunks.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = self.watch
        try:
            if watch.fired:  # it left while the request waited for a replica, and the
                watch.client_left()  # cancel was absorbed there (a retry after ejection)
                self.stream.client_gone()
                return
            await self._relay(send)
        except asyncio.CancelledError:
            if not watch.client_left():
                raise  # cancelled from outside; else the client left: nothing more to send
            self.stream.client_gone()
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
        response: Response
        if stream.complete:  # nothing left to relay: skip the streaming machinery
            watch.close()
            response = Response(stream.whole_body(), status_code=stream.status,
                                headers=headers)
        else:
            response = RelayResponse(stream, headers, watch)
        # a repeated set-cookie goes out line by line, as the replica sent it
        response.raw_headers.extend((b"set-cookie", value.encode("latin-1"))
                                    for value in stream.response.more_cookies)
        # the stream's end counts the request: an error raised while it is sent (which
        # Starlette's error layer still answers) is not a second request
        counted(request)
        return response
    except BaseException:
        watch.close()
        raise
