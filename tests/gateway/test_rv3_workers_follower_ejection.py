"""A follower worker's own ejection of a replica (its requests there failed) lasts its
``ejection_s``, whatever the leader's snapshots say meanwhile."""

from __future__ import annotations

import time
from multiprocessing import shared_memory

from gateway.box_feed import BoxFeed
from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.replica_metrics import ScrapedMetrics
from tests.support.shared_blocks import open_box_feed

REPLICAS = [ReplicaConfig("r0", "http://127.0.0.1:9"), ReplicaConfig("r1", "http://127.0.0.1:8")]


def _feed(block: shared_memory.SharedMemory, fleet: Fleet, leader: bool) -> BoxFeed:
    return open_box_feed(block, fleet, leader, failures_to_eject=2, successes_to_readmit=1)


def test_a_followers_own_ejection_outlasts_the_leaders_next_snapshot(
        feed_block: shared_memory.SharedMemory) -> None:
    leader_fleet, follower_fleet = Fleet(list(REPLICAS)), Fleet(list(REPLICAS))
    leader, follower = _feed(feed_block, leader_fleet, True), \
        _feed(feed_block, follower_fleet, False)
    try:
        leader.publish()
        assert follower.poll()
        r1 = follower_fleet.get("r1")
        assert r1 is not None and r1.healthy
        # the follower's requests to r1 fail (it passes /health): out for 10 s
        for _ in range(3):
            follower_fleet.request_failed("r1", "status 500", 3, 10.0)
        assert not r1.healthy
        # the leader, which saw none of those, scrapes and publishes: r1 healthy to it
        leader_fleet.record_scrape("r0", ScrapedMetrics("vllm", running=1))
        leader_fleet.record_scrape("r1", ScrapedMetrics("vllm", running=1))
        leader.publish()
        assert follower.poll()
        assert not r1.healthy  # still within the follower's ejection
        # once the ejection is over, the leader's word readmits it
        r1.ejected_until = time.monotonic() - 1.0
        leader_fleet.record_scrape("r1", ScrapedMetrics("vllm", running=2))
        leader.publish()
        assert follower.poll()
        assert r1.healthy
        # the leader's own ejection still reaches the follower
        for _ in range(2):
            leader_fleet.record_health("r0", False, "refused", 2, 1)
        leader.publish()
        assert follower.poll()
        r0 = follower_fleet.get("r0")
        assert r0 is not None and not r0.healthy
    finally:
        leader.block.close()
        follower.block.close()
