"""The scratch set: the few replicas where a cost-routed fleet sends its rare prefixes.

Documents seen once churn every LRU cache they pass through. ``ScratchSet`` keeps them on
the first ``size`` healthy replicas on the ring walked from a fixed key, so the set is
stable under membership changes (about 1/R of it moves) and every gateway copy agrees on
it without talking. Its size follows the rare prefixes' prefill load::

    need = rare prefill tokens/s x seconds per token / scratch_utilization   (replicas)

between ``min_scratch`` and ``max_scratch_fraction`` of the fleet. Where the hot prefixes
placed need more of the fleet's caches than ``need`` leaves, the set runs hotter, up to
``max_scratch_utilization``. It grows a replica at a time, a sketch window of routed
requests apart, and shrinks with a quarter replica of hysteresis, so it does not flap at a
boundary. It shrinks only once traffic has flowed ``load_window_s`` since its last lull (no
request judged for a quarter of that): the loads it is sized by are rates over time (its
own, decayed over ``load_window_s``, and the replicas' scraped prefill rate, over the
gateway's ``scrape.hit_rate_window_s``: both 60 s by default), which read low while their
window still holds the lull. Under traffic sparser than that (a request every 15 s or
more) it keeps its size, which matters little at such a load, until traffic flows again.
After an idle hour a set of two shrank to one at the first requests and grew back only a
window later, moving the homes of the replica in between both times (offline,
``contracts-400``, LRU engines, seed 0, an hour's gap after 4,000 requests: the next 500
requests' hit 0.672, and p95 0.542 s in the 500 after them, against 0.702 and 0.424 s with
no shrink).

Not thread-safe; one owner (the policy) drives it.
"""

from __future__ import annotations

import math

from policies.cost_config import CostConfig
from policies.pace import DecayedRate
from policies.ring import stable_hash, walk

_SCRATCH_KEY = stable_hash(b"kvgate-scratch-set")
# requests judged hot or rare (routed after the sketch's first window) before the scratch
# set is first sized from their load: sized from the first few, it grew and shrank again,
# and moved the homes placed on the replicas in between each time
_JUDGED_MIN = 128
# a pause in judged requests this share of ``load_window_s`` long is a lull (see the module)
_LULL_SHARE = 0.25


