"""Where a policy loses its hot prefixes: each hot request's misses by cause.

A hot request *misses* when the replica recomputes part of its shared prefix (the leading
shared segments: the document, the system prompt): ``shared tokens - cached tokens`` of
it, counted when at least one block's worth. The cause is read off the request stream and
the replicas each request went to::

    first     the prefix's first request: nothing can hold it yet (compulsory)
    moved     sent elsewhere than the prefix's previous request (a spill, a new home, a
              scratch replica): the replica did not hold it, or held a stale copy
    evicted   sent where the prefix's previous request went, which has since evicted it
              (the cache is too small for what was sent there)

``moved`` is what routing decides; ``evicted`` is what it sends to each cache. The causes'
tokens add up to the hot requests' lost shared tokens, at most ``hot_prefill_tokens``
(which also counts the unshared questions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loadtests.replica_prompts import ReplicaPrompts, WorkloadIds
from loadtests.workloads import WorkloadRequest

CAUSES = ("first", "moved", "evicted")


def hot_misses(requests: Sequence[WorkloadRequest], chosen: Mapping[int, str],
               cached: Mapping[int, int], block_size: int,
               prompts: ReplicaPrompts | None = None) -> dict[str, dict[str, int]]:
    """Per cause (``CAUSES``): the hot requests that missed and the shared tokens they
    recomputed. ``chosen`` and ``cached`` map a request's index to the replica it was
    sent to and the tokens that replica found cached; ``prompts`` says how many tokens the
    shared segments take on the replicas (default: the workload's own ids)."""
    prompts = prompts or WorkloadIds()
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size!r}")
    out = {cause: {"requests": 0, "tokens": 0} for cause in CAUSES}
    last: dict[str, str] = {}  # affinity key -> the replica its previous request went to
    for req in sorted(requests, key=lambda r: r.index):
        replica = chosen[req.index]
        previous = last.get(req.affinity_key)
        last[req.affinity_key] = replica
        if req.label != "hot":
            continue
        lost = prompts.shared_len(req) - cached[req.index]
        if lost < block_size:
            continue
        cause = "first" if previous is None else "evicted" if previous == replica else "moved"
        out[cause]["requests"] += 1
        out[cause]["tokens"] += lost
    return out
