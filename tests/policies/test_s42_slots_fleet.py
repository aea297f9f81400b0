"""A replica not yet seen full is judged by the most slots learned on another (unless it
ran more than that), and the time a slot is held is read from the replicas' own
``request_inference_time_seconds`` as well as from this gateway's finished requests: a
gateway started or restarted in front of a busy fleet knows both within a scrape or two,
before its own requests finish."""

from __future__ import annotations

import pytest

from gateway.config import ReplicaConfig
from gateway.fleet import Fleet
from gateway.replica_metrics import parse_metrics
from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig
from policies.slots import DecodeSlots
from tests.support.balance_fleet import held, loaded, request, views


def test_a_replica_not_yet_seen_full_counts_the_most_slots_learned_elsewhere() -> None:
    slots = DecodeSlots(confirm=1)
    slots.held(1.0)
    slots.saw("r1", 4, waiting=0)  # seen running 4
    slots.saw("r2", 12, waiting=0)  # seen running more than any limit learned
    assert slots.slots("r1") == 0  # nothing learned yet
    slots.saw("r0", 8, waiting=3)
    assert slots.limit("r0") == 8 and slots.limit("r1") is None
    assert slots.slots("r1") == slots.slots("r9") == 8  # r9: never seen
    assert slots.slots("r2") == 0
    assert slots.wait_s("r1", 9) == pytest.approx(2 * 1.0 / 8)
    assert slots.wait_s("r2", 40) == 0.0
    slots.saw("r3", 16, waiting=2)  # a larger kind: the most learned is the prior
    assert slots.slots("r2") == 16 and slots.slots("r0") == 8
    slots.saw("r1", 17, waiting=0)  # r1 ran more than any: its own, unknown
    assert slots.slots("r1") == 0
    slots.forget("r3")
    assert slots.slots("r2") == 0 and slots.slots("r9") == 8
    slots.forget("r0")
    assert slots.slots("r9") == 0 and slots.prior == 0


def test_a_limit_takes_two_scrapes_however_often_one_is_read() -> None:
    slots = DecodeSlots()
    for _ in range(12):  # one scrape read by many decisions: requests may have come in
        slots.saw("r0", 8, waiting=3, scrape=5)  # during a step, to run at the next
    assert slots.limit("r0") is None
    slots.saw("r0", 8, waiting=2, scrape=7)  # a second scrape full at 8
    assert slots.limit("r0") == 8


def test_cost_charges_a_slot_wait_where_the_replica_was_never_seen_full() -> None:
    req = RouteRequest(tokens=list(range(300)), prompt_tokens=300, model="m")
    policy = Cost(CostConfig(prefill_s_per_token=1e-4, min_scratch=0))
    policy.observe(Routed(req, "r1"))  # r1 holds the prompt: it wins unless it must wait
    full = [ReplicaView("r0", running=8, waiting=4, in_flight=12, scrape_seq=1,
                        slot_hold_s=2.0),
            ReplicaView("r1", in_flight=11, scrape_seq=1),  # more in flight than r0 runs
            ReplicaView("r2", in_flight=1, scrape_seq=1)]
    for seq in (1, 1, 2, 2):  # two scrapes show r0 full, each read by two decisions
        full = [r._replace(scrape_seq=seq) for r in full]
        policy.choose(req, full)
    assert policy.describe()["slots"] == {"r0": 8, "r1": 8, "r2": 8}
    d = policy.choose(req, full)
    waits = {s.replica: dict(s.terms)["wait_s"] for s in d.scores}
    # r1: 11 in flight on 8 slots held 2 s each (read from r0's scrape alone, none of this
    # gateway's requests finished): the 4th finish frees its slot, in about 1 s
    assert d.chosen == "r2", waits


def _page(ran_s: float, ran: int, running: int = 3, hits: int | None = None) -> str:
    counters = "" if hits is None else (
        f"vllm:prefix_cache_hits_total{{model_name=\"m\"}} {hits}\n"
        f"vllm:prefix_cache_queries_total{{model_name=\"m\"}} {2 * hits}\n")
    return (counters + f"vllm:num_requests_running{{model_name=\"m\"}} {running}\n"
            f"vllm:num_requests_waiting{{model_name=\"m\"}} 0\n"
            "# TYPE vllm:request_inference_time_seconds histogram\n"
            f"vllm:request_inference_time_seconds_bucket{{le=\"+Inf\",model_name=\"m\"}} {ran}\n"
            f"vllm:request_inference_time_seconds_count{{model_name=\"m\"}} {ran}\n"
            f"vllm:request_inference_time_seconds_sum{{model_name=\"m\"}} {ran_s}\n")


