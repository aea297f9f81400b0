"""Under isolation a client's own cache salt is mixed into its tenant's only when it is one
its replica would take (a non-empty string of at most 128 characters): else 400 naming
``cache_salt``, on the pass-through paths too, whose bodies are not parsed before."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import TenancyConfig, parse_config
from gateway.networks import Networks
from gateway.tenancy import Tenancy
from kvwire.openai_schema import BadRequest
from tests.support.fake_replica import Behaviour, fake_replica
from tests.support.gateway_harness import Serve

SECRET = "s" * 32


@pytest.mark.parametrize("salt", [5, "", ["a"], "x" * 129])
def test_a_client_salt_a_replica_would_refuse_is_refused_under_isolation(salt: Any) -> None:
    tenancy = Tenancy(TenancyConfig(isolate=True, secret=SECRET), Networks([]))
    with pytest.raises(BadRequest) as caught:
        tenancy.isolate("acme", {"model": "m", "input": "x", "cache_salt": salt})
    assert caught.value.param == "cache_salt"
    assert tenancy.isolate("acme", {"model": "m", "input": "x", "cache_salt": "mine"}) \
        != tenancy.isolate("acme", {"model": "m", "input": "x"})


def test_a_salt_a_replica_would_refuse_gets_400_on_a_pass_through_path(serve: Serve) -> None:
    rec = Behaviour("rec")
    config = parse_config({
        "replicas": [{"id": "r0", "url": serve(fake_replica(rec)).url}],
        "scrape": {"enabled": False}, "trusted_proxies": ["127.0.0.1/32"],
        "tenancy": {"isolate": True, "secret": SECRET}})
    url = serve(create_app(config)).url
    r = httpx.post(f"{url}/v1/embeddings",
                   json={"model": "sim-model", "input": "x", "cache_salt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    assert rec.received == []
