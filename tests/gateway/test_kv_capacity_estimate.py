"""The online KV-capacity estimate: its statistics on synthetic samples with noise, when a
scrape is taken as a sample, and that a scraped or configured capacity always wins."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.config import GatewayConfig, ReplicaConfig
from gateway.fleet import Fleet
from gateway.kv_capacity_estimate import CapacityEstimateConfig, CapacityEstimator, CapacityWindow
from gateway.replica_metrics import ScrapedMetrics
from gateway.request_parse import ParsedRequest
from gateway.resident_requests import prompt_head_key
from policies.config import ConfigError, from_mapping
from tests.support.shared_blocks import new_feed_block, open_box_feed

BLOCK = 16


def synthetic_sample(rng: random.Random, capacity: int) -> tuple[float, float, float]:
    """A replica running 1-4 requests of 200-6,000 tokens: usage counts whole blocks, and
    the gauge is read with 3% noise."""
    lengths = [rng.randint(200, 6000) for _ in range(rng.randint(1, 4))]
    blocks = sum(-(-n // BLOCK) for n in lengths)
    usage = blocks * BLOCK / capacity * rng.gauss(1.0, 0.03)
    return float(sum(lengths)), 0.0, min(1.0, usage)


def test_estimate_on_noisy_samples_with_outliers_is_within_3_percent() -> None:
    rng = random.Random(7)
    for capacity in (12_000, 50_000, 400_000):
        window = CapacityWindow(CapacityEstimateConfig())
        for i in range(200):
            resident, _, usage = synthetic_sample(rng, capacity)
            if usage < 0.02:
                continue
            if i % 10 == 0:  # a request of another client the gateway cannot see
                usage = min(1.0, usage * rng.uniform(1.5, 3.0))
            window.add(resident, 0.0, usage)
        estimate = window.estimate()
        assert estimate is not None
        assert abs(estimate - capacity) <= 0.03 * capacity, (capacity, estimate)


def test_no_estimate_before_min_samples_agree() -> None:
    window = CapacityWindow(CapacityEstimateConfig(min_samples=8))
    for _ in range(7):
        window.add(900.0, 100.0, 0.1)
    assert window.estimate() is None
    window.add(900.0, 100.0, 0.1)
    assert window.estimate() == 10_000
    assert window.estimate(ratio=0.5) == 5_500  # prompts in gateway tokens, outputs not


def test_estimate_follows_a_changed_capacity_within_a_window() -> None:
    rng = random.Random(1)
    window = CapacityWindow(CapacityEstimateConfig(window=64))
    for _ in range(64):
        window.add(*synthetic_sample(rng, 20_000))
    old = window.estimate()
    assert old is not None and abs(old - 20_000) < 1000
    for _ in range(40):  # more than half the window: the median moves over
        window.add(*synthetic_sample(rng, 40_000))
    new = window.estimate()
    assert new is not None and abs(new - 40_000) <= 0.05 * 40_000, new
    assert len(window) == 64  # bounded


@pytest.mark.parametrize(("key", "value"), [("min_samples", 0), ("decay", 1.5),
                                            ("usage_floor", 1.0), ("window", 2),
                                            ("outlier", 0)])
def test_config_errors_name_the_key_and_value(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"{key}.*{value}"):
        from_mapping(GatewayConfig, {"scrape": {"kv_capacity_estimate": {key: value}}},
                     "gateway.yaml")


# -- scrapes as samples ---------------------------------------------------------------------

def calibrated_fleet(*replicas: ReplicaConfig, ratio: float = 1.0) -> Fleet:
    fleet = Fleet(list(replicas) or [ReplicaConfig("r0", "http://127.0.0.1:9")])
    for _ in range(8):
        fleet.calibration.observe("m", round(1000 * ratio), 1000)
    return fleet


def scrape(usage: float, running: int, waiting: int = 0,
           capacity: int | None = None) -> ScrapedMetrics:
    return ScrapedMetrics("vllm", running=running, waiting=waiting, kv_usage=usage,
                          kv_capacity_tokens=capacity)


class Replica:
    """Requests sent to one replica through the fleet's accounting, as the proxy does."""

    def __init__(self, fleet: Fleet, estimator: CapacityEstimator, rid: str = "r0") -> None:
        self.fleet, self.estimator, self.rid = fleet, estimator, rid
        self.outputs: dict[int, int] = {}

    def stream(self, prompt_tokens: int, head: int, output: int = 0) -> None:
        pending = self.fleet.sent(self.rid, prompt_tokens)
        self.fleet.first_byte(pending)
        self.outputs[head] = output
        self.estimator.resident.started(self.rid, prompt_tokens, head,
                                        lambda: self.outputs[head])

    def scrape(self, metrics: ScrapedMetrics) -> str:
        mark = self.estimator.mark(self.rid)
        self.fleet.record_scrape(self.rid, metrics)
        return self.estimator.observe(self.rid, metrics, mark)


