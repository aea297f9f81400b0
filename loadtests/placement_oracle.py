"""``placement_oracle:H``: a clairvoyant reference placement for the contract workloads,
run by the simulator beside the real policies (``--policies cost,placement_oracle:6``).

It knows what no router can: each request's label and document, from the workload itself.
The hot documents are placed once, evenly, on the fleet's first ``H`` replicas (document
``i`` of the hot set on replica ``i mod H``) and each hot request goes to its document's replica,
whatever its queue; every cold request goes to the least loaded (queued prefill tokens) of
the other replicas. It learns nothing and never moves a document, so its misses are each
hot document's first request, the evictions its fixed homes' LRU caches make, and every
cold document's request.

It answers one question about a target: what the fleet's caches and load let a placement
reach when the hot set is known from the first request. With ``H`` too small the hot
replicas' caches overflow and evict hot documents; with ``H`` too large the others queue
the cold documents' prefill and make the tail. It is not a bound (a policy may move
documents as their load needs, or balance better), and it is not a router: it reads the
requests in arrival order, one decision and one ``Routed`` each (the simulator tries no
request twice), so it runs in one gateway copy only.
"""

from __future__ import annotations

from collections.abc import Sequence

from loadtests.workloads import WorkloadRequest
from policies.base import Decision, Policy, ReplicaView, Routed, RouteEvent, RouteRequest, healthy

NAME = "placement_oracle"


def oracle_replicas(name: str) -> int | None:
    """``H`` of a ``placement_oracle:H`` policy name; None for any other name; ValueError
    naming a malformed one."""
    base, colon, count = name.partition(":")
    if base != NAME:
        return None
    if not colon or not count.isdigit() or int(count) < 1:
        raise ValueError(f"{name!r}: expects {NAME}:H, H the replicas holding the hot set "
                         f"(1 or more)")
    return int(count)


class PlacementOracle(Policy):
    """Hot documents on fixed replicas, cold requests on the least loaded of the others,
    from each request's own label (see the module docstring)."""

    name = NAME
    reasons = ("hot_home", "cold_rest")
    tokens_needed = 0

    def __init__(self, requests: Sequence[WorkloadRequest], hot_replicas: int) -> None:
        if any(r.label not in ("hot", "cold") for r in requests):
            other = next(r.label for r in requests if r.label not in ("hot", "cold"))
            raise ValueError(f"{NAME} places the contract workloads' hot and cold "
                             f"documents; a request here is labelled {other!r}")
        self.hot_replicas = hot_replicas
        hot_docs = sorted({r.affinity_key for r in requests if r.label == "hot"},
                          key=lambda doc: (len(doc), doc))
        self._home = {doc: i % hot_replicas for i, doc in enumerate(hot_docs)}
        self._requests = requests
        self._next = 0  # the request the next decision is for (arrival order)

    def choose(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        ok = healthy(replicas)
        rest = [r for r in replicas[self.hot_replicas:] if r.healthy]
        if not rest:
            raise ValueError(f"{NAME}:{self.hot_replicas} needs more than "
                             f"{self.hot_replicas} replicas (some for the cold documents), "
                             f"got {len(replicas)} ({len(ok)} healthy)")
        if self._next >= len(self._requests):
            raise ValueError(f"{NAME} knows {len(self._requests)} requests; asked for more")
        known = self._requests[self._next]
        if known.label == "hot":
            target, reason = replicas[self._home[known.affinity_key]], "hot_home"
        else:
            target = min(rest, key=lambda r: r.queued_tokens)
            reason = "cold_rest"
        return Decision((target.id, *(r.id for r in ok if r.id != target.id)), reason)

    def observe(self, event: RouteEvent) -> None:
        if isinstance(event, Routed):
            self._next += 1
