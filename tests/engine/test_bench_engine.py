import json
import random
from pathlib import Path
from typing import Any

import pytest

from loadtests.bench_engine import PROMPT_TOKENS, bench_batch, bench_throughput, main


def test_bench_batch_counts_the_steps_its_schedule_implies() -> None:
    b = bench_batch("llama3-8b-h100", 2, decode_steps=3, rng=random.Random(1))
    prefill, decode = b["prefill"], b["decode"]
    # two 6,000-token prompts at 8,192 tokens per step: r0 and part of r1, then r1's rest
    assert prefill["steps"] == 2
    # both then decode together until r0 (one token ahead) finishes: max_tokens
    # (2 prefill steps + 3 + 2) less the 2 tokens r0 got while r1 was prefilling
    assert decode["steps"] == 3 + 2
    # a prefill step computes thousands of tokens, a decode step two
    assert prefill["modeled_ms_per_step"] > 10 * decode["modeled_ms_per_step"] > 0
    for phase in (prefill, decode):
        assert phase["overhead_pct_of_modeled"] == pytest.approx(
            100 * phase["overhead_ms_per_step"] / phase["modeled_ms_per_step"],
            rel=0.01, abs=0.002)


def documents_hit(run: dict[str, Any]) -> int:
    """Hits are whole documents asked for again (the questions after them are unique):
    the hit rate times the run's ~6,080-token prompts is a whole number of documents."""
    docs = run["token_hit_rate"] * run["requests"] * (PROMPT_TOKENS + 80) / PROMPT_TOKENS
    assert abs(docs - round(docs)) < 0.15, docs
    return round(docs)


def test_throughput_without_cache_pressure_does_not_depend_on_eviction() -> None:
    # 30 requests touch at most 30 documents, ~11,400 blocks of the 12,800: nothing is
    # evicted, so LRU and frequency eviction must give the same run
    lru, freq = (bench_throughput("llama3-8b-h100", 30, eviction, random.Random(2), rate=2.0,
                                  max_tokens=2) for eviction in ("lru", "frequency"))
    for key in ("token_hit_rate", "steps", "virtual_s", "ttft_p50_s", "preemptions"):
        assert lru[key] == freq[key], key
    assert lru["requests"] == 30 and lru["preemptions"] == 0
    assert lru["steps"] >= 30  # at least one step per request: 2 output tokens each
    assert documents_hit(lru) >= 1


def test_bench_main_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    assert main(["--json", str(out), "--batches", "1", "--decode-steps", "2",
                 "--requests", "10"]) == 0
    report = json.loads(out.read_text())
    assert report["profile"] == "llama3-8b-h100"
    (batch,) = report["per_step"]
    assert batch["batch"] == 1 and batch["prompt_tokens"] == PROMPT_TOKENS
    assert batch["prefill"]["steps"] == 1 and batch["decode"]["steps"] == 2 + 2
    assert report["target"] is None  # judged at batch 32 only
    assert [t["eviction"] for t in report["throughput"]] == ["lru", "frequency"]
    for run in report["throughput"]:
        assert run["requests"] == 10 and run["max_tokens"] == 16 and run["virtual_s"] > 0
        assert 0 <= documents_hit(run) < 10
