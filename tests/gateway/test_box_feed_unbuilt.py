"""A follower that cannot add one of the leader's replicas (its key file unreadable in
that process) still applies the rest of each snapshot: the replicas after it, and every
later snapshot's health and scrapes; it says so once, and adds the replica once it can."""

from __future__ import annotations

import logging
from multiprocessing import shared_memory
from pathlib import Path

import pytest

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from tests.support.shared_blocks import box_feed_pair

REPLICAS = [ReplicaConfig("r0", "http://127.0.0.1:9")]


def test_one_replica_a_follower_cannot_add_leaves_the_others_applied(
        feed_block: shared_memory.SharedMemory, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    key = tmp_path / "key"
    key.write_text("k" * 32)
    leader_fleet, follower_fleet = Fleet(list(REPLICAS)), Fleet(list(REPLICAS))
    leader, follower = box_feed_pair(feed_block, leader_fleet, follower_fleet, 1)
    try:
        leader_fleet.add(ReplicaConfig("r1", "http://127.0.0.1:8", api_key_file=str(key)),
                         forward_auth=False)
        leader_fleet.add(ReplicaConfig("r2", "http://127.0.0.1:7"), forward_auth=False)
        key.unlink()  # gone before the follower reads it
        with caplog.at_level(logging.ERROR, logger="kvgate"):
            leader.publish()
            assert follower.poll()
            assert [s.id for s in follower_fleet] == ["r0", "r2"]
            for _ in range(2):  # later snapshots still reach the others; said once
                leader_fleet.record_health("r0", False, "refused", 1, 1)
                leader_fleet.record_health("r2", False, "refused", 1, 1)
                leader.publish()
                assert follower.poll()
        r0, r2 = follower_fleet.get("r0"), follower_fleet.get("r2")
        assert r0 is not None and not r0.healthy and r2 is not None and not r2.healthy
        said = [r for r in caplog.records if "'r1'" in r.getMessage()]
        assert len(said) == 1 and "cannot be added" in said[0].getMessage()
        key.write_text("k" * 32)  # readable again: added at the next snapshot
        leader_fleet.record_health("r0", True, None, 1, 1)
        leader.publish()
        assert follower.poll()
        assert sorted(s.id for s in follower_fleet) == ["r0", "r1", "r2"]
    finally:
        leader.block.close()
        follower.block.close()
