"""A peer address or listen address whose host no resolver can take (an empty label, one
longer than 63 characters) is refused with the config, naming it."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from policies.config import ConfigError

SECRET = "a-peer-secret-of-some-length"
BASE = {"replicas": [{"id": "r0", "url": "http://127.0.0.1:9"}]}


@pytest.mark.parametrize("peers, named", [
    ({"addresses": ["kvgate-peers..llm.svc:8002"]},
     r"addresses\[0\]: 'kvgate-peers\.\.llm\.svc:8002'"),
    ({"addresses": ["gw-a:8002", f"{'x' * 64}.svc:8002"]}, r"addresses\[1\]: 'xxxx"),
    ({"listen": ".gw:8002"}, r"listen: '\.gw:8002'"),
])
def test_a_host_no_resolver_takes_is_refused_naming_it(peers: dict[str, object],
                                                        named: str) -> None:
    # it was taken, and the gateway then failed to start on a UnicodeError from the
    # resolver that named neither the key nor the address
    with pytest.raises(ConfigError, match=named):
        parse_config({**BASE, "peers": {**peers, "secret": SECRET}})


def test_addresses_a_resolver_takes_still_load() -> None:
    addresses = ["[::1]:8002", "10.0.0.7:8002", "kvgate_peers.llm.svc.:8002",
                 "bücher.example:8002"]
    config = parse_config({**BASE, "peers": {"listen": "[::]:0", "addresses": addresses,
                                             "secret": SECRET}})
    assert config.peers.addresses == addresses
