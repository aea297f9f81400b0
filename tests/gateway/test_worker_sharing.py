"""What worker processes share: the per-replica accounting block, the leader's fleet
snapshot, and the per-worker share of limits; and the relay's idle watch."""

from __future__ import annotations

import asyncio
import multiprocessing
import struct
import time
from collections.abc import Iterator
from multiprocessing import shared_memory

import pytest

from gateway import box_feed
from gateway.box_feed import BLOCK_BYTES, FeedBlock
from gateway.capture import CaptureConfig
from gateway.config import GatewayConfig, LimitsConfig, ReplicaConfig
from gateway.discovery.stats import SourceStats
from gateway.fleet import Fleet, ModelInfo
from gateway.idle_watch import IdleWatch
from gateway.kv_capacity_estimate import CapacityEstimator
from gateway.replica_metrics import ScrapedMetrics
from gateway.shared_load import BOX_ID, SharedLoad
from gateway.workers import share_of
from tests.support.shared_blocks import box_feed_pair, new_load_block, open_box_feed

REPLICAS = [ReplicaConfig("r0", "http://127.0.0.1:9"), ReplicaConfig("r1", "http://127.0.0.1:8")]


@pytest.fixture
def load_block() -> Iterator[shared_memory.SharedMemory]:
    block = new_load_block(workers=2, slots=4)
    yield block
    block.close()
    block.unlink()


def _worker(block: shared_memory.SharedMemory, index: int) -> tuple[Fleet, SharedLoad]:
    # a worker's own handle, as a separate process would open it
    load = SharedLoad(shared_memory.SharedMemory(block.name), 2, index, 4)
    return Fleet(list(REPLICAS), shared=load), load


def test_a_replicas_progress_is_seen_by_every_worker(load_block: shared_memory.SharedMemory
                                                    ) -> None:
    # a try's wait is extended while its replica makes progress: progress another
    # worker's request saw counts (a worker saw none of its own, and gave up on a busy one)
    a, load_a = _worker(load_block, 0)
    b, load_b = _worker(load_block, 1)
    try:
        ra, rb = a.get("r0"), b.get("r0")
        assert ra is not None and rb is not None
        assert ra.progress() == rb.progress() == 0.0
        rb.made_progress()
        assert ra.progress_at == 0.0 and ra.progress() == rb.progress() > 0.0
        sent = a.sent("r0", 10)  # a's own writes keep b's progress in the block
        assert ra.progress() == rb.progress_at
        a.done(sent)
        assert a.get("r1").progress() == 0.0  # type: ignore[union-attr]
    finally:
        load_a.close()
        load_b.close()


def test_each_worker_sees_the_box_pending_tokens(load_block: shared_memory.SharedMemory
                                                 ) -> None:
    a, load_a = _worker(load_block, 0)
    b, load_b = _worker(load_block, 1)
    try:
        sent_a = a.sent("r0", 300, now=100.0)
        sent_b = b.sent("r0", 50, now=90.0)
        b.sent("r1", 7, now=95.0)
        for fleet in (a, b):  # the same view from either worker
            v0, v1 = fleet.views(now=101.0)
            assert (v0.queued_tokens, v0.in_flight) == (350, 2)
            assert (v0.pending_age_s, v0.pending_head_tokens) == (11.0, 50)  # b's, older
            assert (v1.queued_tokens, v1.in_flight) == (7, 1)
        a.first_byte(sent_a)
        assert b.views(now=101.0)[0].queued_tokens == 50
        assert b.views(now=101.0)[0].in_flight == 2  # answering, not done
        a.done(sent_a)
        b.done(sent_b)
        assert a.views(now=101.0)[0].queued_tokens == 0
        assert a.views(now=101.0)[0].in_flight == 0
        assert a.views(now=101.0)[0].pending_age_s == 0.0
        # a scrape's gauge counts beyond the box's pending then (other senders'); the box's
        # own pending counts until its first byte
        b.sent("r0", 40)
        b.record_scrape("r0", ScrapedMetrics("vllm", queued_tokens=1000))
        a.record_scrape("r0", ScrapedMetrics("vllm", queued_tokens=1000))
        assert a.views()[0].queued_tokens == 1000
        a.sent("r0", 5)
        assert b.views()[0].queued_tokens == 1005
    finally:
        load_a.close()
        load_b.close()


