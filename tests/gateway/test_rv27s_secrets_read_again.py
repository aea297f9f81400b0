"""A secret the gateway reads again when it builds its state (the tenancy salt key, the
peers' secret, client API keys) is checked again then: a file or variable changed since
the config was loaded must not hand the gateway a secret the load would have refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.fleet import Fleet
from gateway.networks import Networks
from gateway.peers import Peers
from gateway.tenancy import Tenancy
from policies.registry import build_policy

SECRET = "s" * 40


@pytest.mark.parametrize("rewritten, got", [("\n", 0), ("short\n", 5)])
def test_a_tenancy_secret_file_changed_after_load_is_checked_when_read_again(
        tmp_path: Path, rewritten: str, got: int) -> None:
    """Salts keyed by an empty secret are HMACs any client can compute: another tenant's
    salt, sent as its own, would share that tenant's cache."""
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    config = parse_config({"replicas": [], "trusted_proxies": ["127.0.0.1/32"],
                           "tenancy": {"isolate": True, "secret_file": str(path)}})
    built = Tenancy(config.tenancy, Networks(config.trusted_proxies))  # the file holds it
    assert built.isolate("acme", {"prompt": "x"}) is not None
    path.write_text(rewritten)
    with pytest.raises(ValueError, match=f"at least 32 bytes .*; got {got}$"):
        Tenancy(config.tenancy, Networks(config.trusted_proxies))


def test_a_peers_secret_file_shortened_after_load_is_checked_when_read_again(
        tmp_path: Path) -> None:
    """A copy that proves a short secret lets anyone who guesses it in to teach its policy
    and load its replicas' queues."""
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    config = parse_config({"replicas": [{"id": "a", "url": "http://127.0.0.1:1"}],
                           "peers": {"listen": "127.0.0.1:0", "secret_file": str(path)}})
    fleet = Fleet(config.fleet_replicas())
    policy = build_policy({"name": "round_robin"})
    assert Peers(config.peers, fleet, policy).secret == SECRET.encode()
    path.write_text("short\n")
    with pytest.raises(ValueError, match=r"at least 16 characters .*, got 5$"):
        Peers(config.peers, fleet, policy)
