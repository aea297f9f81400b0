"""``--pause N:S`` for the offline simulator: after the Nth request, S seconds with no
arrivals (a lull, as a night's), then the same arrivals again; and how the requests right
after a change fared (``after_pause`` in the JSON, and ``after_slowdown`` for
``--slowdown-after``), where what a policy learned may be stale."""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

AFTER = 1000  # requests after the pause that ``after_pause`` covers


class Pause(NamedTuple):
    after: int  # requests before the lull
    seconds: float


def pause(text: str) -> Pause:
    """``N:S``: N >= 1 requests, then S >= 0 seconds without arrivals (0: none, for the
    same window's figures without a lull)."""
    head, sep, tail = text.partition(":")
    try:
        after, seconds = int(head), float(tail)
    except ValueError:
        after, seconds = 0, math.nan
    if not sep or after < 1 or not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(
            f"must be N:S, N >= 1 requests then S >= 0 seconds without arrivals, got {text!r}")
    return Pause(after, seconds)


def paused(arrivals: np.ndarray, lull: Pause | None) -> np.ndarray:
    """``arrivals`` with every one after the first ``lull.after`` moved ``lull.seconds``
    later; ValueError where there are not more requests than that."""
    if lull is None:
        return arrivals
    if lull.after >= len(arrivals):
        raise ValueError(f"--pause after {lull.after} requests needs more than that, got "
                         f"{len(arrivals)}")
    out = arrivals.copy()
    out[lull.after:] += lull.seconds
    return out


def figures_after(start: int, prompt_tokens: Sequence[int], cached_tokens: Sequence[int],
                  ttft_s: Sequence[float]) -> dict[str, float | int]:
    """The ``AFTER`` requests from the ``start``th on (fewer where the run ends first; a
    lull's, or a change's, ``--slowdown-after``): their token hit rate (cached over prompt
    tokens, in the replicas' tokens) and p95 time to first token."""
    window = slice(start, start + AFTER)
    prompts, ttft = sum(prompt_tokens[window]), list(ttft_s[window])
    return {"requests": len(ttft),
            "token_hit_rate": sum(cached_tokens[window]) / prompts if prompts else 0.0,
            "ttft_p95_s": float(np.percentile(ttft, 95))}
