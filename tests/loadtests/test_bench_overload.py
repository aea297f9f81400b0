import pytest

from loadtests.bench_overload import summarize


def test_latency_percentiles_are_interpolated_between_ranks():
    # ten answers of 1..10 s, two refusals, a timeout
    results = [("200", float(s)) for s in range(10, 0, -1)]
    results += [("429", 0.25), ("429", 0.5), ("timeout", 30.0)]
    out = summarize(results, 30.0)
    assert out["ok_latency_s"] == {"p50": 5.5, "p95": pytest.approx(9.55), "max": 10.0}
    assert out["refusal_latency_s"] == {"p50": pytest.approx(0.375),
                                        "p99": pytest.approx(0.4975, abs=1e-3)}
    assert (out["sent"], out["ok"], out["refused_429"], out["other"]) == (13, 10, 2,
                                                                          {"timeout": 1})
    assert out["answered_within_timeout_share"] == pytest.approx(10 / 11, abs=1e-4)
    empty = summarize([], 30.0)
    assert empty["ok_latency_s"] == {"p50": None, "p95": None, "max": None}
