"""With client API keys on, ``/admin/explain`` explains for the tenant its tenant header
names (the admin token is no client's key): within that tenant's partition, and under
``require_tenant`` at all."""

from __future__ import annotations

import httpx

from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import AUTH, Serve, start_gateway

BODY = {"model": "sim-model", "prompt": "the same prompt"}


def test_explain_decides_for_the_tenant_named_with_keys_on(serve: Serve) -> None:
    shared, own = Behaviour("r0"), Behaviour("r1")
    gw = start_gateway(serve, [("r0", serve(fake_replica(shared)).url),
                               ("r1", serve(fake_replica(own)).url)],
                       scrape={"enabled": False},
                       auth={"api_keys": [{"key": "acme-key-0123456789", "tenant": "acme"}]},
                       tenancy={"isolate": True, "secret": "s" * 32, "require_tenant": True,
                                "partitions": [{"tenants": ["acme"], "replicas": ["r1"]}]})
    url = f"{gw.admin}/admin/explain"
    missing = httpx.post(url, headers=AUTH, json=BODY)
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "missing_tenant"
    for _ in range(2):  # round robin: the partition, not the rotation, picks r1
        r = httpx.post(url, headers={**AUTH, "x-kvgate-tenant": "acme"}, json=BODY)
        assert r.status_code == 200, r.text
        assert r.json()["chosen"] == "r1" and r.json()["ranked"] == ["r1"]
    other = httpx.post(url, headers={**AUTH, "x-kvgate-tenant": "globex"}, json=BODY)
    assert other.status_code == 200 and other.json()["chosen"] == "r0", other.text
    twice = httpx.post(url, headers=[*AUTH.items(), ("x-kvgate-tenant", "acme"),
                                     ("x-kvgate-tenant", "globex")], json=BODY)
    assert twice.status_code == 400 and twice.json()["error"]["code"] == "repeated_tenant"
    assert shared.received == own.received == []  # explained, never sent


def test_explain_decides_for_the_tenant_named_by_an_admin_caller_no_proxy_trusts(
        serve: Serve) -> None:
    shared, own = Behaviour("r0"), Behaviour("r1")
    # client keys off: clients' tenant headers are believed from the ingress' network
    # alone, and the operator asks from loopback
    gw = start_gateway(serve, [("r0", serve(fake_replica(shared)).url),
                               ("r1", serve(fake_replica(own)).url)],
                       scrape={"enabled": False}, trusted_proxies=["10.9.0.0/16"],
                       tenancy={"isolate": True, "secret": "s" * 32,
                                "partitions": [{"tenants": ["acme"], "replicas": ["r1"]}]})
    url = f"{gw.admin}/admin/explain"
    for _ in range(2):
        r = httpx.post(url, headers={**AUTH, "x-kvgate-tenant": "acme"}, json=BODY)
        assert r.status_code == 200, r.text
        assert r.json()["ranked"] == ["r1"]
    # a client on loopback is no trusted proxy: its tenant header is refused
    sent = httpx.post(f"{gw.url}/v1/completions", headers={"x-kvgate-tenant": "acme"},
                      json=BODY)
    assert sent.status_code == 403
    assert shared.received == own.received == []
