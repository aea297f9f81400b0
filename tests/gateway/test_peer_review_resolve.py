"""Peer addresses looked up again: a name that fails to resolve keeps only what it
resolved to before, never what the other names no longer resolve to."""

from __future__ import annotations

from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peers import Peers
from policies.round_robin import RoundRobin

SECRET = "a-peer-secret-of-some-length"
PORT = 9  # discard: nothing listens, the links only try


async def test_a_name_that_fails_keeps_no_other_names_old_addresses() -> None:
    gone = "no-such-peer.invalid"  # never resolves (RFC 6761)
    peers = Peers(PeersConfig(addresses=[f"127.0.0.2:{PORT}", f"{gone}:{PORT}"],
                              secret=SECRET), Fleet([]), RoundRobin())
    await peers.start()
    try:
        assert set(peers._links) == {("127.0.0.2", PORT)}
        # the first name now answers another address (its pod replaced); the second
        # still fails: the first's old address was kept for it, as any on its port, and
        # a link per address any name ever gave piled up for as long as it failed
        peers.config = PeersConfig(addresses=[f"127.0.0.3:{PORT}", f"{gone}:{PORT}"],
                                   secret=SECRET)
        await peers._resolve()
        assert set(peers._links) == {("127.0.0.3", PORT)}
    finally:
        await peers.stop()
