"""What ``index_matches`` remembers of the prompts sent: the prefix keys sent to a replica
within the grace (their blocks may not be stored yet), and no more: a key past the grace
is forgotten, with or without replicas that publish KV events."""

import math
import random

import pytest

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.index_matches import IndexMatches
from policies.kv_index import KVIndex


def _request(seed: int, at: float) -> RouteRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(50_000) for _ in range(400)]
    return RouteRequest(tokens=ids, prompt_tokens=len(ids), model="m", arrival_s=at)


def test_keys_past_the_grace_are_forgotten_where_no_replica_publishes_events() -> None:
    policy = Cost()  # kv_events on, but no replica publishes any
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    for k in range(600):  # a distinct prompt every 0.5 s: 10 within a 5 s grace
        request = _request(k, at=k * 0.5)
        policy.observe(Routed(request, policy.choose(request, fleet).chosen, fleet))
    kept = sum(len(keys) for keys in policy._exact._sending.values())
    assert 0 < kept <= 2 * 11  # each replica: its sends in the grace before its last


def test_a_key_within_the_grace_is_still_sending_and_a_refusal_puts_it_back() -> None:
    exact, kv = IndexMatches(5.0), KVIndex(16)
    exact.routed(kv, _request(1, at=0.0), "r0", key=7)
    exact.routed(kv, _request(2, at=3.0), "r0", key=7)
    exact.routed(kv, _request(3, at=4.0), "r0", key=8)
    assert exact._sending_now("r0", 7, 7.0) and exact._sending_now("r0", 8, 8.5)
    exact.unrouted("r0", 7, 3.0)  # the send at 3.0 was refused: the one at 0.0 counts
    assert not exact._sending_now("r0", 7, 7.0)
    exact.routed(kv, _request(4, at=20.0), "r0", key=9)  # the others are past the grace
    assert list(exact._sending["r0"]) == [9]
    assert not exact._sending_now("r0", 8, 20.0)


@pytest.mark.parametrize("grace_s", [0.0, -1.0, math.nan])
def test_a_grace_that_is_no_positive_time_is_refused_naming_it(grace_s: float) -> None:
    with pytest.raises(ValueError, match=rf"grace_s must be > 0, got {grace_s!r}"):
        IndexMatches(grace_s)
