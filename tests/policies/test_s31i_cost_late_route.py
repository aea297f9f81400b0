"""cost, one instance per model, and a route told after its replica left: a model first
seen after the removal keeps nothing of the gone replica either; a replica one model
stopped using is still another's."""

import random

from policies.base import ReplicaRemoved, ReplicaView, Routed, RouteRequest
from policies.cost import Cost
from policies.per_model import PerModel


def _request(seed: int, model: str, at: float = 0.0) -> RouteRequest:
    rng = random.Random(seed)
    ids = [rng.randrange(50_000) for _ in range(800)]
    return RouteRequest(tokens=ids, prompt_tokens=len(ids), model=model, arrival_s=at)


def test_a_model_first_seen_after_a_removal_keeps_nothing_of_the_gone_replica() -> None:
    policy = PerModel(Cost(), Cost)
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    first = _request(1, "a")
    policy.choose(first, fleet)
    policy.observe(Routed(first, "r1", fleet))
    policy.observe(ReplicaRemoved("r1"))
    # another worker's route for a model this one has not seen, told after the removal
    policy.observe(Routed(_request(2, "b"), "r1", revocable=False))
    late = policy.policy_for("b")
    assert isinstance(late, Cost)
    assert late._models.get("r1") is None
    assert "r1" not in late.describe()["model_tokens"]  # type: ignore[operator]
    late.check_integrity()
    # back in the fleet (a decision's views hold it), it is modelled again for every model
    again = _request(3, "b", at=1.0)
    policy.choose(again, fleet)
    policy.observe(Routed(again, "r1", fleet))
    assert late._models.get("r1") is not None
    policy.observe(Routed(_request(4, "a", at=1.0), "r1", revocable=False))
    assert policy.policy_for("a")._models.get("r1") is not None  # type: ignore[attr-defined]


def test_a_replica_one_model_stopped_using_is_still_modelled_for_another() -> None:
    policy = PerModel(Cost(), Cost)
    both = [ReplicaView("r0"), ReplicaView("r1")]
    for model in ("a", "b"):
        request = _request(5, model)
        policy.choose(request, both)
        policy.observe(Routed(request, "r1", both))
    # r1 serves model b alone from now on: model a's decisions no longer see it
    later = _request(6, "a", at=700.0)
    policy.choose(later, both[:1])
    a, b = policy.policy_for("a"), policy.policy_for("b")
    assert isinstance(a, Cost) and isinstance(b, Cost)
    assert a._models.get("r1") is None  # forgotten by the model that stopped using it
    # another worker's route of model b to r1 still counts there
    told = _request(7, "b", at=700.0)
    policy.observe(Routed(told, "r1", revocable=False))
    model = b._models.get("r1")
    assert model is not None and model.used == 1600
    a.check_integrity()
    b.check_integrity()
