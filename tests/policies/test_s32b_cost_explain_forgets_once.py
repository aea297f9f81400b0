"""cost's ``/admin/explain`` looks for the replicas unseen past the timeout once: before it
decides over its copy of the placement, and not again in that decision; what it shows is
what a decision at that time would show."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost


class Counting(Cost):
    """``Cost`` that counts its looks for unseen replicas."""

    def __init__(self) -> None:
        super().__init__()
        self.looks = 0

    def _forget_unseen(self, replicas: Sequence[ReplicaView], now: float) -> None:
        self.looks += 1
        super()._forget_unseen(replicas, now)


def request(seed: int, at: float | None) -> RouteRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(50_000) for _ in range(800)]
    return RouteRequest(tokens=ids, prompt_tokens=len(ids), model="m", arrival_s=at)


def placed() -> tuple[Counting, list[ReplicaView]]:
    """A policy with hot documents placed over four replicas."""
    policy = Counting()
    fleet = [ReplicaView(f"r{i}") for i in range(4)]
    at = 0.0
    for _ in range(5):
        for doc in range(6):
            at += 0.1
            req = request(doc, at)
            chosen = policy.choose(req, fleet).chosen
            policy.observe(Routed(req, chosen, fleet))
            policy.observe(Finished(req, chosen, ok=True))
    assert len(policy._placement), "no hot document was placed"
    return policy, fleet


@pytest.mark.parametrize(("before_s", "at_s"), [
    (None, 100.0),  # the decision refreshes the replicas' facts
    (100.0, 100.1),  # a decision refreshed them just before: not again
    (None, 700.0),  # past the timeout since the placement's home was last seen
])
def test_explain_looks_for_unseen_replicas_once(before_s: float | None, at_s: float) -> None:
    explained, fleet = placed()
    chose, _ = placed()
    home = next(r.id for r in fleet if explained._placement.tokens_on(r.id))
    rest = [r for r in fleet if r.id != home]
    if before_s is not None:
        for policy in (explained, chose):
            policy.choose(request(1, before_s), rest)
    explained.looks = 0
    shown = explained.explain(request(0, at_s), rest)
    assert explained.looks == 1
    assert shown.ranked == chose.choose(request(0, at_s), rest).ranked
    forgotten = at_s - 3.0 > 600.0  # (placed's last decision was at 3.0 s)
    for policy in (explained, chose):
        assert (policy._placement.tokens_on(home) == 0) is forgotten
        policy.check_integrity()


def test_explain_without_an_arrival_time_looks_for_none() -> None:
    policy, fleet = placed()
    policy.looks = 0
    policy.explain(request(0, None), fleet)
    assert policy.looks == 0
