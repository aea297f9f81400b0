import random

from policies.base import ReplicaView, Routed, RouteRequest
from policies.per_model import PerModel
from policies.radix import Radix, RadixConfig

BOUND_MB = 0.05


def make() -> Radix:
    return Radix(RadixConfig(max_tree_mb=BOUND_MB, chunk_chars=0))


def test_max_tree_mb_bounds_every_models_tree_together() -> None:
    # one radix instance per model: each had a tree of its own under the whole bound, so
    # a fleet of 16 models held 16 times max_tree_mb; the bound is the gateway's
    policy = PerModel(make(), make)
    rng = random.Random(3)
    views = [ReplicaView(f"r{i}", kv_capacity_tokens=10_000_000) for i in range(4)]
    for n in range(400):
        model = f"m{n % 8}"
        tokens = [rng.randrange(50_000) for _ in range(200)]
        request = RouteRequest(tokens, len(tokens), model=model)
        chosen = policy.choose(request, views).chosen
        policy.observe(Routed(request, chosen, views))
    instances = [policy.policy_for(f"m{i}") for i in range(8)]
    assert len({id(p) for p in instances}) == 8  # still one policy state per model
    assert all(isinstance(p, Radix) for p in instances)
    trees = {id(p.tree): p.tree for p in instances if isinstance(p, Radix)}
    assert len(trees) == 1  # one tree, under the one bound
    held = sum(tree.estimated_bytes() for tree in trees.values())
    assert held <= BOUND_MB * 1024 * 1024, (len(trees), held)
    # and each model's prompts are still found in the shared tree, under its own name
    last = RouteRequest(tokens, len(tokens), model=model)
    assert policy.choose(last, views).matched_tokens == len(tokens)


def test_a_restart_seen_by_one_models_instance_is_not_dropped_again_by_another() -> None:
    # one replica serving two names: after its restart, the instance that routes first
    # drops its old entries and makes new ones; the other instance, told the same epoch
    # through the shared tree's records, must not drop those again
    policy = PerModel(make(), make)
    old = [ReplicaView("r", epoch=0, kv_capacity_tokens=1_000_000)]
    new = [ReplicaView("r", epoch=1, kv_capacity_tokens=1_000_000)]
    doc = list(range(1_000, 1_300))
    for model in ("a", "b"):
        policy.observe(Routed(RouteRequest(doc, len(doc), model=model), "r", old))
    fresh = RouteRequest(doc, len(doc), model="a")
    policy.observe(Routed(fresh, "r", new))  # the restart, learned by a's instance
    policy.observe(Routed(RouteRequest(list(range(9)), 9, model="b"), "r", new))
    assert policy.choose(fresh, new).matched_tokens == len(doc)
