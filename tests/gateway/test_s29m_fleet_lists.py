from gateway.config import ReplicaConfig
from gateway.fleet import Fleet, ModelInfo


def test_lists_looks_only_at_the_partition_it_is_given() -> None:
    # a tenant's request for a model only another partition's replica serves is not
    # served for it: the check that spares building every model's name must agree
    fleet = Fleet([ReplicaConfig(id="a", url="http://127.0.0.1:1"),
                   ReplicaConfig(id="b", url="http://127.0.0.1:2")])
    for rid, model in (("a", "llama"), ("b", "qwen")):
        state = fleet.get(rid)
        assert state is not None
        state.model_info = {model: ModelInfo()}
    only_a = {"a"}.__contains__
    assert fleet.lists("llama") and fleet.lists("qwen")
    assert fleet.lists("llama", only_a) and not fleet.lists("qwen", only_a)
    assert not fleet.lists(None) and not fleet.lists("mistral")
    # the same answers as the set of every model the partition serves
    for model in ("llama", "qwen", "mistral"):
        assert fleet.lists(model, only_a) == (model in fleet.models(only_a))
