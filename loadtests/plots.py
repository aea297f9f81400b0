"""PNG plots for simulator and load-test reports (matplotlib, headless Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# a log axis cannot show 0: TTFT samples below this are drawn at it (and counted in the
# axis label), so the CDF still starts from its true fraction instead of losing them
CDF_FLOOR_S = 0.001


def cdf_points(samples: Sequence[float] | np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The empirical CDF of ``samples`` for a log axis: sorted values (those below
    ``CDF_FLOOR_S`` raised to it), the fraction at or below each, and how many were
    raised."""
    values = np.sort(np.asarray(samples, dtype=float))
    frac = np.arange(1, len(values) + 1) / max(1, len(values))
    below = int(np.count_nonzero(values < CDF_FLOOR_S))
    return np.maximum(values, CDF_FLOOR_S), frac, below


def plot_policies(path: str | Path, results: Mapping[str, tuple[float, Sequence[float]]],
                  *, upper_bound: float | None = None, static_oracle: float | None = None,
                  title: str = "") -> Path:
    """Two panels: token hit rate per policy (bars; the simulator's ``upper_bound`` and
    ``static_oracle`` as lines, ``loadtests.oracle``) and the TTFT CDF.

    ``results`` maps a policy name to ``(token hit rate, TTFT samples in seconds)``; a load
    run's TTFT samples count from each request's due time and include lower bounds for
    requests unanswered at its end or due and never sent.
    """
    plt = _pyplot()
    names = list(results)
    fig, (ax_hit, ax_cdf) = plt.subplots(1, 2, figsize=(11, 4.2))
    rates = [results[n][0] for n in names]
    # a rate not measured (NaN: its engines counted no lookup) gets a bar of no height
    # that says so (bar_label leaves a NaN bar's label out)
    bars = ax_hit.bar(names, [0.0 if math.isnan(r) else r for r in rates],
                      color=[f"C{i}" for i in range(len(names))])
    ax_hit.bar_label(bars, labels=["not measured" if math.isnan(r) else f"{r:.2f}"
                                   for r in rates])
    if upper_bound is not None:
        ax_hit.axhline(upper_bound, color="black", linestyle="--", linewidth=1,
                       label=f"upper bound (unlimited cache) {upper_bound:.2f}")
    if static_oracle is not None:
        ax_hit.axhline(static_oracle, color="grey", linestyle=":", linewidth=1,
                       label=f"static oracle (fixed blocks, not a bound) {static_oracle:.2f}")
    if upper_bound is not None or static_oracle is not None:
        ax_hit.legend(loc="upper left", fontsize="small")
    # room above the bars for the lines' legend
    ax_hit.set_ylim(0, 1 if upper_bound is None and static_oracle is None else 1.25)
    ax_hit.set_yticks(np.linspace(0, 1, 6))
    ax_hit.set_ylabel("token hit rate (cached / prompt tokens)")
    ax_hit.tick_params(axis="x", rotation=15)
    floored = drawn = 0
    for i, name in enumerate(names):
        samples = np.asarray(results[name][1], dtype=float)
        if len(samples) == 0:
            continue
        drawn += 1
        p95 = float(np.percentile(samples, 95))
        xs, frac, below = cdf_points(samples)
        floored += below
        ax_cdf.plot(xs, frac, color=f"C{i}", label=f"{name} (p95 {p95:.2f} s)")
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("time to first token (s, log scale)" + (
        f"; {floored} under {CDF_FLOOR_S * 1000:g} ms drawn at it" if floored else ""))
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.axhline(0.95, color="grey", linewidth=0.5)
    if drawn:
        ax_cdf.legend(loc="lower right", fontsize="small")
    else:  # (a legend of nothing warns) every request failed or none was sent
        ax_cdf.text(0.5, 0.5, "no request was timed", ha="center", va="center",
                    transform=ax_cdf.transAxes)
    ax_cdf.grid(True, which="both", alpha=0.3)
    if title:
        fig.suptitle(title)
    return _save(plt, fig, path)


def plot_replica_load(path: str | Path, loads: Mapping[str, Sequence[float]],
                      *, ylabel: str = "prefill tokens computed", title: str = "") -> Path:
    """Grouped bars: one group per replica, one bar per policy."""
    plt = _pyplot()
    names = list(loads)
    width = 0.8 / max(1, len(names))
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for i, name in enumerate(names):
        values = list(loads[name])
        x = np.arange(len(values)) + i * width
        ax.bar(x, values, width, label=name, color=f"C{i}")
    n = max((len(v) for v in loads.values()), default=0)
    ax.set_xticks(np.arange(n) + width * (len(names) - 1) / 2, [f"r{i}" for i in range(n)])
    ax.set_ylabel(ylabel)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    return _save(plt, fig, path)


def _save(plt: Any, fig: Any, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
