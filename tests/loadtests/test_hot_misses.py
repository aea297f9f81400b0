import pytest

from loadtests.hot_misses import CAUSES, hot_misses
from loadtests.replica_prompts import WorkloadIds
from loadtests.simulate import build_policy, simulate
from loadtests.workloads import (
    Segment,
    SegmentContent,
    WorkloadRequest,
)
from tests.support.small_library import SMALL_FLEET, small_library

_CONTENT = SegmentContent(seed=1)


def _req(index: int, doc: str, label: str = "hot") -> WorkloadRequest:
    segments = (Segment(doc, 160, "user", True), Segment(f"q{index}", 20, "user", False))
    return WorkloadRequest(index, segments, 8, label, doc, _CONTENT)


def test_each_miss_is_counted_once_under_its_cause():
    requests = [_req(0, "a"), _req(1, "a"), _req(2, "a"), _req(3, "b"), _req(4, "a"),
                _req(5, "b", "cold"), _req(6, "b")]
    chosen = {0: "r0", 1: "r0", 2: "r1", 3: "r1", 4: "r1", 5: "r0", 6: "r0"}
    cached = {0: 0, 1: 160, 2: 0, 3: 0, 4: 32, 5: 0, 6: 150}
    out = hot_misses(requests, chosen, cached, block_size=16)
    assert set(out) == set(CAUSES)
    # 0 and 3: first of a and b; 2: a moved to r1; 4: a on r1 again, evicted but 32
    # tokens; 5 is cold (but it takes b to r0, where 6 then hits within a block)
    assert out["first"] == {"requests": 2, "tokens": 320}
    assert out["moved"] == {"requests": 1, "tokens": 160}
    assert out["evicted"] == {"requests": 1, "tokens": 128}
    assert WorkloadIds().shared_len(requests[0]) == 160


def test_a_move_after_a_cold_request_of_the_same_key_counts_from_where_that_went():
    requests = [_req(0, "a"), _req(1, "a", "cold"), _req(2, "a")]
    chosen = {0: "r0", 1: "r1", 2: "r1"}
    cached = {0: 0, 1: 0, 2: 0}
    out = hot_misses(requests, chosen, cached, block_size=16)
    assert out["evicted"]["requests"] == 1 and out["moved"]["requests"] == 0


def test_a_bad_block_size_is_named():
    with pytest.raises(ValueError, match="block_size"):
        hot_misses([], {}, {}, block_size=0)


def test_the_simulator_reports_them_within_the_hot_prefill():
    requests, arrivals = small_library(800)
    fleet = SMALL_FLEET
    hot_docs = {r.affinity_key for r in requests if r.label == "hot"}
    rr = simulate(requests, arrivals, build_policy("round_robin"), fleet)
    pa = simulate(requests, arrivals, build_policy("prefix_affinity", prefix_tokens=256), fleet)
    for res in (rr, pa):
        # a fresh fleet holds nothing: every hot document's first request misses it whole
        assert res.hot_misses["first"]["requests"] == len(hot_docs)
        lost = sum(m["tokens"] for m in res.hot_misses.values())
        assert 0 < lost <= res.hot_prefill_tokens
    # round robin scatters each document over the fleet: its misses are moves; affinity
    # that never spilled kept every document on one replica: its misses are evictions
    assert rr.hot_misses["moved"]["tokens"] > rr.hot_misses["evicted"]["tokens"]
    assert pa.spills == 0
    assert pa.hot_misses["moved"]["requests"] == 0 < pa.hot_misses["evicted"]["requests"]
