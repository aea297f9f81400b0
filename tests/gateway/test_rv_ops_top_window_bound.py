"""``kvgate top``'s window holds a bounded number of samples per replica, however many
reads its ``--window`` spans (a day at ``--interval 0.05`` is 1.7 million reads), and its
rates stay those of the window's ends."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.top_window import TopWindow


def snap(at: float) -> dict[str, Any]:
    """Replica r0 served 3 requests/s and hit 40% of 100 queried tokens/s since t=0."""
    n = round(at * 10)  # tenths of a second, exact
    return {"replicas": [{"id": "r0", "hit_tokens": 4 * n, "query_tokens": 10 * n,
                          "requests": 3 * n // 10, "reasons": {"affinity": 3 * n // 10}}]}


def test_samples_are_bounded_and_rates_kept() -> None:
    window = TopWindow(window_s=3600.0)
    for tenth in range(20_000):  # 2,000 s of reads a tenth of a second apart
        window.add(tenth / 10, snap(tenth / 10))
        assert len(window._series["r0"]) <= 1024
    rates = window.rates("r0")
    assert rates.span_s == pytest.approx(1999.9)
    assert rates.requests_per_s == pytest.approx(3.0, rel=1e-3)
    assert rates.token_hit_rate == pytest.approx(0.4)
    assert rates.reasons == {"affinity": 5999}


def test_the_left_edge_moves_with_the_window() -> None:
    window = TopWindow(window_s=100.0)
    for tenth in range(5_000):  # 500 s: the window is the last 100 s, to a sample's gap
        window.add(tenth / 10, snap(tenth / 10))
    span = window.rates("r0").span_s
    assert 100.0 <= span <= 101.0