def test_a_restarted_worker_starts_from_zero(load_block: shared_memory.SharedMemory) -> None:
    a, load_a = _worker(load_block, 0)
    a.sent("r0", 300)
    load_a.close()
    b, load_b = _worker(load_block, 1)
    assert b.views()[0].queued_tokens == 300
    _, load_again = _worker(load_block, 0)  # worker 0 again: its cells are cleared
    assert b.views()[0].queued_tokens == 0
    load_b.close()
    load_again.close()


def test_a_removed_replicas_slot_is_reused_once_idle_and_quarantined(
        load_block: shared_memory.SharedMemory) -> None:
    leader, load = _worker(load_block, 0)
    follower, load_f = _worker(load_block, 1)
    try:
        # the follower still streams an answer from r1 when the leader removes it
        held = follower.sent("r1", 40)
        follower.first_byte(held)
        leader.remove("r1")
        assert leader.add(ReplicaConfig("r1", "http://127.0.0.1:8")).slot == 2  # quarantined
        leader.remove("r1")
        leader.slot_quarantine_s = 0.0
        # slot 1 still has the follower's answer in flight; slot 2 is idle
        assert leader.add(ReplicaConfig("a", "http://127.0.0.1:7")).slot == 2
        assert leader.add(ReplicaConfig("b", "http://127.0.0.1:6")).slot == 3
        with pytest.raises(ValueError, match="4 slots"):  # every slot held or in flight
            leader.add(ReplicaConfig("c", "http://127.0.0.1:5"))
        follower.done(held)  # its answer ended: slot 1 is free
        assert leader.add(ReplicaConfig("c", "http://127.0.0.1:5")).slot == 1
        # discovery's churn, pods replaced one at a time, never runs out
        for n in range(50):
            leader.remove("c" if n == 0 else f"pod-{n - 1}")
            state = leader.add(ReplicaConfig(f"pod-{n}", "http://127.0.0.1:5"))
            assert state.slot < 4
            sent = leader.sent(f"pod-{n}", 10)
            leader.done(sent)
        assert len(leader) == 4
    finally:
        load.close()
        load_f.close()


def test_a_box_is_named_by_16_random_bytes_every_worker_reads_alike(
        load_block: shared_memory.SharedMemory) -> None:
    # its peers id was a hash of the block's name, which holds 32 random bits
    (_, one), (_, two) = _worker(load_block, 0), _worker(load_block, 1)
    other_block = new_load_block(workers=2, slots=4)
    other = SharedLoad(shared_memory.SharedMemory(other_block.name), 2, 0, 4)
    try:
        assert one.box_id == two.box_id != other.box_id
        assert one.box_id == bytes(load_block.buf[BOX_ID]) != bytes(16)  # drawn at create
    finally:
        for load in (one, two, other):
            load.close()
        other_block.close()
        other_block.unlink()


def test_load_block_rejects_a_foreign_block() -> None:
    block = shared_memory.SharedMemory(create=True, size=SharedLoad.size(2, 4))
    try:
        with pytest.raises(ValueError, match="not a kvgate load block"):
            SharedLoad(block, 2, 0, 4)
        with pytest.raises(ValueError, match="worker must be in"):
            SharedLoad(block, 2, 2, 4)
    finally:
        block.close()
        block.unlink()


