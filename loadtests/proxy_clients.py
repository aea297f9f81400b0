"""Minimal pass-through proxies on the gateway's own stack (uvicorn, httptools, uvloop).

    uvicorn loadtests.proxy_clients:httpx_app     (BENCH_BACKEND=http://127.0.0.1:PORT)
    uvicorn loadtests.proxy_clients:aiohttp_app
    uvicorn loadtests.proxy_clients:kvgate_app
    uvicorn loadtests.proxy_clients:aiohttp_stream_app
    uvicorn loadtests.proxy_clients:kvgate_stream_app

The first three, one per upstream HTTP client (httpx, aiohttp, the gateway's own
``gateway.upstream_http``), read the request body, POST it to the backend and return the
backend's body: the same work, so ``bench_proxy`` can compare the clients' overhead under
concurrency. The stream apps relay the answer chunk by chunk as it arrives, as the gateway
does, and do nothing else: no routing, no accounting, no metrics. The one on the gateway's
own client is the floor of the stack the gateway is built on; the aiohttp one, of the same
server with a general client.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx

from gateway.upstream_http import UpstreamClient, UpstreamResponse

BACKEND = os.environ.get("BENCH_BACKEND", "http://127.0.0.1:9")


async def _read(receive: Any) -> bytes:
    body = bytearray()
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return bytes(body)


async def _lifespan(receive: Any, send: Any, opened: Any, closed: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await opened()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await closed()
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


class _Passthrough:
    """What every pass-through shares: its client opened and closed with the lifespan,
    then ``serve`` per request."""

    async def open(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise NotImplementedError

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, self.open, self.close)
        else:
            await self.serve(scope, receive, send)


async def _relay(send: Any, status: int, kind: str | None, chunks: AsyncIterator[bytes]
                 ) -> None:
    """An answer passed on chunk by chunk as it arrives."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", kind.encode())] if kind else []})
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _chunks(response: UpstreamResponse) -> AsyncIterator[bytes]:
    while chunk := await response.readany():
        yield chunk


class _HttpxProxy(_Passthrough):
    client: httpx.AsyncClient | None = None

    async def open(self) -> None:
        self.client = httpx.AsyncClient(
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    async def close(self) -> None:
        assert self.client is not None
        await self.client.aclose()

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await _read(receive)
        assert self.client is not None
        r = await self.client.post(BACKEND + scope["path"], content=body)
        await _reply(send, r.status_code, r.content)


class _AiohttpProxy(_Passthrough):
    session: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def close(self) -> None:
        assert self.session is not None
        await self.session.close()

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await _read(receive)
        assert self.session is not None
        async with self.session.post(BACKEND + scope["path"], data=body) as r:
            await _reply(send, r.status, await r.read())


class _AiohttpStreamProxy(_AiohttpProxy):
    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] != "/v1/completions":
            await super().serve(scope, receive, send)  # /health, /ready
            return
        body = await _read(receive)
        assert self.session is not None
        async with self.session.post(BACKEND + scope["path"], data=body) as r:
            await _relay(send, r.status, r.headers.get("content-type"), r.content.iter_any())


class _KvgateProxy(_Passthrough):
    client: UpstreamClient | None = None

    async def open(self) -> None:
        self.client = UpstreamClient()

    async def close(self) -> None:
        assert self.client is not None
        await self.client.close()

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await _read(receive)
        assert self.client is not None
        r = await self.client.post(BACKEND + scope["path"], body, {})
        try:
            whole = b"".join([chunk async for chunk in _chunks(r)])
        finally:
            r.release()
        await _reply(send, r.status, whole)


class _KvgateStreamProxy(_KvgateProxy):
    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] != "/v1/completions":
            await super().serve(scope, receive, send)  # /health, /ready
            return
        body = await _read(receive)
        assert self.client is not None
        r = await self.client.post(BACKEND + scope["path"], body, {})
        try:
            await _relay(send, r.status, r.headers.get("content-type"), _chunks(r))
        finally:
            r.release()


httpx_app = _HttpxProxy()
aiohttp_app = _AiohttpProxy()
aiohttp_stream_app = _AiohttpStreamProxy()
kvgate_app = _KvgateProxy()
kvgate_stream_app = _KvgateStreamProxy()
