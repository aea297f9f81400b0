"""A gateway in front of test replicas, as the fault and trickle tests start it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.app import create_app
from gateway.config import parse_config
from gateway.http_server import bounded_protocol
from tests.support.servers import ThreadServer


def gateway(serve: Callable[..., ThreadServer], replicas: list[ThreadServer],
            **extra: Any) -> ThreadServer:
    """A round-robin gateway (``extra``: more of its config) in front of ``replicas``,
    health-checked every 0.2 s (one failure ejects), not scraped, on the gateway's own
    HTTP protocol."""
    config = parse_config({
        "replicas": [{"id": f"r{i}", "url": r.url} for i, r in enumerate(replicas)],
        "policy": {"name": "round_robin"},
        "health": {"interval_s": 0.2, "timeout_s": 0.5, "failures_to_eject": 1},
        "scrape": {"enabled": False},
        **extra,
    })
    return serve(create_app(config), http=bounded_protocol(config))
