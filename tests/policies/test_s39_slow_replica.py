"""``cost`` learns each replica's own prefill pace from its first-token times and weighs
one clearly slower than the fleet (another device generation, a throttled one) at its own
pace: a prompt whose part the slow replica holds goes to an idle replica that prefills it
whole sooner, and its scratch set passes over a slow replica. ``ReplicaSlowdown`` reads a
replica as slow only past ``ratio``, with enough samples, and forgets one that left or
restarted."""

from __future__ import annotations

import random

import pytest

from policies.base import Finished, ReplicaRemoved, ReplicaReset, ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.cost_config import CostConfig
from policies.pace import MAX_SLOWDOWN, PrefillPace, ReplicaSlowdown
from policies.ring import RingCache
from policies.scratch_set import ScratchSet

FLEET_S = 1e-4  # seconds per uncached token on the fleet's devices


def _tokens(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def _request(tokens: list[int], at: float) -> RouteRequest:
    return RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="m", arrival_s=at)


def _views() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=50_000) for i in range(4)]


def _learn(policy: Cost, slow: dict[str, float], per_replica: int = 40) -> None:
    """``per_replica`` one-off 1,000-token prompts answered by each replica, uncached,
    its first token after 1,000 x FLEET_S x its slowdown (1 unless in ``slow``)."""
    seed = 1000
    for rid in (v.id for v in _views()):
        for _ in range(per_replica):
            seed += 1
            req = _request(_tokens(seed, 1000), 0.0)
            ttft = 1000 * FLEET_S * slow.get(rid, 1.0)
            policy.observe(Finished(req, rid, ok=True, cached_tokens=0, ttft_s=ttft,
                                    duration_s=ttft + 0.1))


def _choice_with_half_held_on_r3(config: CostConfig) -> tuple[str, dict[str, dict[str, float]]]:
    """The replica chosen, idle fleet, for a 2,000-token prompt whose first 1,000 tokens
    r3 holds (routed there before); each scored replica's terms."""
    policy = Cost(config)
    _learn(policy, {"r3": 4.0})
    head = _tokens(7, 1000)
    first = _request(head, 1.0)
    policy.choose(first, _views())
    policy.observe(Routed(first, "r3"))
    policy.observe(Finished(first, "r3", ok=True, cached_tokens=0, ttft_s=0.4,
                            duration_s=0.5))
    decision = policy.choose(_request(head + _tokens(8, 1000), 2.0), _views())
    return decision.chosen, {s.replica: dict(s.terms) for s in decision.scores}


def test_a_slow_replica_holding_half_the_prompt_loses_to_an_idle_fast_one() -> None:
    chosen, terms = _choice_with_half_held_on_r3(CostConfig())
    # r3 would prefill its 1,000 uncached tokens at 4x: twice what an idle one pays for
    # 2,000 (0.4 s, weighed twice); so much that it was not even scored
    assert chosen != "r3" and "r3" not in terms, terms
    assert terms[chosen]["prefill_s"] == pytest.approx(2 * 2000 * FLEET_S), terms


def test_without_it_the_replica_holding_half_the_prompt_wins() -> None:
    chosen, terms = _choice_with_half_held_on_r3(CostConfig(slow_replica_ratio=None))
    assert chosen == "r3", terms


def test_a_replica_is_slow_only_past_the_ratio_with_enough_samples() -> None:
    fleet = PrefillPace(FLEET_S)
    slow = ReplicaSlowdown(FLEET_S, ratio=1.5)

    def answered(rid: str, times: float, n: int) -> None:
        for _ in range(n):
            fleet.observe(1000 * FLEET_S * times, 1000)
            slow.observe(rid, 1000 * FLEET_S * times, 1000, fleet)

    answered("fast", 1.0, 64)
    answered("a bit slower", 1.3, 64)  # under the ratio: noise, or what weights say
    answered("new", 3.0, 31)  # too few samples yet
    assert [slow.slow().get(r, 1.0) for r in ("fast", "a bit slower", "new")] == [1.0, 1.0, 1.0]
    answered("new", 3.0, 1)
    assert slow.slow().get("new", 1.0) == pytest.approx(3.0)
    answered("stalled", 50.0, 32)
    assert slow.slow().get("stalled", 1.0) == MAX_SLOWDOWN
    assert set(slow.slow()) == {"new", "stalled"}
    slow.forget("new")
    assert slow.slow().get("new", 1.0) == 1.0 and set(slow.slow()) == {"stalled"}


