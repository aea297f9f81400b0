"""The peers' listener needs a port of its own: on the gateway's or the admin API's, worker
processes (SO_REUSEPORT) would share that port's clients with it."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from policies.config import ConfigError

PEERS = {"secret": "s" * 32, "addresses": ["kvgate-peers.llm.svc:8002"]}


@pytest.mark.parametrize(("listen", "named"), [
    ("0.0.0.0:8000", "gateway's port"),
    ("127.0.0.1:8001", "gateway's admin.port"),
])
def test_a_peer_listener_on_a_port_the_gateway_serves_is_refused(listen: str,
                                                                 named: str) -> None:
    with pytest.raises(ConfigError, match=named) as refused:
        parse_config({"port": 8000, "peers": {**PEERS, "listen": listen}})
    assert listen in str(refused.value)


def test_a_peer_listener_on_its_own_port_or_a_picked_one_is_taken() -> None:
    for listen in ("0.0.0.0:8002", "127.0.0.1:0"):
        config = parse_config({"port": 8000, "peers": {**PEERS, "listen": listen}})
        assert config.peers.listen == listen
