import json
import random
from pathlib import Path

from loadtests.bench_engine import bench_batch, bench_throughput, main


def test_bench_pieces_report_consistent_numbers() -> None:
    rng = random.Random(1)
    b = bench_batch("llama3-8b-h100", 2, decode_steps=3, rng=rng)
    assert b["prefill"]["steps"] == 2  # two 6,000-token prompts, 8,192 tokens per step
    assert b["decode"]["steps"] >= 3
    assert b["decode"]["modeled_ms_per_step"] > 0
    t = bench_throughput("llama3-8b-h100", 30, "frequency", rng, rate=2.0, max_tokens=2)
    assert t["requests"] == 30 and t["steps"] > 0 and t["preemptions"] == 0
    assert 0 <= t["token_hit_rate"] < 1


def test_bench_main_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["--json", str(out), "--batches", "1", "--decode-steps", "2",
                 "--requests", "10"]) == 0
    report = json.loads(out.read_text())
    assert [b["batch"] for b in report["per_step"]] == [1]
    assert [t["eviction"] for t in report["throughput"]] == ["lru", "frequency"]
