"""Where a policy's hits and slowest requests fall, by workload label and by replica.

    label_token_hit_rates   per label (contracts: ``hot`` and ``cold`` documents), the
                            tokens the replicas found cached / the prompt tokens
    ttft_tail               the requests whose time to first token is at or above the
                            run's 95th percentile: how many per label and per replica

Both say *why* a total moved: a policy that keeps one-off documents on a few scratch
replicas earns fewer of their rare repeats than one that hashes each to a home of its own,
and one-off documents queued behind each other on one busy scratch replica fill the tail.
Token counts are the replicas' (``prompts``: the workload's own ids by default).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loadtests.replica_prompts import ReplicaPrompts, WorkloadIds
from loadtests.workloads import WorkloadRequest


def label_token_hit_rates(requests: Sequence[WorkloadRequest], cached: Mapping[int, int],
                          prompts: ReplicaPrompts | None = None) -> dict[str, float]:
    """Per label: cached tokens / prompt tokens of its requests (``cached`` by request
    index), labels in the order they first come."""
    prompts = prompts or WorkloadIds()
    total: Counter[str] = Counter()
    hit: Counter[str] = Counter()
    for req in requests:
        total[req.label] += prompts.prompt_len(req)
        hit[req.label] += cached[req.index]
    return {label: hit[label] / n if n else 0.0 for label, n in total.items()}


def ttft_tail(requests: Sequence[WorkloadRequest], ttft: Mapping[int, float],
              chosen: Mapping[int, str], replica_ids: Sequence[str], q: float = 95.0
              ) -> dict[str, Any]:
    """The requests at or above the ``q``-th percentile of time to first token:
    ``threshold_s``, ``requests``, and their counts ``by_label`` and ``by_replica`` (in
    ``replica_ids``' order)."""
    if not 0.0 < q < 100.0:
        raise ValueError(f"q must be in (0, 100), got {q!r}")
    if not requests:
        return {"threshold_s": None, "requests": 0, "by_label": {},
                "by_replica": [0] * len(replica_ids)}
    threshold = float(np.percentile([ttft[r.index] for r in requests], q))
    slow = [r for r in requests if ttft[r.index] >= threshold]
    where = Counter(chosen[r.index] for r in slow)
    unknown = set(where) - set(replica_ids)
    if unknown:
        raise ValueError(f"requests went to replicas not in replica_ids: {sorted(unknown)}")
    return {"threshold_s": threshold, "requests": len(slow),
            "by_label": dict(Counter(r.label for r in slow)),
            "by_replica": [where.get(rid, 0) for rid in replica_ids]}
