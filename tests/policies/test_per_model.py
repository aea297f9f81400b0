"""One policy state per model: each model's decisions learn over its own replicas only."""

from __future__ import annotations

import random

import pytest

from kvwire.kv_event_format import BlockStored
from policies.base import ReplicaRemoved, ReplicaReset, ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.per_model import PerModel
from policies.registry import build_policy

DOC = 1000


def doc(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(50_000) for _ in range(DOC + 20)]


def fleet(model: str) -> list[ReplicaView]:
    return [ReplicaView(f"{model}{i}", kv_capacity_tokens=8000) for i in range(4)]


def per_model(**kwargs: object) -> PerModel:
    return PerModel(build_policy({"name": "cost"}), lambda: build_policy({"name": "cost"}),
                    **kwargs)  # type: ignore[arg-type]


def route(policy: PerModel, model: str, tokens: list[int], at: float) -> str:
    req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=model, arrival_s=at)
    chosen = policy.choose(req, fleet(model)).chosen
    policy.observe(Routed(req, chosen))
    return chosen


def test_two_models_on_their_own_replicas_learn_apart() -> None:
    policy = per_model()
    for n in range(600):  # the two models' requests alternate, each with hot documents
        model = "a" if n % 2 else "b"
        assert route(policy, model, doc(n % 20 + (100 if model == "b" else 0)),
                     float(n)).startswith(model)
    a, b = policy.policy_for("a"), policy.policy_for("b")
    assert isinstance(a, Cost) and isinstance(b, Cost) and a is not b
    for model, state in (("a", a), ("b", b)):
        placed = state.describe()["placed_hot_tokens"]
        assert isinstance(placed, dict) and placed
        assert all(rid.startswith(model) for rid in placed)  # never the other's replicas
        a.check_integrity()
        b.check_integrity()
    described = policy.describe()["models"]
    assert isinstance(described, dict) and set(described) == {"a", "b"}


def test_one_model_is_the_first_policy_as_it_was() -> None:
    first = build_policy({"name": "cost"})
    policy = PerModel(first, lambda: build_policy({"name": "cost"}))
    route(policy, "a", doc(1), 0.0)
    assert policy.policy_for("a") is first
    assert policy.describe() == first.describe()
    assert policy.name == "cost" and policy.reasons == first.reasons


def test_instances_share_the_kv_index_and_hear_of_replicas_that_leave() -> None:
    policy = per_model()
    route(policy, "a", doc(1), 0.0)
    route(policy, "b", doc(2), 0.0)
    a, b = policy.policy_for("a"), policy.policy_for("b")
    assert a.kv_index is not None and a.kv_index is b.kv_index is policy.kv_index
    holders_before = b.choose(RouteRequest(tokens=doc(2), prompt_tokens=DOC + 20, model="b",
                                           arrival_s=1.0), fleet("b")).matched_tokens
    assert holders_before > 0
    for i in range(4):
        policy.observe(ReplicaRemoved(f"b{i}"))
    after = b.choose(RouteRequest(tokens=doc(2), prompt_tokens=DOC + 20, model="b",
                                  arrival_s=2.0), fleet("b")).matched_tokens
    assert after == 0


@pytest.mark.parametrize("name", ["cost", "kv_events"])
def test_a_restart_heard_by_every_models_state_is_counted_once(name: str) -> None:
    # each model's instance resets the index they share: one restart was counted (and
    # the replica's resets, which start a replay of its events) once per model
    policy = PerModel(build_policy({"name": name}), lambda: build_policy({"name": name}))
    for model in ("a", "b", "c"):
        policy.policy_for(model)
    index = policy.kv_index
    assert index is not None
    index.apply("a0", 0, [BlockStored((7,), None, tuple(range(16)), 16)])
    policy.observe(ReplicaReset("a0"))
    assert index.stats.restarts == 1 and index.resets["a0"] == 1
    assert index.num_blocks("a0") == 0 and index.last_seq("a0") is None
    index.apply("a0", 0, [BlockStored((7,), None, tuple(range(16)), 16)])
    policy.observe(ReplicaReset("a0"))  # a second restart, after it was heard from again
    assert index.stats.restarts == 2 and index.resets["a0"] == 2


