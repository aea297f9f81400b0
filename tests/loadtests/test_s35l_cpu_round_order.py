"""bench_proxy's CPU rounds alternate the order of every target, the floors included: the
policies then the floors in even rounds, all reversed in odd ones (a machine drifting over
a round's ~100 s then favours neither side of a gateway-to-floor ratio). Before, the floors
ran last in every round, always in the same order."""

from __future__ import annotations

from loadtests.bench_proxy import FLOORS, run_cpu_rounds

POLICIES = ["round_robin", "prefix_affinity", "cost"]


def test_s35l_the_floors_take_part_in_the_alternating_order() -> None:
    ran: list[str] = []

    def measure(name: str) -> dict[str, float]:
        ran.append(name)
        return {"stream_fresh": float(len(ran))}

    rounds = run_cpu_rounds(POLICIES, 3, measure)
    every = [*POLICIES, *FLOORS]
    assert FLOORS == ("kvgate_client_stream_proxy", "aiohttp_stream_proxy")
    assert ran == [*every, *every[::-1], *every]
    # each round keyed as the JSON has it (policies, then floors), whichever order it ran in
    assert [list(r) for r in rounds] == [every] * 3
    assert rounds[1]["aiohttp_stream_proxy"] == {"stream_fresh": len(every) + 1.0}
    assert rounds[1]["round_robin"] == {"stream_fresh": 2.0 * len(every)}
