"""A replica whose /metrics is prometheus-client's own ASGI app (SGLang mounts it so, and
vLLM releases before its instrumentator did): it gzips the page for any client that
accepts gzip, and the gateway's scrapes must still read it. A server or proxy that
compresses it though asked not to (gzip, deflate) is decoded, its output bounded as a
page is."""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, Gauge, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from tests.support.gateway_harness import Serve, start_gateway, wait_for_metric
from tests.support.waiting import wait_until


def _sglang_app() -> Starlette:
    """SGLang's server as far as the gateway's calls go: its /metrics mounted as
    ``add_prometheus_middleware`` mounts it (with its workaround for the 307)."""
    registry = CollectorRegistry()
    Gauge("sglang:num_running_reqs", "running", registry=registry).set(3)
    Gauge("sglang:num_queue_reqs", "queued", registry=registry).set(1)
    Gauge("sglang:token_usage", "usage", registry=registry).set(0.5)
    Gauge("sglang:cache_hit_rate", "hit rate", registry=registry).set(0.75)

    async def health(request: Request) -> Response:
        return PlainTextResponse("")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    metrics = Mount("/metrics", make_asgi_app(registry=registry))
    metrics.path_regex = re.compile("^/metrics(?P<path>.*)$")
    return Starlette(routes=[Route("/health", health), Route("/v1/models", models), metrics])


def test_a_page_prometheus_client_would_gzip_is_scraped(serve: Serve) -> None:
    replica = serve(_sglang_app())
    gw = start_gateway(serve, [("s", replica.url)])
    wait_for_metric(gw, 'kvgate_replica_token_hit_rate{replica="s"}', 0.75)


def _compressing_app(coding: str, page: bytes) -> Starlette:
    """A server (or a proxy before it) that compresses /metrics though the gateway asks
    for it unencoded, and says so."""
    async def health(request: Request) -> Response:
        return PlainTextResponse("")

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def metrics(request: Request) -> Response:
        return Response(page, headers={"content-encoding": coding,
                                       "content-type": "text/plain; version=0.0.4"})
    return Starlette(routes=[Route("/health", health), Route("/v1/models", models),
                             Route("/metrics", metrics)])


_PAGE = b"sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n" \
        b"sglang:cache_hit_rate 0.25\n"


def _raw_deflate(page: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-15)
    return packer.compress(page) + packer.flush()


def _two_members(page: bytes) -> bytes:
    return gzip.compress(page[:30]) + gzip.compress(page[30:]) + b"\0" * 8  # and padding


@pytest.mark.parametrize("coding, encode", [
    ("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", _raw_deflate),
    ("gzip", _two_members)], ids=["gzip", "zlib", "raw-deflate", "gzip-members"])
def test_a_page_compressed_unasked_is_decoded(serve: Serve, coding: str,
                                              encode: Callable[[bytes], bytes]) -> None:
    replica = serve(_compressing_app(coding, encode(_PAGE)))
    gw = start_gateway(serve, [("s", replica.url)])
    wait_for_metric(gw, 'kvgate_replica_token_hit_rate{replica="s"}', 0.25)


def test_a_compressed_page_past_the_bound_is_refused(serve: Serve,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    bomb = gzip.compress(b"#" * (64 << 20))  # 64 MiB of comment, 64 KiB sent
    replica = serve(_compressing_app("gzip", bomb))
    with caplog.at_level(logging.INFO, logger="kvgate.monitor"):
        start_gateway(serve, [("s", replica.url)])
        wait_until(lambda: "the page is over 8388608 bytes" in caplog.text, 10,
                   "the page to be refused")
