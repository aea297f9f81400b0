import json

import pytest

from loadtests.run import RunConfig, run

pytestmark = pytest.mark.slow


def test_two_policies_on_a_local_fleet(tmp_path):
    cfg = RunConfig(
        policies=("round_robin", "prefix_affinity"),
        duration_s=10, replicas=2, users=4, rate=4.0, kv_cache_gib=0.5, max_num_seqs=4,
        workload={"num_docs": 12, "hot_docs": 4, "doc_tokens": 600, "output_tokens": [2, 4]},
    )
    out = run(cfg, tmp_path / "report", tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text())["policies"] == out["policies"]
    for name in cfg.policies:
        r = out["policies"][name]
        assert r["requests_failed"] == 0
        assert r["requests_ok"] >= 10
        # the engines' counters and what clients were told agree token for token
        assert r["prompt_tokens"] == r["client_prompt_tokens"] > 0
        hits = round(r["token_hit_rate"] * r["prompt_tokens"])
        assert hits == r["client_cached_tokens"]
        assert r["prefill_tokens"] == r["prompt_tokens"] - hits
        assert sum(r["replica_requests"]) == r["requests_ok"]
        assert 0 < r["ttft_p50_s"] <= r["ttft_p95_s"] <= r["ttft_p99_s"]
    assert out["policies"]["round_robin"]["routes"] == {"round_robin":
                                                       out["policies"]["round_robin"]["requests_ok"]}
    report = (tmp_path / "report" / "report.md").read_text()
    assert "| round_robin |" in report and "| prefix_affinity |" in report
    assert (tmp_path / "report" / "hit_rate_ttft.png").stat().st_size > 10_000
