"""The cache models aged out of arrival order."""

from policies.base import ReplicaView
from policies.replica_models import ReplicaModels


def _size(_: str) -> tuple[int, int]:
    return 0, 10**9


def test_a_decision_out_of_arrival_order_does_not_age_a_model_twice() -> None:
    # requests tokenized on the pool reach the policy out of arrival order: the late one's
    # earlier arrival time moved the model's clock back, and the seconds in between were
    # counted again as other senders' prefill at the next aging
    models = ReplicaModels(60.0)
    view = [ReplicaView("r0", prefill_tokens_per_s=1000.0)]
    for now in (0.0, 10.0, 5.0, 11.0):
        models.age(view, now, _size)
    model = models.get("r0")
    assert model is not None
    assert model.used == 11_000  # 11 s at 1,000 tokens/s, none of them twice
    models.check_integrity()
