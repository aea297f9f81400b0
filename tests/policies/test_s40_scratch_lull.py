"""The scratch set does not shrink on the loads read right after a lull: they are rates
over a window that still holds the idle time (the replicas' scraped prefill rate over 60 s,
the decayed loads), and read low until traffic has flowed a window again. A load that
stays low shrinks it once that window has passed."""

from __future__ import annotations

from policies.cost_config import CostConfig
from policies.scratch_set import ScratchSet

PACE_S = 1e-3  # seconds per prefilled token
WINDOW_S = 60.0  # the scraped prefill rate's window (``scrape.hit_rate_window_s``)


class Traffic:
    """A second's rare and hot uncached tokens, judged and the set resized, as ``Cost``
    drives it; the replicas' scraped prefill rate is the rate over the last ``WINDOW_S``
    of what was sent (idle seconds count as none)."""

    def __init__(self) -> None:
        self.scratch = ScratchSet(CostConfig(min_scratch=1, scratch_utilization=0.5,
                                             max_scratch_fraction=0.5))
        self.routed = 0
        self.sent: list[tuple[float, int]] = []

    def second(self, now: float, rare: int, hot: int) -> None:
        for tokens, is_rare in ((rare, True), (hot, False)):
            self.scratch.judged(now, tokens, is_rare)
            self.sent.append((now, tokens))
            self.routed += 1
            scraped = sum(t for at, t in self.sent if now - at < WINDOW_S) / WINDOW_S
            self.scratch.resize(now, self.routed, 16, scraped, PACE_S, 8, 0, 0.0)


def _warm(traffic: Traffic) -> float:
    """1.6 scratch replicas' load of rare prefixes (800 tokens/s at 50%) for 300 s."""
    for s in range(300):
        traffic.second(float(s), 800, 1200)
    assert traffic.scratch.size == 2
    return 300.0


def test_the_same_load_after_an_idle_hour_keeps_the_set() -> None:
    traffic = Traffic()
    at = _warm(traffic) + 3600.0
    for s in range(200):
        traffic.second(at + s, 800, 1200)
        assert traffic.scratch.size == 2, s


def test_a_load_that_stays_low_after_a_lull_shrinks_the_set_a_window_later() -> None:
    traffic = Traffic()
    at = _warm(traffic) + 3600.0
    sizes = []
    for s in range(200):
        traffic.second(at + s, 200, 1800)  # 0.4 replicas of rare load
        sizes.append(traffic.scratch.size)
    assert sizes[:59] == [2] * 59 and sizes[-1] == 1, sizes


def test_a_load_that_falls_without_a_lull_shrinks_the_set_at_once() -> None:
    traffic = Traffic()
    at = _warm(traffic)
    traffic.sent.clear()  # (the scraped window read as the new rate at once)
    traffic.second(at, 50, 1950)
    assert traffic.scratch.size == 1
