"""A route the wire cannot carry (its affinity key, model and tenant past the frame's
bound) is counted as a frame dropped for each link, not lost without a count."""

from __future__ import annotations

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peers import Peers
from policies.base import RouteRequest
from tests.support.waiting import wait_until_async

SECRET = "a-peer-secret-of-some-length"
REPLICAS = [ReplicaConfig("r0", "http://127.0.0.1:9")]


async def test_a_route_too_long_for_the_wire_counts_as_dropped() -> None:
    b = Peers(PeersConfig(listen="127.0.0.1:0", secret=SECRET), Fleet(list(REPLICAS)), None)
    await b.start()
    assert b.address is not None
    a = Peers(PeersConfig(addresses=[f"{b.address[0]}:{b.address[1]}"], secret=SECRET),
              Fleet(list(REPLICAS)), None)
    await a.start()
    try:
        await wait_until_async(lambda: a.counts.links_up == 1, 5.0, "a's link to b")
        long = RouteRequest(tokens=[], prompt_tokens=10, model="m", affinity_key="k" * 4000)
        a.routed(long, "r0")
        assert a.counts.frames_dropped == 1
        a.routed(RouteRequest(tokens=[], prompt_tokens=10, model="m", affinity_key="k"), "r0")
        assert a.counts.frames_dropped == 1  # one that fits goes out
    finally:
        await a.stop()
        await b.stop()
