"""An event stream relayed from a raw chunked replica on loopback through the gateway's
``UpstreamStream`` and ``RelayResponse`` to an ASGI client that stays: what the client was
sent, how the answer was settled, and the stream (for what it counted)."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from typing import Any, NamedTuple

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.proxy import UpstreamStream
from gateway.relay_response import RelayResponse
from gateway.upstream_http import UpstreamClient
from kvwire.request_edge import ClientWatch


class Relayed(NamedTuple):
    sent: list[tuple[bytes, bool, float]]  # body, more_body, seconds since the relay began
    ended: list[bool]  # how the answer was settled (once: [True] for a whole one)
    stream: UpstreamStream


async def _replica(writes: Sequence[bytes], pause_s: float, end_apart_s: float | None
                   ) -> tuple[asyncio.Server, int, asyncio.Event]:
    """A replica answering one request with ``writes``, each a chunk in a write of its
    own, ``pause_s`` apart; the body's end in the last write (``end_apart_s`` None) or that
    many seconds after it; and an event set once it closed the connection."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for i, data in enumerate(writes):
            chunk = b"%x\r\n%s\r\n" % (len(data), data)
            if i == len(writes) - 1 and end_apart_s is None:
                writer.write(chunk + b"0\r\n\r\n")
                break
            writer.write(chunk)
            await writer.drain()
            await asyncio.sleep(pause_s if i < len(writes) - 1 else end_apart_s or 0.0)
        else:
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the gateway closes the connection
        writer.close()
        await writer.wait_closed()
        done.set()

    done = asyncio.Event()
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], done


def relayed(writes: Sequence[bytes], pause_s: float, end_apart_s: float | None, path: str,
            count_events: bool = False) -> Relayed:
    """``writes`` relayed as the replica's answer to a POST of ``path`` (see ``_replica``);
    with ``count_events``, the stream counts its content events (``content_chunks``)."""
    async def main() -> Relayed:
        server, port, closed = await _replica(writes, pause_s, end_apart_s)
        fleet = Fleet([ReplicaConfig("r", f"http://127.0.0.1:{port}")])
        ended: list[bool] = []
        sent: list[tuple[bytes, bool, float]] = []
        loop = asyncio.get_running_loop()
        start = loop.time()
        stay = asyncio.Event()

        async def receive() -> dict[str, str]:
            await stay.wait()  # the client stays
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.body":
                sent.append((message["body"], message["more_body"], loop.time() - start))

        client = UpstreamClient()
        try:
            response = await client.post(f"http://127.0.0.1:{port}{path}", b"{}", {})
            first = await response.readany()
            stream = UpstreamStream("r", response, first, fleet.sent("r", 10), 5.0,
                                    fleet, lambda s, ok: ended.append(ok))
            if count_events:
                stream.count_events()
            await RelayResponse(stream, {}, ClientWatch(receive))({"type": "http"},
                                                                   receive, send)
        finally:
            stay.set()
            await client.close()
            await asyncio.wait_for(closed.wait(), 5)
            server.close()
            await server.wait_closed()
        return Relayed(sent, ended, stream)

    return asyncio.run(main())
