"""The DNS source's config: what its resolver would refuse is refused with the config."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.discovery.runner import build_source
from policies.config import ConfigError


@pytest.mark.parametrize("server", ["10.0.0.10:53", "kube-dns.kube-system"])
def test_a_nameserver_that_is_no_address_is_refused_with_the_config(server: str) -> None:
    # it passed the config's checks, and the resolver's bare ValueError (no key named)
    # came only when the gateway built its app
    dns = {"type": "dns", "name": "vllm.llm.svc", "port": 8000, "nameservers": [server]}
    with pytest.raises(ConfigError) as err:
        parse_config({"discovery": [dns]})
    assert f"discovery[0]: nameservers: {server!r} is not an IP address" in str(err.value)
    ok = parse_config({"discovery": [{**dns, "nameservers": ["10.0.0.10", "fd00::a"]}]})
    assert build_source(ok.discovery[0]).label == "dns:vllm.llm.svc:8000"
