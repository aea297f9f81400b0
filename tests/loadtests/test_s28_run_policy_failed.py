"""A load run whose policy fails (here a third-party router that exits as it starts) names
it and why in its JSON, report and exit status, and still runs and reports the policies
after it: the failure cost every other policy's results, minutes of runs, before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.netns import isolated
from tests.support.processes import REPO

pytestmark = pytest.mark.slow

# ``python -m loadtests.run`` with the clients' workload stream cut to 3,000 requests, many
# times what the run sends: the default 200,000 takes seconds to generate, twice
CLI_WITH_A_SHORT_STREAM = ("import sys; from loadtests import run; run.STREAM_REQUESTS = 3000; "
                           "sys.exit(run.main(sys.argv[1:]))")


def test_a_router_that_does_not_start_leaves_the_other_policies_results(
        tmp_path: Path) -> None:
    router = tmp_path / "sglang-router"
    router.write_text("#!/bin/sh\necho 'no such option: --policy' >&2\nexit 3\n")
    router.chmod(0o755)
    out, report = tmp_path / "out.json", tmp_path / "report"
    run = subprocess.run(isolated([
        sys.executable, "-c", CLI_WITH_A_SHORT_STREAM,
        "--policies", "sglang:cache_aware,round_robin",
        "--duration", "2", "--replicas", "1", "--users", "2", "--rate", "4",
        "--kv-cache-gib", "0.5", "--max-num-seqs", "4", "--set", "num_docs=4",
        "--set", "hot_docs=2", "--set", "doc_tokens=300", "--set", "output_tokens=[2,4]",
        "--sglang-router", str(router), "--json", str(out), "--report", str(report)]),
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert run.returncode == 1, run.stderr[-3000:]
    results = json.loads(out.read_text())
    assert list(results["policies"]) == ["round_robin"]
    assert results["policies"]["round_robin"]["requests_ok"] >= 1
    assert list(results["failed"]) == ["sglang:cache_aware"]
    assert "no such option: --policy" in results["failed"]["sglang:cache_aware"]
    assert "| round_robin |" in run.stdout
    assert "error: sglang:cache_aware failed:" in run.stderr
    text = (report / "report.md").read_text()
    assert "| round_robin |" in text and "**sglang:cache_aware** failed" in text