@pytest.mark.parametrize("event", [ReplicaRemoved("r3"), ReplicaReset("r3")])
def test_a_replica_that_left_or_restarted_starts_at_the_fleets_pace(
        event: ReplicaRemoved | ReplicaReset) -> None:
    policy = Cost()
    _learn(policy, {"r3": 4.0})
    assert policy.describe()["slow_replicas"] == {"r3": pytest.approx(4.0)}
    policy.observe(event)
    assert policy.describe()["slow_replicas"] == {}


@pytest.mark.parametrize("ratio", [0.5, float("nan")])
def test_a_ratio_under_one_is_refused(ratio: float) -> None:
    with pytest.raises(ValueError, match="slow_replica_ratio must be >= 1 or null"):
        CostConfig(slow_replica_ratio=ratio).validate()


def _scratch_members(scratch: ScratchSet, avoid: frozenset[int]) -> list[str]:
    ids = [f"r{i}" for i in range(8)]
    ring, owners = RingCache(64).layout(ids, [1.0] * 8)
    return [ids[i] for i in scratch.members(ring.points, owners, len(ring), [True] * 8, 8,
                                            avoid)]


def test_the_scratch_set_passes_over_slow_replicas_while_there_are_others() -> None:
    scratch = ScratchSet(CostConfig(min_scratch=2))
    first = _scratch_members(scratch, frozenset())
    slow = int(first[0][1:])
    second = _scratch_members(scratch, frozenset({slow}))
    assert first[0] not in second and first[1] in second and len(second) == 2
    # every replica slow: the set is what it was
    assert _scratch_members(scratch, frozenset(range(8))) == first
    # all but one slow: that one, then the first slow one on the ring
    fast = int(next(f"r{i}" for i in range(8) if f"r{i}" not in first)[1:])
    assert _scratch_members(scratch, frozenset(range(8)) - {fast}) == [f"r{fast}", first[0]]


def test_cost_takes_a_replica_found_slow_out_of_its_scratch_set() -> None:
    policy = Cost(CostConfig(min_scratch=2))
    before = policy.scratch_set(_views())
    _learn(policy, {before[0]: 3.0})
    after = policy.scratch_set(_views())
    assert before[0] not in after and before[1] in after, (before, after)


def _routed_answer(policy: Cost, tokens: list[int], rid: str, at: float, ttft: float) -> None:
    """``tokens`` routed to ``rid`` and answered, its usage telling no cached tokens."""
    req = _request(tokens, at)
    policy.choose(req, _big_views())
    policy.observe(Routed(req, rid))
    policy.observe(Finished(req, rid, ok=True, cached_tokens=0, ttft_s=ttft, duration_s=0.5,
                            cached_told=False))


def _big_views() -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", kv_capacity_tokens=500_000) for i in range(4)]


def test_untold_answers_the_model_predicted_partly_cached_teach_no_replica_pace() -> None:
    # vLLM without --enable-prompt-tokens-details: r3's cache lost the documents the model
    # believes it holds, so it prefills questions' whole prompts (2,000 tokens) where the
    # model predicted 1,000: read so, r3 would look twice as slow as it is
    policy = Cost()
    seed, at = 7000, 0.0
    docs = [_tokens(seed + i, 1000) for i in range(40)]
    for doc in docs:  # first sight: the whole prompt prefilled, as predicted
        at += 0.1
        _routed_answer(policy, doc, "r3", at, 1000 * FLEET_S)
    for round_ in range(5):
        for i, doc in enumerate(docs):
            for rid in ("r0", "r1", "r2") if i % 2 == 0 else ():  # the fleet's one-offs
                seed += 1
                _routed_answer(policy, _tokens(seed + 10_000, 1000), rid, at, 1000 * FLEET_S)
            at += 0.1
            question = _tokens(20_000 + 100 * i + round_, 1000)
            _routed_answer(policy, doc + question, "r3", at, 2000 * FLEET_S)
    assert policy.describe()["prefill_s_per_token"] == pytest.approx(FLEET_S)
    assert policy.describe()["slow_replicas"] == {}


def test_a_removed_replicas_late_answers_keep_no_pace() -> None:
    policy = Cost()
    _learn(policy, {"r3": 4.0})
    policy.observe(ReplicaRemoved("r3"))
    for seed in range(40):  # answers of requests sent before it left
        req = _request(_tokens(9000 + seed, 1000), 3.0)
        policy.observe(Finished(req, "r3", ok=True, cached_tokens=0, ttft_s=0.4,
                                duration_s=0.5))
    assert policy._slow is not None and "r3" not in policy._slow._paces


def test_a_flush_keeps_what_was_learned_of_the_replicas_pace() -> None:
    policy = Cost()
    _learn(policy, {"r3": 4.0})
    policy.observe(ReplicaReset("r3", cache_only=True))
    assert policy.describe()["slow_replicas"] == {"r3": pytest.approx(4.0)}
