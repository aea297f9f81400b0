"""The TTFT CDF on its log axis keeps the samples a log scale cannot show."""

from __future__ import annotations

import numpy as np

from loadtests.plots import CDF_FLOOR_S, cdf_points


def test_zero_ttft_samples_are_drawn_at_the_floor_and_counted() -> None:
    xs, frac, below = cdf_points([0.2, 0.0, 0.05, 0.0, 0.0004])
    assert below == 3
    assert xs.tolist() == [CDF_FLOOR_S, CDF_FLOOR_S, CDF_FLOOR_S, 0.05, 0.2]
    assert frac.tolist() == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert np.all(xs > 0)  # every point is drawn on a log axis

