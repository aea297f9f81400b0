"""A bound on how unevenly a policy may spread requests in flight: a replica holding more
than ``factor`` x the least loaded healthy replica's requests in flight (per unit of
weight), plus ``extra``, is passed over while that least loaded one is under the bound.
SGLang's router has a rule of the same intent, judged over the whole fleet instead (its
most and least loaded workers: most - least > 64 and most > 1.5 x least sends every
request to the least loaded); judged per candidate, a loaded replica is left only by the
requests it would hold past the bound, not by all of them.

``cost`` weighs a replica's queue by the prefill it holds and the decode slots it was seen
to fill; neither says enough where a prompt's prefix sits on few replicas and the
engines' batches are full (a system prompt every request shares, a fresh gateway in front
of caches it has not seen fill, a new hot prefix): there its predicted wait stayed a few
tenths of a second while twenty requests queued on each holder and the rest of the fleet
stood idle. Requests in flight, which the gateway counts as they go, tell that at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.base import ReplicaView


def in_flight_load(r: ReplicaView) -> float:
    """The replica's requests in flight (this gateway's now, other senders' as last
    scraped) per unit of weight (inf at weight 0)."""
    return (r.in_flight + r.others_in_flight) / r.weight if r.weight > 0 else math.inf


def in_flight_loads(replicas: Sequence[ReplicaView]) -> list[float]:
    """``in_flight_load`` of each replica."""
    return [in_flight_load(r) for r in replicas]


def least_loaded(loads: Sequence[float], up: Sequence[bool], order: Sequence[int],
                 start: int) -> int:
    """The healthy replica of least load; ties to the first in ``order`` (positions,
    e.g. by id) counted from ``start``. -1 when none is healthy."""
    n = len(order)
    best, best_load = -1, math.inf
    for j in range(start, start + n):
        i = order[j if j < n else j - n]
        if up[i] and (best < 0 or loads[i] < best_load):
            best, best_load = i, loads[i]
    return best


def balance_bound(least: float, factor: float, extra: float) -> float:
    """The most requests in flight per unit of weight a replica may hold before it is
    passed over, with ``least`` at the least loaded one."""
    return factor * least + extra
