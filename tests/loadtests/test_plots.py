"""The TTFT CDF on its log axis keeps the samples a log scale cannot show."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from loadtests import plots
from loadtests.plots import CDF_FLOOR_S, cdf_points, plot_policies


def test_zero_ttft_samples_are_drawn_at_the_floor_and_counted() -> None:
    xs, frac, below = cdf_points([0.2, 0.0, 0.05, 0.0, 0.0004])
    assert below == 3
    assert xs.tolist() == [CDF_FLOOR_S, CDF_FLOOR_S, CDF_FLOOR_S, 0.05, 0.2]
    assert frac.tolist() == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert np.all(xs > 0)  # every point is drawn on a log axis



def test_a_run_with_no_request_timed_is_plotted(tmp_path: Path) -> None:
    # every request failed: no TTFT sample, and no rate measured (NaN, as the report
    # passes a null one); a legend of nothing used to warn (an error under pytest)
    out = plot_policies(tmp_path / "p.png", {"round_robin": (float("nan"), []),
                                             "cost": (float("nan"), [])})
    assert out.stat().st_size > 0


def test_a_rate_not_measured_is_labelled_so(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    drawn: list[Any] = []
    save = plots._save

    def keep(plt: Any, fig: Any, path: str | Path) -> Path:
        drawn.append([t.get_text() for t in fig.axes[0].texts])  # the bars' labels
        return save(plt, fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    plot_policies(tmp_path / "p.png", {"round_robin": (float("nan"), [0.2]),
                                       "cost": (0.61, [0.1])})
    assert drawn == [["not measured", "0.61"]]
