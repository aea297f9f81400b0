import pytest

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig
from policies.slots import DecodeSlots


def test_a_slot_limit_needs_requests_waiting_at_the_most_ever_running() -> None:
    slots = DecodeSlots(confirm=3)
    for running in (2, 5, 3, 6):  # short of prefill budget: waiting at any count
        slots.saw("r0", running, waiting=2)
    slots.saw("r0", 8, waiting=0)  # more ran since: 6 was no limit
    for _ in range(2):
        slots.saw("r0", 8, waiting=1)
    assert slots.limit("r0") is None  # not yet confirmed
    slots.saw("r0", 8, waiting=3)
    assert slots.limit("r0") == 8
    slots.saw("r0", 9, waiting=0)  # a higher count drops the limit until confirmed again
    assert slots.limit("r0") is None
    slots.forget("r0")
    assert slots.limit("r0") is None


def test_a_slot_limit_is_not_learned_from_a_wait_for_prefill_nor_from_lone_arrivals() -> None:
    slots = DecodeSlots(confirm=3)
    for scrape in range(1, 6):  # a replica prefilling long prompts two at a time
        slots.saw("r0", 2, waiting=1, prefilling=1, scrape=scrape)
    assert slots.limit("r0") is None
    for scrape in (6, 8, 10):  # scrapes that each caught one request come in mid-step,
        for _ in range(4):  # read by several decisions
            slots.saw("r0", 2, waiting=1, scrape=scrape)
    assert slots.limit("r0") is None
    # one waiting in scrapes that follow each other: the first of them does not count
    slots.saw_all([ReplicaView("r0", running=2, waiting=1, scrape_seq=12)] * 3)
    assert slots.limit("r0") is None
    slots.saw_all([ReplicaView("r0", running=2, waiting=1, scrape_seq=13)] * 2)
    slots.saw_all([ReplicaView("r0", running=2, waiting=1, scrape_seq=14)] * 4)
    assert slots.limit("r0") is None  # each scrape counted once, however often read
    slots.saw_all([ReplicaView("r0", running=2, waiting=1, scrape_seq=15)])
    assert slots.limit("r0") == 2
    slots.saw("r0", 3, waiting=0, scrape=16)
    assert slots.limit("r0") is None
    for scrape in (20, 22, 24):  # two or more waiting: counted from a run's first scrape
        slots.saw("r0", 3, waiting=2, scrape=scrape)
    assert slots.limit("r0") == 3


def test_a_lone_arrival_in_a_replicas_first_full_scrape_counts_nothing() -> None:
    # scrapes are numbered from 1: the first one seen full starts a run of its own, so
    # one request waiting in it (come in mid-step) is no sign of a limit
    slots = DecodeSlots(confirm=1)
    slots.saw("r0", 2, waiting=1, scrape=1)
    assert slots.limit("r0") is None
    slots.saw("r0", 2, waiting=1, scrape=2)  # the next one full too: counted
    assert slots.limit("r0") == 2


def test_the_wait_counts_the_finishes_ahead() -> None:
    slots = DecodeSlots(alpha=0.5, confirm=1)
    assert slots.wait_s("r0", 100) == 0.0  # nothing known
    slots.saw("r0", 4, waiting=1)
    for seconds in (2.0, 2.0):
        slots.held(seconds)
    assert slots.hold_s == pytest.approx(2.0)
    assert slots.wait_s("r0", 3) == 0.0  # a slot is free
    assert slots.wait_s("r0", 4) == pytest.approx(1 * 2.0 / 4)
    assert slots.wait_s("r0", 7) == pytest.approx(4 * 2.0 / 4)
    slots.held(float("nan"))
    assert slots.hold_s == pytest.approx(2.0)
    with pytest.raises(ValueError, match="confirm"):
        DecodeSlots(confirm=0)


def test_cost_waits_for_a_decode_slot_and_weight_zero_ignores_it() -> None:
    def fleet(r0_running: int) -> list[ReplicaView]:
        # r0: no prefill queued, but every slot busy and 4 requests waiting for one
        return [ReplicaView("r0", running=r0_running, waiting=4 if r0_running else 0,
                            in_flight=r0_running + 4 if r0_running else 0),
                ReplicaView("r1", queued_tokens=2000, running=1, in_flight=1)]

    req = RouteRequest(tokens=list(range(500)), prompt_tokens=500, model="m")
    for weight, expected in ((1.0, "r1"), (0.0, "r0")):
        policy = Cost(CostConfig(slot_weight=weight, prefill_s_per_token=1e-4,
                                 min_scratch=0))
        policy.observe(Routed(req, "r0"))  # r0 holds the prompt: always a candidate
        for _ in range(8):  # r0 seen full: 8 running, others waiting
            policy.choose(req, fleet(8))
        for _ in range(20):  # requests hold a slot ~10 s (decode) after their first token
            policy.observe(Finished(req, "r0", True, cached_tokens=0, ttft_s=0.1,
                                    duration_s=10.1))
        d = policy.choose(req, fleet(8))
        waits = {s.replica: dict(s.terms)["wait_s"] for s in d.scores}
        assert d.chosen == expected, waits
        assert set(d.ranked) == {"r0", "r1"}
        if weight:
            # 5 finishes ahead on 8 slots, each held ~10 s: about 6 s, more than r1's whole
            # score, so r0 is ranked second without its eviction walk
            assert waits == {"r1": pytest.approx(2000 * 1e-4)}
            # r1, never seen running more, is judged by the slots r0 was seen to fill
            assert policy.describe()["slots"] == {"r0": 8, "r1": 8}


def test_requests_waiting_while_none_runs_teach_no_limit() -> None:
    # a scrape taken as requests came in, before the engine ran any: no slot limit of 0,
    # and cost keeps routing (a limit of 0 once divided every decision by zero)
    slots = DecodeSlots(confirm=2)
    for _ in range(10):
        slots.saw("r0", 0, waiting=1)
        slots.held(1.0)
    assert slots.limit("r0") is None and slots.wait_s("r0", 5) == 0.0
    policy = Cost(CostConfig(min_scratch=0))
    req = RouteRequest(tokens=list(range(50)), prompt_tokens=50, model="m")
    for _ in range(20):
        views = [ReplicaView("r0", running=0, waiting=1, in_flight=1)]
        d = policy.choose(req, views)
        policy.observe(Routed(req, d.chosen))
        policy.observe(Finished(req, d.chosen, True, cached_tokens=0, ttft_s=0.1,
                                duration_s=0.5))
    assert d.chosen == "r0" and policy.describe()["slots"] == {"r0": None}
