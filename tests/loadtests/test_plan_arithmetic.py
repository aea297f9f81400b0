"""The capacity arithmetic against the seed's worked example (REFERENCE.md), and the
shared-prefix estimate a capture's library comes from."""

from __future__ import annotations

import pytest

from engine.cost_model import load_profile
from engine.hf_shape import shape_from_config
from loadtests.plan_arithmetic import (
    GIB,
    MIB,
    ONE_REPLICA,
    ROUTING_WINS,
    TOO_BIG,
    FleetSize,
    Library,
    arithmetic,
)
from loadtests.shared_prefixes import block_units, estimate

SEED = Library(docs=2000, doc_tokens=6000, hot_docs=250, hot_share=0.8, tail_tokens=80)
LLAMA3_8B_CONFIG = {  # Meta-Llama-3-8B's config.json, the keys sizing reads
    "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "vocab_size": 128256, "torch_dtype": "bfloat16", "max_position_embeddings": 8192,
}


def seed_fleet(replicas: int = 8, idle_kv_gib: float = 25.0) -> FleetSize:
    per_token = load_profile("llama3-8b-h100").model.kv_bytes_per_token
    return FleetSize(per_token, idle_kv_gib, replicas)


def test_the_seeds_numbers() -> None:
    a = arithmetic(SEED, seed_fleet())
    assert a.kv_bytes_per_token == 128 * 1024  # 2 x 32 x 8 x 128 x 2 B
    assert a.bytes_per_doc / MIB == pytest.approx(750, rel=0.01)
    assert a.docs_per_replica == 33
    assert a.hot_docs_per_replica_affinity == pytest.approx(31, abs=0.5)
    assert a.distinct_docs_fleet_affinity == 264
    assert a.distinct_docs_fleet_round_robin == 33
    assert a.verdict == ROUTING_WINS
    # hot prefill: round robin recomputes 1 - 33/250 of hot documents, affinity none
    assert a.hot_hit_round_robin == pytest.approx(33 / 250)
    assert a.hot_hit_affinity == 1.0
    assert a.hot_prefill_tokens_affinity == 80
    assert 50 <= a.hot_prefill_reduction <= 100  # close to two orders of magnitude
    assert a.replicas_for_hot_set == 8  # ceil(250 / 33)


def test_a_config_json_gives_the_profiles_kv_size() -> None:
    shape = shape_from_config(LLAMA3_8B_CONFIG)
    profile = load_profile("llama3-8b-h100").model
    assert shape.kv_bytes_per_token == profile.kv_bytes_per_token == 131072
    assert shape.params == pytest.approx(profile.params, rel=0.01)  # 8.03e9
    fp32 = shape_from_config({**LLAMA3_8B_CONFIG, "torch_dtype": "float32"})
    assert fp32.kv_bytes_per_token == 2 * 131072
    # null, as many configs write an unset field, takes the default as absence does
    unset = {k: v for k, v in LLAMA3_8B_CONFIG.items() if k != "head_dim"}
    assert shape_from_config({**unset, "head_dim": None}) == shape_from_config(unset)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        shape_from_config({**LLAMA3_8B_CONFIG, "num_hidden_layers": 0})
    with pytest.raises(ValueError, match="'int3'"):
        shape_from_config({**LLAMA3_8B_CONFIG, "torch_dtype": "int3"})


@pytest.mark.parametrize(("hot", "replicas", "verdict"), [
    (20, 8, ONE_REPLICA), (250, 8, ROUTING_WINS), (264, 8, ROUTING_WINS),
    (265, 8, TOO_BIG), (250, 4, TOO_BIG)])
def test_verdict_compares_the_hot_set_with_one_replica_and_the_fleet(
        hot: int, replicas: int, verdict: str) -> None:
    library = Library(docs=2000, doc_tokens=6000, hot_docs=hot, hot_share=0.8)
    a = arithmetic(library, seed_fleet(replicas))
    assert a.verdict == verdict
    if verdict == TOO_BIG:
        assert a.replicas_for_hot_set is not None and a.replicas_for_hot_set > replicas
        assert a.hot_hit_affinity < 1.0


def test_no_room_for_one_document() -> None:
    a = arithmetic(SEED, seed_fleet(idle_kv_gib=0.5))
    assert a.docs_per_replica == 0 and a.replicas_for_hot_set is None
    assert a.verdict == TOO_BIG and a.hot_prefill_reduction == pytest.approx(1.0)
    assert a.bytes_per_request == 380 * 16 * 131072  # [0, 6000) doc, [6000, 6080) question
    assert a.bytes_per_request < 0.75 * GIB


