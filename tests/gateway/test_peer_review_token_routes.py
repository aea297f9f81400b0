"""A copy whose policy keys on prompt token ids (``chunk_chars: 0``) and its peers: the
wire carries no token ids, so such a route would reach the peers as an empty prompt."""

from __future__ import annotations

import random

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.peer_config import PeersConfig
from gateway.peers import Peers
from policies.base import Routed, RouteRequest
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from tests.support.waiting import wait_until_async

SECRET = "a-peer-secret-of-some-length"
REPLICAS = [ReplicaConfig(f"r{i}", f"http://127.0.0.1:{9 + i}") for i in range(2)]


def _policy() -> PrefixAffinity:
    return PrefixAffinity(PrefixAffinityConfig(chunk_chars=0, prefix_tokens=64,
                                               common_block=64, common_min_samples=8))


def _prompts(seed: int, n: int) -> list[RouteRequest]:
    rng = random.Random(seed)
    head = [rng.randrange(50_000) for _ in range(512)]  # a system prompt every one shares
    out = []
    for i in range(n):
        tokens = head + [rng.randrange(50_000) for _ in range(300)]
        out.append(RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m",
                                arrival_s=float(i)))
    return out


def _queued(fleet: Fleet, replica: str) -> int:
    return next(v.queued_tokens for v in fleet.views() if v.id == replica)


async def test_routes_keyed_by_token_ids_do_not_unlearn_the_peers_common_prefix() -> None:
    b_fleet, b_policy = Fleet(list(REPLICAS)), _policy()
    b = Peers(PeersConfig(listen="127.0.0.1:0", secret=SECRET), b_fleet, b_policy)
    await b.start()
    assert b.address is not None
    a_fleet = Fleet(list(REPLICAS))
    a = Peers(PeersConfig(addresses=[f"{b.address[0]}:{b.address[1]}"], secret=SECRET),
              a_fleet, _policy())
    a_fleet.outbox = a
    await a.start()
    try:
        await wait_until_async(lambda: a.counts.links_up == 1, 5.0, "a's link to b")
        alone = _policy()  # what b learns from its own requests
        for request in _prompts(1, 100):
            for policy in (alone, b_policy):
                policy.observe(Routed(request, "r0"))
        assert alone.tokens_needed > 64  # the shared head was learned: K past it
        for request in _prompts(2, 200):  # a's requests, its system prompt shared too
            a.routed(request, "r1")
        a_fleet.sent("r0", 5)  # after a's routes on the one connection
        await wait_until_async(lambda: _queued(b_fleet, "r0") == 5, 5.0,
                               "b hears a's prefill")
        # a's routes reached b without their token ids, as prompts sharing nothing: b's
        # learned common prefix went back to none, and every prompt keyed on its head
        assert b_policy.tokens_needed == alone.tokens_needed
    finally:
        await a.stop()
        await b.stop()
