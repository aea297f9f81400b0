"""Replicas holding far more requests than the rest of the fleet are tried after the others.

A policy weighs a replica's queued prefill (prompt tokens without a first byte) and, where
it has learned them, its decode slots. A replica whose requests stall or crawl after their
first byte (a hung accelerator behind a live HTTP server, a throttled one) shows neither,
so a policy keeps choosing it, and each new request waits there with the others until its
idle timeout: in a chaos run one such replica held 29 of 30 requests in flight while the
healthy ones idled. ``held_back`` counts the requests each healthy replica holds (this
gateway's in flight, and other senders' at the last scrape) and moves after the others
every ranked replica holding at least ``FACTOR`` x the fleet's median plus ``margin``
(the lower median: one outlier in a fleet of two or three does not raise it), keeping
the policy's order among those moved and among those kept. A replica a policy favours
for its cache keeps its place while the fleet is about as busy; where every ranked
replica is over the bound, the order is the policy's.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import ReplicaView

FACTOR = 2


def held_back(ranked: tuple[str, ...], views: Sequence[ReplicaView], margin: int
              ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``ranked`` with the replicas holding far more requests than the fleet's median
    moved after the others, and those moved (in their ranked order)."""
    held = {v.id: v.in_flight + v.others_in_flight for v in views if v.healthy}
    counts = list(held.values())
    if len(counts) < 2 or max(counts) < FACTOR * min(counts) + margin:
        return ranked, ()  # the common case: no replica far over the median
    counts.sort()
    bound = FACTOR * counts[(len(counts) - 1) // 2] + margin
    moved = tuple(rid for rid in ranked if held.get(rid, 0) >= bound)
    if not moved or len(moved) == len(ranked):
        return ranked, ()
    return tuple(rid for rid in ranked if held.get(rid, 0) < bound) + moved, moved
