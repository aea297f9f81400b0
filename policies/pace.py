"""How fast the fleet prefills, learned from what the gateway sees.

* ``DecayedRate``: tokens per second over an exponentially decayed window, on the
  caller's clock (the gateway's monotonic seconds, the simulator's virtual ones).
* ``PrefillPace``: seconds per prompt token a replica spends prefilling, from finished
  requests' time to first token over the tokens they did not find cached. Queueing only
  ever adds to that ratio, so a low percentile of recent ratios estimates the pace of an
  idle replica; until enough samples arrive the configured prior stands.
"""

from __future__ import annotations

import math
from collections import deque


class DecayedRate:
    """Σ tokens x exp(-(now - t) / tau) / tau: a rate in tokens per second. Before ``tau``
    has passed since the first tokens, the sum is divided by the share of the window seen
    so far (1 - exp(-elapsed / tau)), so a steady rate reads as itself from the start."""

    __slots__ = ("_acc", "_first", "_last", "tau_s")

    def __init__(self, tau_s: float) -> None:
        if tau_s <= 0:
            raise ValueError(f"tau_s must be > 0, got {tau_s!r}")
        self.tau_s = tau_s
        self._acc = 0.0
        self._first: float | None = None
        self._last: float | None = None

    def add(self, now: float, tokens: float) -> None:
        if self._last is not None and now > self._last:
            self._acc *= math.exp((self._last - now) / self.tau_s)
        if self._last is None or now > self._last:
            self._last = now
        if self._first is None:
            self._first = now
        self._acc += tokens

    def take_back(self, at: float, tokens: float) -> None:
        """Take back ``tokens`` added at ``at`` (a try its replica refused): what is left of
        them, decayed since to the last add."""
        if self._last is not None:
            self.add(at, -tokens * math.exp(min(0.0, at - self._last) / self.tau_s))

    @property
    def last(self) -> float | None:
        """When tokens were last added (None before any)."""
        return self._last

    def rate(self, now: float) -> float:
        if self._last is None or self._first is None:
            return 0.0
        decay = math.exp(min(0.0, self._last - now) / self.tau_s)
        # the share of the window seen; the first add's own second counts as seen
        seen = -math.expm1(-max(1.0, now - self._first) / self.tau_s)
        return self._acc * decay / self.tau_s / seen


class PrefillPace:
    """Seconds per uncached prompt token (see the module docstring)."""

    __slots__ = ("_fresh", "_samples", "min_tokens", "percentile", "prior_s", "value_s")

    def __init__(self, prior_s: float, window: int = 256, percentile: float = 0.2,
                 min_tokens: int = 256) -> None:
        if prior_s <= 0:
            raise ValueError(f"prior_s must be > 0, got {prior_s!r}")
        self.prior_s = prior_s
        self.value_s = prior_s
        self.percentile = percentile
        self.min_tokens = min_tokens
        self._samples: deque[float] = deque(maxlen=window)
        self._fresh = 0

    def observe(self, ttft_s: float, uncached_tokens: int) -> None:
        """One finished request: its first token after ``ttft_s`` with ``uncached_tokens``
        to prefill (requests with too little to prefill say little and are skipped)."""
        if uncached_tokens < self.min_tokens or not ttft_s > 0:
            return
        self._samples.append(ttft_s / uncached_tokens)
        self._fresh += 1
        if self._fresh >= 32 or len(self._samples) == 32:
            self._fresh = 0
            ordered = sorted(self._samples)
            self.value_s = ordered[int(self.percentile * (len(ordered) - 1))]

    @property
    def samples(self) -> int:
        return len(self._samples)
