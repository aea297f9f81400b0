"""A request every replica refused (``Routed``, ``Unrouted`` on each, then ``Finished``)
is let go at its end: before, its refusal (its ``RouteRequest``, the prompt's tokens) was
kept until newer refusals pushed it out."""

from __future__ import annotations

import gc
import random
import weakref
from collections.abc import Callable

import pytest

from policies.base import Finished, Policy, ReplicaView, Routed, RouteRequest, Unrouted
from policies.cost import Cost
from policies.prefix_affinity import PrefixAffinity

FLEET = [ReplicaView(rid, kv_capacity_tokens=20_000) for rid in ("a", "b")]


class _Request(RouteRequest):
    """A request that can be watched for collection (a slotted one cannot)."""


def _refused_everywhere(policy: Policy, seed: int) -> weakref.ref[RouteRequest]:
    rng = random.Random(seed)
    tokens = [rng.randrange(50_000) for _ in range(1000)]
    req = _Request(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=1.0)
    policy.choose(req, FLEET)
    for view in FLEET:
        policy.observe(Routed(req, view.id, FLEET))
        policy.observe(Unrouted(req, view.id))
    policy.observe(Finished(req, FLEET[-1].id, ok=False))
    return weakref.ref(req)


@pytest.mark.parametrize("make", [Cost, PrefixAffinity])
def test_a_request_every_replica_refused_is_let_go_at_its_end(
        make: Callable[[], Policy]) -> None:
    policy = make()
    gone = _refused_everywhere(policy, 1)
    # another request's decision and route: what a policy keeps of the last one decided
    # (its memo) is the new one's
    other = RouteRequest(tokens=[1, 2, 3], prompt_tokens=3, model="m", arrival_s=2.0)
    policy.choose(other, FLEET)
    policy.observe(Routed(other, "a", FLEET))
    policy.observe(Finished(other, "a", ok=True))
    gc.collect()
    assert gone() is None  # the bug: held as a refused try whose retry was to come
