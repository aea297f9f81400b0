"""A secret the gateway reads again when it builds its state (the tenancy salt key, the
peers' secret, client API keys) is checked again then: a file or variable changed since
the config was loaded must not hand the gateway a secret the load would have refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.client_auth import ClientAuth
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


@pytest.mark.parametrize("rewritten, message", [
    ("\n", "needs key, key_file or key_env"), ("short\n", "must be at least 16 characters, got 5"),
])
def test_a_client_key_file_changed_after_load_is_named_when_read_again(
        tmp_path: Path, rewritten: str, message: str) -> None:
    """Else a key file emptied failed an assert (a traceback, or with ``python -O`` a
    crash in hashing None), and one shortened was accepted as a client's key."""
    path = tmp_path / "key"
    path.write_text("k" * 24 + "\n")
    config = parse_config({"replicas": [],
                           "auth": {"api_keys": [{"key": "j" * 16, "tenant": "a"},
                                                 {"key_file": str(path), "tenant": "b"}]}})
    assert ClientAuth(config.auth.api_keys).on
    path.write_text(rewritten)
    with pytest.raises(ValueError, match=re.escape(f"auth.api_keys[1]: an api key {message}")):
        ClientAuth(config.auth.api_keys)
