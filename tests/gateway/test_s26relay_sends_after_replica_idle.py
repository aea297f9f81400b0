"""After the replica sent nothing for ``idle_s`` (a stream that stays open after its
``[DONE]``, or one cut mid-answer), what is left to send (the end of the body, the error
event) is still bounded by ``idle_s`` for a client that reads nothing. The idle watch
fired once and watched no more: such a send, waiting on a client that stopped reading
(uvicorn's flow control, modelled by a ``send`` that waits on it), held the request's
handler and connection for ever."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

import pytest

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.proxy import UpstreamStream
from gateway.relay_response import RelayResponse
from gateway.upstream_http import UpstreamClient
from kvwire.request_edge import ClientWatch

_EVENT = b'data: {"n": 0}\n\n'
_DONE = b"data: [DONE]\n\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _replica(events: bytes) -> tuple[asyncio.Server, int]:
    """A replica that streams ``events`` and then sends nothing more, its body open."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n" + _chunk(events))
        await writer.drain()
        await reader.read()  # until the gateway closes the connection
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def _relayed_to_a_client_that_stops(events: bytes) -> list[bytes]:
    """The bodies a client took before it stopped reading (the first message after the
    replica's silence never completes), once the relay ended."""
    async def main() -> list[bytes]:
        server, port = await _replica(events)
        fleet = Fleet([ReplicaConfig("r", f"http://127.0.0.1:{port}")])
        taken: list[bytes] = []
        stay, never = asyncio.Event(), asyncio.Event()
        silent = False  # the replica's silence lasted idle_s

        async def receive() -> dict[str, str]:
            await stay.wait()  # the client stays
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] != "http.response.body":
                return
            if silent:
                await never.wait()  # it reads nothing more
            taken.append(message["body"])

        def relayed(stream: UpstreamStream, ok: bool) -> None:
            nonlocal silent
            silent = True  # the relay ended: the replica's idle_s passed

        client = UpstreamClient()
        try:
            response = await client.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
            first = await response.readany()
            stream = UpstreamStream("r", response, first, fleet.sent("r", 10), 0.3,
                                    fleet, relayed)
            relay = asyncio.create_task(RelayResponse(stream, {}, ClientWatch(receive))(
                {"type": "http"}, receive, send))
            # (not wait_for: its cancel is no client's, and must not be taken for one)
            await asyncio.wait([relay], timeout=10)
            if not relay.done():
                relay.cancel()
                await asyncio.wait([relay])
                raise AssertionError("the relay still waits on a client that reads nothing")
            relay.result()
        finally:
            stay.set()
            await client.close()
            server.close()
            await server.wait_closed()
        return taken

    return asyncio.run(main())


@pytest.mark.parametrize("events", [_EVENT + _DONE, _EVENT], ids=["done", "cut"])
def test_a_send_after_the_replica_was_idle_is_bounded_by_idle_s(events: bytes) -> None:
    # done: the end of the body waits; cut: the error event does
    assert _relayed_to_a_client_that_stops(events) == [events]
