"""A replica whose /metrics is prometheus-client's own ASGI app (SGLang mounts it so, and
vLLM releases before its instrumentator did): it gzips the page for any client that
accepts gzip, and the gateway's scrapes must still read it."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, Gauge, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route

from tests.support.gateway_harness import Serve, start_gateway, wait_for_metric


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