def test_followers_apply_what_the_leader_found(feed_block: shared_memory.SharedMemory
                                               ) -> None:
    leader_fleet, follower_fleet = Fleet(list(REPLICAS)), Fleet(list(REPLICAS))
    leader, follower = box_feed_pair(feed_block, leader_fleet, follower_fleet, 2)
    try:
        assert not follower.poll()  # nothing published yet
        for _ in range(2):  # two failed checks eject r1; the follower sees each
            leader_fleet.record_health("r1", False, "refused", 2, 1)
            leader.publish()
            assert follower.poll()
        leader_fleet.record_scrape("r0", ScrapedMetrics("vllm", running=3, kv_usage=0.5))
        leader_fleet.get("r0").model_info = {"m": ModelInfo()}  # type: ignore[union-attr]
        leader_fleet.add(ReplicaConfig("r2", "http://127.0.0.1:7", weight=2.0),
                         forward_auth=False)
        leader_fleet.remove("r0")
        leader.publish()
        assert follower.poll()
        assert not follower.poll()  # nothing new
        assert [s.id for s in follower_fleet] == ["r1", "r2"]
        r1, r2 = follower_fleet.get("r1"), follower_fleet.get("r2")
        assert r1 is not None and not r1.healthy and r1.last_error == "refused"
        assert r2 is not None and r2.config.weight == 2.0 and r2.slot == 2
        assert not r2.forward_auth
        leader_fleet.record_scrape("r1", ScrapedMetrics("vllm", running=4))
        leader_fleet.record_health("r1", True, None, 2, 1)
        leader.publish()
        assert follower.poll()
        assert r1.healthy and r1.scraped is not None and r1.scraped.running == 4
        # what only the leader counts (its calls refused, its discovery's rounds) is
        # every worker's to export: a scrape may reach any of them
        leader.discovery = [SourceStats("dns", replicas=2, syncs=7, last_sync=5.0)]
        follower.discovery = [SourceStats("dns")]
        leader_fleet.get("r1").auth_failures = 3  # type: ignore[union-attr]
        leader.publish()
        assert follower.poll()
        assert r1.auth_failures == 3
        assert follower.discovery[0] == SourceStats("dns", replicas=2, syncs=7, last_sync=5.0)
    finally:
        leader.block.close()
        follower.block.close()


def test_followers_keep_a_replica_out_while_the_leader_does(
        feed_block: shared_memory.SharedMemory) -> None:
    # a replica added at run time is out until the leader's first check passes: the
    # followers added it healthy, and one failed check (of two to eject) left it in
    leader_fleet, follower_fleet = Fleet(list(REPLICAS)), Fleet(list(REPLICAS))
    leader, follower = box_feed_pair(feed_block, leader_fleet, follower_fleet, 2)

    def healthy() -> tuple[bool, ...]:
        return tuple(next(v.healthy for v in f.views() if v.id == "new")
                     for f in (leader_fleet, follower_fleet))

    try:
        leader_fleet.add(ReplicaConfig("new", "http://127.0.0.1:7"), checked_first=True)
        leader.publish()
        assert follower.poll() and healthy() == (False, False)
        leader_fleet.record_health("new", False, "refused", 2, 1)  # still starting
        leader.publish()
        assert follower.poll() and healthy() == (False, False)
        leader_fleet.record_health("new", True, None, 2, 1)
        leader.publish()
        assert follower.poll() and healthy() == (True, True)
    finally:
        leader.block.close()
        follower.block.close()


async def test_a_follower_whose_leader_died_before_publishing_stops_at_once(
        feed_block: shared_memory.SharedMemory) -> None:
    bell, ring = multiprocessing.Pipe(duplex=False)
    ring.close()  # worker 0 exited (at start-up) before it published anything
    follower = open_box_feed(feed_block, Fleet(list(REPLICAS)), False, failures_to_eject=1,
                             successes_to_readmit=1, bell=bell)
    started = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match="worker 0 exited before it published"):
            await follower.start(first_within_s=30.0)
        assert time.monotonic() - started < 2.0
    finally:
        follower.block.close()
        bell.close()


