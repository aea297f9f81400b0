import json

import pytest

from loadtests import run as load_run
from loadtests.run import RunConfig, run

pytestmark = pytest.mark.slow


@pytest.fixture
def short_stream(monkeypatch):
    """The clients' workload stream cut to 3,000 requests, many times what a contracts run
    here sends (at most ~30): the default 200,000 took Locust's process ~2 s to generate
    before each run, and the hot misses' count as long again. Locust and that count read
    the same length. (The chat-apps run keeps the default: its stream, 12 s to generate,
    once counted in the run's time, which that test catches.)"""
    monkeypatch.setattr(load_run, "STREAM_REQUESTS", 3000)


def test_two_policies_on_a_local_fleet(tmp_path, short_stream):
    cfg = RunConfig(
        policies=("round_robin", "prefix_affinity"),
        duration_s=3, replicas=2, users=4, rate=8.0, kv_cache_gib=0.5, max_num_seqs=4,
        workload={"num_docs": 12, "hot_docs": 4, "doc_tokens": 600, "output_tokens": [2, 4]},
    )
    out = run(cfg, tmp_path / "report", tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text())["policies"] == out["policies"]
    for name in cfg.policies:
        r = out["policies"][name]
        assert r["requests_failed"] == 0 and r["failures"] == {}
        assert r["requests_unfinished"] == 0
        assert 0.0 <= r["send_late_s"]["p50"] <= r["send_late_s"]["p99"]
        assert r["requests_ok"] >= 10
        # the engines' counters and what clients were told agree token for token
        assert r["prompt_tokens"] == r["client_prompt_tokens"] > 0
        hits = round(r["token_hit_rate"] * r["prompt_tokens"])
        assert hits == r["client_cached_tokens"]
        assert r["prefill_tokens"] == r["prompt_tokens"] - hits
        assert sum(r["replica_requests"]) == r["requests_ok"]
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] <= r["ttft_p99_s"]
        # the sim engines' steps ran for a modeled time, and how late they ended was read
        assert r["engine_lateness"] is not None and r["engine_lateness"] >= 0
        assert len(r["replica_engine_lateness"]) == cfg.replicas
        # where the hot documents were lost, as the simulator reports it: each of the 4
        # hot documents' first request misses, if it came
        misses = r["hot_misses"]
        assert set(misses) == {"first", "moved", "evicted"}
        assert 1 <= misses["first"]["requests"] <= 4
        assert misses["first"]["tokens"] > 500 * misses["first"]["requests"]
        # hits by label add up to what the clients were told; the tail is on the replicas
        rates = r["label_token_hit_rates"]
        assert set(rates) <= {"hot", "cold"} and "hot" in rates
        assert all(0.0 <= rate < 1.0 for rate in rates.values())
        tail = r["ttft_tail"]
        assert tail["threshold_s"] == pytest.approx(r["ttft_p95_s"])
        assert sum(tail["by_replica"]) == sum(tail["by_label"].values()) == tail["requests"]
        assert 1 <= tail["requests"] <= r["requests_ok"] // 10 + 1
    assert out["policies"]["round_robin"]["routes"] == {"round_robin":
                                                       out["policies"]["round_robin"]["requests_ok"]}
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| round_robin |" in report and "| prefix_affinity |" in report
    assert (tmp_path / "report" / "hit_rate_ttft.png").stat().st_size > 10_000


def test_replicas_with_their_own_tokenizer_get_documents_sized_in_their_tokens(
        tmp_path, short_stream):
    from kvwire.tokenizer_build import build
    from loadtests.run import replica_tokens_per_word

    engine_tok = build(tmp_path / "tok16k", vocab_size=16000).parent
    ours, theirs = replica_tokens_per_word(None), replica_tokens_per_word(str(engine_tok))
    assert theirs < 0.8 * ours  # a tokenizer that counts other tokens than the gateway's
    doc_tokens = 600
    cfg = RunConfig(
        policies=("cost",), duration_s=3, replicas=2, users=4, rate=7.0, kv_cache_gib=0.5,
        max_num_seqs=4, engine_tokenizer=str(engine_tok),
        workload={"num_docs": 6, "hot_docs": 2, "doc_tokens": doc_tokens,
                  "question_tokens": [20, 30], "output_tokens": [2, 4]},
    )
    r = run(cfg)["policies"]["cost"]
    assert r["requests_failed"] == 0 and r["requests_ok"] >= 8
    # the replicas counted about doc_tokens per document in their own tokens (the gateway's
    # tokenizer would have counted ours / theirs as many)
    per_request = r["prompt_tokens"] / r["requests_ok"]
    assert 0.85 * doc_tokens < per_request < 1.25 * (doc_tokens + 30)


def test_two_gateway_copies_in_front_of_engines_publishing_kv_events(tmp_path, short_stream):
    cfg = RunConfig(
        policies=("cost",), duration_s=3, replicas=2, users=4, rate=8.0, kv_cache_gib=0.5,
        max_num_seqs=4, kv_events=True, gateways=2,
        workload={"num_docs": 6, "hot_docs": 2, "doc_tokens": 600, "output_tokens": [2, 4]},
    )
    r = run(cfg)["policies"]["cost"]
    assert r["requests_failed"] == 0 and r["requests_ok"] >= 10
    # each request went to one copy at random; both copies' indexes heard the engines
    assert len(r["gateway_requests"]) == 2 and min(r["gateway_requests"]) > 0
    assert sum(r["gateway_requests"]) == r["requests_ok"]
    assert len(r["kv_event_messages"]) == 2 and min(r["kv_event_messages"]) > 0


def test_chat_apps_turns_with_tools_on_their_own_times(tmp_path):
    # four apps' chats, each turn carrying its app's tools in the `tools` field
    cfg = RunConfig(
        scenario="chat-apps", policies=("cost",), duration_s=10, replicas=2, users=8,
        rate=30.0, kv_cache_gib=0.5, max_num_seqs=4,
        workload={"rate": 6.0, "think_s": 2.0, "output_tokens": [2, 4]},
    )
    r = run(cfg)["policies"]["cost"]
    # sent on the workload's own times (conversations start at rate / mean turns, their
    # later turns think_s apart), not as Poisson arrivals at cfg.rate (300 in 10 s, as
    # many as 8 users can send). The workload has 37 turns due in the first 10 s and 46 by
    # 12 s. (Generating the clients' stream takes seconds: counted in the run's time, as it
    # once was, it left 1-9 of them sent.)
    from loadtests.workloads import build_spec, generate

    stream = generate(build_spec("chat-apps", **cfg.workload), 400)
    assert r["requests_failed"] == 0
    assert 20 <= r["requests_ok"] <= sum(1 for req in stream if req.arrival_s < 12.0)
    rates = r["label_token_hit_rates"]
    assert set(rates) <= {"app0", "app1", "app2", "app3"} and "app0" in rates
    # an app's system prompt and tools come first in every one of its prompts: they hit
    assert r["token_hit_rate"] > 0.3
    # the tools reached the engines: a prompt holds the app's system prompt (500-800
    # tokens) and its tools (400-800), rendered
    assert r["prompt_tokens"] / r["requests_ok"] > 900
