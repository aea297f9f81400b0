import pytest

from loadtests.engine_counters import deltas, parse_counters

TEXT = """\
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="a"} 1000.0
vllm:prefix_cache_queries_total{model_name="b"} 500.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="a"} 600.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a"} 3.0
"""


def test_counters_are_summed_over_label_sets_and_others_ignored():
    c = parse_counters(TEXT)
    assert c["queries"] == 1500 and c["hits"] == 600
    assert c["prompt_tokens"] == 0 and "running" not in c


def test_fleet_hit_rate_is_taken_over_deltas():
    before = [parse_counters(TEXT), parse_counters(TEXT)]
    after = [dict(before[0], queries=2500.0, hits=1400.0), dict(before[1], queries=2500.0)]
    d = deltas(before, after)
    assert d.total("queries") == 2000 and d.total("hits") == 800
    assert d.token_hit_rate == pytest.approx(0.4)
    assert d.prefill_tokens == 1200
    with pytest.raises(ValueError, match="scrapes"):
        deltas(before, after[:1])


def test_a_replica_whose_counters_went_back_counts_what_it_counted_since_its_restart():
    before = [parse_counters(TEXT), parse_counters(TEXT)]
    # the second restarted during the run: 300 tokens looked up since, 100 found
    after = [dict(before[0], queries=2500.0, hits=1400.0),
             dict(before[1], queries=300.0, hits=100.0)]
    d = deltas(before, after)
    assert d.restarted == (1,)
    assert d.per_replica[1]["queries"] == 300 and d.per_replica[1]["hits"] == 100
    assert d.total("queries") == 1300 and d.total("hits") == 900
    assert d.token_hit_rate == pytest.approx(900 / 1300)
    assert deltas(before, before).restarted == ()
