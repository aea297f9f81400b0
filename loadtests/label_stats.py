"""Where a policy's hits and slowest requests fall, by workload label and by replica.

    label_token_hit_rates   per label (contracts: ``hot`` and ``cold`` documents), the
                            tokens the replicas found cached / the prompt tokens
    ttft_tail               the requests whose time to first token is at or above the
                            run's 95th percentile: how many per label and per replica

Both say *why* a total moved: a policy that keeps one-off documents on a few scratch
replicas earns fewer of their rare repeats than one that hashes each to a home of its own,
and one-off documents queued behind each other on one busy scratch replica fill the tail.
The simulator and ``loadtests.run`` report both from their requests (token counts are the
replicas').
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def label_token_hit_rates(rows: Iterable[tuple[str, int, int]]) -> dict[str, float]:
    """Per label, over ``(label, prompt tokens, cached tokens)`` rows (one a request):
    cached / prompt tokens, labels in the order they first come."""
    total: Counter[str] = Counter()
    hit: Counter[str] = Counter()
    for label, prompt, cached in rows:
        total[label] += prompt
        hit[label] += cached
    return {label: hit[label] / n if n else 0.0 for label, n in total.items()}


def ttft_tail(rows: Sequence[tuple[str, str | None, float]], replica_ids: Sequence[str],
              q: float = 95.0) -> dict[str, Any]:
    """Over ``(label, replica, time to first token)`` rows (one a request), those at or
    above the ``q``-th percentile of the times: ``threshold_s``, ``requests``, and their
    counts ``by_label`` and ``by_replica`` (in ``replica_ids``' order). A row whose replica
    is None (a router that does not say where it sent a request) counts in ``requests``
    and ``by_label``, and in ``unattributed`` instead of ``by_replica``."""
    if not 0.0 < q < 100.0:
        raise ValueError(f"q must be in (0, 100), got {q!r}")
    if not rows:
        return {"threshold_s": None, "requests": 0, "by_label": {},
                "by_replica": [0] * len(replica_ids), "unattributed": 0}
    threshold = float(np.percentile([ttft for _, _, ttft in rows], q))
    slow = [(label, replica) for label, replica, ttft in rows if ttft >= threshold]
    where = Counter(replica for _, replica in slow if replica is not None)
    unknown = set(where) - set(replica_ids)
    if unknown:
        raise ValueError(f"requests went to replicas not in replica_ids: {sorted(unknown)}")
    return {"threshold_s": threshold, "requests": len(slow),
            "by_label": dict(Counter(label for label, _ in slow)),
            "by_replica": [where.get(rid, 0) for rid in replica_ids],
            "unattributed": sum(1 for _, replica in slow if replica is None)}