def test_a_scrape_tells_the_mean_time_the_requests_finished_since_the_last_ran() -> None:
    page = parse_metrics(_page(30.0, 10))
    assert (page.ran_seconds, page.ran_requests) == (30.0, 10)
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1")])
    fleet.record_scrape("r0", page, now=1.0)
    assert fleet.views(now=1.0)[0].slot_hold_s is None  # one read: no finish between
    fleet.record_scrape("r0", parse_metrics(_page(42.0, 14)), now=2.0)
    assert fleet.views(now=2.0)[0].slot_hold_s == pytest.approx(3.0)  # 12 s over 4
    fleet.record_scrape("r0", parse_metrics(_page(42.0, 14)), now=3.0)
    assert fleet.views(now=3.0)[0].slot_hold_s is None  # none finished
    fleet.record_scrape("r0", parse_metrics(_page(5.0, 2)), now=4.0)
    assert fleet.views(now=4.0)[0].slot_hold_s is None  # counters back: a restart
    fleet.record_scrape("r0", parse_metrics(_page(9.0, 3)), now=5.0)
    assert fleet.views(now=5.0)[0].slot_hold_s == pytest.approx(4.0)
    no_histogram = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
    fleet.record_scrape("r0", parse_metrics(no_histogram), now=6.0)
    assert fleet.views(now=6.0)[0].slot_hold_s is None


def test_the_scraped_hold_is_read_once_per_scrape() -> None:
    slots = DecodeSlots()  # a plain mean of the samples while they are few
    view = ReplicaView("r0", scrape_seq=3, slot_hold_s=4.0)
    slots.saw_all([view])
    slots.saw_all([view])  # the same scrape read again by the next decision
    slots.saw_all([view._replace(scrape_seq=4, slot_hold_s=2.0)])
    assert slots.hold_s == pytest.approx(3.0)  # (read twice, 4 would weigh 2/3: 3.33)


def test_no_hold_is_read_across_a_restart_that_came_between_scrapes() -> None:
    fleet = Fleet([ReplicaConfig("r0", "http://127.0.0.1:1")])
    fleet.record_scrape("r0", parse_metrics(_page(30.0, 10, hits=500)), now=1.0)
    # restarted unseen (scrapes failed meanwhile), then finished more than before
    fleet.record_scrape("r0", parse_metrics(_page(900.0, 12, hits=20)), now=9.0)
    view = fleet.views(now=9.0)[0]
    assert view.epoch == 1 and view.slot_hold_s is None
    # a page without prefix-cache counters tells a restart by its token counters alone
    tokens = "vllm:prompt_tokens_total{{model_name=\"m\"}} {}\n"
    fleet.record_scrape("r0", parse_metrics(_page(30.0, 10) + tokens.format(9000)), now=10.0)
    fleet.record_scrape("r0", parse_metrics(_page(900.0, 12) + tokens.format(40)), now=11.0)
    view = fleet.views(now=11.0)[0]
    assert view.epoch == 2 and view.slot_hold_s is None


def test_the_engine_counts_what_its_finished_requests_ran() -> None:
    from engine.request import SamplingParams
    from loadtests.sim_fleet import FleetSpec, SimFleet

    fleet = SimFleet(FleetSpec(replicas=1))
    replica = fleet.replicas[0]
    core = replica.core
    for i, n in enumerate((40, 7)):
        core.add_request(core.make_request(f"q{i}", list(range(1, 300)), SamplingParams(
            max_tokens=n, ignore_eos=True)), now=0.0)
    now, ends = 0.0, {}
    while core.has_unfinished():
        out = core.step(now)
        now += out.seconds
        ends.update((o.request_id, o.finish_time - o.first_scheduled_time)
                    for o in out.outputs if o.finished)
    stats = core.scheduler.stats
    assert stats.ran_requests == 2 and stats.ran_seconds == pytest.approx(sum(ends.values()))
    page = replica.scraped("vllm")  # what the simulator's gateway scrapes
    assert (page.ran_seconds, page.ran_requests) == (stats.ran_seconds, 2.0)


def test_until_anything_is_known_of_the_slots_the_balance_floor_is_the_early_one() -> None:
    policy = Cost()  # early_balance_requests 4, balance_requests 12
    tokens, first = held(policy)
    fleet = loaded(views(), {first: (5, 0)})  # past 2 x 0 + 4, under 2 x 0 + 12
    d = policy.choose(request(tokens, at=0.1), fleet)
    assert d.chosen != first and d.reason == "balance"
    # a scrape tells how long the replicas' requests held a slot: no longer blind
    told = [r._replace(scrape_seq=1, slot_hold_s=0.8) for r in fleet]
    d = policy.choose(request(tokens, at=0.5), told)
    assert d.chosen == first and d.reason == "cache_match"
    off = Cost(CostConfig(early_balance_requests=None))
    tokens, first = held(off)
    assert off.choose(request(tokens, at=0.1), loaded(views(), {first: (5, 0)})).chosen \
        == first
    with pytest.raises(ValueError, match="early_balance_requests must be a number >= 0 "
                                         "or null, got -1"):
        CostConfig(early_balance_requests=-1).validate()