def test_past_max_models_a_new_model_takes_the_least_recent_ones_place() -> None:
    # a fleet rolling model versions: models that left must not leave later ones sharing
    # the first model's state (which mixed their placements)
    policy = per_model(max_models=3)
    for model in ("a", "b", "c"):
        route(policy, model, doc(ord(model)), 0.0)
    b = policy._by_model["b"]
    route(policy, "d", doc(ord("d")), 0.0)  # b is the least recent but the first's (a)
    assert set(policy._by_model) == {"a", "c", "d"}
    d = policy._by_model["d"]
    assert d is not policy.first and d is not b
    assert policy.policy_for("a") is policy.first  # the first keeps its place
    route(policy, "e", doc(ord("e")), 0.0)  # c now the least recent
    assert set(policy._by_model) == {"a", "d", "e"}
    assert len({id(policy.policy_for(m)) for m in ("a", "d", "e")}) == 3
    one = per_model(max_models=1)
    route(one, "a", doc(1), 0.0)
    assert one.policy_for("b") is one.first  # nothing else to give up
    with pytest.raises(ValueError, match="max_models"):
        per_model(max_models=0)


def test_names_no_replica_lists_share_one_state() -> None:
    """Where a replica lists more models than the gateway keeps, a name none lists is
    routed, not refused: made-up names share one state instead of pushing the fleet's
    models out of the bounded set one by one."""
    listed = {"a", "b"}
    policy = per_model(max_models=3, listed=listed.__contains__)
    route(policy, "a", doc(1), 0.0)
    route(policy, "b", doc(2), 1.0)
    a, b = policy.policy_for("a"), policy.policy_for("b")
    for n in range(20):
        route(policy, f"made-up-{n}", doc(n), 2.0 + n)
    assert policy.policy_for("a") is a and policy.policy_for("b") is b
    assert policy.policy_for("made-up-x") is policy.policy_for(None)
    assert len(policy.describe()["models"]) == 3  # type: ignore[arg-type]



def test_explaining_a_model_not_routed_yet_keeps_every_models_state() -> None:
    policy = per_model(max_models=2)
    for model in ("a", "b"):
        route(policy, model, doc(ord(model)), 0.0)
    kept = list(policy._by_model.items())
    tokens = doc(ord("c"))
    req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model="c", arrival_s=1.0)
    explained = policy.explain(req, fleet("c"))
    assert explained.chosen in {r.id for r in fleet("c")}
    assert list(policy._by_model.items()) == kept  # none made, let go or moved
    policy.explain(RouteRequest(tokens=doc(ord("a")), prompt_tokens=DOC, model="a",
                                arrival_s=1.0), fleet("a"))
    assert list(policy._by_model) == ["a", "b"]  # an explain is no use of "a"


def test_adapters_are_decided_by_their_base_models_state() -> None:
    # each adapter had an instance of its own: none saw the others' load or hot prefixes
    # on the replicas they share, and past max_models adapters they pushed each other's
    # learned state out one after another
    policy = per_model(max_models=4)
    replicas = fleet("b")
    for n in range(400):
        adapter = f"b-lora-{n % 10}"
        tokens = doc(n % 3)  # three documents hot for every adapter
        req = RouteRequest(tokens=tokens, prompt_tokens=len(tokens), model=adapter,
                           arrival_s=float(n), base_model="b")
        policy.observe(Routed(req, policy.choose(req, replicas).chosen))
    state = policy.policy_for("b")
    assert isinstance(state, Cost)
    assert "models" not in policy.describe()  # one instance
    placed = state.describe()["placed_hot_tokens"]
    assert isinstance(placed, dict)
    # every adapter's three documents are placed (keys apart: 30), on the base's replicas
    assert len(state._placement) == 30 and set(placed) <= {v.id for v in replicas}
    state.check_integrity()
