"""The end of a relayed answer: where the replica's last bytes and the end of its body
arrive together, the client's last chunk and the end of its body go out in one message
(one socket write); where the end comes later, nothing is held back waiting for it."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.proxy import UpstreamStream
from gateway.relay_response import RelayResponse
from gateway.upstream_http import UpstreamClient
from kvwire.request_edge import ClientWatch

_EVENTS = [b'data: {"n": %d}\n\n' % i for i in range(3)] + [b"data: [DONE]\n\n"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _replica(end_apart_s: float | None, last_chunk_gap_s: float = 0.01
                   ) -> tuple[asyncio.Server, int, asyncio.Event]:
    """A replica that streams ``_EVENTS`` as chunks, each in a write of its own; the end
    of the body (``0\\r\\n\\r\\n``) in the last event's write (``end_apart_s`` None) or
    that many seconds after it; and an event set once it closed the connection."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n")
        for event in _EVENTS[:-1]:
            writer.write(_chunk(event))
            await writer.drain()
            await asyncio.sleep(last_chunk_gap_s)
        last = _chunk(_EVENTS[-1])
        if end_apart_s is None:
            writer.write(last + b"0\r\n\r\n")
        else:
            writer.write(last)
            await writer.drain()
            await asyncio.sleep(end_apart_s)
            writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the gateway closes the connection
        writer.close()
        await writer.wait_closed()
        done.set()

    done = asyncio.Event()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], done


def _relayed(end_apart_s: float | None) -> tuple[list[tuple[bytes, bool, float]], list[bool]]:
    """The client's body messages (body, more_body, seconds since the relay started) and
    how the answer was settled."""
    async def main() -> tuple[list[tuple[bytes, bool, float]], list[bool]]:
        server, port, closed = await _replica(end_apart_s)
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
            response = await client.post(f"http://127.0.0.1:{port}/v1/completions", b"{}", {})
            first = await response.readany()
            stream = UpstreamStream("r", response, first, fleet.sent("r", 10), 5.0,
                                    fleet, lambda s, ok: ended.append(ok))
            watch = ClientWatch(receive)
            await RelayResponse(stream, {}, watch)({"type": "http"}, receive, send)
        finally:
            stay.set()
            await client.close()
            await asyncio.wait_for(closed.wait(), 5)
            server.close()
            await server.wait_closed()
        return sent, ended

    return asyncio.run(main())


def test_the_last_event_goes_out_with_the_end_of_the_body_when_they_come_together() -> None:
    sent, ended = _relayed(None)
    assert b"".join(body for body, _, _ in sent) == b"".join(_EVENTS)
    assert [more for _, more, _ in sent] == [True] * (len(sent) - 1) + [False]
    assert sent[-1][0].endswith(b"data: [DONE]\n\n")  # no empty message after it
    assert ended == [True]


def test_a_late_end_of_body_does_not_hold_back_the_last_event() -> None:
    sent, ended = _relayed(0.3)
    assert b"".join(body for body, _, _ in sent) == b"".join(_EVENTS)
    done = next(i for i, (body, _, _) in enumerate(sent) if body.endswith(b"[DONE]\n\n"))
    assert sent[done][1] is True  # sent as it came, not held for the end
    assert sent[-1][:2] == (b"", False)
    assert sent[-1][2] - sent[done][2] > 0.2  # the end followed when the replica sent it
    assert ended == [True]
