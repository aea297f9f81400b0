import random
from collections import Counter

from policies.base import ReplicaRemoved, ReplicaReset, ReplicaView, Routed, RouteRequest
from policies.radix import Radix, RadixConfig
from tests.support.policy_state import snapshot


def doc(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def fleet(n: int = 4, **loads: int) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", queued_tokens=loads.get(f"r{i}", 0)) for i in range(n)]


def route(policy: Radix, tokens: list[int], views: list[ReplicaView], to: str | None = None) -> str:
    req = RouteRequest(tokens, len(tokens))
    rid = to or policy.choose(req, views).chosen
    policy.observe(Routed(req, rid, views))
    policy.check_integrity()
    return rid


def test_routes_to_the_holder_and_choose_is_pure() -> None:
    policy = Radix()
    views = fleet()
    body = doc(1, 3000)
    route(policy, [*body, 1], views, to="r2")
    req = RouteRequest([*body, 2, 3], 3002)
    before = snapshot(policy)
    d = policy.choose(req, views)
    assert (d.chosen, d.reason, d.matched_tokens) == ("r2", "cache_match", 3000)
    assert policy.choose(req, views) == d and policy.tree.tokens == {"r2": 3001}
    # nor does a view of a restarted replica, which choose only reads
    restarted = [*views[:2], ReplicaView("r2", epoch=1), *views[3:]]
    assert policy.choose(req, restarted).reason == "balance"
    assert snapshot(policy) == before


def test_ties_at_random_on_a_miss_and_on_a_match() -> None:
    policy = Radix(RadixConfig(seed=7))
    views = fleet(4)
    miss = RouteRequest(doc(2, 500), 500)
    misses = Counter(policy.choose(miss, views).chosen for _ in range(200))
    assert set(misses) == {"r0", "r1", "r2", "r3"}
    body = doc(3, 2000)
    route(policy, body, views, to="r1")
    route(policy, body, views, to="r3")
    hits = Counter(policy.choose(RouteRequest(body, 2000), views).chosen for _ in range(200))
    assert set(hits) == {"r1", "r3"} and min(hits.values()) > 40


def test_imbalance_is_judged_for_the_candidate() -> None:
    cfg = RadixConfig(balance_abs_tokens=10_000, balance_rel=1.5)
    policy = Radix(cfg)
    body = doc(4, 2000)
    route(policy, body, fleet(), to="r1")
    # another replica is swamped: the holder still gets its prefix (no fleet-wide switch)
    d = policy.choose(RouteRequest(body, 2000), fleet(r0=500_000, r1=3_000))
    assert (d.chosen, d.reason) == ("r1", "cache_match")
    # the holder itself is overloaded against the least loaded: spill
    d = policy.choose(RouteRequest(body, 2000), fleet(r0=1_000, r1=50_000, r2=900, r3=2_000))
    assert (d.chosen, d.reason) == ("r2", "spill")
    assert d.scores[[s.replica for s in d.scores].index("r1")].matched_tokens == 2000


def test_shared_system_prompt_alone_is_not_a_match() -> None:
    policy = Radix()
    views = fleet(4)
    system = doc(5, 1500)
    for i in range(4):
        route(policy, system + doc(100 + i, 300), views, to=f"r{i}")
    fresh = system + doc(999, 300)
    d = policy.choose(RouteRequest(fresh, len(fresh)), views)
    assert d.reason == "balance" and d.matched_tokens == 1500
    own = system + doc(102, 300)
    d = policy.choose(RouteRequest(own, len(own)), views)
    assert (d.chosen, d.reason) == ("r2", "cache_match")


def test_minimum_match_length() -> None:
    policy = Radix(RadixConfig(min_match_tokens=600, cache_threshold=0.0))
    views = fleet(2)
    body = doc(6, 500)
    route(policy, body, views, to="r0")
    assert policy.choose(RouteRequest(body + doc(7, 50), 550), views).reason == "balance"


def test_restart_and_removal_forget_the_replica() -> None:
    policy = Radix()
    views = fleet(3)
    a, b = doc(8, 1000), doc(9, 1000)
    route(policy, a, views, to="r0")
    route(policy, b, views, to="r1")
    restarted = [views[0], ReplicaView("r1", epoch=1), views[2]]
    d = policy.choose(RouteRequest(b, 1000), restarted)
    assert d.reason == "balance"  # the restarted replica counts as empty at once
    assert "r1" in policy.tree.tokens  # dropped at the next observe, not in choose
    route(policy, doc(10, 200), restarted, to="r2")
    assert "r1" not in policy.tree.tokens
    route(policy, b, restarted, to="r1")
    assert policy.choose(RouteRequest(b, 1000), restarted).chosen == "r1"
    policy.observe(ReplicaReset("r1"))
    policy.observe(ReplicaRemoved("r0"))
    policy.check_integrity()
    assert set(policy.tree.tokens) == {"r2"}


def test_budget_follows_kv_capacity_with_fallback() -> None:
    cfg = RadixConfig(default_capacity_tokens=5_000, capacity_fraction=0.5)
    policy = Radix(cfg)
    views = [ReplicaView("big", kv_capacity_tokens=20_000), ReplicaView("small")]
    docs = [doc(20 + i, 1000) for i in range(30)]
    for i, d in enumerate(docs):
        req = RouteRequest(d, 1000)
        policy.choose(req, views)
        policy.observe(Routed(req, "big" if i % 2 else "small", views))
        policy.check_integrity()
    assert policy.budget("big") == 10_000 and policy.budget("small") == 2_500
    assert 9_000 <= policy.tree.tokens["big"] <= 10_000
    assert policy.tree.tokens["small"] <= 2_500
    # the most recent documents survive, the oldest are gone
    assert policy.choose(RouteRequest(docs[-1], 1000), views).chosen == "big"
    oldest = policy.choose(RouteRequest(docs[1], 1000), views)
    assert oldest.reason == "balance" and oldest.matched_tokens == 0


def test_whole_tree_memory_bound() -> None:
    policy = Radix(RadixConfig(max_tree_mb=0.05))
    views = fleet(4)
    for i in range(40):
        route(policy, doc(i, 2000), views, to=f"r{i % 4}")
        assert policy.tree.estimated_bytes() <= 0.05 * 1024 * 1024
    assert policy.tree.nodes > 0


def test_a_replica_removed_between_a_decision_and_its_send_is_not_brought_back() -> None:
    # the send's event carries the decision's snapshot, which still named the replica
    # discovery removed meanwhile: it was learned again and never forgotten
    policy = Radix()
    for k in range(50):
        views = [ReplicaView("stay"), ReplicaView(f"pod-{k}")]
        request = RouteRequest(tokens=[k] * 40, prompt_tokens=40)
        policy.choose(request, views)
        policy.observe(ReplicaRemoved(f"pod-{k}"))
        policy.observe(Routed(request, "stay", views))
    assert set(policy._seen) == set(policy._epochs) == {"stay"}
