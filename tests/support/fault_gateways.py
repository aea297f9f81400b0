"""A gateway in front of test replicas, as the fault and trickle tests start it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.support.gateway_harness import Gateway, start_gateway
from tests.support.servers import ThreadServer


def gateway(serve: Callable[..., ThreadServer], replicas: list[ThreadServer],
            **extra: Any) -> Gateway:
    """``start_gateway``'s round-robin gateway (``extra``: more of its config) in front of
    ``replicas`` (ids ``r0``, ``r1``, ...), not scraped: only health checks and the
    requests themselves tell it of a fault."""
    return start_gateway(serve, [(f"r{i}", r.url) for i, r in enumerate(replicas)],
                         scrape={"enabled": False}, **extra)