async def test_a_rung_follower_applies_a_change_at_once_and_an_idle_one_sleeps(
        feed_block: shared_memory.SharedMemory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader publishes a change PUBLISH_S after it and rings; the follower reads then,
    not at its next poll (the fallback is set to a minute here, so only the doorbell can
    deliver the change in time). Idle, the follower does not read at all."""
    monkeypatch.setattr(box_feed, "FALLBACK_S", 60.0)
    bell, ring = multiprocessing.Pipe(duplex=False)
    leader_fleet, follower_fleet = Fleet(list(REPLICAS)), Fleet(list(REPLICAS))
    leader = open_box_feed(feed_block, leader_fleet, True, failures_to_eject=1,
                           successes_to_readmit=1, rings=[ring])
    follower = open_box_feed(feed_block, follower_fleet, False, failures_to_eject=1,
                             successes_to_readmit=1, bell=bell)
    reads = 0
    poll = follower.poll

    def counted() -> bool:
        nonlocal reads
        reads += 1
        return poll()

    follower.poll = counted  # type: ignore[method-assign]
    try:
        await leader.start()
        await follower.start(first_within_s=5.0)
        await asyncio.sleep(0.1)  # the ring of the first snapshot, read already
        reads = 0
        await asyncio.sleep(0.5)
        assert reads == 0  # nothing rang: no wake-up at all
        leader_fleet.record_health("r1", False, "refused", 1, 1)
        r1 = follower_fleet.get("r1")
        assert r1 is not None
        for _ in range(100):
            if not r1.healthy:
                break
            await asyncio.sleep(0.02)
        assert not r1.healthy and r1.last_error == "refused"
        assert 1 <= reads <= 2
        leader_fleet.record_scrape("r0", ScrapedMetrics("vllm", running=7))
        leader_fleet.add(ReplicaConfig("r2", "http://127.0.0.1:7"))
        for _ in range(100):
            r0 = follower_fleet.get("r0")
            if follower_fleet.get("r2") is not None and r0 is not None \
                    and r0.scraped is not None:
                break
            await asyncio.sleep(0.02)
        r0 = follower_fleet.get("r0")
        assert follower_fleet.get("r2") is not None
        assert r0 is not None and r0.scraped is not None and r0.scraped.running == 7
        ring.close()  # the leader's end gone: the follower stops listening, never spins
        for _ in range(100):
            if not follower._listening:
                break
            await asyncio.sleep(0.02)
        assert not follower._listening
    finally:
        await follower.stop()
        await leader.stop()
        leader.block.close()
        follower.block.close()
        bell.close()


def test_a_follower_counts_the_gauge_against_the_box_pending_when_it_was_scraped(
        load_block: shared_memory.SharedMemory, feed_block: shared_memory.SharedMemory
        ) -> None:
    """A follower applies the leader's scrape a little later. A request answered in
    between is still in the gauge: counted against the box's pending now, it would read
    as another sender's queue on an idle replica."""
    leader_fleet, load_a = _worker(load_block, 0)
    follower_fleet, load_b = _worker(load_block, 1)
    leader, follower = box_feed_pair(feed_block, leader_fleet, follower_fleet, 2)
    try:
        sent = follower_fleet.sent("r0", 8000)
        leader_fleet.record_scrape("r0", ScrapedMetrics("vllm", queued_tokens=8000))
        leader.publish()
        follower_fleet.done(sent)  # answered before the follower reads the snapshot
        assert follower.poll()
        assert leader_fleet.views()[0].queued_tokens == 0
        assert follower_fleet.views()[0].queued_tokens == 0
    finally:
        leader.block.close()
        follower.block.close()
        load_a.close()
        load_b.close()


def test_a_torn_snapshot_is_never_applied(feed_block: shared_memory.SharedMemory) -> None:
    writer = FeedBlock(shared_memory.SharedMemory(feed_block.name))
    reader = FeedBlock(shared_memory.SharedMemory(feed_block.name))
    try:
        writer.write(b'{"replicas": []}')
        got = reader.read(0)
        assert got is not None and got[1] == b'{"replicas": []}'
        assert reader.read(got[0]) is None  # seen already
        buf = feed_block.buf
        assert buf is not None
        struct.pack_into("<Q", buf, 0, got[0] + 1)  # a write under way: odd sequence
        assert reader.read(0) is None
        struct.pack_into("<Q", buf, 0, got[0] + 2)
        buf[24] = ord("[")  # bytes that do not match the checksum
        assert reader.read(0) is None
        with pytest.raises(ValueError, match="exceeds"):
            writer.write(b"x" * BLOCK_BYTES)
    finally:
        writer.close()
        reader.close()


def test_each_worker_takes_its_share_of_the_limits_and_its_own_capture_log() -> None:
    config = GatewayConfig(limits=LimitsConfig(max_in_flight=1025, max_pending=3,
                                               max_connections=4096,
                                               connections_per_replica=3))
    limits = share_of(config, 2).limits
    assert (limits.max_in_flight, limits.max_pending, limits.max_connections,
            limits.connections_per_replica) == (513, 2, 2048, 2)
    assert share_of(config, 1).limits == config.limits
    logged = GatewayConfig(capture=CaptureConfig(path="/tmp/kvgate-capture.jsonl"))
    assert share_of(logged, 2, 1).capture.path == "/tmp/kvgate-capture.jsonl.w1"
    assert share_of(logged, 1).capture.path == "/tmp/kvgate-capture.jsonl"


async def test_idle_watch_cancels_a_wait_that_lasts_and_spares_busy_ones() -> None:
    async def relay(gaps_s: list[float], idle_s: float) -> tuple[int, bool]:
        watch = IdleWatch(idle_s)
        got = 0
        try:
            for gap in gaps_s:
                watch.waiting()
                await asyncio.sleep(gap)
                watch.got()
                got += 1
                await asyncio.sleep(gap)  # not waiting upstream: never cancelled here
        except asyncio.CancelledError:
            assert watch.fired
            return got, True
        finally:
            watch.stop()
        return got, False

    # gaps far from the idle limit, so a stalled loop on a busy machine cannot flip them
    assert await relay([0.02] * 10, 0.5) == (10, False)  # 0.2 s in all, no gap of 0.5
    assert await relay([0.01, 0.01, 2.0], 0.5) == (2, True)


def test_no_kv_capacity_is_estimated_while_the_load_is_shared(
        load_block: shared_memory.SharedMemory) -> None:
    # a scrape sees every worker's requests, a worker only its own: no sample is clean
    fleet, load = _worker(load_block, 0)
    try:
        assert CapacityEstimator(fleet).on is False
        assert CapacityEstimator(Fleet(list(REPLICAS))).on is True
    finally:
        load.close()


def test_the_newer_listing_of_a_replicas_models_wins(feed_block: shared_memory.SharedMemory
                                                     ) -> None:
    replicas = [ReplicaConfig("r0", "http://127.0.0.1:9")]
    leader_fleet, follower_fleet = Fleet(list(replicas)), Fleet(list(replicas))
    leader, follower = box_feed_pair(feed_block, leader_fleet, follower_fleet, 2)
    ours, theirs = leader_fleet.get("r0"), follower_fleet.get("r0")
    assert ours is not None and theirs is not None
    try:
        ours.model_info, ours.models_at = {"m": ModelInfo(max_model_len=4096)}, 10.0
        leader.publish()
        assert follower.poll()
        assert theirs.model_info == ours.model_info
        # the follower listed the replica on a miss: an adapter loaded since
        theirs.model_info = {"m": ModelInfo(max_model_len=4096), "m-lora": ModelInfo()}
        theirs.models_at = 20.0
        leader_fleet.record_health("r0", True, None, 2, 1)  # the leader's older listing
        leader.publish()                                    # travels on with its check
        assert follower.poll()
        assert theirs.checks == 1 and set(theirs.model_info) == {"m", "m-lora"}
        # the leader lists it again later: the adapter was unloaded meanwhile
        ours.models_at, ours.models_cut = 30.0, True
        leader.publish()
        assert follower.poll()
        assert set(theirs.model_info) == {"m"} and theirs.models_cut
        assert theirs.models_at == 30.0
    finally:
        leader.block.close()
        follower.block.close()
