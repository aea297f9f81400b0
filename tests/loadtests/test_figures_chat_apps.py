"""The chat-apps stream is the first turns by arrival time, whatever the rate."""

from __future__ import annotations

from loadtests.workloads import ChatAppsSpec, generate


def test_the_first_turns_by_arrival_do_not_depend_on_how_many_are_asked() -> None:
    # at 40 requests/s the later turns of the conversations drawn for 200 requests
    # outnumber them: conversations that start later still have turns among the first 200
    spec = ChatAppsSpec(rate=40.0)
    few = [r.arrival_s for r in generate(spec, 200)]
    many = [r.arrival_s for r in generate(spec, 1000)]
    assert few == many[:200]
    assert few == sorted(few)
