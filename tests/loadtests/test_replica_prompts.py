import json

import pytest

from kvwire.block_hashing import block_hashes
from kvwire.tokenizer import load_tokenizer
from loadtests.hot_misses import hot_misses
from loadtests.oracle import static_oracle, upper_bound
from loadtests.prefix_hashes import PrefixHashes
from loadtests.replica_prompts import RenderedPrompts, WorkloadIds, replica_tokens_per_word
from loadtests.sim_fleet import FleetSpec
from loadtests.simulate import build_policy, main, poisson_arrivals, simulate
from loadtests.workloads import ChatSpec, ContractsSpec, ToolsSpec, generate

SMALL = ContractsSpec(num_docs=12, hot_docs=4, doc_tokens=300, seed=3)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


@pytest.mark.parametrize("spec", [SMALL, ChatSpec(active=6), ToolsSpec(toolsets=3)])
def test_rendered_prompts_share_their_shared_length_and_hash_as_the_engine(spec, tokenizer):
    prompts, memo = RenderedPrompts(tokenizer), PrefixHashes(16, "m")
    by_key: dict[tuple[str, ...], list[int]] = {}
    for r in generate(spec, 120):
        ids, shared = prompts.ids(r), prompts.shared_len(r)
        assert ids == tokenizer.encode(tokenizer.render_chat(r.messages(), tools=r.tools()))
        assert prompts.prompt_len(r) == len(ids) and 0 <= shared <= len(ids)
        key = tuple(s.key for s in r.segments if s.shared)
        first = by_key.setdefault(key, ids)
        assert ids[:shared] == first[:shared]  # every request with that prefix shares it
        assert memo.hashes(r, ids, shared) == block_hashes(ids, 16, model_id="m")


def test_a_rendered_document_counts_other_tokens_than_its_segment(tokenizer):
    prompts = RenderedPrompts(tokenizer)
    reqs = generate(SMALL, 60)
    nominal = [WorkloadIds().shared_len(r) for r in reqs]
    rendered = [prompts.shared_len(r) for r in reqs]
    assert any(abs(a - b) >= 16 for a, b in zip(nominal, rendered, strict=True))
    assert all(0.8 * a < b < 1.25 * a for a, b in zip(nominal, rendered, strict=True))


def test_a_whole_cached_document_is_no_miss_in_the_replicas_tokens(tokenizer):
    prompts = RenderedPrompts(tokenizer)
    spec = ContractsSpec(num_docs=30, hot_docs=20, doc_tokens=600, seed=4)
    reqs = [r for r in generate(spec, 200) if r.label == "hot"]
    chosen = {r.index: "r0" for r in reqs}
    seen: set[str] = set()
    cached = {}
    for r in reqs:  # every document's repeats find all its full blocks cached
        cached[r.index] = prompts.shared_len(r) // 16 * 16 if r.affinity_key in seen else 0
        seen.add(r.affinity_key)
    out = hot_misses(reqs, chosen, cached, 16, prompts)
    assert out["evicted"]["requests"] == 0 and out["first"]["requests"] == len(seen)
    # read in the workload's nominal lengths, some of the same answers look like misses
    assert hot_misses(reqs, chosen, cached, 16)["evicted"]["requests"] > 0


def test_the_simulator_and_the_oracles_count_the_replicas_tokens(tokenizer):
    fleet = FleetSpec(replicas=2, kv_pool_gib=0.3, idle_kv_gib=0.2, max_num_seqs=4)
    requests = generate(SMALL, 60)
    arrivals = poisson_arrivals(len(requests), 10.0, 1)
    prompts = RenderedPrompts(tokenizer)
    rendered = sum(prompts.prompt_len(r) for r in requests)
    assert rendered != sum(r.prompt_tokens for r in requests)
    res = simulate(requests, arrivals, build_policy("prefix_affinity"), fleet,
                   prompts="text", replica_prompts=prompts)
    assert res.prompt_tokens == rendered and res.token_hit_rate > 0.3
    static = static_oracle(requests, PrefixHashes(16, "m"), 400, prompts)
    bound = upper_bound(requests, PrefixHashes(16, "m"), prompts)
    assert static.prompt_tokens == bound.prompt_tokens == rendered
    assert res.token_hit_rate <= bound.token_hit_rate


def test_the_cli_renders_for_the_replicas_only_with_text_prompts(tmp_path):
    args = ["--scenario", "contracts", "--replicas", "2", "--requests", "80", "--policies",
            "prefix_affinity", "--kv-pool-gib", "0.3", "--idle-kv-gib", "0.2", "--rate", "10",
            "--set", "num_docs=12", "--set", "hot_docs=4", "--set", "doc_tokens=300"]
    with pytest.raises(SystemExit, match="needs --prompts text"):
        main([*args, "--prompts", "ids", "--engine-tokenizer", "gateway"])
    with pytest.raises(SystemExit, match="no-such-dir"):
        main([*args, "--prompts", "text", "--engine-tokenizer", str(tmp_path / "no-such-dir")])
    out = tmp_path / "out.json"
    main([*args, "--prompts", "text", "--engine-tokenizer", "gateway", "--json", str(out)])
    report = json.loads(out.read_text())
    assert report["engine_tokenizer"] == "gateway"
    spec = ContractsSpec(num_docs=12, hot_docs=4, doc_tokens=300)
    prompts = RenderedPrompts(load_tokenizer(None))
    assert report["policies"]["prefix_affinity"]["prompt_tokens"] == sum(
        prompts.prompt_len(r) for r in generate(spec, 80))


def test_replicas_with_their_own_tokenizer_count_documents_near_their_length(tmp_path):
    from kvwire.tokenizer_build import build

    engine_tok = str(build(tmp_path / "tok", vocab_size=3000).parent)
    # a tokenizer that counts other tokens than the gateway's
    assert abs(replica_tokens_per_word(engine_tok) / replica_tokens_per_word(None) - 1) > 0.05
    out = tmp_path / "out.json"
    main(["--scenario", "contracts", "--replicas", "2", "--requests", "40", "--policies",
          "cost", "--kv-pool-gib", "0.6", "--idle-kv-gib", "0.4", "--rate", "10",
          "--set", "num_docs=6", "--set", "hot_docs=2", "--set", "doc_tokens=1200",
          "--prompts", "text", "--engine-tokenizer", engine_tok, "--json", str(out)])
    counted = json.loads(out.read_text())["policies"]["cost"]["prompt_tokens"]
    # the text is drawn at the replicas' rate, as loadtests.run's clients draw it (drawn
    # at the gateway's, these prompts would count ~1.12x)
    nominal = sum(r.prompt_tokens for r in generate(ContractsSpec(
        num_docs=6, hot_docs=2, doc_tokens=1200), 40))
    assert 0.95 * nominal < counted < 1.07 * nominal
