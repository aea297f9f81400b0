"""A ``Routed`` cost does not admit (its replica refuses a prompt that long, or left) still
ends the try before it under the request's id: a pending try whose end was never told,
its request gone and its id taken by a new one, is not taken back by the new request's
refusal."""

from __future__ import annotations

import random

from policies.base import ReplicaView, Routed, RouteRequest, Unrouted
from policies.cost import Cost

FLEET = [ReplicaView(rid, kv_capacity_tokens=8000) for rid in ("a", "b")]


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(body: list[int]) -> RouteRequest:
    return RouteRequest(tokens=body, prompt_tokens=len(body), model="m", arrival_s=0.0)


def _sent(policy: Cost, body: list[int]) -> int:
    """The id of a request routed to "a" whose end is never told, let go."""
    lost = request(body)
    policy.observe(Routed(lost, "a", FLEET))
    return id(lost)


def test_a_try_not_admitted_ends_a_lost_try_under_its_id() -> None:
    policy = Cost()
    doc = tokens(1, 1000)
    policy.choose(request(doc), FLEET)  # learns the replicas' capacities
    lost_id = _sent(policy, doc)
    assert policy.describe()["pending_tries"] == 1
    # a request longer than "a" holds (refused there at once), under the lost one's id
    longer = tokens(2, 12_000)
    kept = []
    for _ in range(100_000):
        new = request(longer)
        if id(new) == lost_id:
            break
        kept.append(new)
    else:
        raise AssertionError("no new request took the id of the one let go")
    policy.observe(Routed(new, "a", FLEET))  # not admitted: too long for "a"
    assert policy.describe()["pending_tries"] == 0
    policy.observe(Unrouted(new, "a"))  # the bug: took back the lost try's admission
    assert policy.explain(request(doc), [FLEET[0]]).matched_tokens >= 900
    policy.check_integrity()
