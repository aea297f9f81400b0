"""How ``Proxy.open`` spends a request's tries: only a replica actually tried uses one of
``max_attempts``; one passed over (ejected or gone since the decision) does not. Real
sockets on loopback: closed ports, a replica that answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.config import ReplicaConfig, TimeoutConfig
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy, UpstreamStream
from gateway.upstream_http import UpstreamClient
from tests.support.servers import free_port

_BODY = b'{"id":"x","object":"text_completion","choices":[]}'


@asynccontextmanager
async def _answering() -> AsyncIterator[int]:
    """A replica answering every request 200 with ``_BODY``; yields its port."""
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()
        await server.wait_closed()


async def _open(proxy: Proxy, ranked: list[str]) -> UpstreamStream:
    def done(stream: UpstreamStream, ok: bool) -> None:
        pass

    return await proxy.open(ranked, "/v1/completions", b"{}", {}, lambda r: 1,
                            lambda r: None, done)


def _proxy(urls: dict[str, str], max_attempts: int) -> tuple[Proxy, Fleet, UpstreamClient]:
    fleet = Fleet([ReplicaConfig(rid, url) for rid, url in urls.items()])
    client = UpstreamClient()
    proxy = Proxy(client, fleet, TimeoutConfig(first_byte_s=5, idle_s=5),
                  GatewayMetrics(fleet), max_attempts)
    return proxy, fleet, client


def test_replicas_passed_over_use_none_of_the_requests_tries() -> None:
    async def main() -> None:
        async with _answering() as port:
            proxy, fleet, client = _proxy({
                "r0": f"http://127.0.0.1:{free_port()}",
                "r1": f"http://127.0.0.1:{free_port()}",
                "r2": f"http://127.0.0.1:{free_port()}",
                "r3": f"http://127.0.0.1:{port}"}, max_attempts=2)
            # ejected since the decision ranked them (by another request's failure)
            assert fleet.eject("r1", "refused") and fleet.eject("r2", "refused")
            try:
                stream = await _open(proxy, ["r0", "r1", "r2", "r3"])
                assert (stream.replica, stream.status) == ("r3", 200)
                assert stream.whole_body() == _BODY
            finally:
                proxy.close()
                await client.close()

    asyncio.run(main())
