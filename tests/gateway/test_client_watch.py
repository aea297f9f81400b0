"""The one watch per request that sees a client leave, from the wait for a replica through
the relay: a leaving whose cancel was absorbed while the request waited (a replica ejected
in the same turn makes one CancelledError of both, and the proxy retries) must still stop
the relay."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.proxy import UpstreamStream
from gateway.relay_response import RelayResponse
from gateway.upstream_http import UpstreamClient
from kvwire.request_edge import ClientWatch
from tests.support.servers import aiohttp_site


async def _absorbed_leave(watch_receive: Any) -> ClientWatch:
    """A ClientWatch whose client left while the task's own cancel (an ejection) was
    pending: the task takes back one cancel, as the proxy's retry does, and goes on."""
    task = asyncio.current_task()
    assert task is not None
    watch = ClientWatch(watch_receive)
    task.cancel()  # the ejection, in the same turn as the client leaves
    try:
        await asyncio.sleep(1)
    except asyncio.CancelledError:
        task.uncancel()  # the proxy: ejected, try the next replica
    await asyncio.sleep(0.01)  # the next replica answers
    return watch


def test_a_leaving_absorbed_while_waiting_still_reads_as_gone() -> None:
    async def main() -> tuple[bool, bool, bool]:
        async def gone() -> dict[str, str]:
            return {"type": "http.disconnect"}
        watch = await _absorbed_leave(gone)
        fired = watch.fired
        first, again = watch.client_left(), watch.client_left()
        watch.close()
        return fired, first, again

    assert asyncio.run(main()) == (True, True, False)


def test_the_relay_sends_nothing_to_a_client_that_left_while_it_waited() -> None:
    async def main() -> tuple[list[dict[str, Any]], list[bool]]:
        async def sse(request: web.Request) -> web.StreamResponse:
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(20):
                await resp.write(b'data: {"n": %d}\n\n' % i)
                await asyncio.sleep(0.005)
            return resp

        app = web.Application()
        app.router.add_post("/v1/completions", sse)
        runner, port = await aiohttp_site(app)
        fleet = Fleet([ReplicaConfig("r", f"http://127.0.0.1:{port}")])
        ended: list[bool] = []
        sent: list[dict[str, Any]] = []

        async def gone() -> dict[str, str]:
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        client = UpstreamClient()
        try:
            watch = await _absorbed_leave(gone)
            response = await client.post(f"http://127.0.0.1:{port}/v1/completions", b"", {})
            first = await response.readany()
            stream = UpstreamStream("r", response, first, fleet.sent("r", 10), 5.0,
                                    fleet, lambda s, ok: ended.append(ok))
            await RelayResponse(stream, {}, watch)({"type": "http"}, gone, send)
        finally:
            await client.close()
            await runner.cleanup()
        return sent, ended

    sent, ended = asyncio.run(main())
    assert sent == []  # not even the head: nobody is there to read it
    assert ended == [False]  # settled once, as not answered