def test_clean_scrapes_publish_an_estimate_in_gateway_tokens() -> None:
    fleet = calibrated_fleet(ratio=0.5)  # a replica token is two gateway tokens
    estimator = CapacityEstimator(fleet)
    replica = Replica(fleet, estimator)
    replica.stream(4000, head=1, output=10)  # 2,000 replica tokens + 10 generated
    state = fleet.get("r0")
    assert state is not None
    for _ in range(estimator.config.min_samples):
        assert state.kv_capacity().source is None
        assert replica.scrape(scrape(0.1, running=1)) == "sampled"
    assert state.kv_capacity() == (20_100, "estimated")
    for _ in range(5):
        replica.scrape(scrape(0.1, running=1))
    view = fleet.views()[0]
    assert view.kv_capacity_tokens == 40_200  # in gateway tokens
    info = estimator.describe("r0")
    assert info["samples"] == 8 and info["replica_tokens"] == 20_100


def test_unclean_scrapes_are_skipped_with_their_reason() -> None:
    fleet = calibrated_fleet()
    estimator = CapacityEstimator(fleet)
    replica = Replica(fleet, estimator)
    assert replica.scrape(scrape(0.3, running=0)) == "idle"
    replica.stream(1000, head=1)
    assert replica.scrape(scrape(0.1, running=1, waiting=1)) == "waiting"
    assert replica.scrape(scrape(0.2, running=2)) == "other_load"
    assert replica.scrape(scrape(0.001, running=1)) == "low_usage"
    fleet.sent("r0", 500)  # no first byte yet
    assert replica.scrape(scrape(0.2, running=2)) == "unsettled"
    # a request starting while the scrape was on the wire
    mark = estimator.mark("r0")
    replica.stream(700, head=2)
    metrics = scrape(0.2, running=3)
    fleet.record_scrape("r0", metrics)
    assert estimator.observe("r0", metrics, mark) == "moved"

    shared = calibrated_fleet()
    same = Replica(shared, CapacityEstimator(shared))
    same.stream(1000, head=5)
    same.stream(1100, head=5)  # the same document: blocks shared on the replica
    assert same.scrape(scrape(0.1, running=2)) == "shared_prefix"
    window = estimator.window("r0")
    assert window is not None and len(window) == 0
    assert window.skipped == {"idle": 1, "waiting": 1, "other_load": 1, "low_usage": 1,
                              "unsettled": 1, "moved": 1}


def test_samples_taken_before_the_token_ratio_was_learned_follow_it() -> None:
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")])  # no answers seen yet
    estimator = CapacityEstimator(fleet)
    replica = Replica(fleet, estimator)
    replica.stream(3000, head=1, output=0)
    for _ in range(8):
        replica.scrape(scrape(0.1, running=1))
    state = fleet.get("r0")
    assert state is not None and state.estimated_kv_replica_tokens == 30_000  # ratio 1 so far
    assert not estimator.describe("r0")["ratio_learned"]
    for _ in range(8):  # the replica counts a third of the gateway's tokens
        fleet.calibration.observe("m", 1000, 3000)
    replica.scrape(scrape(0.1, running=2))  # skipped, yet the estimate is recomputed
    assert state.estimated_kv_replica_tokens == 10_000
    assert estimator.describe("r0")["ratio_learned"]
    assert fleet.views()[0].kv_capacity_tokens == 30_000  # the same, in gateway tokens


def test_scraped_and_configured_capacity_win_over_the_estimate() -> None:
    fleet = calibrated_fleet(ReplicaConfig("scraped", "http://127.0.0.1:9"),
                             ReplicaConfig("configured", "http://127.0.0.1:9",
                                           kv_capacity_tokens=5_000))
    estimator = CapacityEstimator(fleet)
    for rid in ("scraped", "configured"):
        replica = Replica(fleet, estimator, rid)
        replica.stream(1000, head=1)
        for _ in range(8):
            gauge = 8_000 if rid == "scraped" else None
            assert replica.scrape(scrape(0.05, running=1, capacity=gauge)) == "sampled"
    scraped, configured = fleet.get("scraped"), fleet.get("configured")
    assert scraped is not None and configured is not None
    # the estimate exists (shown in /admin), yet routing uses the given figures
    assert scraped.estimated_kv_replica_tokens == configured.estimated_kv_replica_tokens == 20_000
    assert scraped.kv_capacity() == (8_000, "scraped")
    assert configured.kv_capacity() == (5_000, "configured")
    assert {v.id: v.kv_capacity_tokens for v in fleet.views()} == {
        "scraped": 8_000, "configured": 5_000}


