"""The spans the tracing exporter lost are served on the gateway's /metrics."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gateway.app import create_app
from gateway.config import parse_config
from gateway.otel_tracing import OtelTracing
from gateway.state import build_state
from tests.support.servers import ThreadServer

Serve = Callable[..., ThreadServer]


def test_the_spans_lost_by_cause_are_on_the_metrics_page(serve: Serve) -> None:
    config = parse_config({"tracing": {"enabled": True, "service_name": "kvgate-test",
                                       "endpoint": "http://127.0.0.1:9/v1/traces"}})
    server = serve(create_app(config, build_state(config, tracing=OtelTracing(config.tracing))))
    page = httpx.get(f"{server.url}/metrics").text
    for cause in ("queue_full", "export_failed", "closed"):
        assert f'kvgate_tracing_spans_dropped_total{{cause="{cause}"}} 0.0' in page


def test_without_tracing_there_is_no_such_series(serve: Serve) -> None:
    config = parse_config({})
    server = serve(create_app(config, build_state(config)))
    assert "kvgate_tracing_spans_dropped" not in httpx.get(f"{server.url}/metrics").text
