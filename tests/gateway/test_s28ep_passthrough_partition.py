"""A pass-through request of a tenant whose partition holds no replica of the model is
told so, naming the tenant, as a routed request is: not that the model has no healthy
replica, while its replicas are healthy (an operator would look for an outage)."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve, metric, start_gateway
from tests.support.waiting import wait_until


def test_a_tenant_outside_every_partition_is_told_its_partition_is_empty(
        serve: Serve) -> None:
    replica = Behaviour("a")
    gw = start_gateway(serve, [("a", serve(fake_replica(replica)).url)],
                       trusted_proxies=["127.0.0.0/8"],
                       tenancy={"partitions": [{"tenants": ["acme"], "replicas": ["a"]}]})
    wait_until(lambda: httpx.get(f"{gw.url}/ready").status_code == 200, 10, "a ready gateway")
    for tenant, named in (("globex", "'globex'"), (None, "the anonymous tenant")):
        headers = {"x-kvgate-tenant": tenant} if tenant else {}
        r = httpx.post(f"{gw.url}/v1/embeddings", headers=headers, timeout=10,
                       json={"model": "sim-model", "input": "x"})
        assert r.status_code == 503, r.text
        message = r.json()["error"]["message"]
        assert "partition" in message and named in message and "healthy" not in message
    assert replica.received == []
    assert metric(gw, 'kvgate_requests_total{replica="none",route="passthrough",status="503"}'
                  ) == 2
