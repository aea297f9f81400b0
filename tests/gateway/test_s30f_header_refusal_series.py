"""A request head too large is answered 431 by the HTTP server alone, before any route:
its ``kvgate_requests_total`` series is there from the start under ``route="none"`` only,
not under every routing policy's route, which no such answer can reach."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway


def test_the_431_series_is_route_nones_alone(serve: Serve) -> None:
    gw = start_gateway(serve, [("r0", serve(fake_replica(Behaviour("r0"))).url)])
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    assert 'kvgate_requests_total{replica="none",route="none",status="431"} 0.0' in text
    routed = [line for line in text.splitlines()
              if line.startswith("kvgate_requests_total{") and 'status="431"' in line
              and 'route="none"' not in line]
    assert routed == []
    # the series of the other refusals are there under the routes as before
    assert 'kvgate_requests_total{replica="none",route="round_robin",status="429"} 0.0' \
        in text