class ScratchSet:
    """Which replicas form the scratch set, and how many; see the module docstring."""

    __slots__ = ("_active_since", "_cfg", "_grown_at", "_judged", "_judged_load", "_memo",
                 "_rare_load", "size")

    def __init__(self, config: CostConfig) -> None:
        self._cfg = config
        self.size = config.min_scratch
        self._grown_at = -(1 << 62)  # the routed count when the set last grew
        # uncached tokens routed once the sketch has seen a window (before, every key
        # looks rare), and of those for rare keys
        self._judged = 0
        self._judged_load = DecayedRate(config.load_window_s)
        self._rare_load = DecayedRate(config.load_window_s)
        self._active_since = -math.inf  # when traffic resumed after its last lull
        # the last members: (ring points, their owners as indexes of the views, size,
        # healthy flags, indexes); one membership in another order shares the points
        self._memo: tuple[list[int], list[int], int, list[bool], list[int],
                          frozenset[int]] | None = None

    def members(self, points: list[int], owners: list[int], distinct: int, up: list[bool],
                healthy_count: int, avoid: frozenset[int] = frozenset()) -> list[int]:
        """Indexes of the scratch set: the first ``size`` healthy replicas on the ring
        walked from a fixed key (never every healthy replica), passing over those in
        ``avoid`` (replicas on slower devices: a one-off prompt is prefilled whole, and
        pays a slow device's pace in full, where a home's prompts are mostly cached)
        while there are others."""
        size = min(self.size, healthy_count - 1)
        memo = self._memo
        if memo is not None and memo[0] is points and memo[1] is owners \
                and memo[2] == size and memo[3] == up and memo[5] == avoid:
            return memo[4]
        out: list[int] = []
        if size > 0:
            later: list[int] = []
            for i in walk(points, owners, distinct, _SCRATCH_KEY):
                if up[i]:
                    if i in avoid:
                        later.append(i)
                        continue
                    out.append(i)
                    if len(out) == size:
                        break
            out += later[:size - len(out)]
        self._memo = (points, owners, size, list(up), out, avoid)
        return out

    def judged(self, now: float, uncached: int, rare: bool, again: bool = False) -> None:
        """Count a request routed once the sketch could judge it: its uncached tokens,
        and whether its prefix was rare. ``again``: its retry after a replica refused it
        (``take_back``): its uncached tokens at the next replica, the request not again."""
        if not again:
            self._judged += 1
        last = self._judged_load.last
        if last is None or now - last > self._cfg.load_window_s * _LULL_SHARE:
            self._active_since = now
        self._judged_load.add(now, uncached)
        if rare:
            self._rare_load.add(now, uncached)

    def take_back(self, now: float, uncached: int, rare: bool) -> None:
        """Take back the uncached tokens ``judged`` counted at ``now`` for a try its replica
        refused before taking the prompt (the request stays counted)."""
        self._judged_load.take_back(now, uncached)
        if rare:
            self._rare_load.take_back(now, uncached)

    def resize(self, now: float, routed: int, window: int, fleet_prefill: float | None,
               pace_s: float, replicas: int, placed_tokens: int, mean_room: float) -> None:
        """``size`` from the rare prefill load in replicas (see the module docstring).
        ``routed``: requests routed so far; ``window``: the sketch's window;
        ``fleet_prefill``: the replicas' scraped prefill tokens/s, every gateway copy's
        (None when unknown); ``pace_s``: seconds per prefilled token; ``replicas``: the
        fleet's size; ``placed_tokens``: the hot prefixes' tokens placed on homes;
        ``mean_room``: the tokens a replica's cache holds for them, on average."""
        cfg = self._cfg
        every = self._judged_load.rate(now)
        if every <= 0 or self._judged < _JUDGED_MIN:
            # until the sketch has seen a window every prefix looks rare, and the first
            # few judged after it say little about the rare share
            return
        rare = self._rare_load.rate(now)
        if fleet_prefill is not None:
            # the replicas' own counters see every gateway copy's traffic: the rare share
            # of what this copy routed, times the fleet's prefill rate
            rare = rare / every * fleet_prefill
        replicas = max(1, replicas)
        limit = max(cfg.min_scratch, int(cfg.max_scratch_fraction * replicas))
        need = rare * pace_s / cfg.scratch_utilization
        # the hot prefixes placed need this many replicas' caches: a scratch set that
        # leaves fewer sheds hot hits, so it runs hotter (up to max_scratch_utilization)
        # (its own hysteresis: it shrinks once the hotter load is a quarter replica under
        # one replica less, so the set does not flap where that load crosses a whole one)
        hottest: float | None = None
        if mean_room > 0:
            spare = replicas - math.ceil(placed_tokens / mean_room)
            if need > spare:
                hottest = rare * pace_s / cfg.max_scratch_utilization
                need = max(float(spare), hottest)
        size = self.size
        settled = now - self._active_since >= cfg.load_window_s  # (see the module)
        if need > size:
            # one replica at a time, a sketch window of routed requests apart: early in a
            # run the rare load reads high (prefixes not yet counted hot, caches still
            # filling), and a set grown to it at once shrank again, moving the homes of
            # the replica in between both times
            if routed - self._grown_at < window:
                return
            self._grown_at = routed
            size += 1
        elif not settled:  # (a shrink waits: see the module)
            return
        elif hottest is not None:
            if hottest <= size - 1.25:
                size = max(spare, math.ceil(hottest))
        elif need < size - 1.25:
            size = math.ceil(need + 0.25)
        self.size = max(cfg.min_scratch, min(limit, size))
