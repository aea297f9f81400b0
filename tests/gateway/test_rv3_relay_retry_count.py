"""``kvgate_retries_total`` counts every try that another try followed, however the
request ends: a request that failed on every replica was retried too. Real sockets on
loopback: closed ports (unreachable replicas)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import ReplicaConfig, TimeoutConfig
from gateway.errors import UpstreamError
from gateway.fleet import Fleet
from gateway.metrics import GatewayMetrics
from gateway.proxy import Proxy, UpstreamStream
from gateway.upstream_http import UpstreamClient
from tests.support.servers import free_port


def test_a_try_followed_by_another_is_a_retry_when_the_request_fails_too() -> None:
    async def main() -> None:
        fleet = Fleet([ReplicaConfig(rid, f"http://127.0.0.1:{free_port()}")
                       for rid in ("r0", "r1")])
        client = UpstreamClient()
        proxy = Proxy(client, fleet, TimeoutConfig(first_byte_s=5, idle_s=5),
                      GatewayMetrics(fleet), max_attempts=2)

        def done(stream: UpstreamStream, ok: bool) -> None:
            pass

        try:
            with pytest.raises(UpstreamError, match=r"'r0' \(connect\), 'r1' \(connect\)"):
                await proxy.open(["r0", "r1"], "/v1/completions", b"{}", {}, lambda r: 1,
                                 lambda r: None, done)
        finally:
            proxy.close()
            await client.close()
        registry = proxy.metrics.registry
        assert registry.get_sample_value(
            "kvgate_retries_total", {"replica": "r0", "cause": "connect"}) == 1
        # the last try was followed by none: no retry
        assert not registry.get_sample_value(
            "kvgate_retries_total", {"replica": "r1", "cause": "connect"})

    asyncio.run(main())
