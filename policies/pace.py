"""How fast the fleet prefills, learned from what the gateway sees.

* ``DecayedRate``: tokens per second over an exponentially decayed window, on the
  caller's clock (the gateway's monotonic seconds, the simulator's virtual ones).
* ``PrefillPace``: seconds per prompt token a replica spends prefilling, from finished
  requests' time to first token over the tokens they did not find cached. Queueing only
  ever adds to that ratio, so a low percentile of recent ratios estimates the pace of an
  idle replica; until enough samples arrive the configured prior stands.
* ``ReplicaSlowdown``: each replica's own ``PrefillPace`` against the fleet's, read as how
  many times slower its device is (another generation's, a throttled one), where that is
  clearly so.
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


MAX_SLOWDOWN = 8.0


# samples a replica's own pace is taken over (the fleet's: 256): a replica that turns
# slow mid-run is judged so once about 52 of them came slow (the low percentile past them),
# where over 256 it took about 205. Offline (contracts-400, LRU engines, 8,000 requests,
# r4-r7 at half speed from the 3,000th, seeds 0 / 1) p95 TTFT 0.837 / 0.817 s -> 0.731 /
# 0.717 s; r5 at a third, p99 2.003 / 1.929 s -> 1.305 / 1.296 s; fleets slow from the
# start, and equal ones, the same to the last digit. 32 was quicker still, but took a
# replica of an equal fleet for slow once (chat-apps, seed 1)
REPLICA_WINDOW = 64


class ReplicaSlowdown:
    """How many times slower than the fleet's pace each replica prefills, learned from its
    own finished requests (a ``PrefillPace`` each, over the same samples as the fleet's,
    the last ``REPLICA_WINDOW`` of them):
    1.0 until it has ``min_samples``, and wherever its pace is under ``ratio`` times the
    fleet's (a busy replica's samples carry some queueing, which the low percentile mostly
    leaves out; a small difference is noise, and weights say the rest); else that ratio,
    ``MAX_SLOWDOWN`` at most, in ``slow``'s dict (the slow ones only; a lookup where a
    decision reads it): the ratios are worked out when a pace moves (every 32 samples of a
    replica or of the fleet)."""

    __slots__ = ("_factors", "_fleet_s", "_paces", "min_samples", "prior_s", "ratio")

    def __init__(self, prior_s: float, ratio: float, min_samples: int = 32) -> None:
        if not ratio >= 1.0:
            raise ValueError(f"ratio must be >= 1, got {ratio!r}")
        self.prior_s = prior_s
        self.ratio = ratio
        self.min_samples = min_samples
        self._paces: dict[str, PrefillPace] = {}
        self._factors: dict[str, float] = {}  # the slow replicas only
        self._fleet_s = prior_s

    def observe(self, replica: str, ttft_s: float, uncached_tokens: int,
                fleet: PrefillPace) -> None:
        """One finished request of ``replica`` (after ``fleet`` observed it too)."""
        pace = self._paces.get(replica)
        if pace is None:
            pace = self._paces[replica] = PrefillPace(self.prior_s, REPLICA_WINDOW)
        before = pace.value_s
        pace.observe(ttft_s, uncached_tokens)
        if fleet.value_s != self._fleet_s:
            self._fleet_s = fleet.value_s
            for rid in self._paces:
                self._judge(rid)
        elif pace.value_s != before:
            self._judge(replica)

    def _judge(self, replica: str) -> None:
        pace = self._paces[replica]
        factor = pace.value_s / self._fleet_s if pace.samples >= self.min_samples else 1.0
        if factor >= self.ratio:
            self._factors[replica] = min(factor, MAX_SLOWDOWN)
        else:
            self._factors.pop(replica, None)

    def slow(self) -> dict[str, float]:
        """The replicas found slow, with their slowdowns (the live dict: read it only)."""
        return self._factors

    def forget(self, replica: str) -> None:
        """Keep nothing of ``replica`` (it left, or restarted: perhaps on another device)."""
        self._paces.pop(replica, None)
        self._factors.pop(replica, None)
