"""``cost`` where caches thrash: an eviction from a cache that takes in prompts every few
seconds costs only the hit its victim would have had before leaving anyway, and a hot
document its home lost is not queued there into the tail."""

from __future__ import annotations

import math
import random

import pytest

from policies.base import ReplicaView, Routed, RouteRequest
from policies.cost import Cost, CostConfig
from policies.replica_models import ReplicaModels

DOC = 1000  # tokens per document in these tests
PACE = 1e-4


def views(n: int, capacity: int, queued: dict[str, int] | None = None, epoch: int = 0
          ) -> list[ReplicaView]:
    queued = queued or {}
    return [ReplicaView(f"r{i}", queued_tokens=queued.get(f"r{i}", 0),
                        kv_capacity_tokens=capacity, epoch=epoch) for i in range(n)]


def doc(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(DOC + 20)]


def request(tokens: list[int], at: float) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def test_the_eviction_loss_is_the_victims_chance_of_coming_back_before_it_would_go() -> None:
    models = ReplicaModels(60.0)
    view = ReplicaView("r0", kv_capacity_tokens=4000)
    assert models.eviction_loss(view, 1000, 0.5, 10.0) == 1.0  # nothing known of its inflow
    for inflow, loss in [(100.0, -math.expm1(-0.5 * 10)), (1e5, -math.expm1(-0.5 * 0.01))]:
        seen = view._replace(prefill_tokens_per_s=inflow)
        assert models.eviction_loss(seen, 1000, 0.5, 10.0) == pytest.approx(loss)
    assert models.eviction_loss(view._replace(prefill_tokens_per_s=1e5), 1000, 0.0,
                                10.0) == 1.0  # the victims' rate unknown


@pytest.mark.parametrize("survival, hot_docs, to_home", [
    (True, 3, False),  # the home keeps its 3 hot documents: evicting one costs its next hit
    (True, 6, True),  # 6 hot documents churn its room for 3: the victim was about to go
    (False, 6, False),  # without eviction_survival every victim counts in full
])
def test_a_one_off_document_evicts_from_a_home_only_where_the_victim_would_go_anyway(
        survival: bool, hot_docs: int, to_home: bool) -> None:
    policy = Cost(CostConfig(min_scratch=1, prefill_s_per_token=PACE,
                             eviction_survival=survival))
    fleet = views(2, capacity=3100)  # the home's model holds 3 documents, no more
    (scratch,) = policy.scratch_set(fleet)
    home = next(v.id for v in fleet if v.id != scratch)
    for t in range(60 // hot_docs):  # 60 requests for the hot documents, all on the home
        for seed in range(hot_docs):
            req = request(doc(seed), at=(t * hot_docs + seed) / 6)
            policy.choose(req, fleet)
            policy.observe(Routed(req, home))
    rare = doc(99)
    # the scratch replica 0.6 of a prefill behind: waiting there (0.6, and 0.4 past the
    # tail's 1.2) costs less than a hot document evicted in full, more than one that
    # was about to leave
    d = policy.choose(request(rare, at=10.0),
                      views(2, capacity=3100, queued={scratch: 6 * len(rare) // 10}))
    assert d.chosen == (home if to_home else scratch), d.scores
    terms = {s.replica: dict(s.terms) for s in d.scores}
    evict = terms[home]["evict_s"]  # the home is scored in each case
    full = 2.0 * len(rare) * PACE  # rare_eviction_weight x a whole document
    assert evict < 0.5 * full if to_home else evict > 0.9 * full


@pytest.mark.parametrize("tail_weight, leaves", [(1.0, True), (0.0, False)])
def test_a_hot_document_its_home_lost_is_not_queued_there_into_the_tail(
        tail_weight: float, leaves: bool) -> None:
    # (spill_survival off: the wait is weighed against the whole prompt's prefill)
    policy = Cost(CostConfig(min_scratch=1, prefill_s_per_token=PACE,
                             tail_weight=tail_weight, spill_survival=False))
    tokens = doc(3)
    for k in range(4):  # seen often enough to be hot, among one-off documents (one home)
        for j, tokens_k in enumerate([tokens] + [doc(100 + 10 * k + j) for j in range(10)]):
            req = request(tokens_k, at=k + 0.05 * j)
            policy.observe(Routed(req, policy.choose(req, views(8, 4000)).chosen))
    # the replicas restarted (nothing cached); the home has 0.7 of a prefill queued, so
    # the prompt's first token would come 1.7 prefills away, past the tail's 1.2: waiting
    # (0.7) plus that lateness (0.5) outweighs the prefill a re-cached home saves (1.0)
    home = policy.choose(request(tokens, at=4.0), views(8, 4000, epoch=1)).chosen
    fleet = views(8, 4000, queued={home: 7 * len(tokens) // 10}, epoch=1)
    d = policy.choose(request(tokens, at=4.0), fleet)
    assert (d.chosen != home) is leaves, d.scores
    if leaves:
        assert dict(d.scores[0].terms)["wait_s"] == 0.0
