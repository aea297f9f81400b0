"""Answers relayed from a raw replica on loopback through the gateway's ``UpstreamStream``
and ``RelayResponse`` to an ASGI client that stays: what the client was sent, how the
answer was settled, and the stream (for what it counted). ``relayed``: an event stream,
chunked; ``relayed_whole``: a non-streamed answer, opened by the ``Proxy``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple

from gateway.config import ReplicaConfig, TimeoutConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from gateway.proxy import AnswerSigns, Proxy, UpstreamStream, Usage, answer_signs
from gateway.relay_response import RelayResponse
from gateway.upstream_http import UpstreamClient
from kvwire.request_edge import ClientWatch

_Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Relayed(NamedTuple):
    sent: list[tuple[bytes, bool, float]]  # body, more_body, seconds since the relay began
    ended: list[bool]  # how the answer was settled (once: [True] for a whole one)
    stream: UpstreamStream


class RelayedWhole(NamedTuple):
    sent: list[tuple[bytes, bool, float]]  # body, more_body, seconds since the relay began
    ended: list[tuple[str, bool]]  # how the answer was settled: (outcome, whole)
    usage: list[Usage | None]  # what it was read to report, as it was settled
    request_failures: int  # failures the proxy counted against the replica (``Fleet``)

    @property
    def body(self) -> bytes:
        return b"".join(body for body, _, _ in self.sent)

    @property
    def finished(self) -> bool:
        """The client's body was ended (the server closes it as a whole one)."""
        return bool(self.sent) and not self.sent[-1][1]


@asynccontextmanager
async def _serving(answer: _Answer) -> AsyncIterator[int]:
    """A replica on loopback answering one connection with ``answer``: its port; on exit,
    once ``answer`` has ended (within 5 s), the server is closed, and what ``answer``
    raised is raised (a note on what the block raised, where it raised too)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except Exception as exc:  # raised on exit, not left in the server's task
            failed.append(exc)
            writer.close()  # the gateway sees the connection drop, not a silence
        finally:
            done.set()

    async def closed() -> None:
        try:
            await asyncio.wait_for(done.wait(), 5)
        finally:
            server.close()
            await server.wait_closed()

    done = asyncio.Event()
    failed: list[Exception] = []
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    except BaseException as exc:
        await closed()
        if failed:
            exc.add_note(f"the replica's answer failed too: {failed[0]!r}")
        raise
    await closed()
    if failed:
        raise RuntimeError("the replica's answer failed") from failed[0]


def _chunked(writes: Sequence[bytes], pause_s: float, end_apart_s: float | None) -> _Answer:
    """An answer of ``writes``, each a chunk in a write of its own, ``pause_s`` apart; the
    body's end in the last write (``end_apart_s`` None) or that many seconds after it; the
    connection closed once the gateway closed it."""
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

    return answer


def _raw(raw: bytes, first_body_bytes: int) -> _Answer:
    """An answer of ``raw`` (head and body) in two writes, its head and first
    ``first_body_bytes`` of body then the rest, once the request's body was read; then the
    connection closed (which ends a body with neither a length nor chunks)."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        split = raw.index(b"\r\n\r\n") + 4 + first_body_bytes
        writer.write(raw[:split])
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(raw[split:])
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    return answer


class _StayingClient:
    """An ASGI client that stays until the relay is over: the body messages it was sent
    (body, more_body, seconds since it was made)."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bool, float]] = []
        self.stay = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()

    def got(self, body: bytes, more_body: bool) -> None:
        self.sent.append((body, more_body, self._loop.time() - self._start))

    async def receive(self) -> dict[str, str]:
        await self.stay.wait()  # the client stays
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.got(message["body"], message["more_body"])

    async def relay(self, stream: UpstreamStream) -> None:
        await RelayResponse(stream, {}, ClientWatch(self.receive))({"type": "http"},
                                                                    self.receive, self.send)


def relayed(writes: Sequence[bytes], pause_s: float, end_apart_s: float | None, path: str,
            count_events: bool = False, several_choices: bool | None = None) -> Relayed:
    """``writes`` relayed as the replica's answer to a POST of ``path`` (see ``_chunked``);
    with ``count_events``, the stream counts its content events (``content_chunks``).
    ``several_choices``: the answer is judged as the gateway judges one to ``path`` for a
    request of several choices or of one (``answer_signs``); None: by its transport
    alone, as a pass-through answer is."""
    async def main() -> Relayed:
        ended: list[bool] = []
        async with _serving(_chunked(writes, pause_s, end_apart_s)) as port:
            fleet = Fleet([ReplicaConfig("r", f"http://127.0.0.1:{port}")])
            client = _StayingClient()
            upstream = UpstreamClient()
            try:
                response = await upstream.post(f"http://127.0.0.1:{port}{path}", b"{}", {})
                first = await response.readany()
                signs = AnswerSigns() if several_choices is None \
                    else answer_signs(path, several_choices)
                stream = UpstreamStream("r", response, first, fleet.sent("r", 10), 5.0,
                                        fleet, lambda s, ok: ended.append(ok), signs=signs)
                if count_events:
                    stream.count_events()
                await client.relay(stream)
            finally:
                client.stay.set()
                await upstream.close()
        return Relayed(client.sent, ended, stream)

    return asyncio.run(main())


def relayed_whole(raw: bytes, buffer_bytes: int, path: str = "/v1/completions",
                  first_write: int | None = None) -> RelayedWhole:
    """``raw`` (an HTTP answer, head and body) written by a replica in two writes (its head
    and first ``first_write`` bytes of body, ``buffer_bytes`` unless told, then the rest)
    and the connection closed, as the answer to a POST of ``path`` opened by a ``Proxy``
    of that ``buffer_bytes``: sent whole where the proxy held all of it, else relayed. (A
    chunked body's first ``buffer_bytes`` hold its chunk lines too: a larger
    ``first_write`` fills the proxy's buffer with the first write.)"""
    async def main() -> RelayedWhole:
        ended: list[tuple[str, bool]] = []
        usage: list[Usage | None] = []

        def done(stream: UpstreamStream, ok: bool) -> None:
            ended.append((stream.outcome, ok))
            usage.append(stream.usage())

        split = buffer_bytes if first_write is None else first_write
        async with _serving(_raw(raw, split)) as port:
            fleet = Fleet([ReplicaConfig("r", f"http://127.0.0.1:{port}")])
            client = _StayingClient()
            upstream = UpstreamClient()
            proxy = Proxy(upstream, fleet, TimeoutConfig(buffer_bytes=buffer_bytes, idle_s=5),
                          GatewayMetrics(fleet), 1)
            try:
                stream = await proxy.open(["r"], path, b"{}", {}, lambda r: 1,
                                          lambda r: None, done)
                if stream.complete:
                    client.got(stream.whole_body(), False)
                else:
                    await client.relay(stream)
            finally:
                client.stay.set()
                proxy.close()
                await upstream.close()
        state = fleet.get("r")
        assert state is not None
        return RelayedWhole(client.sent, ended, usage, state.request_failures)

    return asyncio.run(main())