def test_a_restart_drops_the_estimate_and_a_removal_forgets_the_replica() -> None:
    fleet = calibrated_fleet()
    estimator = CapacityEstimator(fleet)
    replica = Replica(fleet, estimator)
    replica.stream(1000, head=1)
    for _ in range(8):
        replica.scrape(scrape(0.1, running=1))
    state = fleet.get("r0")
    assert state is not None and state.estimated_kv_replica_tokens == 10_000
    # its prefix-cache counters go back: it restarted, perhaps with another pool
    assert not fleet.record_scrape("r0", ScrapedMetrics("vllm", hit_tokens=50.0,
                                                        query_tokens=90.0))
    assert fleet.record_scrape("r0", ScrapedMetrics("vllm", hit_tokens=0.0, query_tokens=0.0))
    assert state.estimated_kv_replica_tokens is None and estimator.window("r0") is None
    assert state.kv_capacity() == (None, None)
    fleet.remove("r0")
    assert estimator.resident.running("r0") == ()
    info = estimator.describe("r0")
    assert (info["replica_tokens"], info["samples"], info["skipped"]) == (None, 0, {})
    # an answer's first byte that came from it as it left: nothing kept for it
    late = estimator.resident.started("r0", 500, 7, lambda: None)
    assert late.ended and estimator.resident.running("r0") == ()
    assert estimator.resident.changes("r0") == 0  # no record made for it
    estimator.resident.ended(late)  # its end, told as any other's: still nothing kept
    assert estimator.resident.running("r0") == () and estimator.resident.changes("r0") == 0


def test_the_prompt_head_tells_shared_documents_apart() -> None:
    doc_a, doc_b = "contract A " * 100, "contract B " * 100

    def completion(text: str, salt: str | None = None) -> ParsedRequest:
        return ParsedRequest("completions", {}, "m", True, text, None, None, salt, None)

    assert prompt_head_key(completion(doc_a + "Q1")) == prompt_head_key(completion(doc_a + "Q2"))
    assert prompt_head_key(completion(doc_a)) != prompt_head_key(completion(doc_b))
    assert prompt_head_key(completion(doc_a, "t1")) != prompt_head_key(completion(doc_a, "t2"))

    def chat(parts: list[Any], tools: list[Any] | None = None) -> ParsedRequest:
        return ParsedRequest("chat/completions", {}, "m", True, None, None,
                             [{"role": "user", "content": parts}], None, None, tools)

    # chats are read only as far as their head: what comes after it (a large image, a
    # long tool list) neither changes the key nor is turned into text
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 10**6}}
    text = {"type": "text", "text": doc_a}
    tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {}}}
             for i in range(10_000)]
    assert prompt_head_key(chat([text, image])) == prompt_head_key(chat([text]))
    assert prompt_head_key(chat([text], tools)) == prompt_head_key(chat([text], tools[:20]))
    assert prompt_head_key(chat([text], tools)) != prompt_head_key(chat([text]))
    assert prompt_head_key(chat([text])) != prompt_head_key(
        chat([{"type": "text", "text": doc_b}]))


def test_worker_processes_take_the_leaders_estimate() -> None:
    leader_fleet = calibrated_fleet()
    follower_fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:9")])
    block = new_feed_block()
    leader = open_box_feed(block, leader_fleet, True, failures_to_eject=2, successes_to_readmit=1)
    follower = open_box_feed(block, follower_fleet, False, failures_to_eject=2,
                             successes_to_readmit=1)
    try:
        replica = Replica(leader_fleet, CapacityEstimator(leader_fleet))
        replica.stream(1000, head=1)
        for _ in range(3):  # only the leader scrapes
            replica.scrape(scrape(0.1, running=1))
            leader.publish()
            follower.poll()
        state = follower_fleet.get("r0")
        assert state is not None and state.kv_capacity() == (10_000, "estimated")
    finally:
        leader.block.close()
        follower.block.close()
        block.close()
        block.unlink()
