"""A routed request of a tenant whose partition holds no replica is told so naming the
tenant by the start of its header (a header may be 64 KiB, all of it repeated in the
error and its log line), and the anonymous tenant as such, not as ``tenant None``."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, start_gateway
from tests.support.waiting import wait_until


def test_the_tenant_of_an_empty_partition_is_named_by_its_start(serve: Serve) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)],
                       trusted_proxies=["127.0.0.0/8"],
                       tenancy={"partitions": [{"tenants": ["acme"], "replicas": ["a"]}]})
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    long = "g" * 20_000
    for tenant, named in ((long, "tenant 'gggg"), (None, "the anonymous tenant")):
        headers = {"x-kvgate-tenant": tenant} if tenant else {}
        r = httpx.post(f"{gw.url}/v1/completions", headers=headers, timeout=10,
                       json={"model": "sim-model", "prompt": "x"})
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "partition" in message and named in message, message
        assert len(message) < 300 and "None" not in message, message
    assert replica.received == []
