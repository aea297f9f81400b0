import random
from collections.abc import Sequence
from itertools import pairwise

import pytest

from policies.base import (
    Finished,
    ReplicaRemoved,
    ReplicaReset,
    ReplicaView,
    Routed,
    RouteRequest,
)
from policies.config import ConfigError
from policies.cost import Cost, CostConfig
from policies.registry import build_policy, load_preset

DOC = 1000  # tokens per document in these tests


def views(n: int = 8, capacity: int = 4000, queued: dict[str, int] | None = None,
          epoch: int = 0) -> list[ReplicaView]:
    queued = queued or {}
    return [ReplicaView(f"r{i}", queued_tokens=queued.get(f"r{i}", 0),
                        kv_capacity_tokens=capacity, epoch=epoch) for i in range(n)]


def doc(seed: int, extra: int = 20) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(DOC + extra)]


def request(tokens: list[int], at: float = 0.0) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def route(policy: Cost, tokens: list[int], fleet: Sequence[ReplicaView], at: float = 0.0
          ) -> str:
    req = request(tokens, at)
    chosen = policy.choose(req, fleet).chosen
    policy.observe(Routed(req, chosen))
    return chosen


def holders(policy: Cost, tokens: list[int], fleet: Sequence[ReplicaView]) -> list[str]:
    d = policy.choose(request(tokens), fleet)
    return [s.replica for s in d.scores if s.matched_tokens > DOC // 2]


def test_a_routed_document_is_found_again_and_spills_only_under_load() -> None:
    policy = Cost()
    fleet = views()
    tokens = doc(1)
    first = route(policy, tokens, fleet)
    again = policy.choose(request(doc(1, extra=20)), fleet)
    assert again.chosen == first and again.reason == "cache_match"
    assert again.matched_tokens >= DOC - 128  # whole blocks of 8 x 16 ids
    busy = policy.choose(request(tokens), views(queued={first: 200_000}))
    assert busy.chosen != first and busy.reason == "scratch"  # still rare: seen once


@pytest.mark.parametrize("weight, stays", [(1.0, False), (2.0, True)])
def test_a_holder_a_prefill_and_a_half_behind_keeps_its_prefix_once_prefill_counts_double(
        weight: float, stays: bool) -> None:
    policy = Cost(CostConfig(prefill_weight=weight, prefill_s_per_token=1e-4))
    tokens = doc(2)
    first = route(policy, tokens, views())
    # its queue: 1.5 prefills of the prompt; every other replica idle, holding nothing
    d = policy.choose(request(tokens), views(queued={first: 3 * len(tokens) // 2}))
    assert (d.chosen == first) is stays
    terms = dict(d.scores[0].terms)
    if stays:
        assert terms["wait_s"] == pytest.approx(1.5 * len(tokens) * 1e-4)
    else:  # an idle replica's whole prefill beats the holder's wait (ranked next)
        assert terms["prefill_s"] == pytest.approx(len(tokens) * 1e-4)
        assert d.ranked[1] == first


def test_every_score_names_its_terms() -> None:
    policy = Cost()
    fleet = views()
    for seed in range(3):  # some history, so evictions and matches have values
        route(policy, doc(seed), fleet)
    d = policy.choose(request(doc(0)), views(queued={"r3": 5000}))
    assert d.scores
    for s in d.scores:
        terms = dict(s.terms)
        assert set(terms) == {"wait_s", "prefill_s", "evict_s", "scratch_s", "late_s"}
        assert s.score == pytest.approx(sum(terms.values()))
    assert [s.score for s in d.scores] == sorted(s.score for s in d.scores)


@pytest.mark.parametrize("tail_weight", [0.0, 2.0])
def test_a_one_off_document_queued_into_the_tail_goes_to_an_idle_replica_instead(
        tail_weight: float) -> None:
    pace = 1e-4
    # (each evicted hot token weighed 0.75 of a prefill, whatever the home's turnover)
    policy = Cost(CostConfig(min_scratch=1, prefill_s_per_token=pace, tail_weight=tail_weight,
                             rare_eviction_weight=0.75, eviction_survival=False))
    fleet = views(n=2, capacity=3100)  # the home's model holds 3 documents, no more
    (scratch,) = policy.scratch_set(fleet)
    home = next(v.id for v in fleet if v.id != scratch)
    for seed in range(3):  # hot documents filling the home
        for t in range(3):
            req = request(doc(seed), at=t)
            policy.choose(req, fleet)
            policy.observe(Routed(req, home))
    rare = doc(99)
    p = len(rare)
    # the scratch replica half a prefill behind: its first token 1.5 prefills away, past
    # the tail's 1.2; the idle home would evict a hot document, which costs more than that
    # wait alone
    d = policy.choose(request(rare, at=10), views(n=2, capacity=3100, queued={scratch: p // 2}))
    terms = {s.replica: dict(s.terms) for s in d.scores}
    assert terms[home]["evict_s"] > 0.5 * p * pace
    assert terms[home]["late_s"] == 0.0
    assert d.chosen == (scratch if tail_weight == 0 else home)
    if tail_weight == 0:
        assert terms[scratch]["late_s"] == 0.0
    else:  # scored, or passed over once its wait, prefill and lateness exceeded the best
        assert scratch not in terms or terms[scratch]["late_s"] == pytest.approx(
            tail_weight * 0.3 * p * pace)
        assert d.ranked == (home, scratch)
    # a shorter wait, its first token within the slack, costs nothing beyond itself
    d = policy.choose(request(rare, at=10), views(n=2, capacity=3100, queued={scratch: p // 10}))
    assert d.chosen == scratch
    assert dict(d.scores[0].terms)["late_s"] == 0.0


def test_a_one_off_document_never_evicts_a_hot_document_from_its_home() -> None:
    policy = Cost(CostConfig(min_scratch=1))
    fleet = views(capacity=4000)  # the model holds 3 documents per replica
    hot = doc(0)
    home = next(v.id for v in fleet if v.id not in policy.scratch_set(fleet))
    for t in range(4):  # seen often, and placed on a home outside the scratch set
        policy.observe(Routed(request(hot, at=t), home))
    assert holders(policy, hot, fleet) == [home]
    for i in range(300):  # a stream of documents nobody asks for twice
        route(policy, doc(1000 + i), fleet, at=10 + i * 0.1)
        policy.check_integrity()
    assert home in holders(policy, hot, fleet)


def test_the_scratch_set_and_homes_are_stable_when_a_replica_leaves() -> None:
    policy = Cost(CostConfig(min_scratch=2))
    fleet = views(n=10)
    scratch = policy.scratch_set(fleet)
    assert len(scratch) == 2
    gone = next(v.id for v in fleet if v.id not in scratch)
    smaller = [v for v in fleet if v.id != gone]
    assert policy.scratch_set(smaller) == scratch
    # homes of hot keys: only the departed replica's keys move (~1/R)
    moved = 0
    docs = [doc(5000 + i)[:300] for i in range(400)]
    for tokens in docs:
        for t in range(3):
            policy.observe(Routed(request(tokens, at=t), "r0"))  # make it hot
    for tokens in docs:
        before = policy.choose(request(tokens), views(n=10, queued={"r0": 10**9})).chosen
        after = policy.choose(request(tokens), [v for v in views(n=10, queued={"r0": 10**9})
                                                if v.id != gone]).chosen
        moved += before != after
    assert moved / len(docs) < 2.5 / 10


def test_a_rare_document_fills_its_home_then_goes_to_the_scratch_set() -> None:
    policy = Cost(CostConfig(min_scratch=2))
    fleet = views(capacity=4000)  # room for 3 documents of 1,020 tokens
    scratch = policy.scratch_set(fleet)
    # caches still filling: a first-seen document goes to its home, where it would live
    # if it turned hot, so its next request hits
    d = policy.choose(request(doc(42)), fleet)
    assert d.reason == "affinity" and d.chosen not in scratch
    for seed in range(100, 140):  # one-off documents fill every home
        route(policy, doc(seed), fleet)
    d = policy.choose(request(doc(42)), fleet)
    assert d.reason == "scratch" and d.chosen in scratch
    off = Cost(CostConfig(min_scratch=2, fill_homes=False))
    d = off.choose(request(doc(43)), fleet)
    assert d.reason == "scratch" and d.chosen in off.scratch_set(fleet)


def test_a_restarted_replica_is_treated_as_empty() -> None:
    policy = Cost()
    tokens = doc(3)
    home = route(policy, tokens, views())
    assert holders(policy, tokens, views()) == [home]
    assert holders(policy, tokens, views(epoch=1)) == []
    policy.observe(ReplicaRemoved(home))
    assert holders(policy, tokens, views()) == []


def test_the_pace_is_learned_from_first_token_times() -> None:
    policy = Cost(CostConfig(prefill_s_per_token=1e-4))
    req = request(doc(7))
    for _ in range(40):  # 1020 tokens to prefill in 0.51 s: 5e-4 s per token
        policy.observe(Finished(req, "r0", True, cached_tokens=0, ttft_s=0.51))
    assert policy.pace_s_per_token == pytest.approx(5e-4)


def test_the_scratch_set_grows_with_the_rare_prefill_load() -> None:
    policy = Cost(CostConfig(prefill_s_per_token=1e-3, scratch_utilization=0.55,
                             max_scratch_fraction=0.5))
    fleet = views(n=8)
    # 1 one-off document of 1020 tokens per second at 1 ms per token: ~1 replica busy,
    # 2 replicas at 51%
    for i in range(300):
        route(policy, doc(20_000 + i), fleet, at=float(i))
    # the sketch halved at 256 requests; 44 judged rare since are too few to size it by
    assert policy.scratch_size == 1
    for i in range(300, 400):
        route(policy, doc(20_000 + i), fleet, at=float(i))
    assert policy.scratch_size == 2
    assert len(policy.scratch_set(fleet)) == 2


def test_the_scratch_set_grows_a_replica_at_a_time_a_sketch_window_apart() -> None:
    # two one-off documents a second at 1 ms per token: ~2 replicas busy, 4 at 51%
    policy = Cost(CostConfig(prefill_s_per_token=1e-3, scratch_utilization=0.55,
                             max_scratch_fraction=0.5))
    fleet = views(n=8)
    sizes = []
    for i in range(1600):
        route(policy, doc(20_000 + i), fleet, at=i / 2)
        sizes.append(policy.scratch_size)
    grew = [i for i in range(1, len(sizes)) if sizes[i] > sizes[i - 1]]
    assert [sizes[i] - sizes[i - 1] for i in grew] == [1] * len(grew)
    assert all(b - a >= policy._sketch.window for a, b in pairwise(grew))
    assert sizes[-1] == 4  # where it gets, the load's need: 2.04 / 0.55 -> 4
    assert len(grew) == 3


@pytest.mark.parametrize("keep, stays", [(1, True), (2, False)])
def test_a_placed_hot_document_whose_count_dips_at_a_halving_keeps_its_home(
        keep: int, stays: bool) -> None:
    policy = Cost(CostConfig(hot_keep_count=keep, fill_homes=False))
    fleet = views()
    hot = doc(9)
    for t in range(3):  # counted 3: hot, and placed on a home
        route(policy, hot, fleet, at=float(t))
    fresh = views(epoch=1)  # caches emptied: where a document goes is its home, or scratch
    home = policy.choose(request(hot, at=3.0), fresh)
    assert home.reason == "affinity" and home.chosen not in policy.scratch_set(fleet)
    for i in range(256):  # one-off documents: the sketch halves, the count falls to 1
        route(policy, doc(30_000 + i, extra=0)[:200], fleet, at=4.0 + i * 0.01)
    assert policy._sketch.estimate(policy._prepare(request(hot)).key) == 1
    d = policy.choose(request(hot, at=10.0), fresh)
    assert (d.chosen == home.chosen) is stays
    assert (d.reason == "scratch") is not stays
    assert policy.describe()["placed_hot_keys"] == (1 if stays else 0)


def test_the_scratch_set_is_the_same_whatever_order_the_replicas_come_in() -> None:
    policy = Cost(CostConfig(min_scratch=2))
    fleet = views(n=8)
    first = policy.scratch_set(fleet)
    assert len(first) == 2
    assert set(policy.scratch_set(list(reversed(fleet)))) == set(first)
    assert set(policy.scratch_set(fleet)) == set(first)


def test_the_preset_builds_and_bad_values_are_named() -> None:
    assert isinstance(build_policy(load_preset("cost")), Cost)
    with pytest.raises(ConfigError, match="scratch_utilization"):
        build_policy({"name": "cost", "scratch_utilization": 0})
    # below the utilization it grows the set at, "running hotter" grew it instead
    with pytest.raises(ConfigError, match=r"max_scratch_utilization must be >= "
                                          r"scratch_utilization \(0\.7\), got 0\.5"):
        build_policy({"name": "cost", "scratch_utilization": 0.7,
                      "max_scratch_utilization": 0.5})
    with pytest.raises(ConfigError, match="sketch_width"):
        build_policy({"name": "cost", "sketch_width": 1000})
    # too narrow to halve or place anything (it failed building, naming no setting), and
    # a typo's 2^40 (it allocated 16 TiB)
    for width in (2, 4, 1 << 40):
        with pytest.raises(ConfigError, match="sketch_width"):
            build_policy({"name": "cost", "sketch_width": width})
    with pytest.raises(ConfigError, match="prefill_weight"):
        build_policy({"name": "cost", "prefill_weight": 0})
    with pytest.raises(ConfigError, match="hot_keep_count"):
        build_policy({"name": "cost", "hot_keep_count": 4})


def test_the_head_index_follows_evictions_restarts_and_removals() -> None:
    policy = Cost(CostConfig(default_capacity_tokens=3 * DOC))
    rng = random.Random(5)
    fleet = views(n=4, capacity=3 * DOC)
    for i in range(200):
        tokens = doc(rng.randrange(30))
        chosen = route(policy, tokens, fleet, at=i * 0.1)
        if i == 80:  # a restart: the model is dropped on the new epoch
            fleet = [v if v.id != chosen else ReplicaView(v.id, kv_capacity_tokens=3 * DOC,
                                                          epoch=1) for v in fleet]
        if i == 150:
            policy.observe(ReplicaRemoved("r2"))
            fleet = [v for v in fleet if v.id != "r2"]
        policy.check_integrity()
        # what the index finds agrees with asking every model
        assert set(holders(policy, tokens, fleet)) <= {v.id for v in fleet}
    assert holders(policy, tokens, fleet) == [chosen]


def test_other_gateway_copies_are_noticed_from_the_replicas_prefill_counters() -> None:
    policy = Cost(CostConfig(min_scratch=1))

    def fleet(rate: float) -> list[ReplicaView]:
        return [ReplicaView(f"r{i}", kv_capacity_tokens=4000, prefill_tokens_per_s=rate)
                for i in range(8)]

    def traffic(rate: float, start: int, n: int = 400) -> None:
        for i in range(start, start + n):  # one-off documents, ~10k uncached tokens/s
            route(policy, doc(20_000 + i), fleet(rate), at=i * 0.1)

    traffic(1300.0, 0)  # the replicas prefill what this copy sends (8 x 1,300 tokens/s)
    assert policy.describe()["other_gateway_copies"] is False
    traffic(5000.0, 400, 1200)  # ... then 4x that: three more copies route there
    assert policy.describe()["other_gateway_copies"] is True
    traffic(1300.0, 1600, 1200)  # alone again
    assert policy.describe()["other_gateway_copies"] is False


def test_a_replicas_prefill_that_this_copy_did_not_send_ages_its_model() -> None:
    # another gateway copy sends its own documents to r0: r0's LRU cache evicts this
    # copy's document, and this copy's model must stop predicting a hit there
    def fleet(rate: float) -> list[ReplicaView]:
        return [ReplicaView(f"r{i}", kv_capacity_tokens=4000, prefill_tokens_per_s=rate)
                for i in range(2)]

    tokens = doc(7)
    for rate, expect_held in ((0.0, True), (2000.0, False)):
        policy = Cost(CostConfig(min_scratch=0))
        home = route(policy, tokens, fleet(0.0), at=0.0)
        # 10 s later, arrivals every 0.5 s of another prompt that this copy sends nowhere
        # near the model's capacity: r0 and r1 prefill ``rate`` tokens/s beside it
        for i in range(20):
            policy.choose(request(doc(100 + i, extra=0)[:40], at=0.5 * (i + 1)), fleet(rate))
        matched = {s.replica: s.matched_tokens
                   for s in policy.choose(request(tokens, at=11.0), fleet(rate)).scores}
        held = matched.get(home, 0) > DOC // 2
        assert held is expect_held, (rate, matched)
        policy.check_integrity()


def test_the_scratch_set_runs_hotter_when_the_hot_set_needs_the_room() -> None:
    # the same one-off load as above (2 scratch replicas at 51%, or 1 at 102%), on 4
    # replicas whose caches hold 3 documents each, with 9 hot documents placed: they need
    # 3 replicas' caches, so the scratch set may keep only 1 (up to max_scratch_utilization)
    def run(max_util: float) -> int:
        policy = Cost(CostConfig(prefill_s_per_token=1e-3, scratch_utilization=0.55,
                                 max_scratch_utilization=max_util, max_scratch_fraction=0.5,
                                 placement_fill=1.0))
        fleet = views(n=4, capacity=3 * (DOC + 20))
        for i in range(300):
            at = float(i)
            route(policy, doc(20_000 + i), fleet, at=at)
            route(policy, doc(i % 9), fleet, at=at + 0.5)  # hot: every 9 s
        assert policy.describe()["placed_hot_keys"] == 9
        return policy.scratch_size

    assert run(1.2) == 1  # 102% is within 1.2: one scratch replica, 3 for the hot set
    assert run(0.85) == 2  # ... not within 0.85: the load wins


def test_a_scratch_set_the_hot_set_needs_room_from_shrinks_once_its_load_falls() -> None:
    # 4 replicas holding 3 documents each, 9 hot documents placed (3 replicas' caches):
    # one replica is spare. A heavy one-off load first takes 2 scratch replicas; once it
    # falls to 0.7 of a replica (70% on one, within max_scratch_utilization 1.0, and a
    # quarter replica under one less), the set gives the hot set its room back
    policy = Cost(CostConfig(prefill_s_per_token=1e-3, scratch_utilization=0.55,
                             max_scratch_utilization=1.0, max_scratch_fraction=0.5,
                             placement_fill=1.0))
    fleet = views(n=4, capacity=3 * (DOC + 20))
    at, rare = 0.0, 0
    while at < 150:  # two one-off documents a second: 2 replicas busy
        route(policy, doc(20_000 + rare), fleet, at=at)
        route(policy, doc(20_000 + rare + 1), fleet, at=at + 0.25)
        route(policy, doc(rare // 2 % 9), fleet, at=at + 0.5)
        at, rare = at + 1.0, rare + 2
    assert policy.scratch_size == 2
    while at < 600:  # 0.7 a second
        route(policy, doc(20_000 + rare), fleet, at=at)
        route(policy, doc(rare % 9), fleet, at=at + 0.5)
        at, rare = at + 1 / 0.7, rare + 1
    assert policy.describe()["placed_hot_keys"] == 9
    assert policy.scratch_size == 1


def test_a_hot_document_spills_to_the_least_loaded_once_its_homes_are_busy() -> None:
    policy = Cost(CostConfig(min_scratch=1))
    tokens = doc(1)
    for _ in range(4):  # seen often enough to be hot
        route(policy, tokens, views())
    queued: dict[str, int] = {}
    reasons = []
    for _ in range(8):  # each replica it picks gets a long queue, until it spills
        d = policy.choose(request(tokens), views(queued=queued))
        reasons.append(d.reason)
        if d.reason == "spill":
            assert queued.get(d.chosen, 0) == 0  # to an idle replica, not a queued one
            break
        queued[d.chosen] = 200_000
    assert reasons[-1] == "spill", reasons
    assert set(reasons[:-1]) <= {"cache_match", "affinity"}


@pytest.mark.parametrize("prefill_per_s, spills", [(None, False), (1e7, True)])
def test_a_queued_home_is_waited_for_only_where_its_cache_would_keep_the_prompt(
        prefill_per_s: float | None, spills: bool) -> None:
    tokens = doc(3)
    for survival in (False, True):
        policy = Cost(CostConfig(min_scratch=1, spill_survival=survival))
        for k in range(4):  # seen often enough to be hot, among one-off documents
            route(policy, tokens, views(), at=float(k))
            for j in range(10):
                route(policy, doc(100 + 10 * k + j), views(), at=k + 0.05 * (j + 1))
        # the replicas restarted (nothing cached); its home has half a prefill queued and
        # takes in prefill at prefill_per_s (with 1e7 its cache turns over in a millisecond)
        home = policy.choose(request(tokens, at=4.0), views(epoch=1)).chosen
        fleet = [v._replace(prefill_tokens_per_s=prefill_per_s) if v.id == home else v
                 for v in views(queued={home: len(tokens) // 2}, epoch=1)]
        d = policy.choose(request(tokens, at=4.0), fleet)
        # it leaves the home for an idle replica (its second home) only where the home's
        # cache would not keep the prompt, and only with spill_survival
        assert (d.chosen != home) is (spills and survival), (survival, d.reason)
        assert dict(d.scores[0].terms)["wait_s"] == (0.0 if d.chosen != home else
                                                     pytest.approx(len(tokens) // 2 * 1e-4))


def test_a_hot_document_no_home_has_room_for_lives_on_the_scratch_set() -> None:
    # 4 replicas holding 3 documents each, one of them scratch: 11 hot documents fill the
    # 3 homes (9) and leave 2 on the scratch replica, which is then their home (affinity,
    # no scratch charge), instead of a fourth document on a home that holds 3
    policy = Cost(CostConfig(placement_fill=1.0, max_scratch_fraction=0.25))
    fleet = views(n=4, capacity=3 * (DOC + 20))
    for i in range(440):
        route(policy, doc(i % 11), fleet, at=i * 0.1)
    (scratch,) = policy.scratch_set(fleet)
    placed = policy.describe()["placed_hot_tokens"]
    assert isinstance(placed, dict)
    assert {r: t // (DOC + 20) for r, t in placed.items()} == {
        r.id: 2 if r.id == scratch else 3 for r in fleet}
    # the replicas restarted (their caches empty): each document goes to its home
    fresh = views(n=4, capacity=3 * (DOC + 20), epoch=1)
    decisions = [policy.choose(request(doc(k), at=50.0), fresh) for k in range(11)]
    on_scratch = [d for d in decisions if d.chosen == scratch]
    assert len(on_scratch) == 2
    for d in on_scratch:
        assert d.reason == "affinity"
        assert dict(d.scores[0].terms)["scratch_s"] == 0.0


def _spill_of(policy: Cost, tokens: list[int], n: int = 8) -> str:
    """Where ``tokens`` (hot) spills once each replica it picks has a long queue."""
    queued: dict[str, int] = {}
    for _ in range(n):
        d = policy.choose(request(tokens), views(n, queued=queued))
        if d.reason == "spill":
            return d.chosen
        queued[d.chosen] = 200_000
    raise AssertionError(f"never spilled: {queued}")


def test_spills_among_idle_replicas_go_by_the_prefix_not_to_the_fleets_first() -> None:
    policy = Cost(CostConfig(min_scratch=1, max_scratch_fraction=0.125))
    docs = [doc(i) for i in range(12)]
    for _ in range(4):  # each seen often enough to be hot
        for tokens in docs:
            route(policy, tokens, views())
    spills = []
    for tokens in docs:
        chosen = _spill_of(policy, tokens)
        assert _spill_of(policy, tokens) == chosen  # one prefix, one spill target
        spills.append(chosen)
    # the fleet's first replica took every spill when ties went by the fleet's order
    assert len(set(spills)) >= 3, spills


def test_between_equally_loaded_replicas_the_least_loaded_is_a_scratch_one() -> None:
    policy = Cost()
    fleet = views(6, queued={f"r{i}": 500 for i in range(6)})
    up = [True] * 6
    for key in range(6):
        least, outside = policy._least_loaded(fleet, up, {3, 4}, key)
        assert least in (3, 4) and outside not in (3, 4)
    # a less loaded replica still wins, scratch or not
    fleet = views(6, queued={**{f"r{i}": 500 for i in range(6)}, "r1": 100})
    assert policy._least_loaded(fleet, up, {3, 4}, 5) == (1, 1)


def test_a_restart_forgets_the_replicas_learned_decode_slots() -> None:
    policy = Cost()
    full = [ReplicaView(f"r{i}", kv_capacity_tokens=4000, running=64 if i == 0 else 0,
                        waiting=5 if i == 0 else 0) for i in range(4)]
    for n in range(12):  # r0 seen full, others waiting, scrape after scrape
        policy.choose(request(doc(n), at=float(n)), full)
    slots = policy.describe()["slots"]
    assert isinstance(slots, dict) and slots["r0"] == 64
    policy.observe(ReplicaReset("r0"))  # it may come back running fewer at once
    slots = policy.describe()["slots"]
    assert isinstance(slots, dict) and slots.get("r0") is None


def test_a_decode_slot_is_waited_for_by_the_requests_there_now_not_at_the_last_scrape(
        ) -> None:
    """The scraped gauges lag a scrape interval: requests of this gateway's that they
    showed running have since finished (``in_flight``), and only what they held beyond
    this gateway's own then (``others_in_flight``) still counts as other senders'."""
    policy = Cost()
    full = [ReplicaView(f"r{i}", kv_capacity_tokens=4000, running=8, waiting=4)
            for i in range(4)]
    for n in range(12):  # each seen full with others waiting: 8 slots
        policy.choose(request(doc(n), at=float(n)), full)
    policy.observe(Finished(request(doc(0), at=12.0), "r0", True, 0, None, 2.0))
    assert policy.describe()["slots"] == {f"r{i}": 8 for i in range(4)}
    stale = full[0]._replace(in_flight=0, others_in_flight=0)  # the 12 were ours: done
    assert policy._slot_wait(stale) == 0.0
    ours = full[0]._replace(in_flight=12, others_in_flight=0)  # ours, still there
    others = full[0]._replace(in_flight=0, others_in_flight=12)  # another sender's
    assert policy._slot_wait(ours) == policy._slot_wait(others) > 0.0


def test_no_hot_prefix_is_placed_on_a_removed_replica_again() -> None:
    policy = Cost(CostConfig(min_scratch=1))
    six = views(n=6)
    for i in range(24):  # hot documents, placed over all six, still hot at the window
        for _ in range(6):
            route(policy, doc(i), six, at=float(i))
    assert policy._placement.tokens_on("r5") > 0
    policy.observe(ReplicaRemoved("r5"))
    five = views(n=5)
    window = policy.describe()["sketch_window"]
    assert isinstance(window, int) and window > 144
    for n in range(window - 144):  # one-off documents only, up to the sketch window,
        route(policy, doc(10_000 + n), five, at=100.0 + n)  # which homes the hot set again
    assert len(policy._placement) == 24
    policy.check_integrity()
    assert policy._placement.tokens_on("r5") == 0


def test_a_replica_of_weight_zero_holding_the_prompt_is_never_chosen() -> None:
    # its wait is 0 x inf (nothing queued, no speed): scored as never starting, not NaN
    policy = Cost()
    tokens = doc(7)
    fleet = views()
    holder = route(policy, tokens, fleet)
    weightless = [v._replace(weight=0.0) if v.id == holder else v for v in fleet]
    decision = policy.choose(request(doc(7)), weightless)
    assert decision.chosen != holder
    assert all(s.score == s.score for s in decision.scores)  # no NaN among them


def test_long_model_names_are_not_kept_by_the_key_memo() -> None:
    # a client names the model: a long name is hashed per request, not kept
    policy = Cost()
    fleet = views()
    for i in range(3):
        long_name = f"{i}" + "m" * 10_000
        req = RouteRequest(tokens=doc(i), prompt_tokens=DOC, model=long_name, arrival_s=0.0)
        policy.observe(Routed(req, policy.choose(req, fleet).chosen))
    route(policy, doc(9), fleet)
    assert sum(len(name[0] or "") for name in policy._keys.kept_names()) < 100


def test_a_decision_over_a_tenants_partition_leaves_the_fleets_homes_alone() -> None:
    # a partitioned tenant's decisions see part of the fleet: placing hot keys over that
    # part re-homed every hot prefix onto it, and the next decision over the whole fleet
    # moved them all back
    policy = Cost(CostConfig(min_scratch=1))
    fleet = views(n=6)
    hot = [doc(7000 + i) for i in range(6)]
    for t in range(4):
        for tokens in hot:
            route(policy, tokens, fleet, at=t)
    placed = policy.describe()["placed_hot_tokens"]
    homes = [policy.choose(request(tokens, at=5), fleet).chosen for tokens in hot]
    partition = fleet[:2]
    new_hot = doc(9999)
    for t in range(4):  # a new hot key, and the others, asked for inside the partition
        for tokens in [new_hot, *hot]:
            chosen = route(policy, tokens, partition, at=6 + t)
            assert chosen in {"r0", "r1"}
    assert policy.describe()["placed_hot_tokens"] == placed
    assert [policy.choose(request(tokens, at=20), fleet).chosen for tokens in hot] == homes
    policy.check_integrity()


@pytest.mark.parametrize("apart_s", [0.3, 0.05])
def test_each_tenants_partition_ages_its_replicas_by_their_own_time(apart_s: float) -> None:
    # decisions over two partitions in turn: each aged its replicas by the time since the
    # other's decision (half the others' prefill), and a partition whose decisions came
    # within 0.25 s of the other's was never refreshed (never aged, its replicas unknown)
    def views(ids: list[str]) -> list[ReplicaView]:
        return [ReplicaView(r, kv_capacity_tokens=10**9, prefill_tokens_per_s=5000.0)
                for r in ids]

    policy, t, i = Cost(), 0.0, 0
    while t < 60.0:
        for ids, at in ((["a0", "a1"], t), (["b0", "b1"], t + apart_s)):
            policy.choose(RouteRequest(tokens=list(range(i, i + 20)), prompt_tokens=20,
                                       arrival_s=at), views(ids))
            i += 20
        t += 0.6
    aged = {rid: model.used for rid, model in policy._models.models()}
    assert sorted(aged) == ["a0", "a1", "b0", "b1"]
    assert all(290_000 < used <= 300_000 for used in aged.values()), aged


def test_equally_idle_replicas_are_told_apart_in_id_order_not_the_fleets() -> None:
    # gateway copies whose discovery listed the replicas in another order spilled one
    # prefix to different idle replicas
    chosen = set()
    for order in (["r0", "r1", "r2", "r3"], ["r2", "r0", "r3", "r1"]):
        policy = Cost()
        views = [ReplicaView(rid) for rid in order]
        policy._index_of(order)
        best, _ = policy._least_loaded(views, [True] * 4, set(), key=6)
        chosen.add(order[best])
    assert chosen == {"r2"}  # 6 % 4 in id order


def test_a_restart_is_read_by_the_next_decision_however_soon() -> None:
    """The views are read at most every 0.25 s of arrivals; a restart told meanwhile must
    not leave the next prompts in the old process's model, dropped when the new epoch is
    read (they were then predicted nowhere)."""
    policy = Cost()
    tokens = doc(5)
    home = route(policy, tokens, views(), at=0.0)
    policy.observe(ReplicaReset(home))
    restarted = views(epoch=1)
    again = route(policy, tokens, restarted, at=0.1)
    later = policy.choose(request(tokens, at=1.0), restarted)
    assert later.chosen == again and later.reason == "cache_match"
