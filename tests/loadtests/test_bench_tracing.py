"""The tracing benchmark runs and reports what it promises."""

from __future__ import annotations

import json
from pathlib import Path

from loadtests.bench_tracing import main


def test_bench_tracing_reports_its_figures(tmp_path: Path) -> None:
    out = tmp_path / "tracing.json"
    assert main(["--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert set(figures) == {"tracing_off_us", "tracing_on_us", "media_hash_ms_per_mib",
                            "media_check_ms_per_mib"}
    # the no-op is far below recording spans; checking a part far below hashing it
    assert 0 < figures["tracing_off_us"] < figures["tracing_on_us"] / 10
    assert 0 < figures["media_check_ms_per_mib"] < figures["media_hash_ms_per_mib"] / 10
