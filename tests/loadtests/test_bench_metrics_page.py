"""The /metrics page benchmark runs each case in a process of its own (the worker case in
prometheus-client's multiprocess mode) and reports what it promises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.bench_metrics_page import main


def test_bench_metrics_page_reports_each_case(tmp_path: Path) -> None:
    out = tmp_path / "page.json"
    assert main(["--replicas", "3", "--workers", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    single, files = figures["cases"]
    assert (single["replicas"], single["workers"]) == (3, 1)
    assert (files["replicas"], files["workers"]) == (3, 2)
    for case in (single, files):
        assert case["page_bytes"] > 0 and case["whole_on_loop_ms"] >= 0
        assert case["page_longest_hold_ms"] >= 0 and case["idle_longest_hold_ms"] >= 0
    # the files' page leaves out the process's own series, which one process's page has
    assert files["page_bytes"] < single["page_bytes"]


def test_fleet_sizes_are_checked() -> None:
    with pytest.raises(SystemExit):
        main(["--replicas", "0"])
