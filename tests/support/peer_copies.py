"""Gateway copies whose ``Peers`` link over real loopback TCP, each with its own fleet of
four replicas (``r0``-``r3``) and policy, for tests of what copies tell each other."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peers import Peers
from policies.base import Policy
from policies.cost import Cost, CostConfig
from tests.support.waiting import wait_until_async

SECRET = "a-peer-secret-of-some-length"
REPLICAS = [ReplicaConfig(f"r{i}", f"http://127.0.0.1:{9 + i}") for i in range(4)]


class PeerCopy:
    """One gateway copy's fleet, policy (``cost``, unless ``policy``) and peers."""

    def __init__(self, addresses: list[str], secret: str = SECRET,
                 listen: str = "127.0.0.1:0", policy: Policy | None = None) -> None:
        self.fleet = Fleet(list(REPLICAS))
        self.policy = Cost(CostConfig(prefill_s_per_token=1e-4)) if policy is None else policy
        self.peers = Peers(PeersConfig(listen=listen, addresses=addresses,
                                       secret=secret), self.fleet, self.policy)
        self.fleet.outbox = self.peers

    def queued(self, replica: str) -> tuple[int, int]:
        view = next(v for v in self.fleet.views() if v.id == replica)
        return view.queued_tokens, view.in_flight

    def address(self) -> str:
        assert self.peers.address is not None
        return f"{self.peers.address[0]}:{self.peers.address[1]}"


@contextlib.asynccontextmanager
async def linked_pair(prepare: Callable[[PeerCopy, PeerCopy], None] | None = None
                      ) -> AsyncIterator[tuple[PeerCopy, PeerCopy]]:
    """Two copies, ``a`` and ``b``: ``b`` listens; ``a`` sends to it, its link up.
    ``prepare(a, b)``: called before ``a`` starts (``b`` listening already)."""
    b = PeerCopy([])
    await b.peers.start()
    a = PeerCopy([b.address()])
    if prepare is not None:
        prepare(a, b)
    await a.peers.start()
    try:
        await wait_until_async(lambda: a.peers.counts.links_up == 1, 5.0, "a's link to b")
        yield a, b
    finally:
        await a.peers.stop()
        await b.peers.stop()
