"""A route another gateway copy or worker made (``Routed(revocable=False)``) stands as it
comes: no ``Unrouted`` or ``Finished`` follows it here, so a policy keeps nothing pending
for it, and it never pushes out the pending tries this copy sent, whose refusal is still to
come."""

from __future__ import annotations

import random

from policies.base import ReplicaView, Routed, RouteRequest, Unrouted
from policies.cost import Cost
from policies.radix import Radix
from policies.ring import token_bytes

FLEET = [ReplicaView(rid, kv_capacity_tokens=1_000_000) for rid in ("a", "b")]
OTHERS = 4200  # routes told by other copies: more than the pending tries kept (4096)


def request(seed: int, n: int) -> RouteRequest:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(n)]
    return RouteRequest(tokens=tokens, prompt_tokens=n, model="m", arrival_s=0.0)


def told(seed: int) -> RouteRequest:  # a short prompt another copy routed
    return request(seed, 16)


def test_cost_takes_back_its_own_try_after_many_routes_told_by_others() -> None:
    policy = Cost()
    mine = request(1, 1000)
    policy.observe(Routed(mine, "a", FLEET))
    for seed in range(OTHERS):
        policy.observe(Routed(told(10 + seed), "b", revocable=False))
    assert policy.describe()["pending_tries"] == 1  # the bug: every told route pending
    policy.observe(Unrouted(mine, "a"))  # the bug: settled, pushed out by those
    chosen = policy.explain(request(1, 1000), [FLEET[0]])
    assert chosen.matched_tokens == 0
    assert policy.describe()["model_tokens"]["a"] == 0  # type: ignore[index]
    policy.check_integrity()


def test_a_route_told_by_others_stands_in_cost() -> None:
    policy = Cost()
    theirs = request(2, 1000)
    policy.observe(Routed(theirs, "a", FLEET, revocable=False))
    assert policy.describe()["pending_tries"] == 0
    policy.observe(Unrouted(theirs, "a"))  # (never told: a request of another copy)
    assert policy.explain(request(2, 1000), [FLEET[0]]).matched_tokens >= 900


def test_radix_takes_back_its_own_try_after_many_routes_told_by_others() -> None:
    policy = Radix()
    mine = request(3, 1000)
    data = bytes(token_bytes(mine.tokens))
    policy.observe(Routed(mine, "a", FLEET))
    for seed in range(OTHERS):
        policy.observe(Routed(told(10 + seed), "b", revocable=False))
    policy.observe(Unrouted(mine, "a"))
    assert "a" not in policy.tree.match(("m", None), data)
    theirs = request(4, 500)
    policy.observe(Routed(theirs, "a", FLEET, revocable=False))
    policy.observe(Unrouted(theirs, "a"))
    assert policy.tree.match(("m", None), bytes(token_bytes(theirs.tokens))) == {"a": 500}
    policy.check_integrity()
