import itertools
from collections import Counter

import pytest

from kvwire.block_hashing import block_hashes
from loadtests.oracle import static_oracle, upper_bound
from loadtests.prefix_hashes import PrefixHashes
from loadtests.workloads import (
    ChatSpec,
    ContractsSpec,
    ToolsSpec,
    build_spec,
    generate,
    popularity,
)

SMALL = ContractsSpec(num_docs=200, hot_docs=25, doc_tokens=300, seed=3)


def _summary(requests):
    return [(r.segments, r.max_tokens, r.label, r.affinity_key) for r in requests]


@pytest.mark.parametrize("spec", [SMALL, ChatSpec(active=8, seed=5), ToolsSpec(toolsets=3)])
def test_same_seed_same_stream_other_seed_differs(spec):
    a, b = generate(spec, 300), generate(spec, 300)
    assert _summary(a) == _summary(b)
    assert [r.token_ids() for r in a[:20]] == [r.token_ids() for r in b[:20]]
    assert [r.messages() for r in a[:5]] == [r.messages() for r in b[:5]]
    other = generate(build_spec(_name(spec), seed=spec.seed + 1), 300)
    assert _summary(other) != _summary(a)


def _name(spec):
    return {ContractsSpec: "contracts", ChatSpec: "chat", ToolsSpec: "tools"}[type(spec)]


def test_hot_set_receives_its_share_within_tolerance():
    n = 20_000
    reqs = generate(ContractsSpec(seed=11), n)
    hot = sum(r.label == "hot" for r in reqs) / n
    # binomial std at p=0.8, n=20k is 0.0028: 4 sigma
    assert abs(hot - 0.8) < 0.012
    # and the 250 most asked documents are the hot set (uniform popularity)
    counts = Counter(r.affinity_key for r in reqs)
    top = {doc for doc, _ in counts.most_common(250)}
    assert top == {f"doc{i}" for i in range(250)}


def test_zipf_concentrates_inside_the_hot_set():
    reqs = generate(ContractsSpec(popularity="zipf", zipf_s=1.0, seed=2), 20_000)
    counts = Counter(r.affinity_key for r in reqs if r.label == "hot")
    p = popularity(250, "zipf", 1.0)
    n_hot = sum(counts.values())
    assert abs(counts["doc0"] / n_hot - p[0]) < 0.02
    assert counts["doc0"] > 5 * counts["doc100"]


def test_contract_prompt_shape_and_lengths():
    spec = ContractsSpec(system_tokens=128, seed=1)
    for r in generate(spec, 200):
        sys, doc, question = r.segments
        assert sys.key == "system" and sys.length == 128
        assert 5700 <= doc.length <= 6300
        assert 60 <= question.length <= 100 and not question.shared
        assert len(r.token_ids()) == r.prompt_tokens
        assert 16 <= r.max_tokens <= 48


def test_same_document_same_prefix_ids():
    reqs = generate(SMALL, 400)
    by_doc: dict[str, list] = {}
    for r in reqs:
        by_doc.setdefault(r.affinity_key, []).append(r)
    a, b = next(v for v in by_doc.values() if len(v) >= 2)[:2]
    n = a.segments[0].length
    assert a.token_ids()[:n] == b.token_ids()[:n]
    assert a.token_ids()[n:] != b.token_ids()[n:]


def test_chat_turns_extend_the_previous_prompt():
    reqs = generate(ChatSpec(active=4, turns=(3, 3), seed=9), 60)
    by_conv: dict[str, list] = {}
    for r in reqs:
        by_conv.setdefault(r.affinity_key, []).append(r)
    checked = 0
    for turns in by_conv.values():
        for prev, cur in itertools.pairwise(turns):
            assert cur.segments[: len(prev.segments)] == prev.segments
            assert cur.token_ids()[: prev.prompt_tokens] == prev.token_ids()
            msgs_prev, msgs_cur = prev.messages(), cur.messages()
            assert msgs_cur[: len(msgs_prev)] == msgs_prev
            assert msgs_cur[len(msgs_prev)]["role"] == "assistant"
            checked += 1
    assert checked >= 20


