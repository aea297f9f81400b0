"""``kvgate top``'s rates: differences of cumulative counters over a sliding window."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from gateway import top
from gateway.top_window import TopWindow


def snap(*reps: tuple[str, float | None, float | None, dict[str, int]]) -> dict[str, Any]:
    return {"replicas": [{"id": rid, "hit_tokens": hits, "query_tokens": queries,
                          "requests": sum(reasons.values()), "reasons": reasons}
                         for rid, hits, queries, reasons in reps]}


def test_rates_over_the_window() -> None:
    w = TopWindow(window_s=10)
    assert w.rates("a").requests_per_s is None
    w.add(0.0, snap(("a", 0, 0, {})))
    first = w.rates("a")
    assert first.requests_per_s is None and first.token_hit_rate is None
    w.add(5.0, snap(("a", 300, 1000, {"affinity": 8, "spill": 2})))
    r = w.rates("a")
    assert r.span_s == 5.0
    assert r.token_hit_rate == pytest.approx(0.3)
    assert r.requests_per_s == pytest.approx(2.0)
    assert r.reasons == {"affinity": 8, "spill": 2}
    # 20 s later only the last 10 s count: samples at 5 and 25 drop out of the left edge
    w.add(15.0, snap(("a", 900, 2000, {"affinity": 18, "spill": 2})))
    w.add(25.0, snap(("a", 1900, 3000, {"affinity": 28, "spill": 2})))
    r = w.rates("a")
    assert r.span_s == 10.0
    assert r.token_hit_rate == pytest.approx(1.0)
    assert r.requests_per_s == pytest.approx(1.0)
    assert r.reasons == {"affinity": 10}


def test_a_restarted_replica_starts_over_and_a_removed_one_is_forgotten() -> None:
    w = TopWindow(window_s=30)
    w.add(0.0, snap(("a", 500, 1000, {"affinity": 10}), ("b", None, None, {})))
    w.add(1.0, snap(("a", 10, 100, {"affinity": 11}), ("b", None, None, {"balance": 3})))
    a = w.rates("a")
    assert a.span_s == 0.0 and a.token_hit_rate is None  # counters went back: one sample
    b = w.rates("b")
    assert b.token_hit_rate is None  # the replica exports no counters
    assert b.requests_per_s == pytest.approx(3.0) and b.reasons == {"balance": 3}
    w.add(2.0, snap(("a", 60, 200, {"affinity": 12})))
    assert w.rates("a").token_hit_rate == pytest.approx(0.5)
    assert w.rates("b").requests_per_s is None


def test_the_hit_rate_starts_at_the_first_sample_with_counters() -> None:
    """A replica added (or a gateway started) just before top's first read has no
    scraped counters in it: the hit rate showed '-' until that sample left the window."""
    w = TopWindow(window_s=10)
    w.add(0.0, snap(("a", None, None, {})))
    w.add(1.0, snap(("a", 100, 1000, {"affinity": 1})))
    w.add(2.0, snap(("a", 400, 2000, {"affinity": 2})))
    r = w.rates("a")
    assert r.token_hit_rate == pytest.approx(0.3)
    assert r.span_s == 2.0 and r.requests_per_s == pytest.approx(1.0)


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_s"):
        TopWindow(0)


@pytest.mark.parametrize("flag", ["--window", "--interval"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "1e10", "0.01", "soon"])
def test_kvgate_top_refuses_a_window_or_interval_that_is_no_duration(
        flag: str, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="kvgate top")
    top.add_arguments(parser)
    with pytest.raises(SystemExit) as exited:  # before any read of the admin API
        parser.parse_args(["--token", "t", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: must be " in err and value in err and "Traceback" not in err
    assert parser.parse_args([flag, "86400"]).interval > 0
