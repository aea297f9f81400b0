import pytest

from loadtests.label_stats import label_token_hit_rates, ttft_tail
from loadtests.replica_prompts import WorkloadIds
from loadtests.simulate import build_policy, simulate
from tests.support.small_library import SMALL_FLEET, small_library


def test_each_label_counts_its_own_requests_tokens():
    rows = [("hot", 120, 0), ("hot", 120, 96), ("cold", 120, 0), ("cold", 120, 60),
            ("chat", 0, 0)]
    rates = label_token_hit_rates(rows)
    assert list(rates) == ["hot", "cold", "chat"]
    assert rates == {"hot": pytest.approx(96 / 240), "cold": pytest.approx(60 / 240),
                     "chat": 0.0}


def test_the_tail_is_counted_by_label_and_by_replica():
    # the slowest are the last: 0.0 .. 1.9 s
    rows = [("hot" if i % 4 else "cold", "r1" if i >= 18 else "r0", 0.1 * i)
            for i in range(20)]
    tail = ttft_tail(rows, ["r0", "r1", "r2"], q=90)
    # the 90th percentile of 0.0 .. 1.9 is 1.71: the last two requests
    assert tail["threshold_s"] == pytest.approx(1.71)
    assert tail["requests"] == 2
    assert tail["by_label"] == {"hot": 2}
    assert tail["by_replica"] == [0, 2, 0]
    with pytest.raises(ValueError, match="q must be in"):
        ttft_tail(rows, ["r0", "r1"], q=100)
    with pytest.raises(ValueError, match="replicas not in replica_ids"):
        ttft_tail(rows, ["r0"])
    assert ttft_tail([], ["r0"])["by_replica"] == [0]
    assert tail["unattributed"] == 0


def test_requests_a_router_did_not_attribute_count_in_the_tail_but_not_by_replica():
    rows = [("hot", None, 0.1 * i) for i in range(19)] + [("cold", "r1", 5.0)]
    tail = ttft_tail(rows, ["r0", "r1"], q=90)
    assert tail["requests"] == 2  # 1.8 s (unattributed) and 5.0 s (r1)
    assert tail["by_label"] == {"hot": 1, "cold": 1}
    assert tail["by_replica"] == [0, 1]
    assert tail["unattributed"] == 1


def test_the_simulator_reports_them_consistently_with_its_totals():
    requests, arrivals = small_library(600)
    res = simulate(requests, arrivals, build_policy("cost"), SMALL_FLEET)
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
