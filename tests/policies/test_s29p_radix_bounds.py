import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.radix import Radix, RadixConfig


def doc(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(n)]


def send(policy: Radix, tokens: list[int], to: str, views: list[ReplicaView]) -> None:
    policy.observe(Routed(RouteRequest(tokens, len(tokens)), to, views))


def test_a_replica_whose_capacity_shrinks_is_cut_to_its_budget_at_once() -> None:
    # a replica's scraped KV capacity falls (it restarted with a smaller pool, or the
    # fleet's token ratio moved): its share of the tree must fit the new budget when the
    # policy learns it, not at the replica's own next insert, which may never come
    policy = Radix(RadixConfig(capacity_fraction=0.5))
    big = [ReplicaView("a", kv_capacity_tokens=40_000),
           ReplicaView("b", kv_capacity_tokens=40_000)]
    for i in range(15):
        send(policy, doc(i, 1000), "b", big)
    assert policy.tree.tokens["b"] == 15_000
    shrunk = [big[0], ReplicaView("b", kv_capacity_tokens=8_000)]
    send(policy, doc(99, 1000), "a", shrunk)  # a decision's snapshot shows it
    assert policy.budget("b") == 4_000
    assert 3_000 <= policy.tree.tokens["b"] <= 4_000  # LRU leaves went, the newest stay
    policy.check_integrity()
    newest = RouteRequest(doc(14, 1000), 1000)
    assert policy.choose(newest, shrunk).scores[0].matched_tokens == 1000
    oldest = RouteRequest(doc(0, 1000), 1000)
    assert max(s.matched_tokens for s in policy.choose(oldest, shrunk).scores) == 0
