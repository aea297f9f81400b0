"""A prefix cache flush done through worker 0's admin API (``/flush_cache``) reaches the
other workers' policies: each follower, applying the leader's snapshot, forgets what its
own policy modelled on the flushed replica, as the leader's does; a replica not flushed
keeps its model."""

from __future__ import annotations

import random
from multiprocessing import shared_memory

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.fleet_events import CacheFlushed, FleetEvent
from gateway.state import policy_listener
from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from tests.support.shared_blocks import box_feed_pair

REPLICAS = [ReplicaConfig("r0", "http://127.0.0.1:9"), ReplicaConfig("r1", "http://127.0.0.1:8")]


def _routed(policy: Cost, replica: str, seed: int) -> None:
    """A 1,000-token prompt answered whole on ``replica``."""
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(1000)]
    request = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m",
                           arrival_s=1.0)
    policy.choose(request, [ReplicaView(c.id, kv_capacity_tokens=20_000) for c in REPLICAS])
    policy.observe(Routed(request, replica))
    policy.observe(Finished(request, replica, ok=True, ttft_s=0.1, duration_s=0.2))


def _modelled(policy: Cost) -> dict[str, int]:
    held = policy.describe()["model_tokens"]
    assert isinstance(held, dict)
    return {rid: tokens for rid, tokens in held.items() if tokens}


def test_a_flush_on_the_leader_empties_a_followers_model_of_that_replica(
        feed_block: shared_memory.SharedMemory) -> None:
    leader_fleet, follower_fleet = Fleet(list(REPLICAS)), Fleet(list(REPLICAS))
    policy = Cost()
    follower_fleet.listen(policy_listener(policy))
    told: list[FleetEvent] = []
    follower_fleet.listen(told.append)
    leader, follower = box_feed_pair(feed_block, leader_fleet, follower_fleet, 2)
    try:
        leader.publish()
        assert follower.poll()
        _routed(policy, "r0", 1)
        _routed(policy, "r1", 2)
        assert set(_modelled(policy)) == {"r0", "r1"}, _modelled(policy)
        # a snapshot with no flush in it leaves the model alone
        leader.publish()
        follower.poll()
        assert set(_modelled(policy)) == {"r0", "r1"}
        leader_fleet.flushed("r0")  # as gateway.cache_flush tells it
        leader.publish()
        assert follower.poll()
        assert set(_modelled(policy)) == {"r1"}, _modelled(policy)
        assert [e for e in told if isinstance(e, CacheFlushed)] == [CacheFlushed("r0")]
        r0 = follower_fleet.get("r0")
        assert r0 is not None and r0.flushes == 1
        # applied once: a later snapshot (another scrape's) does not tell it again
        _routed(policy, "r0", 3)
        leader.publish()
        follower.poll()
        assert set(_modelled(policy)) == {"r0", "r1"}
        assert len([e for e in told if isinstance(e, CacheFlushed)]) == 1
    finally:
        leader.block.close()
        follower.block.close()
