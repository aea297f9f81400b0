"""Servers of several data-parallel ranks whose own balancer picks the rank (vLLM's
internal one): a gateway that sees only the servers loses the cache affinity it routes
for; one that routes to the ranks (``data_parallel_size``) keeps it."""

from __future__ import annotations

import dataclasses

import pytest

from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import build_policy, poisson_arrivals, simulate
from loadtests.workloads import generate
from tests.loadtests.test_simulate import SMALL_LIBRARY, SMALL_LRU, SMALL_RATE


def test_routing_to_the_ranks_keeps_the_hits_a_servers_balancer_loses() -> None:
    requests = generate(SMALL_LIBRARY, 1200)
    arrivals = poisson_arrivals(len(requests), SMALL_RATE, 1)
    ranks = simulate(requests, arrivals, build_policy("cost"), SMALL_LRU)
    hidden = simulate(requests, arrivals, build_policy("cost"),
                      dataclasses.replace(SMALL_LRU, ranks_hidden=2))
    assert ranks.token_hit_rate > hidden.token_hit_rate + 0.05
    # the servers' balancer uses every rank
    assert all(n > 0 for n in hidden.replica_requests)


@pytest.mark.parametrize(("change", "named"), [
    ({"ranks_hidden": 3}, "ranks_hidden"),  # 4 replicas are no servers of 3
    ({"ranks_hidden": 0}, "ranks_hidden"),
    ({"ranks_hidden": 2, "views": "exact"}, "ranks_hidden"),
    ({"ranks_hidden": 2, "kv_events": True}, "ranks_hidden"),
])
def test_ranks_the_simulator_cannot_hide_are_refused(change: dict[str, object],
                                                     named: str) -> None:
    spec: FleetSpec = dataclasses.replace(SMALL_LRU, **change)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=named):
        spec.validate()