def test_tools_tree_branches_under_one_system_prompt():
    reqs = generate(ToolsSpec(toolsets=4, active=16, seed=4), 400)
    assert {r.segments[0].key for r in reqs} == {"system"}
    assert {r.segments[1].key for r in reqs} == {f"tools{k}" for k in range(4)}
    assert len({r.segments[2].key for r in reqs}) > 16


def test_text_is_sized_for_the_project_tokenizer():
    from kvwire.tokenizer import load_tokenizer

    tok = load_tokenizer(None)
    r = generate(ContractsSpec(doc_tokens=2000, seed=6), 3)[0]
    n = len(tok.encode(r.messages()[0]["content"]))
    assert 0.85 * r.prompt_tokens < n < 1.15 * r.prompt_tokens


@pytest.mark.parametrize("spec", [SMALL, ChatSpec(active=8), ToolsSpec(toolsets=3)])
def test_memoized_hashes_equal_the_engine_chain(spec):
    memo = PrefixHashes(16, "m")
    for r in generate(spec, 150):
        ids = r.token_ids()
        assert memo.hashes(r, ids) == block_hashes(ids, 16, model_id="m")


def test_static_oracle_on_a_hand_counted_stream():
    spec = ContractsSpec(num_docs=4, hot_docs=1, hot_fraction=0.5, doc_tokens=64,
                         doc_jitter=0.0, question_tokens=(10, 10), seed=8)
    reqs = generate(spec, 40)
    counts = Counter(r.affinity_key for r in reqs)
    prompt = sum(r.prompt_tokens for r in reqs)
    memo = PrefixHashes(16, "m")
    # room for every document: each one's first request misses, the rest hit 64 tokens
    full = static_oracle(reqs, memo, capacity_blocks=16)
    assert full.hit_tokens == sum(64 * (c - 1) for c in counts.values())
    # room for one document: the most asked one
    one = static_oracle(reqs, memo, capacity_blocks=4)
    assert one.hit_tokens == 64 * (max(counts.values()) - 1)
    assert one.token_hit_rate == pytest.approx(one.hit_tokens / prompt)
    # an unlimited cache: every document's first request misses its 4 blocks, the rest hit
    # them, and no question's tail (10 tokens) fills a block
    bound = upper_bound(reqs, memo)
    assert bound.hit_tokens == full.hit_tokens and bound.prompt_tokens == prompt


def test_the_upper_bound_is_an_unlimited_caches_count_turn_after_turn():
    # one conversation at a time, each turn sent after the last: an unlimited cache hits
    # the longest cached prefix of each prompt (up to the engine's cap), then caches the
    # prompt's every full block (the last one too, which the cap never looks up)
    reqs = generate(ChatSpec(active=1, seed=4), 12)
    seen: set[bytes] = set()
    hits = 0
    for r in reqs:
        chain = block_hashes(r.token_ids(), 16, model_id="m")
        cap = (r.prompt_tokens - 1) // 16
        hits += sum(1 for _ in itertools.takewhile(seen.__contains__, chain[:cap]))
        seen.update(chain)
    bound = upper_bound(reqs, PrefixHashes(16, "m"))
    assert bound.hit_tokens == 16 * hits > 0
    assert bound.distinct_blocks == len(seen)


def test_bad_spec_values_are_named():
    with pytest.raises(ValueError, match="hot_docs"):
        build_spec("contracts", num_docs=10, hot_docs=10)
    with pytest.raises(ValueError, match="popularity"):
        build_spec("contracts", popularity="pareto")
    with pytest.raises(ValueError, match="unknown key 'docs'"):
        build_spec("contracts", docs=3)
    with pytest.raises(ValueError, match="unknown workload"):
        build_spec("poems")
