"""A ``Routed`` cost does not admit (its replica refuses a prompt that long, or left) still
ends the try before it under the request's id: a pending try whose end was never told,
its request gone and its id taken by a new one, is not taken back by the new request's
refusal."""

from __future__ import annotations

import dataclasses
import random

from policies.base import ReplicaView, Routed, RouteRequest, Unrouted
from policies.cost import Cost

FLEET = [ReplicaView(rid, kv_capacity_tokens=8000) for rid in ("a", "b")]


def tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def request(body: list[int]) -> RouteRequest:
    return RouteRequest(tokens=body, prompt_tokens=len(body), model="m", arrival_s=0.0)


def _under_its_id(lost: RouteRequest, new: RouteRequest) -> RouteRequest:
    """``new`` under the id of ``lost``, a request whose end was never told: what a request
    made once ``lost`` was freed may be (CPython's id is the object's address, which a new
    object can take). Made here without waiting for the allocator: once the policy's
    counted requests let ``lost`` go, nothing of the policy holds ``lost`` itself (it
    keeps a pending try by its request's id), so ``lost`` becomes ``new`` in place."""
    for field in dataclasses.fields(new):
        object.__setattr__(lost, field.name, getattr(new, field.name))
    assert lost == new
    return lost


def test_a_try_not_admitted_ends_a_lost_try_under_its_id() -> None:
    policy = Cost()
    doc = tokens(1, 1000)
    policy.choose(request(doc), FLEET)  # learns the replicas' capacities
    lost = request(doc)
    policy.observe(Routed(lost, "a", FLEET))  # its end is never told
    assert policy.describe()["pending_tries"] == 1
    # the policy holds `lost` among its counted requests until it ends: let go here as
    # 16,384 newer requests would push it out (routing them all would take seconds), so
    # that `lost` can be freed and its id taken, and `new` is not a retry of it
    policy._counted.ended(lost)
    assert not len(policy._counted)
    # a request longer than "a" holds (refused there at once), under the lost one's id
    new = _under_its_id(lost, request(tokens(2, 12_000)))
    assert id(new) == id(lost)
    policy.observe(Routed(new, "a", FLEET))  # not admitted: too long for "a"
    assert policy.describe()["pending_tries"] == 0
    policy.observe(Unrouted(new, "a"))  # the bug: took back the lost try's admission
    assert policy.explain(request(doc), [FLEET[0]]).matched_tokens >= 900
    policy.check_integrity()
