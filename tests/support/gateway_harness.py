"""An in-process gateway in front of loopback replicas, for tests: its main and admin
listeners on the gateway's own HTTP protocol, and its /metrics read back."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from gateway.admin import create_admin_app
from gateway.app import create_app
from gateway.config import parse_config
from gateway.http_server import bounded_protocol
from gateway.state import build_state
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.servers import ThreadServer
from tests.support.waiting import wait_until

Serve = Callable[..., ThreadServer]

ADMIN_TOKEN = "admin-token-0123456789"
AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}


@dataclass
class Gateway:
    """A gateway's main listener (``url``, ``port``) and its admin listener (``admin``)."""

    url: str
    port: int
    admin: str


def start_gateway(serve: Serve, replicas: Sequence[tuple[str, str] | dict[str, Any]],
                  **extra: Any) -> Gateway:
    """A gateway (round robin unless ``policy`` says) in front of ``replicas`` ((id, url),
    or a replica's whole config), health-checked and scraped every 0.2 s, its admin API
    open to loopback. One failed check ejects a replica; a check waits 2 s for its answer,
    so a loaded test machine's slow answer is not taken for a failure."""
    config = parse_config({
        "replicas": [r if isinstance(r, dict) else {"id": r[0], "url": r[1]}
                     for r in replicas],
        "policy": extra.pop("policy", {"name": "round_robin"}),
        "health": {"interval_s": 0.2, "timeout_s": 2.0, "failures_to_eject": 1},
        "scrape": {"interval_s": 0.2},
        "admin": {"token": ADMIN_TOKEN, "allow_networks": ["127.0.0.0/8"]},
        **extra,
    })
    state = build_state(config)
    # the gateway's own HTTP protocol, as kvgate serve runs it (its client-leaving hooks)
    pair = serve(create_app(config, state), side=create_admin_app(state),
                 http=bounded_protocol(config, state.refused_by_server))
    return Gateway(pair.url, pair.port, pair.side_url)


def two_replicas(serve: Serve) -> tuple[Gateway, Behaviour, Behaviour]:
    """A round-robin gateway in front of two scriptable replicas, ``a`` and ``b``."""
    a, b = Behaviour("a"), Behaviour("b")
    ra, rb = serve(fake_replica(a)), serve(fake_replica(b))
    return start_gateway(serve, [("a", ra.url), ("b", rb.url)]), a, b


def metric(gw: Gateway, series: str) -> float | None:
    """The value of ``series`` on the gateway's /metrics, or None when it is absent."""
    for line in httpx.get(f"{gw.url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def wait_for_metric(gw: Gateway, series: str, value: float) -> None:
    """Wait until ``series`` reads ``value`` (the gateway's scrapes are periodic)."""
    wait_until(lambda: (seen := metric(gw, series)) is not None and abs(seen - value) < 1e-6,
               10, f"{series} to read {value}")
