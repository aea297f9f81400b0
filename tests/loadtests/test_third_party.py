"""SGLang's and vLLM's routers in front of a local fleet, through ``loadtests.run`` (the
real ``sglang-router`` and ``vllm-router`` programs, in a network namespace of their own)."""

import json
import os
import subprocess
import sys

import pytest

from loadtests import third_party
from loadtests.third_party import ThirdPartyRouter, Worker, argv, parse
from tests.support.binaries import which
from tests.support.netns import isolated
from tests.support.processes import REPO


def test_policy_names_pick_a_third_party_router_or_a_kvgate_policy():
    assert parse("sglang:cache_aware") == ThirdPartyRouter("sglang", "cache_aware")
    assert parse("sglang:cache_aware").name == "sglang:cache_aware"
    assert parse("vllm:kv_aware") == ThirdPartyRouter("vllm", "kv_aware")
    assert parse("cost") is None and parse("prefix_affinity") is None
    with pytest.raises(ValueError, match=r"'cache-aware'.*cache_aware"):
        parse("sglang:cache-aware")
    assert parse("vllm:kv_aware").needs_kv_events
    assert not parse("vllm:cache_aware").needs_kv_events
    assert not parse("sglang:cache_aware").needs_kv_events


def test_the_router_is_started_in_front_of_every_engine_with_its_policy():
    workers = [Worker("http://127.0.0.1:1", "tcp://127.0.0.1:11", "tcp://127.0.0.1:12"),
               Worker("http://127.0.0.1:2", "tcp://127.0.0.1:21")]
    cmd = argv(ThirdPartyRouter("sglang", "power_of_two"), "/opt/sgl", "127.0.0.1", 4000,
               workers, "m")
    assert cmd[:2] == ["/opt/sgl", "launch"]
    at = cmd.index("--worker-urls")
    assert cmd[at + 1:at + 3] == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert cmd[cmd.index("--policy") + 1] == "power_of_two"
    assert cmd[cmd.index("--port") + 1] == "4000"
    assert "--kv-event-source" not in cmd
    # vLLM's kv_aware is told each engine's KV event (and replay) endpoints
    cmd = argv(ThirdPartyRouter("vllm", "kv_aware"), "/opt/vr", "127.0.0.1", 4000, workers,
               "m")
    assert cmd[0] == "/opt/vr" and cmd[cmd.index("--policy") + 1] == "kv_aware"
    sources = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--kv-event-source"]
    assert sources == ["http://127.0.0.1:1=tcp://127.0.0.1:11",
                       "http://127.0.0.1:2=tcp://127.0.0.1:21"]
    replays = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--kv-event-replay-source"]
    assert replays == ["http://127.0.0.1:1=tcp://127.0.0.1:12"]
    assert cmd[cmd.index("--kv-event-model") + 1] == "m"
    with pytest.raises(ValueError, match=r"publish none: http://127\.0\.0\.1:3"):
        argv(ThirdPartyRouter("vllm", "kv_aware"), "/opt/vr", "127.0.0.1", 4000,
             [Worker("http://127.0.0.1:3")], "m")


def test_a_third_party_router_is_refused_where_the_network_is_reachable():
    check = [sys.executable, "-c", "from loadtests.third_party import require_isolation; "
             "require_isolation()"]
    inside = subprocess.run(isolated(check), cwd=REPO, capture_output=True, text=True)
    assert inside.returncode == 0, inside.stderr
    if not third_party.outside_interfaces():
        pytest.skip("this machine has no interface but loopback")
    outside = subprocess.run(check, cwd=REPO, capture_output=True, text=True)
    assert outside.returncode != 0
    assert "unshare -rn" in outside.stderr
    assert third_party.outside_interfaces()[0] in outside.stderr


@pytest.mark.slow
def test_sglang_and_vllm_routers_in_front_of_a_local_fleet(tmp_path):
    programs = {}
    for kind in third_party.KINDS.values():
        programs[kind.name] = third_party.find_program(kind.name) or which(
            kind.program, f"pip install {kind.program}, in a virtual environment of its own")
        if programs[kind.name] is None:
            pytest.skip(f"{kind.program} is not installed")
    out = tmp_path / "out.json"
    policies = ("sglang:cache_aware", "vllm:kv_aware")
    run = subprocess.run(isolated([
        sys.executable, "-m", "loadtests.run", "--policies", ",".join(policies),
        "--duration", "5", "--replicas", "2", "--users", "4", "--rate", "6",
        "--kv-cache-gib", "0.5", "--max-num-seqs", "4", "--set", "num_docs=6",
        "--set", "hot_docs=2", "--set", "doc_tokens=600", "--set", "output_tokens=[2,4]",
        "--sglang-router", programs["sglang"], "--vllm-router", programs["vllm"],
        "--json", str(out)]),
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())["policies"]
    for name in policies:
        r = results[name]
        assert r["requests_failed"] == 0 and r["requests_ok"] >= 8, name
        # the engines' counters and what the clients were told through the router agree
        assert r["prompt_tokens"] == r["client_prompt_tokens"] > 0
        assert round(r["token_hit_rate"] * r["prompt_tokens"]) == r["client_cached_tokens"]
        # six documents asked again and again: a cache-aware choice earns hits
        assert r["token_hit_rate"] > 0.2, name
        # which replica answered: the engines name themselves, and the routers pass it on
        assert sum(r["replica_requests"]) == r["requests_ok"]
        assert r["routes"] == {"null": r["requests_ok"]}  # no kvgate route header
        tail = r["ttft_tail"]
        assert tail["unattributed"] == 0
        assert sum(tail["by_replica"]) == tail["requests"] >= 1
        # so the hot documents' misses are told by cause, as for kvgate's policies
        assert set(r["hot_misses"]) == {"first", "moved", "evicted"}
        assert 1 <= r["hot_misses"]["first"]["requests"] <= 2
        assert f"| {name} |" in run.stdout
