import pytest

from loadtests.label_stats import label_token_hit_rates, ttft_tail
from loadtests.replica_prompts import WorkloadIds
from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import build_policy, poisson_arrivals, simulate
from loadtests.workloads import (
    ContractsSpec,
    Segment,
    SegmentContent,
    WorkloadRequest,
    generate,
)

_CONTENT = SegmentContent(seed=1)


def _req(index: int, doc: str, label: str) -> WorkloadRequest:
    segments = (Segment(doc, 100, "user", True), Segment(f"q{index}", 20, "user", False))
    return WorkloadRequest(index, segments, 8, label, doc, _CONTENT)


def test_each_label_counts_its_own_requests_tokens():
    requests = [_req(0, "a", "hot"), _req(1, "a", "hot"), _req(2, "b", "cold"),
                _req(3, "c", "cold")]
    cached = {0: 0, 1: 96, 2: 0, 3: 60}
    rates = label_token_hit_rates(requests, cached)
    assert list(rates) == ["hot", "cold"]
    assert rates == {"hot": pytest.approx(96 / 240), "cold": pytest.approx(60 / 240)}


def test_the_tail_is_counted_by_label_and_by_replica():
    requests = [_req(i, "a", "hot" if i % 4 else "cold") for i in range(20)]
    ttft = {i: 0.1 * i for i in range(20)}  # the slowest are the last indexes
    chosen = {i: "r1" if i >= 18 else "r0" for i in range(20)}
    tail = ttft_tail(requests, ttft, chosen, ["r0", "r1", "r2"], q=90)
    # the 90th percentile of 0.0 .. 1.9 is 1.71: requests 18 and 19
    assert tail["threshold_s"] == pytest.approx(1.71)
    assert tail["requests"] == 2
    assert tail["by_label"] == {"hot": 2}
    assert tail["by_replica"] == [0, 2, 0]
    with pytest.raises(ValueError, match="q must be in"):
        ttft_tail(requests, ttft, chosen, ["r0", "r1"], q=100)
    with pytest.raises(ValueError, match="replicas not in replica_ids"):
        ttft_tail(requests, ttft, chosen, ["r0"])
    assert ttft_tail([], {}, {}, ["r0"])["by_replica"] == [0]


def test_the_simulator_reports_them_consistently_with_its_totals():
    spec = ContractsSpec(num_docs=60, hot_docs=24, doc_tokens=400, seed=2)
    fleet = FleetSpec(replicas=4, kv_pool_gib=0.4, idle_kv_gib=0.24, max_num_seqs=4)
    requests = generate(spec, 600)
    arrivals = poisson_arrivals(len(requests), 20.0, 1)
    res = simulate(requests, arrivals, build_policy("cost"), fleet)
    prompts = WorkloadIds()
    by_label: dict[str, list[int]] = {}
    for req, cached in zip(requests, res.cached_tokens, strict=True):
        pair = by_label.setdefault(req.label, [0, 0])
        pair[0] += cached
        pair[1] += prompts.prompt_len(req)
    assert set(res.label_token_hit_rates) == {"hot", "cold"}
    for label, (hit, total) in by_label.items():
        assert res.label_token_hit_rates[label] == pytest.approx(hit / total)
    # hot documents come back, one-off ones rarely do
    assert res.label_token_hit_rates["hot"] > res.label_token_hit_rates["cold"]
    tail = res.ttft_tail
    assert tail["threshold_s"] == pytest.approx(res.ttft_p95_s)
    assert tail["requests"] == sum(t >= tail["threshold_s"] for t in res.ttft_s)
    assert sum(tail["by_replica"]) == sum(tail["by_label"].values()) == tail["requests"]
    assert len(tail["by_replica"]) == 4
    assert "label_token_hit_rates" in res.summary() and "ttft_tail" in res.summary()
