"""A finished request of a model whose policy state was let go."""

from policies.base import Finished, ReplicaView, Routed, RouteRequest
from policies.per_model import PerModel
from policies.round_robin import RoundRobin


def test_a_finished_request_does_not_push_out_a_model_in_use() -> None:
    made: list[RoundRobin] = []

    def make() -> RoundRobin:
        made.append(RoundRobin())
        return made[-1]

    policy = PerModel(make(), make, max_models=2)
    fleet = [ReplicaView("r0"), ReplicaView("r1")]
    a, b, c = (RouteRequest((), 10, model=m) for m in "abc")
    for req in (a, b, c):  # c takes b's place (a holds the first instance)
        policy.observe(Routed(req, policy.choose(req, fleet).chosen, fleet))
    kept = dict(policy._by_model)
    assert list(kept) == ["a", "c"]
    # b's answer comes after its state was let go: it has nothing to tell a new one, and
    # made one in c's place
    policy.observe(Finished(b, "r0", True, 0, 0.1, 1.0))
    assert policy._by_model == kept
    assert len(made) == 3