def test_nothing_left_to_prefill_is_no_ratio() -> None:
    whole = Library(docs=2000, doc_tokens=6000, hot_docs=250, hot_share=0.8, tail_tokens=0)
    a = arithmetic(whole, seed_fleet())
    assert a.hot_prefill_tokens_affinity == 0 and a.hot_prefill_reduction is None


@pytest.mark.parametrize(("field", "value"), [
    ("docs", 0), ("doc_tokens", -1), ("hot_docs", 2001), ("hot_share", 1.5),
    ("tail_tokens", -3)])
def test_library_names_the_bad_key(field: str, value: float) -> None:
    args = {"docs": 2000, "doc_tokens": 6000, "hot_docs": 250, "hot_share": 0.8,
            field: value}
    with pytest.raises(ValueError, match=rf"{field} .*{value}"):
        Library(**args)  # type: ignore[arg-type]


def test_estimate_finds_documents_and_the_hot_set() -> None:
    # 10 documents of 64 tokens: documents 0 and 1 get 8 questions each, the others 2;
    # then a one-off prompt that shares nothing (33 requests)
    prompts = []
    asked = dict([(0, 8), (1, 8), *((d, 2) for d in range(2, 10))])
    for q in range(8):  # interleaved: every document in use from start to end
        for doc, questions in asked.items():
            if q < questions:
                prompts.append(block_units([1000 + doc] * 64 + [5000 + doc * 100 + q] * 20))
    prompts.append(block_units([7] * 50))
    found = estimate(prompts, hot_share=0.4)
    lib = found.library
    assert lib.docs == 11  # 10 documents + 1 one-off
    assert found.one_off_requests == 1
    assert lib.hot_docs == 2 and lib.doc_tokens == 64  # 16 of 33 requests >= 0.4
    assert lib.hot_share == pytest.approx(16 / 33)
    assert lib.tail_tokens == 20
    assert len(found.hot) == 2
    shapes = found.requests
    assert {s.doc_tokens for s in shapes[:-1]} == {64}
    assert shapes[-1].doc is None and shapes[-1].tail_tokens == 50


def test_questions_that_start_alike_stay_with_their_document() -> None:
    doc = [11] * 64
    alike = [block_units(doc + [22] * 16 + [30 + q] * 8) for q in range(2)]  # +1 block
    others = [block_units(doc + [40 + q] * 24) for q in range(3)]
    found = estimate([*alike, *others], hot_share=1.0)
    assert found.library.docs == 1 and found.library.doc_tokens == 64
    assert {s.doc_tokens for s in found.requests} == {64}
    assert [s.tail_tokens for s in found.requests] == [24] * 5


def test_a_conversation_is_one_document_a_shared_system_prompt_is_not() -> None:
    system = [1] * 32
    # two conversations of three turns under one system prompt: each turn extends the last
    convs = []
    for c in range(2):
        turns, prompt = [], list(system)
        for t in range(3):
            prompt = prompt + [100 + 10 * c + t] * 48
            turns.append(block_units(prompt))
        convs.append(turns)
    singles = [block_units(system + [200 + q] * 40) for q in range(3)]  # one-turn chats
    prompts = [*convs[0], *convs[1], *singles]
    found = estimate(prompts, hot_share=1.0)
    # documents: each conversation (as deep as its second turn, the deepest prompt
    # another request shares) and the system prompt, which several branch under
    assert found.library.docs == 3
    # one after another: the conversations and the single turns are never in use at once
    assert len(found.hot) == 3 and found.library.hot_docs == 1
    interleaved = estimate([convs[0][0], convs[1][0], convs[0][1], convs[1][1], *singles],
                           hot_share=1.0)
    assert interleaved.library.hot_docs == 2
    shapes = found.requests
    conv0 = {s.doc for s in shapes[:3]}
    assert len(conv0) == 1 and conv0 != {s.doc for s in shapes[3:6]}
    assert {s.doc for s in shapes[6:]} == {shapes[6].doc} and shapes[6].doc_tokens == 32
    # a replay rebuilds what is shared: turn 3 shares [0, 32) with everyone, then
    # [32, 128) with its own conversation
    assert shapes[2].prefix[0] == (shapes[6].prefix[0][0], 32)
    assert [depth for _, depth in shapes[2].prefix] == [32, 80, 128]
    assert shapes[2].doc_tokens == 128 and shapes[2].tail_tokens == 48
    assert shapes[1].prefix == shapes[2].prefix[:3]  # turn 2's whole prompt is shared
