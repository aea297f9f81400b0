"""``kvgate plan`` as users run it: the seed's worked example, a config.json, a scenario
and a gateway capture."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvwire.tokenizer_build import sample_text
from loadtests.plan_arithmetic import ROUTING_WINS
from tests.support.plan_runs import plan_parser
from tests.support.processes import REPO

SEED_ARGS = ("--profile", "llama3-8b-h100", "--replicas", "8", "--idle-kv-gib", "25",
             "--docs", "2000", "--doc-tokens", "6000", "--hot", "250", "--hot-share", "0.8")
KEYS = ("kv_bytes_per_token", "bytes_per_doc", "docs_per_replica",
        "hot_docs_per_replica_affinity", "distinct_docs_fleet_affinity",
        "distinct_docs_fleet_round_robin", "verdict", "policies", "hot_prefill_reduction",
        "recommendation")
MIB = 1 << 20


def plan(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvgate", "plan", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=timeout_s)


def plan_json(*args: str) -> dict[str, Any]:
    done = plan(*args, "--json")
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


@pytest.mark.slow
def test_the_seeds_worked_example() -> None:
    p = plan_json(*SEED_ARGS, "--sim-requests", "800")
    assert all(key in p for key in KEYS), sorted(p)
    assert p["kv_bytes_per_token"] == 128 * 1024
    assert p["bytes_per_doc"] / MIB == pytest.approx(750, rel=0.01)
    assert p["docs_per_replica"] == 33
    assert round(p["hot_docs_per_replica_affinity"]) == 31
    assert p["distinct_docs_fleet_affinity"] == 264
    assert p["distinct_docs_fleet_round_robin"] == 33
    assert p["verdict"] == ROUTING_WINS
    # The seed's "prefill for hot traffic down by close to two orders of magnitude" is the
    # arithmetic (no cold churn); it is what this test holds to the seed's claim.
    assert 50 <= p["hot_prefill_reduction_arithmetic"] <= 100
    # The simulator (LRU engines, cold documents churning the caches) gives far less; the
    # plan reports it as the headline figure, and both side by side.
    pol = p["policies"]
    assert set(pol) == {"round_robin", "prefix_affinity", "cost"}
    assert all({"token_hit_rate", "hot_prefill_tokens"} <= set(f) for f in pol.values())
    assert pol["round_robin"]["token_hit_rate"] < 0.15
    best = p["hot_prefill_reduction_best_policy"]
    assert best in ("prefix_affinity", "cost")
    assert pol[best]["token_hit_rate"] > 3 * pol["round_robin"]["token_hit_rate"]
    simulated = p["hot_prefill_reduction_simulated"]
    assert simulated == p["hot_prefill_reduction"]
    assert simulated == pytest.approx(pol["round_robin"]["hot_prefill_tokens"]
                                      / pol[best]["hot_prefill_tokens"])
    assert 1.5 < simulated < p["hot_prefill_reduction_arithmetic"]
    rec = p["recommendation"]
    assert rec["replicas"] == 8 and rec["policy"] in ("prefix_affinity", "cost")


def test_text_report_prints_the_arithmetic() -> None:
    done = plan(*SEED_ARGS, "--sim-requests", "0")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for text in ("2 x 32 layers x 8 KV heads x 128 x 2 B = 128 KiB", "= 750 MiB",
                 "25 GiB = 33 documents", "~31.2 hot documents per replica",
                 "264 distinct across the fleet", ROUTING_WINS, "66x less",
                 "recommendation: cost on 8 replicas"):
        assert text in out, out


def test_model_directory_and_a_small_fleet(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "torch_dtype": "bfloat16"}))
    p = plan_json("--model", str(tmp_path), "--replicas", "4", "--idle-kv-gib", "25",
                  "--sim-requests", "300", "--policies", "round_robin,prefix_affinity")
    assert p["kv_bytes_per_token"] == 131072 and p["docs_per_replica"] == 33
    assert p["distinct_docs_fleet_affinity"] == 132
    assert "larger than the fleet's cache" in p["verdict"]
    assert p["replicas_for_hot_set"] == 8
    assert p["recommendation"]["replicas"] == 8
    assert set(p["policies"]) == {"round_robin", "prefix_affinity"}
    assert all(f["requests"] == 300 for f in p["policies"].values())


def test_scenarios_give_their_library() -> None:
    p = plan_json("--scenario", "contracts-400", "--sim-requests", "0")
    w = p["workload"]
    assert (w["docs"], w["doc_tokens"], w["hot_docs"], w["estimated"]) == (400, 1500, 50,
                                                                           False)
    assert p["fleet"]["idle_kv_gib"] == 1.46  # the scenario's
    assert p["docs_per_replica"] == 7  # 1.46 GiB // (99 blocks x 16 x 128 KiB)
    chat = plan_json("--scenario", "chat-apps", "--sim-requests", "0")
    assert chat["workload"]["estimated"] is True and chat["workload"]["hot_docs"] >= 1


def write_capture(path: Path) -> None:
    """Chats about six documents, two of them hot, in the gateway's capture format; plus
    a completions request, a line without a prompt and a line that is not JSON."""
    rng = random.Random(5)
    docs = [sample_text(rng, 400) for _ in range(6)]
    lines = []
    for i in range(120):
        doc = i % 2 if i % 5 else 2 + (i // 5) % 4
        body = {"model": "m", "messages": [
            {"role": "system", "content": "You answer questions about contracts."},
            {"role": "user", "content": f"{docs[doc]}\n\nQuestion {i}: {sample_text(rng, 20)}"}]}
        lines.append(json.dumps({"model": "m", "body": body}))
    lines.append(json.dumps({"model": "m", "body": {"model": "m", "prompt": docs[0]}}))
    lines.append(json.dumps({"model": "m", "body": {"model": "m"}}))
    lines.append("{not json")
    path.write_text("\n".join(lines) + "\n")


def test_capture_documents_estimated_from_shared_prefixes(tmp_path: Path) -> None:
    capture = tmp_path / "capture.jsonl"
    write_capture(capture)
    p = plan_json("--workload", str(capture), "--replicas", "2", "--idle-kv-gib", "0.1",
                  "--hot-share", "0.7", "--sim-requests", "200",
                  "--policies", "round_robin,prefix_affinity")
    w = p["workload"]
    assert w["estimated"] is True and w["skipped_lines"] == 2
    # six documents, and the completions prompt: document 0's text without the chat
    # template before it, so it shares nothing (a one-off)
    assert w["docs"] == 7
    assert w["hot_docs"] == 2  # documents 0 and 1 get 96 of 121 prompts
    assert w["doc_tokens"] > 400
    # the replay is the capture's 121 prompts: documents of ~800 tokens asked about again
    # and again, questions of ~60 tokens; two replicas hold all six documents
    for figures in p["policies"].values():
        assert figures["requests"] == 121
        assert 0.6 < figures["token_hit_rate"] < 0.95


@pytest.mark.parametrize(("args", "message"), [
    (("--hot", "3000"), "hot_docs (3000) must be < num_docs (2000)"),
    (("--workload", "/nonexistent/capture.jsonl"), "No such file"),
    (("--model", "/nonexistent"), "no config.json"),
    (("--replicas", "0"), "argument --replicas: must be >= 1, got 0"),
])
def test_bad_inputs_say_what_is_wrong(args: tuple[str, ...], message: str) -> None:
    done = plan(*args, "--sim-requests", "0")
    assert done.returncode == 2
    assert message in done.stderr, done.stderr


@pytest.mark.parametrize("value", ["inf", "nan", "-1", "0", "1e12"])
def test_idle_kv_no_replica_has_is_refused_before_planning(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = plan_parser()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--idle-kv-gib", value])
    assert exited.value.code == 2
    assert f"argument --idle-kv-gib: must be > 0 and <= 4096 GiB, got {value}" \
        in capsys.readouterr().err
    assert parser.parse_args(["--idle-kv-gib", "4096"]).idle_kv_gib == 4096


@pytest.mark.parametrize(("args", "message"), [
    (("--docs", "0"), "argument --docs: must be >= 1, got 0"),
    (("--doc-tokens", "-5"), "argument --doc-tokens: must be >= 1, got -5"),
    (("--hot", "0"), "argument --hot: must be >= 1, got 0"),
    (("--hot-share", "2"), "argument --hot-share: must be between 0 and 1, got 2"),
    (("--hot-share", "nan"), "argument --hot-share: must be between 0 and 1, got nan"),
])
def test_workload_numbers_are_checked_by_their_flags_name(
        args: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = plan_parser()
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(list(args))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
