"""On fast devices (an 8B model on H100s) with answers of 100-300 tokens, ``cost``'s
scratch set carries the one-off documents on enough replicas that their queue is not
the p95: at scratch_utilization 0.6 (the default before) it was one replica, and the
p95 twice round robin's (0.111 s against 0.080 s at 3,000 requests)."""

from __future__ import annotations

import json
from pathlib import Path

from loadtests.simulate import main


def test_one_off_documents_do_not_queue_into_the_tail(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert main(["--scenario", "contracts-400", "--eviction", "lru", "--requests", "3000",
                 "--profile", "llama3-8b-h100", "--kv-pool-gib", "3", "--idle-kv-gib", "2.5",
                 "--max-num-seqs", "128", "--rate", "40", "--set", "output_tokens=[100,300]",
                 "--policies", "cost,round_robin", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["policies"]
    # (measured: 0.056 s against round robin's 0.080 s; 0.111 s before)
    assert runs["cost"]["ttft_p95_s"] < runs["round_robin"]["ttft_p95_s"], runs
    assert runs["cost"]["token_hit_rate"] > 0.7
