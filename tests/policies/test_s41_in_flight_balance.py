"""``cost`` passes over a replica holding more requests in flight than balance_factor x
the least loaded replica's plus balance_requests: the
holders of a prefix every request shares no longer take twenty requests each while the
rest of the fleet stands idle, their predicted wait a few tenths of a second because
their decode slots were never seen full."""

from __future__ import annotations

import pytest

from policies.base import ReplicaView
from policies.cost import Cost, CostConfig
from policies.in_flight_bound import balance_bound, in_flight_loads, least_loaded
from tests.support.balance_fleet import doc, held, loaded, request, views


@pytest.mark.parametrize(("ours", "others", "passed_over"), [
    (13, 0, True),   # past 2 x 0 + 12
    (12, 0, False),  # at the bound
    (6, 7, True),    # another sender's requests count too
])
def test_a_holder_past_the_bound_is_passed_over(ours: int, others: int,
                                                passed_over: bool) -> None:
    policy = Cost(CostConfig(early_balance_requests=None))  # (the floor from the start)
    tokens, first = held(policy)
    fleet = loaded(views(), {first: (ours, others)})
    d = policy.choose(request(tokens, at=0.1), fleet)
    assert (d.chosen != first) is passed_over, d
    if passed_over:
        assert d.reason == "balance" and first in d.ranked  # still there for a retry
    else:
        assert d.reason == "cache_match"


def test_the_bound_scales_with_the_least_loaded_replica() -> None:
    policy = Cost(CostConfig(early_balance_requests=None))
    tokens, first = held(policy)
    # every other replica holds 10: the bound is 2 x 10 + 12 = 32
    busy = {f"r{i}": (10, 0) for i in range(8)}
    d = policy.choose(request(tokens, at=0.1), loaded(views(), {**busy, first: (32, 0)}))
    assert d.chosen == first
    d = policy.choose(request(tokens, at=0.1), loaded(views(), {**busy, first: (33, 0)}))
    assert d.chosen != first and d.reason == "balance"


def test_off_it_keeps_the_holder_however_loaded() -> None:
    policy = Cost(CostConfig(balance_factor=None))
    tokens, first = held(policy)
    d = policy.choose(request(tokens, at=0.1), loaded(views(), {first: (40, 0)}))
    assert d.chosen == first


def test_with_no_scratch_set_a_fleet_past_the_bound_still_has_its_least_loaded() -> None:
    """No scratch set, a new prefix, the replica of least queue past the bound: the least
    loaded one by requests in flight takes it (it raised IndexError: no candidate left)."""
    policy = Cost(CostConfig(min_scratch=0, max_scratch_fraction=0.0, fill_homes=False))
    fleet = [ReplicaView("r0", in_flight=30, kv_capacity_tokens=4000),
             *(ReplicaView(f"r{i}", queued_tokens=5000, kv_capacity_tokens=4000)
               for i in range(1, 4))]
    d = policy.choose(request(doc(3, 600)), fleet)
    assert d.chosen != "r0" and d.reason == "balance", d
    d = Cost(CostConfig(min_scratch=0, max_scratch_fraction=0.0, fill_homes=False,
                        balance_factor=None)).choose(request(doc(3, 600)), fleet)
    assert d.chosen == "r0"


def test_weights_and_ties() -> None:
    fleet = [ReplicaView("a", in_flight=4, weight=2.0), ReplicaView("b", in_flight=3),
             ReplicaView("c", in_flight=2, weight=0.0), ReplicaView("d", in_flight=2)]
    loads = in_flight_loads(fleet)
    assert loads[:2] == [2.0, 3.0] and loads[2] == float("inf")
    up = [True] * 4
    assert least_loaded(loads, up, range(4), 0) == 0  # a: 2 per unit, before d (2)
    assert least_loaded(loads, up, range(4), 3) == 3  # counted from d: d first
    assert least_loaded(loads, [False, True, True, True], range(4), 0) == 3
    assert least_loaded(loads, [False] * 4, range(4), 0) == -1
    assert balance_bound(2.0, 2.0, 12.0) == 16.0


@pytest.mark.parametrize(("key", "value", "named"), [
    ("balance_factor", 0.5, "balance_factor must be >= 1 or null"),
    ("balance_requests", -1.0, "balance_requests must be a number >= 0"),
    ("balance_requests", float("nan"), "balance_requests must be a number >= 0"),
])
def test_bad_settings_are_named(key: str, value: float, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        CostConfig(**{key: value}).validate()
